"""Reading a Search-R1 corpus and storing its passages so any row can be fetched cheaply.

Corpus format (Search-R1 / FlashRAG): one JSON object per line, ``{"id": ..., "contents":
"Title\\ntext"}``. Extra fields are ignored; a line with ``title`` + ``text`` but no ``contents``
is accepted as ``contents = title + "\\n" + text`` (the form Search-R1 itself builds).

Document store: ``docs.jsonl`` holds one ``{"id", "contents"}`` object per row and
``docs.offsets.npy`` (int64, ``num_docs + 1`` entries) the byte offset of every row. Both are
memory-mapped when serving, so a 21M-passage wiki costs page cache, not Python heap: fetching a
hit is one slice + one ``json.loads``. Chosen over SQLite/Arrow because it needs no extra
dependency, is append-only while building and keeps rows human-readable.
"""

from __future__ import annotations

import array
import hashlib
import json
import mmap
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from mia.errors import MiaError

DOCS_FILE = "docs.jsonl"
OFFSETS_FILE = "docs.offsets.npy"

DocId = str | int


@dataclass(frozen=True)
class CorpusStats:
    num_docs: int
    sha256: str
    num_bytes: int


def _parse_line(raw: bytes, lineno: int, path: Path, row: int) -> tuple[DocId, str]:
    try:
        obj = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise MiaError(f"{path} line {lineno}: invalid JSON ({err})") from None
    if not isinstance(obj, dict):
        raise MiaError(f"{path} line {lineno}: expected a JSON object, got {type(obj).__name__}")
    contents = obj.get("contents")
    if contents is None and isinstance(obj.get("text"), str):
        title = obj.get("title")
        contents = f"{title}\n{obj['text']}" if isinstance(title, str) else obj["text"]
    if not isinstance(contents, str):
        raise MiaError(f'{path} line {lineno}: "contents" must be a string (got {contents!r:.60})')
    doc_id = obj.get("id", str(row))
    if isinstance(doc_id, bool) or not isinstance(doc_id, str | int):
        raise MiaError(f'{path} line {lineno}: "id" must be a string or an integer')
    return doc_id, contents


def iter_corpus(path: str | os.PathLike[str], hasher: Any = None) -> Iterator[tuple[DocId, str]]:
    """Yield ``(id, contents)`` per non-blank line; a bad line raises MiaError naming it.

    Every byte read is fed to ``hasher`` (so the manifest can record the corpus sha256 without a
    second pass), and a tqdm bar counts bytes (rate + ETA; no total for a pipe).
    """
    path = Path(path)
    if not path.exists():
        raise MiaError(f"corpus file not found: {path}")
    if path.is_dir():
        raise MiaError(f"corpus must be a JSONL file, got a directory: {path}")
    size = path.stat().st_size if path.is_file() else None
    row = 0
    with (
        open(path, "rb") as f,
        tqdm(total=size or None, unit="B", unit_scale=True, desc="read corpus") as bar,
    ):
        for lineno, raw in enumerate(f, start=1):
            if hasher is not None:
                hasher.update(raw)
            bar.update(len(raw))
            if not raw.strip():
                continue
            yield _parse_line(raw, lineno, path, row)
            row += 1


def write_docstore(corpus_path: str | os.PathLike[str], out_dir: Path) -> CorpusStats:
    """Validate the corpus and write ``docs.jsonl`` + ``docs.offsets.npy`` into ``out_dir``."""
    hasher = hashlib.sha256()
    offsets = array.array("q", [0])
    pos = 0
    with open(out_dir / DOCS_FILE, "wb") as out:
        for doc_id, contents in iter_corpus(corpus_path, hasher):
            line = json.dumps({"id": doc_id, "contents": contents}, ensure_ascii=False) + "\n"
            data = line.encode("utf-8")
            out.write(data)
            pos += len(data)
            offsets.append(pos)
    num_docs = len(offsets) - 1
    if num_docs == 0:
        raise MiaError(f"corpus {corpus_path} has no passages")
    np.save(out_dir / OFFSETS_FILE, np.frombuffer(offsets, dtype=np.int64))
    return CorpusStats(num_docs=num_docs, sha256=hasher.hexdigest(), num_bytes=pos)


class DocStore:
    """Read-only, memory-mapped access to the passages of an index by row number."""

    def __init__(self, index_dir: Path) -> None:
        self.offsets = np.load(index_dir / OFFSETS_FILE, mmap_mode="r")
        self._file = open(index_dir / DOCS_FILE, "rb")  # noqa: SIM115 - lives as long as the store
        self._map = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ)
        if int(self.offsets[-1]) != len(self._map):
            self.close()
            raise ValueError(f"{DOCS_FILE} size does not match {OFFSETS_FILE}")

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def get(self, row: int) -> dict[str, Any]:
        start, end = int(self.offsets[row]), int(self.offsets[row + 1])
        return json.loads(self._map[start:end])

    def iter_contents(self, batch: int = 4096) -> Iterator[list[str]]:
        """Yield the contents of all rows in order, ``batch`` at a time (for building)."""
        for lo in range(0, len(self), batch):
            hi = min(lo + batch, len(self))
            chunk = self._map[int(self.offsets[lo]) : int(self.offsets[hi])]
            yield [json.loads(line)["contents"] for line in chunk.splitlines()]

    def close(self) -> None:
        self._map.close()
        self._file.close()
