"""Executor prompts: the ONE prompt module for training, serving and evaluation.

The reference drifted between a strict training prompt and a "comprehensive answer" serving
prompt, with tool schemas in the chat template during training and inline text when serving.
Here every consumer builds the conversation from these functions:

- a system message: a short role line + the tool schemas in ``<tools>`` exactly as Qwen2.5's
  chat template lays them out (so a Qwen model sees the format it was tuned on, whichever backend
  renders the chat) + "one call at a time";
- one user message: the think -> tool call -> observe -> answer workflow, the question (with one
  ``<image>`` placeholder per question image, replaced by an image content part), and the plan
  block ``\\nHere is a guide for your reference:\\n{plan}\\nBegin your answer:\\n``;
- later user turns: tool results in ``<tool_response>`` blocks, the revised-plan block (from
  :mod:`mia.trace`, which also recognises it in traces) and the "answer now" instruction.

Wording follows docs/reference.md §6 (summarised there, not copied verbatim). Answers are asked to be
short: the training reward scores answers over 100 characters as wrong.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

# Qwen2.5's tool block, under this module's names of it: the warm-start data fingerprint hashes
# the module's constants by name (mia.apps.warm_fingerprints).
from mia.models.chat_template import TOOLS_INTRO as _TOOLS_INTRO
from mia.models.chat_template import TOOLS_OUTRO as _TOOLS_OUTRO
from mia.trace import REVISED_PLAN_MARKER, REVISED_PLAN_TEMPLATE

# The placeholder an image content part replaces (question images and image-search results).
IMAGE_TOKEN = "<image>"

SYSTEM_ROLE = "You are a helpful assistant."

# After Qwen2.5's tool block, our one-call rule.
ONE_CALL_RULE = "\n\nCall one function at a time and wait for its result before you continue."

_WORKFLOW = (
    "Answer the question below by searching for information. Work in rounds:\n"
    "1. Think inside <think> </think> about what you already know and what you still need.\n"
    "2. If you need information, call one tool inside <tool_call> </tool_call> and stop writing. "
    "Its result comes back inside <tool_response> </tool_response>.\n"
    "3. Read the result, think again, and search again if something is still missing.\n"
    "4. When you are sure, give the final answer inside <answer> </answer>: only the answer "
    "itself, as short as possible, with no explanation, summary or filler.\n"
)

USER_PROMPT_TEXT = _WORKFLOW + "\nQuestion: {question}\n"

USER_PROMPT_IMAGE = (
    _WORKFLOW
    + "\nThe question is about the image below. web_image_to_image_search finds web pages with "
    "similar images; you may call it ONLY ONCE for this question.\n"
    "\nQuestion: {images}\n{question}\n"
)

PLAN_TEMPLATE = "\nHere is a guide for your reference:\n{plan}\nBegin your answer:\n"

ANSWER_NOW_PROMPT = (
    "You have reached the limit of tool calls or context for this question. Do not call any more "
    "tools. Based on the information you have gathered so far, give your final answer now inside "
    "<answer> </answer>."
)

VARIANTS = ("auto", "text", "image")

__all__ = [
    "ANSWER_NOW_PROMPT",
    "IMAGE_TOKEN",
    "PLAN_TEMPLATE",
    "REVISED_PLAN_MARKER",
    "REVISED_PLAN_TEMPLATE",
    "USER_PROMPT_IMAGE",
    "USER_PROMPT_TEXT",
    "VARIANTS",
    "plan_block",
    "revised_plan_block",
    "strip_image_tokens",
    "system_prompt",
    "user_prompt",
]


def strip_image_tokens(text: str) -> str:
    """``text`` without ``<image>`` placeholders: only the prompt builder places them, so a
    question or plan that spells one out cannot desynchronise placeholders and images."""
    return text.replace(IMAGE_TOKEN, "")


def system_prompt(tool_schemas: Sequence[dict[str, Any]], role: str = SYSTEM_ROLE) -> str:
    """The system text: ``role`` plus, when there are tools, their schemas in ``<tools>``."""
    if not tool_schemas:
        return role
    lines = "".join("\n" + json.dumps(s, ensure_ascii=False) for s in tool_schemas)
    return role + _TOOLS_INTRO + lines + _TOOLS_OUTRO + ONE_CALL_RULE


def plan_block(plan: str | None) -> str:
    """The guide appended to the user prompt; empty when there is no plan."""
    if plan is None or not plan.strip():
        return ""
    return PLAN_TEMPLATE.format(plan=strip_image_tokens(plan).strip())


def revised_plan_block(replan: str) -> str:
    """The user turn that hands the Executor a supplementary plan (docs/reference.md §5)."""
    return REVISED_PLAN_TEMPLATE.format(replan=strip_image_tokens(replan).strip())


def user_prompt(
    question: str, plan: str | None = None, num_images: int = 0, variant: str = "auto"
) -> str:
    """The first user turn. ``variant``: ``auto`` (image prompt iff there are images), ``text``
    or ``image``. The image variant holds ``num_images`` ``<image>`` placeholders (at least one
    is required for it)."""
    if variant not in VARIANTS:
        raise ValueError(f"prompt variant must be one of {VARIANTS}, got {variant!r}")
    use_image = num_images > 0 if variant == "auto" else variant == "image"
    question = strip_image_tokens(question).strip()
    if use_image:
        text = USER_PROMPT_IMAGE.format(images=IMAGE_TOKEN * num_images, question=question)
    else:
        if num_images:
            # A text prompt still has to place the images somewhere: before the question.
            question = IMAGE_TOKEN * num_images + "\n" + question
        text = USER_PROMPT_TEXT.format(question=question)
    return text + plan_block(plan)
