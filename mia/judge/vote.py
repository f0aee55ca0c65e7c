"""Majority vote over n answers to one question (a no-ground-truth reward, as in TTRL).

Answers are compared after SQuAD normalisation. Empty answers do not vote. Ties go to the
answer seen first, so the result never depends on hashing or dict order.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from mia.judge.rules import normalize_answer


@dataclass
class VoteResult:
    answer: str  # the first original answer with the winning normalised form ("" if none)
    normalized: str
    votes: int  # how many answers have the winning form
    counts: dict[str, int]  # normalised form -> count, in first-seen order
    agreement: list[float]  # per answer: share of all n answers with the same normalised form
    rewards: list[float]  # per answer: 1.0 if it matches the vote, else 0.0

    @property
    def share(self) -> float:
        """The winning form's share of all answers (0.0 when nobody answered)."""
        n = len(self.rewards)
        return self.votes / n if n else 0.0


def majority_vote(
    answers: Sequence[str], normalize: Callable[[str], str] = normalize_answer
) -> VoteResult:
    """Vote over ``answers``; see the module docstring for the rules."""
    forms = [normalize(a) for a in answers]
    counts: Counter[str] = Counter(f for f in forms if f)
    ordered = {f: counts[f] for f in dict.fromkeys(f for f in forms if f)}
    n = len(answers)
    if not ordered:
        return VoteResult("", "", 0, {}, [0.0] * n, [0.0] * n)
    best = max(ordered.values())
    winner = next(f for f, c in ordered.items() if c == best)  # first seen among the tied
    first = forms.index(winner)
    return VoteResult(
        answer=answers[first],
        normalized=winner,
        votes=best,
        counts=ordered,
        agreement=[counts[f] / n if f else 0.0 for f in forms],
        rewards=[1.0 if f == winner else 0.0 for f in forms],
    )
