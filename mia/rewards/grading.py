"""One graded answer: the judge's verdict plus the reward-side rules applied before it.

Rules that need no judge are applied first so no LLM call is spent on them: an empty answer is
"not attempted", and an answer over ``max_words`` words is wrong (the reference meant this rule
but counted characters). Judge failures (:class:`mia.judge.JudgeError`) propagate: a dead judge
must not turn into a stream of zero rewards.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mia.errors import MiaError
from mia.judge.base import Judge

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


@dataclass
class Graded:
    correct: bool
    label: str  # correct | incorrect | not_attempted
    judge: str | None  # None when a rule decided before the judge was asked
    words: int
    too_long: bool = False
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def acc(self) -> float:
        return 1.0 if self.correct else 0.0


def sample_golds(sample: Mapping[str, Any]) -> list[Any]:
    """A training sample's gold answers (``golds``); a sample without one is a MiaError."""
    golds = list(sample.get("golds") or [])
    if not golds:
        raise MiaError(f"sample {sample.get('data_id')!r} has no ground-truth answer")
    return golds


def word_count(text: str) -> int:
    return len(text.split())


async def grade(
    judge: Judge,
    question: str,
    answer: str,
    golds: str | Sequence[str] | None,
    *,
    trajectory: str = "",
    max_words: int | None = None,
) -> Graded:
    """Grade ``answer``; see the module docstring for the rules applied before the judge."""
    words = word_count(answer)
    if words == 0:
        return Graded(False, "not_attempted", None, 0)
    if max_words is not None and words > max_words:
        return Graded(False, "incorrect", None, words, too_long=True)
    verdict = await judge.grade(question, answer, golds, trajectory)
    return Graded(verdict.correct, verdict.label, verdict.judge, words, detail=verdict.detail)


def answer_from_trace(trace: str) -> str:
    """The Executor's final answer in a text trace: the last ``<answer>...</answer>`` after the
    last ``</think>``, else ``""``.

    The reference fell back to the whole text when there was no answer block; with a
    containment judge a trace full of search results then "contains" the gold answer, so a run
    that never answered could score as correct.
    """
    tail = trace.split("</think>")[-1]
    found = _ANSWER.findall(tail)
    return found[-1].strip() if found else ""
