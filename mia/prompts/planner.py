"""The Planner's text, once: its prompts (plan, reflect, replan), how retrieved memories are
laid out for it, the conversations built from them, and how its replies are read.

Everything that talks to the Planner builds its messages here -- memory_serve's routes, the
Planner GRPO episode, TTRL, evaluation and the gold transcripts -- so it reads the same words in
training and serving. Templates use ``str.format`` fields; the filled-in values may contain
braces safely. Wording follows the reference's prompts as summarised in docs/reference.md §5
(not copied verbatim).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from mia.llm.think import text_after_think
from mia.prompts import manager as manager_text

Message = dict[str, Any]
FEEDBACK_KEYS = ("evaluator_1_feedback", "evaluator_2_feedback", "evaluator_3_feedback")

PLANNER_SYSTEM_PROMPT = (
    "You are the Planner of a research team. An Executor agent answers questions by calling "
    "search tools; you guide it. You work in a loop of three steps:\n"
    "1. Plan: given the goal (a question) and background (relevant memories of past attempts), "
    "write an action plan for the Executor.\n"
    "2. Evaluate: given the Executor's trace, decide whether replanning is needed.\n"
    "3. Replan: if it is, write a revised plan that targets the goals that are still unmet.\n"
    "Be concise."
)

_PLAN_COMMON = (
    "{memory}\n\n"
    "## Question\n{question}\n\n"
    "## Instructions\n"
    "- Compare the question with the correct strategies and the failure patterns in the memories "
    "above. Adapt ideas that worked; warn against steps that led to failures.\n"
    "- Write one generalisable, step-by-step plan of at most {max_words} words.\n"
    "- Make every step atomic: one tool call with its query intent, one inference, one "
    "calculation, one cross-check, or one synthesis.\n"
    "- Mention the memories only inside <think></think>; the plan itself must stand alone.\n"
    "- Do not answer the question and do not state facts about it.\n"
    "- Output only the numbered plan."
)

PLAN_PROMPT_TEXT = (
    "Write a research plan for the Executor.\n\n"
    "## Tools available to the Executor\n"
    "- search(query_list): text search over web/wiki passages.\n\n" + _PLAN_COMMON
).replace("{max_words}", "400")

PLAN_PROMPT_IMAGE = (
    "Write a research plan for the Executor. The question comes with an image.\n\n"
    "## Tools available to the Executor\n"
    "- search(query_list): text search over web/wiki passages.\n"
    "- web_image_to_image_search(img_idx): finds web pages with images similar to the input "
    "image.\n\n"
    "IMPORTANT: web_image_to_image_search can be called ONLY ONCE per question. Plan exactly "
    "one image search at most, and never plan to repeat it.\n\n" + _PLAN_COMMON
).replace("{max_words}", "300")

JUDGE_PROMPT = (
    "Here is the Executor's trace for your plan:\n\n{trace}\n\n"
    "Decide whether to replan. Replan if a claim lacks tool support or the support is unclear, "
    "if the reasoning has gaps or unverified assumptions, if the answer is incomplete, or if you "
    "have any doubt. Prefer replanning over accepting a borderline answer.\n"
    "Keep your <think></think> very short, then answer with exactly one word: yes or no."
)

_REPLAN_BODY = (
    "You decided to reflect and replan.\n\n"
    "## Original question\n{question}\n\n"
    "{memory_block}"
    "## Instructions\n"
    "- Only the search tool may be recommended from now on.\n"
    "- Use the strategies from the memories; analyse what was tried and why it failed.\n"
    "- Build on completed steps; do not repeat searches that were already run.\n"
    "- Identify the exact point where the previous attempt failed.\n"
    "- Write a supplementary step-by-step plan of at most 200 words.\n"
    "- Put your reflection only inside <think></think>.\n"
    "- Do not answer the question and do not state facts about it."
)

# The reference kept a {memory} slot in this prompt but commented it out; ``memory_block`` is
# empty unless the service is configured to include retrieved memories.
REPLAN_PROMPT = _REPLAN_BODY
REPLAN_MEMORY_BLOCK = "{memory}\n\n"

# /replan_train: the synthetic conversation says the first answer was wrong, so the decision turn
# is a canned "yes" (docs/reference.md §3.1; the reference misspelled the role as "assitant").
REPLAN_TRAIN_DECISION = "<think>\nThe Executor's final answer is incorrect, so the plan must be revised.\n</think>\n\nyes"

_YES = re.compile(r"\byes\b", re.IGNORECASE)
_NO = re.compile(r"\bno\b", re.IGNORECASE)


def parse_decision(text: str) -> bool:
    """True (replan) iff the answer after the reasoning says ``yes``."""
    return bool(_YES.search(text_after_think(text)))


def plan_prompt(memory: str, question: str, *, image: bool) -> str:
    template = PLAN_PROMPT_IMAGE if image else PLAN_PROMPT_TEXT
    return template.format(memory=memory, question=question)


def judge_prompt(trace: str) -> str:
    return JUDGE_PROMPT.format(trace=trace)


def replan_prompt(question: str, memory: str | None = None) -> str:
    block = REPLAN_MEMORY_BLOCK.format(memory=memory) if memory else ""
    return REPLAN_PROMPT.format(question=question, memory_block=block)


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
    caption = (
        manager_text.CAPTION_LINE.format(caption=rec.image_caption) if rec.image_caption else ""
    )
    lines = manager_text.EXAMPLE_LINES.format(
        modality=rec.modality,
        judgement=rec.judgement,
        question=rec.question,
        caption_line=caption,
        workflow_summary=rec.workflow_summary,
    )
    # No-ground-truth runs store the review panel's feedback; the Planner sees it too.
    feedback = [
        manager_text.FEEDBACK_LINE.format(i=n, feedback=rec.extra[key])
        for n, key in enumerate(FEEDBACK_KEYS, start=1)
        if rec.extra.get(key)
    ]
    # Failures written with the ground truth (memory.remember_expected): what was expected.
    expected = []
    if rec.extra.get("expected"):
        expected.append(manager_text.EXPECTED_LINE.format(answer=rec.extra["expected"]))
        if rec.extra.get("evidence"):
            expected.append(manager_text.EVIDENCE_LINE.format(evidence=rec.extra["evidence"]))
    body = "\n".join([lines, *feedback, *expected])
    return f"{manager_text.EXAMPLE_HEADER.format(i=i)}\n{body}"


def _section(header: str, records: Sequence[MemoryView]) -> str:
    if not records:
        return f"{header.format(n=0)}\n{manager_text.NONE_FOUND}"
    blocks = [format_example(i, rec) for i, rec in enumerate(records, start=1)]
    return header.format(n=len(records)) + "\n" + "\n\n".join(blocks)


def memory_context(positives: Sequence[MemoryView], negatives: Sequence[MemoryView]) -> str:
    """Retrieved memories as the text block of the plan prompt: successes, then failures."""
    return "\n\n".join(
        [
            manager_text.CONTEXT_HEADER,
            _section(manager_text.POSITIVE_HEADER, positives),
            _section(manager_text.NEGATIVE_HEADER, negatives),
        ]
    )


EMPTY_MEMORY = memory_context((), ())  # what the Planner reads when nothing was retrieved


# ----------------------------------------------------------------------------- conversations


def plan_messages(context: str, question: str, *, image: bool) -> list[Message]:
    return [
        {"role": "system", "content": PLANNER_SYSTEM_PROMPT},
        {"role": "user", "content": plan_prompt(context, question, image=image)},
    ]


def judge_turn(trace: str) -> Message:
    """The reflection turn: the Executor's trace, then "replan? yes or no"."""
    return {"role": "user", "content": judge_prompt(trace)}


