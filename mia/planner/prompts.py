"""The Planner's conversations: pure functions from inputs to OpenAI-style message lists.

The memory service sends them to its Planner LLM (``/plan``, ``/judge_replan``, ``/replan``,
``/replan_train``), Planner GRPO and TTRL render them token-exactly, and evaluation reads them
back; all of them build the text here, so the Planner sees the same words everywhere. The
templates themselves are in :mod:`mia.prompts.planner` (the Planner's) and
:mod:`mia.prompts.manager` (how retrieved memories are laid out).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from mia.prompts import manager as M
from mia.prompts import planner as P

Message = dict[str, Any]
FEEDBACK_KEYS = ("evaluator_1_feedback", "evaluator_2_feedback", "evaluator_3_feedback")


class MemoryView(Protocol):
    """What a retrieved memory shows the Planner (memory_serve's records have these fields)."""

    modality: str
    judgement: str
    question: str
    image_caption: str
    workflow_summary: str
    extra: Mapping[str, Any]


# ----------------------------------------------------------------------------- memories


def format_example(i: int, rec: MemoryView) -> str:
    caption = M.CAPTION_LINE.format(caption=rec.image_caption) if rec.image_caption else ""
    lines = M.EXAMPLE_LINES.format(
        modality=rec.modality,
        judgement=rec.judgement,
        question=rec.question,
        caption_line=caption,
        workflow_summary=rec.workflow_summary,
    )
    # No-ground-truth runs store the review panel's feedback; the Planner sees it too.
    feedback = [
        M.FEEDBACK_LINE.format(i=n, feedback=rec.extra[key])
        for n, key in enumerate(FEEDBACK_KEYS, start=1)
        if rec.extra.get(key)
    ]
    # Failures written with the ground truth (memory.remember_expected): what was expected.
    expected = []
    if rec.extra.get("expected"):
        expected.append(M.EXPECTED_LINE.format(answer=rec.extra["expected"]))
        if rec.extra.get("evidence"):
            expected.append(M.EVIDENCE_LINE.format(evidence=rec.extra["evidence"]))
    body = "\n".join([lines, *feedback, *expected])
    return f"{M.EXAMPLE_HEADER.format(i=i)}\n{body}"


def _section(header: str, records: Sequence[MemoryView]) -> str:
    if not records:
        return f"{header.format(n=0)}\n{M.NONE_FOUND}"
    blocks = [format_example(i, rec) for i, rec in enumerate(records, start=1)]
    return header.format(n=len(records)) + "\n" + "\n\n".join(blocks)


def memory_context(positives: Sequence[MemoryView], negatives: Sequence[MemoryView]) -> str:
    """Retrieved memories as the text block of the plan prompt: successes, then failures."""
    return "\n\n".join(
        [
            M.CONTEXT_HEADER,
            _section(M.POSITIVE_HEADER, positives),
            _section(M.NEGATIVE_HEADER, negatives),
        ]
    )


EMPTY_MEMORY = memory_context((), ())  # what the Planner reads when nothing was retrieved


# ----------------------------------------------------------------------------- conversations


def plan_messages(context: str, question: str, *, image: bool) -> list[Message]:
    return [
        {"role": "system", "content": P.PLANNER_SYSTEM_PROMPT},
        {"role": "user", "content": P.plan_prompt(context, question, image=image)},
    ]


def judge_turn(trace: str) -> Message:
    """The reflection turn: the Executor's trace, then "replan? yes or no"."""
    return {"role": "user", "content": P.judge_prompt(trace)}


def replan_turn(question: str, memory: str | None = None) -> Message:
    return {"role": "user", "content": P.replan_prompt(question, memory)}


def judge_messages(past_messages: list[Message], trace: str) -> list[Message]:
    return [*past_messages, judge_turn(trace)]


def replan_messages(
    past_messages: list[Message], question: str, memory: str | None = None
) -> list[Message]:
    return [*past_messages, replan_turn(question, memory)]


def replan_train_messages(
    question: str, plan: str, trace: str, mem_context: str, *, image: bool
) -> list[Message]:
    """The synthetic 6-message planner conversation used while training the Executor: the plan
    was followed, the answer judged wrong, so the decision is a canned "yes" and the planner is
    asked for a supplementary plan. Role names are the standard ones (the reference misspelled
    "assistant")."""
    return [
        *plan_messages(mem_context, question, image=image),
        {"role": "assistant", "content": plan},
        judge_turn(trace),
        {"role": "assistant", "content": P.REPLAN_TRAIN_DECISION},
        replan_turn(question),
    ]


def is_image_question(image_caption: Any, modality: str | None = None) -> bool:
    """The plan prompt's image variant: a question with a caption (or marked text-image)."""
    return bool(image_caption) or modality == "text-image"


text_after_think = P.text_after_think
parse_decision = P.parse_decision
_YES = re.compile(r"\byes\b", re.IGNORECASE)
_NO = re.compile(r"\bno\b", re.IGNORECASE)


def parse_decision_strict(text: str) -> bool | None:
    """The reflection's decision: True (replan) if the answer part says "yes", False if it says
    "no", None when it says neither (an empty or think-only reply): not a decision at all.
    "yes" wins when both appear, as in :func:`mia.prompts.planner.parse_decision`."""
    answer = P.text_after_think(text)
    if _YES.search(answer):
        return True
    if _NO.search(answer):
        return False
    return None
