"""Retrieved memories as the text block the Planner reads (docs/reference.md §4.4)."""

from __future__ import annotations

from collections.abc import Sequence

from memory_serve.records import MemoryRecord, PlanPair, Retrieval
from mia.prompts import manager as P

FEEDBACK_KEYS = ("evaluator_1_feedback", "evaluator_2_feedback", "evaluator_3_feedback")


def format_example(i: int, rec: MemoryRecord) -> str:
    caption = P.CAPTION_LINE.format(caption=rec.image_caption) if rec.image_caption else ""
    lines = P.EXAMPLE_LINES.format(
        modality=rec.modality,
        judgement=rec.judgement,
        question=rec.question,
        caption_line=caption,
        workflow_summary=rec.workflow_summary,
    )
    # No-ground-truth runs store the review panel's feedback; the Planner sees it too.
    feedback = [
        P.FEEDBACK_LINE.format(i=n, feedback=rec.extra[key])
        for n, key in enumerate(FEEDBACK_KEYS, start=1)
        if rec.extra.get(key)
    ]
    body = "\n".join([lines, *feedback])
    return f"{P.EXAMPLE_HEADER.format(i=i)}\n{body}"


def _section(header: str, records: Sequence[MemoryRecord]) -> str:
    if not records:
        return f"{header.format(n=0)}\n{P.NONE_FOUND}"
    blocks = [format_example(i, rec) for i, rec in enumerate(records, start=1)]
    return header.format(n=len(records)) + "\n" + "\n\n".join(blocks)


def format_context(retrieval: Retrieval) -> str:
    positives = [m.record for m in retrieval.positives]
    negatives = [m.record for m in retrieval.negatives]
    return "\n\n".join(
        [
            P.CONTEXT_HEADER,
            _section(P.POSITIVE_HEADER, positives),
            _section(P.NEGATIVE_HEADER, negatives),
        ]
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
