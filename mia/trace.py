"""Readable text traces of an Executor conversation.

One formatter for every consumer: the memory service (input of the workflow summariser), the
agent loop and planner training (the trace shown to the Planner when it decides whether to
replan). The reference copy-pasted this in >10 places and labelled revised-plan user turns as tool
results; here they get their own heading.

Layout::

    ### Question: <question>

    ### Round 1:
    #### Agent Reasoning and Tool Call:
    <assistant text>

    #### Tool Call Return Results:
    <tool text, cut to N words> ... (N more words omitted)

    #### Revised Plan:
    <the supplementary plan turn>
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

# The Executor-side wrapper of a supplementary plan (docs/reference.md §5, "Replan delivery").
REVISED_PLAN_MARKER = "I have a revised plan for you to follow:"
REVISED_PLAN_TEMPLATE = (
    "\n" + REVISED_PLAN_MARKER + "\n{replan}\nPlease continue with this updated guidance:\n"
)

QUESTION_HEADER = "### Question: {question}"
ROUND_HEADER = "### Round {n}:"
ASSISTANT_HEADER = "#### Agent Reasoning and Tool Call:"
TOOL_HEADER = "#### Tool Call Return Results:"
REVISED_PLAN_HEADER = "#### Revised Plan:"
OMITTED_NOTE = "... ({n} more words omitted)"

DEFAULT_MAX_TOOL_WORDS = 1024


def content_text(content: Any) -> str:
    """Text of an OpenAI message ``content``: a string, or a list of parts (images -> <image>)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        pieces = []
        for part in content:
            if isinstance(part, str):
                pieces.append(part)
            elif isinstance(part, dict):
                kind = part.get("type")
                if kind == "text":
                    pieces.append(str(part.get("text", "")))
                elif kind in ("image_url", "image", "input_image"):
                    pieces.append("<image>")
        return "".join(pieces)
    return str(content)


def truncate_words(text: str, max_words: int | None) -> str:
    """The first ``max_words`` whitespace-separated words plus a note on how many were cut."""
    if max_words is None or max_words < 0:
        return text
    words = text.split()
    if len(words) <= max_words:
        return text
    return " ".join(words[:max_words]) + " " + OMITTED_NOTE.format(n=len(words) - max_words)


def is_revised_plan(message: dict[str, Any]) -> bool:
    """A user turn that hands the Executor a supplementary plan (not a tool result)."""
    return message.get("role") == "user" and REVISED_PLAN_MARKER in content_text(
        message.get("content")
    )


def format_rounds(
    messages: Iterable[dict[str, Any]],
    *,
    max_tool_words: int | None = DEFAULT_MAX_TOOL_WORDS,
    start_round: int = 1,
) -> str:
    """The round-by-round body of a trace (no question header).

    ``messages`` is the Executor chat after its first user prompt. System turns are skipped;
    every assistant turn opens a round; other turns are tool results (cut to ``max_tool_words``)
    except revised-plan turns, which are kept whole under their own heading.
    """
    blocks: list[str] = []
    n = start_round - 1
    for msg in messages:
        role = msg.get("role")
        if role == "system":
            continue
        text = content_text(msg.get("content")).strip()
        if role == "assistant":
            n += 1
            blocks.append(f"{ROUND_HEADER.format(n=n)}\n{ASSISTANT_HEADER}\n{text}")
        elif is_revised_plan(msg):
            blocks.append(f"{REVISED_PLAN_HEADER}\n{text}")
        else:
            blocks.append(f"{TOOL_HEADER}\n{truncate_words(text, max_tool_words)}")
    return "\n\n".join(blocks)


def format_trace(
    question: str,
    messages: Iterable[dict[str, Any]],
    *,
    max_tool_words: int | None = DEFAULT_MAX_TOOL_WORDS,
) -> str:
    """Question header + rounds: the text the summariser and the Planner's judge step read."""
    body = format_rounds(messages, max_tool_words=max_tool_words)
    header = QUESTION_HEADER.format(question=question.strip())
    return f"{header}\n\n{body}" if body else header
