"""Question-answer datasets in the reference formats: parquet (RL) and JSON/JSONL (inference).

Both load through ``datasets`` into one typed record, :class:`QAItem`, and both write back out.
The loaders accept the variants found in the reference data:

* parquet: ``prompt`` (list of chat messages; the first user message is the question, a plain
  string is accepted too) or ``question``; ``data_id`` / ``id``; ``reward_model.ground_truth``
  (string or list) or ``answer``; ``images`` as raw bytes, ``{"bytes", "path"}`` dicts (what
  ``datasets`` writes for images), base64 strings or data URLs; ``image_caption`` string or list.
* JSON/JSONL: ``question``; ``id`` / ``ids`` / ``data_id``; ``answer`` (string or list) or
  ``answers`` / ``golden_answers`` / ``ground_truth``; ``images`` as base64 strings, data URLs or
  file paths relative to the data file; ``image_caption`` string or list.

Every error names the file, the 0-based row and the field, e.g.
``test.jsonl row 17: field 'question' missing``.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import io
import json
import re
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from PIL import Image, UnidentifiedImageError

from mia.caption import caption_text
from mia.errors import MiaError
from mia.paths import atomic_write_bytes

MODALITIES = ("text-only", "text-image")
ID_FIELDS = ("id", "ids", "data_id")
ANSWER_FIELDS = ("answer", "answers", "golden_answers", "ground_truth")
_B64_RE = re.compile(r"^[A-Za-z0-9+/=_-]+$")
_MIME_BY_FORMAT = {
    "PNG": "image/png",
    "JPEG": "image/jpeg",
    "WEBP": "image/webp",
    "GIF": "image/gif",
}


class DataFormatError(MiaError, ValueError):
    """A dataset file that cannot be read; the message names file, row and field."""


@dataclass
class QAItem:
    """One question with its gold answer(s), optional image(s) and pass-through fields."""

    id: str
    question: str
    answers: list[str]  # canonical answer first, then accepted aliases; [] when unlabelled
    modality: str = "text-only"  # "text-only" | "text-image"
    images: list[bytes] = field(default_factory=list)  # encoded image files (png, jpeg, ...)
    image_caption: str = ""
    data_source: str = ""
    category: str = ""
    level: int | None = None
    extra_info: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)  # other columns, written back unchanged

    @property
    def answer(self) -> str:
        return self.answers[0] if self.answers else ""

    def pil_images(self) -> list[Image.Image]:
        return [Image.open(io.BytesIO(b)) for b in self.images]


# --------------------------------------------------------------------------------------------
# images


def image_mime(data: bytes) -> str:
    """MIME type of encoded image bytes (by content, not by name)."""
    try:
        with Image.open(io.BytesIO(data)) as img:
            return _MIME_BY_FORMAT.get(img.format or "", f"image/{(img.format or 'png').lower()}")
    except (UnidentifiedImageError, OSError):
        return "application/octet-stream"


def image_to_data_url(data: bytes) -> str:
    return f"data:{image_mime(data)};base64,{base64.b64encode(data).decode('ascii')}"


def _check_image(data: bytes, where: str) -> bytes:
    try:
        with Image.open(io.BytesIO(data)) as img:
            if not img.format:
                raise UnidentifiedImageError
    except (UnidentifiedImageError, OSError):
        raise DataFormatError(f"{where} is not a readable image") from None
    return data


def decode_image(value: Any, where: str, base_dir: Path | None = None) -> bytes:
    """Image bytes from any accepted form: bytes, {"bytes", "path"}, base64, data URL, PIL, path.

    ``where`` prefixes error messages (e.g. ``"test.jsonl row 3: 'images[0]'"``).
    """
    if isinstance(value, Image.Image):
        buf = io.BytesIO()
        value.save(buf, format="PNG")
        return buf.getvalue()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return _check_image(bytes(value), where)
    if isinstance(value, dict):
        if value.get("bytes") is not None:
            return decode_image(value["bytes"], where, base_dir)
        if value.get("path"):
            return _read_image_path(str(value["path"]), where, base_dir)
        raise DataFormatError(f"{where} has neither 'bytes' nor 'path'")
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("data:"):
            head, _, payload = text.partition(",")
            if ";base64" not in head or not payload:
                raise DataFormatError(f"{where} is a data URL without base64 content")
            text = payload
        elif not _B64_RE.match(text.replace("\n", "")):
            return _read_image_path(text, where, base_dir)
        try:
            data = base64.b64decode(text.replace("\n", ""), validate=True)
        except (binascii.Error, ValueError):
            try:  # URL-safe alphabet, as some exporters write
                data = base64.urlsafe_b64decode(text)
            except (binascii.Error, ValueError):
                raise DataFormatError(f"{where} is not valid base64") from None
        return _check_image(data, where)
    raise DataFormatError(f"{where} has unsupported type {type(value).__name__}")


def _read_image_path(text: str, where: str, base_dir: Path | None) -> bytes:
    path = Path(text)
    if not path.is_absolute() and base_dir is not None:
        path = base_dir / path
    if len(text) > 4096 or not path.is_file():
        raise DataFormatError(f"{where} is not valid base64 (nor an existing image file)")
    return _check_image(path.read_bytes(), where)


# --------------------------------------------------------------------------------------------
# reading


@contextlib.contextmanager
def _quiet_datasets() -> Iterator[None]:
    import datasets

    was_enabled = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if was_enabled:
            datasets.enable_progress_bars()


def _undecode_images(ds: Any) -> Any:
    """Columns that ``datasets`` would decode to PIL are cast back to raw ``{bytes, path}``."""
    from datasets import Image as HFImage
    from datasets import List, Sequence

    for name, feat in ds.features.items():
        if isinstance(feat, HFImage):
            ds = ds.cast_column(name, HFImage(decode=False))
        elif isinstance(feat, (List, Sequence)) and isinstance(feat.feature, HFImage):
            ds = ds.cast_column(name, List(HFImage(decode=False)))
    return ds


def _dataset_rows(path: Path, builder: str) -> list[dict[str, Any]]:
    """All rows of one file via ``datasets`` (temporary cache; nothing left behind)."""
    import datasets

    with tempfile.TemporaryDirectory(prefix="mia-ds-") as tmp, _quiet_datasets():
        ds = datasets.load_dataset(
            builder, data_files=str(path), split="train", cache_dir=tmp, keep_in_memory=True
        )
        return _undecode_images(ds).to_list()


def _python_json_rows(path: Path) -> list[dict[str, Any]]:
    """Plain JSON reading: handles rows whose types differ, and names the bad line."""
    text = path.read_text(encoding="utf-8")
    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as err:
            raise DataFormatError(f"{path.name}: invalid JSON: {err}") from None
    else:
        rows = []
        for lineno, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise DataFormatError(
                    f"{path.name} line {lineno}: invalid JSON: {err.msg}"
                ) from None
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise DataFormatError(
                f"{path.name} row {i}: expected an object, got {type(row).__name__}"
            )
    return rows


def _read_rows(path: Path, fmt: str) -> list[dict[str, Any]]:
    if not path.is_file():
        raise DataFormatError(f"{path}: no such file")
    if fmt == "parquet":
        try:
            return _dataset_rows(path, "parquet")
        except Exception as err:  # noqa: BLE001 - any reader failure is a bad file for the user
            raise DataFormatError(
                f"{path.name}: not a readable parquet file ({_first_line(err)})"
            ) from None
    try:
        return _dataset_rows(path, "json")
    except Exception:  # noqa: BLE001
        # Mixed types across rows or a syntax error: plain JSON either copes or names the line.
        return _python_json_rows(path)


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return (text[0] if text else type(err).__name__)[:200]


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


def _answers(value: Any, where: str, name: str) -> list[str]:
    items = value if isinstance(value, (list, tuple)) else [value]
    out = []
    for k, item in enumerate(items):
        if isinstance(item, bool) or not isinstance(item, (str, int, float)):
            raise DataFormatError(
                f"{where}: '{name}[{k}]' must be a string, got {type(item).__name__}"
            )
        if str(item).strip():
            out.append(str(item).strip())
    return out


def _caption(value: Any, where: str) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, (list, tuple)):
        parts = []
        for k, item in enumerate(value):
            if not isinstance(item, str):
                raise DataFormatError(f"{where}: 'image_caption[{k}]' must be a string")
            if item.strip():
                parts.append(item.strip())
        return caption_text(parts)  # the first caption, the rule memory_serve applies too
    raise DataFormatError(f"{where}: 'image_caption' must be a string or a list of strings")


def _question_from_prompt(prompt: Any, where: str) -> str:
    if isinstance(prompt, str):
        return prompt
    if not isinstance(prompt, (list, tuple)) or not prompt:
        raise DataFormatError(f"{where}: field 'prompt' must be a non-empty list of messages")
    users = [m for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
    message = users[0] if users else prompt[0]
    if not isinstance(message, dict) or "content" not in message:
        raise DataFormatError(f"{where}: 'prompt[0]' has no 'content'")
    content = message["content"]
    if isinstance(content, list):  # OpenAI-style content parts
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    if not isinstance(content, str):
        raise DataFormatError(f"{where}: 'prompt[0].content' must be a string")
    return content


class _Row:
    """One row being read: its fields, where it is (for errors), and which fields were read
    (the others are passed through as ``QAItem.extra``)."""

    def __init__(self, row: dict[str, Any], where: str) -> None:
        self.fields = dict(row)
        self.where = where
        self.used: set[str] = set()

    def get(self, key: str) -> Any:
        return self.fields.get(key)

    def take(self, key: str) -> Any:
        """The field's value, marked as read."""
        self.used.add(key)
        return self.fields.get(key)

    def text(self, key: str) -> str:
        """An optional string field ("" when absent)."""
        value = self.take(key)
        if value is None:
            return ""
        if not isinstance(value, str):
            raise DataFormatError(f"{self.where}: field '{key}' must be a string")
        return value

    def rest(self) -> dict[str, Any]:
        """The fields no step read."""
        return {k: v for k, v in self.fields.items() if k not in self.used}


