"""What every judge returns and the interface they share.

A judge grades one prediction: ``await judge.grade(question, prediction, golds, trajectory)``.
Ground-truth judges (rules, LLM) need ``golds``; the no-ground-truth panel ignores them and reads
the ``trajectory`` instead, so callers can swap judges by config alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from mia.errors import MiaError

Label = Literal["correct", "incorrect", "not_attempted"]
LABELS: tuple[str, ...] = ("correct", "incorrect", "not_attempted")


class JudgeError(MiaError):
    """A judge could not reach a verdict (LLM call failed, reply unparsable, bad input)."""


@dataclass
class Judgement:
    """A verdict. ``judge`` names who decided (e.g. ``"llm"``, ``"rules:contains"``, or
    ``"rules:contains (fallback)"`` when the LLM judge failed and rules were configured)."""

    label: Label
    score: float
    judge: str
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def correct(self) -> bool:
        return self.label == "correct"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@runtime_checkable
class Judge(Protocol):
    name: str

    async def grade(
        self,
        question: str,
        prediction: str,
        golds: str | Sequence[str] | None = None,
        trajectory: str = "",
    ) -> Judgement: ...


def as_golds(golds: str | Sequence[str] | None, judge: str) -> list[str]:
    """Gold answers as a non-empty list of strings, or a clear error."""
    if golds is None:
        raise JudgeError(f"{judge} judge needs ground-truth answers (golds), got none")
    items = [golds] if isinstance(golds, str) else list(golds)
    if not items or not all(isinstance(g, str) for g in items):
        raise JudgeError(f"{judge} judge: golds must be a string or a non-empty list of strings")
    return items
