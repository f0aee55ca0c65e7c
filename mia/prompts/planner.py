"""Planner prompts: plan, reflect (replan yes/no), replan.

Shared by the memory service (``/plan``, ``/judge_replan``, ``/replan``, ``/replan_train``),
planner GRPO training and TTRL, so the Planner sees the same text in training and serving.
Templates use ``str.format`` fields; the filled-in values may contain braces safely.
Wording follows the reference's prompts as summarised in docs/reference.md §5 (not copied verbatim).
"""

from __future__ import annotations

import re

from mia.llm.think import strip_think

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

_END_TOKENS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>")


def text_after_think(text: str) -> str:
    """The answer part of a reply: after the last ``</think>``, chat end tokens removed
    (``""`` when the reply stops inside an unclosed ``<think>``)."""
    for tok in _END_TOKENS:
        text = text.replace(tok, "")
    return strip_think(text)


_YES = re.compile(r"\byes\b", re.IGNORECASE)


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