def _row_to_item(
    row: dict[str, Any], i: int, name: str, base_dir: Path, require_answer: bool
) -> QAItem:
    r = _Row(row, f"{name} row {i}")
    question = _row_question(r)
    item_id = _row_id(r, name, i)
    answers, extra_info = _row_answers(r, require_answer)
    images, caption, modality = _row_images(r, base_dir)
    level = _row_level(r)
    return QAItem(
        id=item_id,
        question=question,
        answers=answers,
        modality=modality,
        images=images,
        image_caption=caption,
        data_source=r.text("data_source"),
        category=r.text("category"),
        level=level,
        extra_info=extra_info,
        extra=r.rest(),
    )


def _row_question(r: _Row) -> str:
    """The question: the parquet ``prompt`` (chat messages or a string), else ``question``."""
    if not _missing(r.get("prompt")):
        question = _question_from_prompt(r.take("prompt"), r.where)
        r.used.add("question")
    elif not _missing(r.get("question")):
        question = r.take("question")
        if not isinstance(question, str):
            raise DataFormatError(f"{r.where}: field 'question' must be a string")
    else:
        raise DataFormatError(f"{r.where}: field 'question' missing")
    question = question.strip()
    if not question:
        raise DataFormatError(f"{r.where}: field 'question' is empty")
    return question


