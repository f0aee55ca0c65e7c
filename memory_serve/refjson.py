"""The reference's JSON persistence layout (docs/reference.md §4.7), for import and export.

``{"text-only": {"location": [entries], ..., "others": [...]}, "text-image": {...}}``, written
with indent 4 and ``ensure_ascii=False``. Workflow entries carry ``data_id, question,
image_caption, workflow_summary, plan, judgement, usage_count, success_count, win_rate``; plan
entries ``data_id, question, image_caption, correct_plan, incorrect_plan`` (+ the counters).
The reference stores no embeddings, so an import re-embeds every question and caption.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from memory_serve.records import (
    CATEGORIES,
    DEFAULT_CATEGORY,
    MODALITIES,
    MemoryRecord,
    NewMemory,
    PlanPair,
    check_new_memory,
    check_timestamp,
    extra_json,
    normalise_caption,
    normalise_judgement,
)
from memory_serve.restore import BadField
from mia.errors import MiaError
from mia.paths import atomic_write_text

T = TypeVar("T")
N = TypeVar("N", int, float)

_WORKFLOW_KEYS = (
    "data_id",
    "question",
    "image_caption",
    "workflow_summary",
    "plan",
    "judgement",
    "usage_count",
    "success_count",
    "win_rate",
)
# Our fields beyond the reference's, kept under their own names so a round trip is lossless.
_OUR_KEYS = ("id", "created_at", "source")


def _empty_layout() -> dict[str, dict[str, list[dict[str, Any]]]]:
    return {m: {c: [] for c in CATEGORIES} for m in MODALITIES}


def export_workflows(records: list[MemoryRecord]) -> dict[str, Any]:
    layout = _empty_layout()
    for rec in records:
        entry: dict[str, Any] = {k: getattr(rec, k) for k in _WORKFLOW_KEYS}
        entry.update({k: getattr(rec, k) for k in _OUR_KEYS})
        # Extra fields (e.g. evaluator_1_feedback) sit flat, as the reference's nogt entries.
        for key, value in rec.extra.items():
            entry.setdefault(key, value)
        layout[rec.modality][rec.category].append(entry)
    return layout


def export_plan_pairs(pairs: list[PlanPair]) -> dict[str, Any]:
    layout = _empty_layout()
    for p in pairs:
        entry = {
            "data_id": p.data_id,
            "question": p.question,
            "image_caption": p.image_caption,
            "correct_plan": p.correct_plan,
            "incorrect_plan": p.incorrect_plan,
            "usage_count": 1,
            "success_count": 1,
            "win_rate": 1.0,
            "id": p.id,
            "created_at": p.created_at,
        }
        for key, value in p.extra.items():
            entry.setdefault(key, value)
        layout[p.modality][p.category].append(entry)
    return layout


def write_json(path: str | Path, data: dict[str, Any]) -> None:
    atomic_write_text(path, json.dumps(data, indent=4, ensure_ascii=False))


def read_json(path: str | Path, where: str | None = None) -> dict[str, Any]:
    """Parse a reference-layout file; errors name it as ``where`` (default: the path)."""
    path = Path(path)
    where = where or str(path)
    if not path.is_file():
        raise MiaError(f"no memory file at {where}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise MiaError(f"{where} is not valid JSON: {err}") from None
    except RecursionError:
        raise MiaError(f"{where} is not valid JSON: nested too deeply") from None
    if not isinstance(data, dict) or not set(data) <= set(MODALITIES):
        raise MiaError(
            f"{where}: expected the reference layout {{modality: {{category: [entries]}}}} "
            f"with modalities {list(MODALITIES)}"
        )
    return data


def _entries(data: dict[str, Any], where: str) -> list[tuple[str, str, str, dict[str, Any]]]:
    """``(modality, category, "modality/category[i]", entry)`` for every entry."""
    out = []
    for modality, cats in data.items():
        if not isinstance(cats, dict):
            raise MiaError(f"{where}: {modality!r} must map categories to lists")
        for category, entries in cats.items():
            if not isinstance(entries, list):
                raise MiaError(f"{where}: {modality}/{category} must be a list")
            cat = category if category in CATEGORIES else DEFAULT_CATEGORY
            for i, entry in enumerate(entries):
                if not isinstance(entry, dict) or not isinstance(entry.get("question"), str):
                    raise MiaError(f"{where}: {modality}/{category}[{i}] has no question")
                out.append((modality, cat, f"{modality}/{category}[{i}]", entry))
    return out


def is_plan_layout(data: dict[str, Any]) -> bool:
    """True when the entries are plan pairs (``correct_plan``) rather than workflows."""
    for cats in data.values():
        for entries in cats.values() if isinstance(cats, dict) else ():
            for entry in entries if isinstance(entries, list) else ():
                return isinstance(entry, dict) and "correct_plan" in entry
    return False


def _converted(e: dict[str, Any], name: str, default: N, kind: Callable[[Any], N], what: str) -> N:
    """``e[name]`` (``default`` when absent) as ``kind``; else a ValueError saying it must be
    ``what``."""
    value = e.get(name, default)
    try:
        return kind(value)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{name} must be {what}, got {value!r:.40}") from None


def _whole(e: dict[str, Any], name: str, default: int) -> int:
    return _converted(e, name, default, int, "a whole number")


def _number(e: dict[str, Any], name: str, default: float) -> float:
    return _converted(e, name, default, float, "a number")


def _created(e: dict[str, Any]) -> float | None:
    return None if e.get("created_at") is None else _number(e, "created_at", 0.0)


def _each(
    data: dict[str, Any], where: str, parse: Callable[[str, str, dict[str, Any]], T]
) -> list[T]:
    """``parse`` of every entry; the first bad one is a 422 naming the entry and the field."""
    out = []
    for modality, category, label, e in _entries(data, where):
        try:
            out.append(parse(modality, category, e))
        except (TypeError, ValueError, AttributeError) as err:
            raise BadField(f"{where}: {label}: {err}") from None
    return out


def parse_workflows(data: dict[str, Any], where: str = "memory file") -> list[NewMemory]:
    return _each(data, where, _workflow)


def _workflow(modality: str, category: str, e: dict[str, Any]) -> NewMemory:
    known = set(_WORKFLOW_KEYS) | set(_OUR_KEYS) | {"judgement_nogt"}
    usage = _whole(e, "usage_count", 1)
    success = _whole(e, "success_count", 1)
    mem = NewMemory(
        question=e["question"],
        workflow_summary=str(e.get("workflow_summary", "")),
        judgement=normalise_judgement(e.get("judgement", e.get("judgement_nogt"))),
        data_id=str(e.get("data_id", "")),
        image_caption=normalise_caption(e.get("image_caption")),
        plan=str(e.get("plan", "")),
        category=category,
        modality=modality,
        source=str(e.get("source", "") or "import"),
        extra={k: v for k, v in e.items() if k not in known},
        usage_count=usage,
        success_count=success,
        win_rate=_number(e, "win_rate", success / usage if usage else 1.0),
        created_at=_created(e),
    )
    check_new_memory(mem)
    return mem


def parse_plan_pairs(data: dict[str, Any], where: str = "plan file") -> list[dict[str, Any]]:
    return _each(data, where, _plan_pair)


def _plan_pair(modality: str, category: str, e: dict[str, Any]) -> dict[str, Any]:
    known = {"data_id", "question", "image_caption", "correct_plan", "incorrect_plan"}
    known |= {"usage_count", "success_count", "win_rate", "id", "created_at"}
    created = _created(e)
    extra = {k: v for k, v in e.items() if k not in known}
    if created is not None:
        check_timestamp(created)
    extra_json(extra)
    return {
        "question": e["question"],
        "correct_plan": str(e.get("correct_plan", "")),
        "incorrect_plan": str(e.get("incorrect_plan", "")),
        "data_id": str(e.get("data_id", "")),
        "image_caption": normalise_caption(e.get("image_caption")),
        "category": category,
        "modality": modality,
        "created_at": created,
        "extra": extra,
    }
