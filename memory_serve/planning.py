"""Planner conversations built by the memory service (docs/reference.md §3.1, §5).

Pure functions from inputs to OpenAI-style message lists; the service sends them to the manager
or planner LLM. Keeping them here lets tests and planner training rebuild the exact prompts.
"""

from __future__ import annotations

import re
from typing import Any

from mia.prompts import planner as P

Message = dict[str, Any]
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


def plan_messages(context: str, question: str, *, image: bool) -> list[Message]:
    return [
        {"role": "system", "content": P.PLANNER_SYSTEM_PROMPT},
        {"role": "user", "content": P.plan_prompt(context, question, image=image)},
    ]


def judge_messages(past_messages: list[Message], trace: str) -> list[Message]:
    return [*past_messages, {"role": "user", "content": P.judge_prompt(trace)}]


def replan_messages(
    past_messages: list[Message], question: str, memory: str | None = None
) -> list[Message]:
    return [*past_messages, {"role": "user", "content": P.replan_prompt(question, memory)}]


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
        {"role": "user", "content": P.judge_prompt(trace)},
        {"role": "assistant", "content": P.REPLAN_TRAIN_DECISION},
        {"role": "user", "content": P.replan_prompt(question)},
    ]
