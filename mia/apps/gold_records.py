"""The records of gold data (:mod:`mia.apps.gold`): one question's example, a skipped question,
a run's report, and the JSONL files examples are kept in.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from mia.data.world_questions import QUESTION_TYPES
from mia.errors import MiaError
from mia.paths import atomic_write_text

Message = dict[str, Any]


class GoldSkip(Exception):
    """A question without a valid gold transcript; the message is the reason."""


@dataclass
class GoldExample:
    """One question's gold data. ``messages``: the Executor conversation exactly as the loop
    produced it (OpenAI format, images as data URLs); ``planner_messages``: ``[system, user(plan
    prompt), assistant(plan)]``; ``reflection_messages``: that chat continued with the judge
    prompt over the gold trace and the decision ``no``."""

    id: str
    type: str
    relation: str
    split: str
    question: str
    answer: str
    plan: str
    messages: list[Message]
    planner_messages: list[Message]
    reflection_messages: list[Message]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any, where: str = "gold example") -> GoldExample:
        if not isinstance(data, dict):
            raise MiaError(f"{where}: expected a JSON object")
        names = [f.name for f in fields(cls)]
        missing = [n for n in names if n not in data]
        if missing:
            raise MiaError(f"{where}: missing field(s) {missing}")
        for n in names:
            want = list if n.endswith("messages") else str
            if not isinstance(data[n], want):
                raise MiaError(f"{where}: field {n!r} must be a {want.__name__}")
        return cls(**{n: data[n] for n in names})


@dataclass
class Skipped:
    id: str
    type: str
    relation: str
    reason: str


@dataclass
class GoldReport:
    """Everything a run produced: the examples, the skipped questions with reasons, totals."""

    examples: list[GoldExample] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    # How many chosen queries were the first variant (0), the second (1), ... (incl. skipped).
    variant_use: dict[int, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return len(self.examples) + len(self.skipped)

    @property
    def coverage(self) -> float:
        """Share of questions with a valid gold transcript (1.0 for no questions)."""
        return len(self.examples) / self.total if self.total else 1.0

    def by_type(self) -> dict[str, tuple[int, int]]:
        """``{type: (with gold, total)}`` in the world's type order."""
        ok = Counter(e.type for e in self.examples)
        total = ok + Counter(s.type for s in self.skipped)
        return {t: (ok[t], total[t]) for t in QUESTION_TYPES if total[t]}

    def summary(self) -> str:
        parts = [f"{t} {a}/{n}" for t, (a, n) in self.by_type().items()]
        head = f"coverage {len(self.examples)}/{self.total} ({100 * self.coverage:.1f}%)"
        return head + (f": {', '.join(parts)}" if parts else "")


def dumps_gold(examples: Sequence[GoldExample]) -> str:
    return "".join(json.dumps(e.to_dict(), ensure_ascii=False) + "\n" for e in examples)


def write_gold(path: str | os.PathLike[str], examples: Sequence[GoldExample]) -> Path:
    """Write ``examples`` as JSONL (one object per line), atomically."""
    out = Path(path)
    if out.is_dir():
        raise MiaError(f"gold: {out} is a folder, not a file")
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, dumps_gold(examples))
    return out


def iter_gold(path: str | os.PathLike[str]) -> Iterator[GoldExample]:
    p = Path(path)
    if not p.is_file():
        raise MiaError(f"gold file not found: {p}")
    with p.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                data = json.loads(line)
            except json.JSONDecodeError as err:
                raise MiaError(f"{p.name} line {lineno}: invalid JSON: {err.msg}") from None
            yield GoldExample.from_dict(data, f"{p.name} line {lineno}")


def load_gold(path: str | os.PathLike[str]) -> list[GoldExample]:
    """Read a gold JSONL file; a bad line raises :class:`MiaError` naming it."""
    return list(iter_gold(path))
