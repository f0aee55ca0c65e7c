"""Plain records of the memory store (docs/memory_serve.md; docs/reference.md §4.1).

Frozen dataclasses: the store hands out snapshots, so a caller can never mutate shared state.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from mia.caption import caption_text
from mia.prompts.manager import DEFAULT_CATEGORY
from mia.prompts.planner import memory_context
from mia.services import memory as memory_api
from mia.services.memory import CATEGORIES, MAX_EXTRA_CHARS, MAX_JSON_DEPTH, check_depth, extra_json

TEXT_ONLY = "text-only"
TEXT_IMAGE = "text-image"
MODALITIES = (TEXT_ONLY, TEXT_IMAGE)
# The wire contract lists the same buckets.
assert set(memory_api.MODALITIES) == set(MODALITIES)
CORRECT = "correct"
INCORRECT = "incorrect"

# What every stored value must satisfy (docs/memory_serve.md, "Stored ranges"). Writes and loads
# check the same ranges, so anything a store holds also loads again from its backup.
MAX_ID = 2**53 - 1  # exact as a JavaScript number (the inspector), far below SQLite's 2^63 - 1
MAX_COUNT = 2**31 - 1  # usage/success counters; credit saturates here
MAX_TIMESTAMP = 253402300799.0  # 9999-12-31T23:59:59Z: the last second dates can show

__all__ = [
    "CATEGORIES",
    "CORRECT",
    "DEFAULT_CATEGORY",
    "INCORRECT",
    "MAX_COUNT",
    "MAX_EXTRA_CHARS",
    "MAX_ID",
    "MAX_JSON_DEPTH",
    "MAX_TIMESTAMP",
    "MODALITIES",
    "TEXT_IMAGE",
    "TEXT_ONLY",
    "MemoryRecord",
    "NewMemory",
    "PlanPair",
    "Retrieval",
    "Rollout",
    "ScoredMemory",
    "WriteResult",
    "check_counters",
    "check_depth",
    "check_new_memory",
    "check_number",
    "check_text",
    "check_timestamp",
    "check_whole",
    "extra_json",
    "modality_of",
    "normalise_caption",
    "normalise_judgement",
]


def normalise_caption(caption: str | list[str] | None) -> str:
    """A caption string or a list of them: the one rule of :func:`mia.caption.caption_text`."""
    return caption_text(caption)


def modality_of(caption: str) -> str:
    """text-image iff the question comes with a (non-empty) image caption."""
    return TEXT_IMAGE if caption.strip() else TEXT_ONLY


def normalise_judgement(value: str | bool | int | None) -> str:
    """``"correct"`` (also ``True``/``1``), anything else is ``"incorrect"`` (reference rule)."""
    if isinstance(value, bool):
        return CORRECT if value else INCORRECT
    if isinstance(value, int):
        return CORRECT if value == 1 else INCORRECT
    if isinstance(value, str) and value.strip().lower() == CORRECT:
        return CORRECT
    return INCORRECT


# ----------------------------------------------------------------------------- value checks
# Each raises ValueError naming the field; callers add where it was (row, entry, request).


def check_whole(value: Any, name: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ValueError(f"{name} must be a whole number in [{lo}, {hi}], got {value!r:.40}")
    return value


def check_number(value: Any, name: str, lo: float, hi: float) -> float:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or not lo <= value <= hi:
        bounds = ", ".join(str(int(b)) if float(b).is_integer() else str(b) for b in (lo, hi))
        raise ValueError(f"{name} must be a finite number in [{bounds}], got {value!r:.40}")
    return float(value)


def check_timestamp(value: Any, name: str = "created_at") -> float:
    """Epoch seconds from 1970 to the end of year 9999."""
    return check_number(value, name, 0.0, MAX_TIMESTAMP)


def check_text(value: Any, name: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{name} must be text, got {type(value).__name__}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{name} is not valid UTF-8 text") from None
    return value


def check_counters(usage: Any, success: Any, win_rate: Any) -> None:
    check_whole(usage, "usage_count", 0, MAX_COUNT)
    check_whole(success, "success_count", 0, MAX_COUNT)
    if success > usage:
        # Credit adds at most one success per use, so more would be a forged counter.
        raise ValueError(f"success_count ({success}) must not exceed usage_count ({usage})")
    check_number(win_rate, "win_rate", 0.0, 1.0)


@dataclass(frozen=True)
class MemoryRecord:
    id: int
    data_id: str
    question: str
    image_caption: str
    workflow_summary: str
    plan: str
    judgement: str
    usage_count: int
    success_count: int
    win_rate: float
    modality: str
    category: str
    created_at: float
    source: str
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def correct(self) -> bool:
        return self.judgement == CORRECT


@dataclass
class NewMemory:
    """A trajectory to remember (already compressed). ``modality`` None = from the caption."""

    question: str
    workflow_summary: str
    judgement: str
    data_id: str = ""
    image_caption: str = ""
    plan: str = ""
    category: str = DEFAULT_CATEGORY
    modality: str | None = None
    source: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    used_memory_ids: list[int] = field(default_factory=list)
    # Counters for imports; new trajectories start at the optimistic 1/1/1.0 prior.
    usage_count: int = 1
    success_count: int = 1
    win_rate: float = 1.0
    created_at: float | None = None


def check_new_memory(mem: NewMemory) -> str:
    """ValueError unless a store can hold ``mem``; returns its ``extra`` as JSON text."""
    check_counters(mem.usage_count, mem.success_count, mem.win_rate)
    if mem.created_at is not None:
        check_timestamp(mem.created_at)
    return extra_json(mem.extra)


@dataclass(frozen=True)
class WriteResult:
    # "inserted" (new memory), "replaced" (a duplicate replaced: new id, old id removed) or
    # "kept_existing" (a duplicate that did not win: nothing stored).
    action: str
    id: int
    replaced_id: int | None = None
    credited_ids: tuple[int, ...] = ()
    evicted_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class ScoredMemory:
    record: MemoryRecord
    similarity: float  # raw mixed cosine
    normalised: float  # min-max normalised within the bucket
    score: float  # similarity_weight * normalised + win_rate_weight * win_rate


@dataclass(frozen=True)
class Retrieval:
    positives: tuple[ScoredMemory, ...]
    negatives: tuple[ScoredMemory, ...]
    bucket_size: int = 0
    # The bucket's raw similarity range (the min-max normalisation's); None: nothing scored.
    similarity_min: float | None = None
    similarity_max: float | None = None

    @property
    def positive_ids(self) -> list[int]:
        return [m.record.id for m in self.positives]

    @property
    def negative_ids(self) -> list[int]:
        return [m.record.id for m in self.negatives]

    def context(self) -> str:
        """The memory block the Planner reads (docs/reference.md §4.4): successes, then
        failures (:func:`mia.prompts.planner.memory_context`)."""
        return memory_context(
            [m.record for m in self.positives], [m.record for m in self.negatives]
        )


@dataclass(frozen=True)
class PlanPair:
    id: int
    data_id: str
    question: str
    image_caption: str
    correct_plan: str
    incorrect_plan: str
    modality: str
    category: str
    created_at: float
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Rollout:
    """One buffered TTRL rollout (``/memory_bank_save``)."""

    id: int
    data_id: str
    question: str
    image_caption: str
    plan: str
    judgement: str
    messages: list[dict[str, Any]]
    used_memory_ids: list[int]
    created_at: float
    slow_plan: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        """Rollouts of one question group under its data_id (the question text if none)."""
        return self.data_id or f"question:{self.question}"