def _row_id(r: _Row, name: str, i: int) -> str:
    """The first of :data:`ID_FIELDS` given (a one-item list is its item), else
    ``<file stem>_<row>``."""
    item_id = None
    for key in ID_FIELDS:
        if not _missing(r.get(key)):
            value = r.take(key)
            if isinstance(value, (list, tuple)) and len(value) == 1:
                value = value[0]
            if isinstance(value, bool) or not isinstance(value, (str, int)):
                raise DataFormatError(f"{r.where}: field '{key}' must be a string or integer")
            item_id = str(value)
            break
    r.used.update(ID_FIELDS)
    if item_id is None:
        item_id = f"{Path(name).stem}_{i}"
    return item_id


def _row_answers(r: _Row, require_answer: bool) -> tuple[list[str], dict[str, Any]]:
    """The answers (the parquet ``reward_model.ground_truth``, else the first of
    :data:`ANSWER_FIELDS`, then the aliases) and ``extra_info`` without its aliases."""
    where = r.where
    extra_info = r.take("extra_info")
    if extra_info is None:
        extra_info = {}
    if not isinstance(extra_info, dict):
        raise DataFormatError(f"{where}: field 'extra_info' must be an object")
    answers: list[str] = []
    reward_model = r.take("reward_model")
    if isinstance(reward_model, dict) and not _missing(reward_model.get("ground_truth")):
        answers = _answers(reward_model["ground_truth"], where, "reward_model.ground_truth")
    elif reward_model is not None and not isinstance(reward_model, dict):
        raise DataFormatError(f"{where}: field 'reward_model' must be an object")
    for key in ANSWER_FIELDS:
        if not answers and not _missing(r.get(key)):
            answers = _answers(r.get(key), where, key)
        r.used.add(key)
    for alias_source, label in (
        (r.get("aliases"), "aliases"),
        (extra_info.get("aliases"), "extra_info.aliases"),
    ):
        if alias_source is not None:
            answers += [a for a in _answers(alias_source, where, label) if a not in answers]
    r.used.add("aliases")
    # Aliases now live in ``answers``; keeping them in extra_info too would duplicate on write.
    extra_info = {k: v for k, v in extra_info.items() if k != "aliases"}
    if require_answer and not answers:
        raise DataFormatError(f"{where}: field 'answer' missing (or reward_model.ground_truth)")
    return answers, extra_info


