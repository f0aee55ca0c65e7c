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

import json
import re
from collections.abc import Iterable, Iterator, Mapping
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


def content_parts(messages: Iterable[Mapping[str, Any]]) -> Iterator[Any]:
    """The parts of every message whose ``content`` is a list of parts, in order."""
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            yield from content


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


# ----------------------------------------------------------------------------- rule summaries

_TOOL_CALL = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.S)
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.S)
_THINK = re.compile(r"<think>(.*?)</think>", re.S)
_TITLE = re.compile(r"\(Title: ([^)]*)\)")
_SENTENCE = re.compile(r'(?:(?<=[.!?])|(?<=[.!?]"))\s+')


def _queries(call_text: str) -> list[str]:
    try:
        call = json.loads(call_text)
    except ValueError:
        return []
    args = call.get("arguments") if isinstance(call, dict) else None
    if not isinstance(args, dict):
        return []
    if call.get("name") == "web_image_to_image_search":
        return ["<the question's image>"]
    queries = args.get("query_list") or args.get("queries") or args.get("query") or []
    return [str(q) for q in ([queries] if isinstance(queries, str) else queries)]


def _conclusion(text: str) -> str:
    """The last sentence of the turn's reasoning: where the Executor says what it found."""
    thoughts = _THINK.findall(text)
    sentences = [s.strip() for s in _SENTENCE.split(thoughts[-1].strip())] if thoughts else []
    return sentences[-1] if sentences else ""


def rule_summary(question: str, messages: Iterable[dict[str, Any]], max_titles: int = 3) -> str:
    """A workflow summary without an LLM: one numbered step per Executor action, in the
    "purpose (input -> output)" form of the compression prompt, keeping the query strings and
    the sentence in which the Executor concluded. Deterministic and instant, so small models
    (the embedded default) get workflows a Planner can copy.

        1. search (query "Vorlanic Institute founded by" -> passages: Vorlanic Institute, ...)
        2. answer (So the founder of Vorlanic Institute is Kaleth Morvaine. -> "Kaleth Morvaine")
    """
    steps: list[str] = []
    pending: list[str] = []  # queries whose results come in the next tool turn
    for m in messages:
        role, text = m.get("role"), content_text(m.get("content"))
        if role == "assistant":
            call = _TOOL_CALL.search(text)
            answer = _ANSWER.search(text)
            if call:
                pending = _queries(call.group(1))
            elif answer:
                found = _conclusion(text)
                lead = f"{found} -> " if found else ""
                steps.append(f'answer ({lead}"{answer.group(1).strip()}")')
        elif is_revised_plan(m):
            steps.append("revised plan (the Planner asked for another attempt)")
        elif pending:
            titles = list(dict.fromkeys(_TITLE.findall(text)))[: max_titles * len(pending)]
            shown = ", ".join(titles) if titles else "no passage"
            qs = "; ".join(f'"{q}"' for q in pending)
            steps.append(f"search (query {qs} -> passages: {shown})")
            pending = []
    if not steps:
        steps.append("no action (the Executor neither searched nor answered)")
    return "\n".join(f"{i}. {s}" for i, s in enumerate(steps, 1))


_DOC = re.compile(r"Doc \d+\s*\(Title: [^)]*\)\s*")
_TOOL_RESPONSE = re.compile(r"</?tool_response>")


def answer_evidence(
    messages: Iterable[dict[str, Any]], answers: Iterable[str], max_chars: int = 200
) -> str:
    """The first sentence of a search result the Executor read that contains one of the
    ``answers`` (whole words, any case): in hindsight, where the expected answer was;
    ``""`` when no result contains it. A failed memory shows it next to the expected answer
    (``memory.remember_expected``), so the Planner sees which fact such a question wants.

    >>> msgs = [{"role": "user", "content": "Question: How old is Pstad?"},
    ...         {"role": "user", "content": "<tool_response>\\nDoc 1(Title: Pstad) Pstad is a "
    ...          "city in Pobland. It was founded in 1603 and has 9 parks.\\n</tool_response>"}]
    >>> answer_evidence(msgs, ["1603"])
    'It was founded in 1603 and has 9 parks.'
    >>> answer_evidence(msgs, ["160"])
    ''
    """
    wanted = [a.strip() for a in answers if a and a.strip()]
    if not wanted:
        return ""
    found = re.compile("|".join(rf"(?<!\w){re.escape(a)}(?!\w)" for a in wanted), re.IGNORECASE)
    for m in messages:
        text = content_text(m.get("content"))
        if m.get("role") != "tool" and not text.lstrip().startswith("<tool_response>"):
            continue  # the question, the Executor's own turns: not what it found
        for doc in _DOC.split(_TOOL_RESPONSE.sub(" ", text)):
            for sentence in _SENTENCE.split(" ".join(doc.split())):
                if found.search(sentence):
                    return sentence[:max_chars]
    return ""


_TRACE_HEADER = re.compile(
    r"^("
    + "|".join(re.escape(h) for h in (ASSISTANT_HEADER, TOOL_HEADER, REVISED_PLAN_HEADER))
    + r"|### Round \d+:)$",
    re.M,
)


def trace_tool_results(trace: str) -> list[str]:
    """The tool results of a :func:`format_trace` text, in order (what the Executor read).

    >>> t = format_trace("Who?", [{"role": "assistant", "content": "<tool_call>...</tool_call>"},
    ...                           {"role": "tool", "content": "Doc 1(Title: X) X was born."},
    ...                           {"role": "assistant", "content": "<answer>X</answer>"}])
    >>> trace_tool_results(t)
    ['Doc 1(Title: X) X was born.']
    """
    parts = _TRACE_HEADER.split(trace)
    return [
        body.strip()
        for head, body in zip(parts[1::2], parts[2::2], strict=True)
        if head == TOOL_HEADER
    ]


def evidence_in_trace(trace: str, answers: Iterable[Any]) -> bool:
    """Whether a search result in a :func:`format_trace` text contains one of ``answers``
    (whole words, any case; :func:`answer_evidence`): the Executor's searches reached the
    passage that holds the answer, whatever it then answered.

    >>> t = format_trace("When?", [{"role": "tool", "content": "Pstad was founded in 1603."}])
    >>> evidence_in_trace(t, [1603]), evidence_in_trace(t, ["1604"])
    (True, False)
    """
    tools = [{"role": "tool", "content": text} for text in trace_tool_results(trace)]
    return bool(answer_evidence(tools, [str(a) for a in answers]))


def expected_extra(messages: Iterable[dict[str, Any]], golds: Iterable[Any]) -> dict[str, str]:
    """What a failed question's memory keeps with ``memory.remember_expected`` (``mia eval``
    and supervised ``ttrl`` write it, the Planner's memory block shows it): the first gold as
    ``expected`` and, as ``evidence``, :func:`answer_evidence`; ``{}`` without a gold.

    >>> expected_extra([{"role": "tool", "content": "Pstad was founded in 1603."}], [1603])
    {'expected': '1603', 'evidence': 'Pstad was founded in 1603.'}
    """
    answers = [str(g) for g in golds or []]
    if not answers:
        return {}
    return {"expected": answers[0], "evidence": answer_evidence(messages, answers)}
