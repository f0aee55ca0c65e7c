"""Retrieved memories as the text block the Planner reads (docs/reference.md §4.4)."""

from __future__ import annotations

from collections.abc import Sequence

from memory_serve.records import PlanPair, Retrieval
from mia.planner.prompts import memory_context
from mia.prompts import manager as P


def format_context(retrieval: Retrieval) -> str:
    """The Planner's memory block for a retrieval (:func:`mia.planner.prompts.memory_context`)."""
    return memory_context(
        [m.record for m in retrieval.positives], [m.record for m in retrieval.negatives]
    )


def format_plan_pairs(pairs: Sequence[PlanPair]) -> str:
    return "\n\n".join(
        P.PLAN_PAIR_BLOCK.format(
            i=i,
            question=p.question,
            correct_plan=p.correct_plan,
            incorrect_plan=p.incorrect_plan,
        )
        for i, p in enumerate(pairs, start=1)
    )