def _row_images(r: _Row, base_dir: Path) -> tuple[list[bytes], str, str]:
    """The decoded ``images``, the ``image_caption`` and the ``modality`` (given, else
    text-image when the row has an image or a caption)."""
    raw_images = r.take("images")
    if raw_images is None:
        raw_images = []
    elif not isinstance(raw_images, (list, tuple)):
        raw_images = [raw_images]
    images = [
        decode_image(v, f"{r.where}: 'images[{k}]'", base_dir)
        for k, v in enumerate(raw_images)
        if v is not None
    ]
    caption = _caption(r.take("image_caption"), r.where)
    modality = r.take("modality")
    if _missing(modality):
        modality = "text-image" if (images or caption) else "text-only"
    elif modality not in MODALITIES:
        raise DataFormatError(
            f"{r.where}: field 'modality' must be one of {list(MODALITIES)}, got {modality!r}"
        )
    return images, caption, modality


def _row_level(r: _Row) -> int | None:
    level = r.take("level")
    if level is not None:
        try:
            level = int(level)
        except (TypeError, ValueError):
            raise DataFormatError(f"{r.where}: field 'level' must be an integer") from None
    return level


def _detect_format(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix in (".parquet", ".pq"):
        return "parquet"
    if suffix in (".jsonl", ".json", ".ndjson"):
        return "json"
    raise DataFormatError(f"{path.name}: unknown data format (expected .parquet, .jsonl or .json)")


def load_qa(
    path: str | Path, *, fmt: str | None = None, require_answer: bool = True
) -> list[QAItem]:
    """Load a QA file (parquet or JSON/JSONL, by suffix unless ``fmt`` is given).

    Ids must be unique; a missing id becomes ``<file stem>_<row>``. With ``require_answer=False``
    unlabelled rows are accepted (``answers == []``), as for test-time training without ground truth.
    """
    path = Path(path)
    fmt = fmt or _detect_format(path)
    if fmt not in ("parquet", "json"):
        raise DataFormatError(f"unknown format {fmt!r} (expected 'parquet' or 'json')")
    rows = _read_rows(path, fmt)
    items: list[QAItem] = []
    first_row: dict[str, int] = {}
    for i, row in enumerate(rows):
        item = _row_to_item(row, i, path.name, path.parent, require_answer)
        if item.id in first_row:
            raise DataFormatError(
                f"{path.name} row {i}: duplicate id {item.id!r} (first at row {first_row[item.id]})"
            )
        first_row[item.id] = i
        items.append(item)
    return items


def load_parquet_qa(path: str | Path, *, require_answer: bool = True) -> list[QAItem]:
    return load_qa(path, fmt="parquet", require_answer=require_answer)


def load_jsonl_qa(path: str | Path, *, require_answer: bool = True) -> list[QAItem]:
    return load_qa(path, fmt="json", require_answer=require_answer)


# --------------------------------------------------------------------------------------------
# writing


def _parquet_table(items: list[QAItem]) -> Any:
    import pyarrow as pa

    message = pa.struct([("role", pa.string()), ("content", pa.string())])
    image = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    reward = pa.struct([("ground_truth", pa.string()), ("style", pa.string())])
    columns: dict[str, Any] = {
        "data_source": pa.array([it.data_source for it in items], pa.string()),
        "prompt": pa.array(
            [[{"role": "user", "content": it.question}] for it in items], pa.list_(message)
        ),
        "modality": pa.array([it.modality for it in items], pa.string()),
        "data_id": pa.array([it.id for it in items], pa.string()),
        "image_caption": pa.array([it.image_caption for it in items], pa.string()),
        "images": pa.array(
            [[{"bytes": b, "path": None} for b in it.images] for it in items], pa.list_(image)
        ),
        "reward_model": pa.array(
            [{"ground_truth": it.answer, "style": "rule"} for it in items], reward
        ),
        "category": pa.array([it.category for it in items], pa.string()),
        "level": pa.array([it.level for it in items], pa.int64()),
    }
    # Aliases travel in extra_info so that ground_truth stays a plain string for reward code.
    infos = [{**it.extra_info, "aliases": it.answers[1:]} for it in items]
    columns["extra_info"] = pa.array(infos)
    for key in sorted({k for it in items for k in it.extra}):
        columns[key] = pa.array([it.extra.get(key) for it in items])
    return pa.table(columns)


def _write_file(path: str | Path, data: bytes) -> None:
    atomic_write_bytes(path, data)
    Path(path).chmod(0o644)  # the temp file behind the atomic write is private; data is not


def write_parquet_qa(items: Iterable[QAItem], path: str | Path) -> None:
    """Write the reference RL parquet layout (see module docstring); atomic, deterministic."""
    import pyarrow.parquet as pq

    items = list(items)
    buf = io.BytesIO()
    pq.write_table(_parquet_table(items), buf, compression="zstd")
    _write_file(path, buf.getvalue())


def item_to_json(item: QAItem) -> dict[str, Any]:
    """The inference JSONL record of one item (images as base64 PNG/JPEG strings)."""
    row: dict[str, Any] = {
        "id": item.id,
        "question": item.question,
        "answer": item.answer,
        "aliases": item.answers[1:],
        "images": [base64.b64encode(b).decode("ascii") for b in item.images],
        "image_caption": [item.image_caption] if item.image_caption else [],
        "modality": item.modality,
        "data_source": item.data_source,
        "category": item.category,
        "level": item.level,
        "extra_info": item.extra_info,
    }
    row.update({k: v for k, v in sorted(item.extra.items()) if k not in row})
    return row


def write_jsonl_qa(items: Iterable[QAItem], path: str | Path) -> None:
    """Write the reference inference JSONL layout, one object per line; atomic, deterministic."""
    lines = [json.dumps(item_to_json(it), ensure_ascii=False) + "\n" for it in items]
    _write_file(path, "".join(lines).encode("utf-8"))


__all__ = [
    "DataFormatError",
    "MODALITIES",
    "QAItem",
    "decode_image",
    "image_mime",
    "image_to_data_url",
    "item_to_json",
    "load_jsonl_qa",
    "load_parquet_qa",
    "load_qa",
    "write_jsonl_qa",
    "write_parquet_qa",
]