def replan_turn(question: str, memory: str | None = None) -> Message:
    return {"role": "user", "content": replan_prompt(question, memory)}


def judge_messages(past_messages: list[Message], trace: str) -> list[Message]:
    return [*past_messages, judge_turn(trace)]


def replan_messages(
    past_messages: list[Message], question: str, memory: str | None = None
) -> list[Message]:
    return [*past_messages, replan_turn(question, memory)]


def replan_train_prefix(
    question: str, plan: str, trace: str, mem_context: str, *, image: bool
) -> list[Message]:
    """The synthetic planner conversation of Executor training, up to the replan turn: the plan
    was followed, the answer judged wrong, so the decision is a canned "yes". Role names are the
    standard ones (the reference misspelled "assistant")."""
    return [
        *plan_messages(mem_context, question, image=image),
        {"role": "assistant", "content": plan},
        judge_turn(trace),
        {"role": "assistant", "content": REPLAN_TRAIN_DECISION},
    ]


def replan_train_messages(
    question: str, plan: str, trace: str, mem_context: str, *, image: bool
) -> list[Message]:
    """:func:`replan_train_prefix` and the replan turn: the 6 messages ``/replan_train`` sends."""
    return [
        *replan_train_prefix(question, plan, trace, mem_context, image=image),
        replan_turn(question),
    ]


def is_image_question(image_caption: Any, modality: str | None = None) -> bool:
    """The plan prompt's image variant: a question with a caption (or marked text-image)."""
    return bool(image_caption) or modality == "text-image"


def parse_decision_strict(text: str) -> bool | None:
    """The reflection's decision: True (replan) if the answer part says "yes", False if it says
    "no", None when it says neither (an empty or think-only reply): not a decision at all.
    "yes" wins when both appear, as in :func:`parse_decision`."""
    answer = text_after_think(text)
    if _YES.search(answer):
        return True
    if _NO.search(answer):
        return False
    return None
