"""The Executor's text protocol: parsing an assistant turn, formatting tool results, error texts.

An assistant turn is free text with optional ``<think>`` blocks, at most one
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (anything after the first
``</tool_call>`` is cut, as the reference does) or a final ``<answer>...</answer>``.

Parsing never raises on model output: a call that cannot be used becomes an exact error text that
the loop sends back as the observation, so the model can correct itself (and the reward can see
what went wrong). JSON is repaired the way models break it: code fences, trailing text, single
quotes / unquoted keys / trailing commas (json5), missing closing braces, Python literals.

:func:`check_format` applies the reward-side format rules of docs/reference.md §7.1 to a transcript.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import json5

from mia.judge.rules import extract_answer

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
TOOL_RESPONSE_OPEN = "<tool_response>"
TOOL_RESPONSE_CLOSE = "</tool_response>"
ANSWER_OPEN = "<answer>"
ANSWER_CLOSE = "</answer>"
THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"

# Error kinds. The model's mistakes first; then failures of the tool itself (flagged on the
# trajectory as tool_errors because the model could not have avoided them).
MALFORMED_JSON = "malformed_json"
BAD_CALL = "bad_call"
UNKNOWN_TOOL = "unknown_tool"
BAD_ARGUMENTS = "bad_arguments"
LIMIT = "limit"
SERVICE = "service"
TIMEOUT = "timeout"
INTERNAL = "internal"
MODEL_ERRORS = (MALFORMED_JSON, BAD_CALL, UNKNOWN_TOOL, BAD_ARGUMENTS, LIMIT)
TOOL_FAILURES = (SERVICE, TIMEOUT, INTERNAL)

CALL_FORMAT_HINT = (
    'Call one tool as <tool_call>{"name": "<tool name>", "arguments": {<arguments>}}</tool_call>.'
)


def malformed_json_error(detail: str) -> str:
    return f"Error: the tool call is not valid JSON ({detail}). {CALL_FORMAT_HINT}"


def bad_call_error(detail: str) -> str:
    return f"Error: invalid tool call: {detail}. {CALL_FORMAT_HINT}"


def unknown_tool_error(name: str, available: Sequence[str]) -> str:
    names = ", ".join(available) if available else "none"
    return f'Error: unknown tool "{name}". Available tools: {names}.'


def bad_arguments_error(name: str, detail: str) -> str:
    return f"Error: invalid arguments for {name}: {detail}"


def timeout_error(name: str, seconds: float) -> str:
    return f"Error: tool {name} timed out after {seconds:g} s."


def internal_error(name: str, err: BaseException) -> str:
    return f"Error: tool {name} failed: {type(err).__name__}: {err}"


@dataclass
class ToolCall:
    """A parsed call. ``strict_json``: the body was valid JSON as written (the reward's rule);
    ``repaired``: it needed repairs (or an alias such as ``parameters``) to be understood."""

    name: str
    arguments: dict[str, Any]
    raw: str
    strict_json: bool = True
    repaired: bool = False


@dataclass
class ParsedTurn:
    """One assistant turn. ``has_tool_call`` is true as soon as ``<tool_call>`` appears; then
    either ``call`` is set or ``error``/``error_kind`` say why it is unusable."""

    text: str
    has_tool_call: bool = False
    call: ToolCall | None = None
    error: str | None = None
    error_kind: str | None = None
    raw_call: str | None = None
    think: list[str] = field(default_factory=list)

    @property
    def answer(self) -> str | None:
        """The final answer when the turn has no tool call (the reward-side extraction)."""
        return None if self.has_tool_call else extract_answer(self.text)


def cut_after_tool_call(text: str) -> str:
    """``text`` up to and including the first ``</tool_call>`` (the rest is never used)."""
    end = text.find(TOOL_CALL_CLOSE)
    return text if end == -1 else text[: end + len(TOOL_CALL_CLOSE)]


def tool_call_body(text: str) -> str | None:
    """The text between the first ``<tool_call>`` and the following ``</tool_call>`` (or the end
    of the text when the closer is missing), else None."""
    start = text.find(TOOL_CALL_OPEN)
    if start == -1:
        return None
    body = text[start + len(TOOL_CALL_OPEN) :]
    end = body.find(TOOL_CALL_CLOSE)
    return body if end == -1 else body[:end]


_FENCE = re.compile(r"^```[a-zA-Z0-9_-]*\s*\n?(.*?)\n?```$", re.S)


def _scan_object(text: str, start: int) -> tuple[int | None, list[str], str | None]:
    """From the ``{`` at ``start``: the index of its matching ``}`` (None if unclosed), the
    closers still owed at the end of the text, and the open string quote (if any)."""
    stack: list[str] = []
    quote: str | None = None
    escaped = False
    for i in range(start, len(text)):
        ch = text[i]
        if quote:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == quote:
                quote = None
            continue
        if ch in "\"'":
            quote = ch
        elif ch in "{[":
            stack.append("}" if ch == "{" else "]")
        elif ch in "}]":
            if stack and stack[-1] == ch:
                stack.pop()
                if not stack:
                    return i, [], None
            else:
                return None, list(reversed(stack)), quote  # mismatched: let the parsers judge
    return None, list(reversed(stack)), quote


def _loads_lenient(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        pass
    try:
        return json5.loads(text)
    except ValueError:
        pass
    try:  # Python literals: True/False/None, single quotes
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError):
        pass
    raise ValueError("unparseable")


def repair_json(text: str) -> tuple[Any, bool]:
    """Parse ``text`` leniently -> ``(value, strict)``; ``strict`` is true when plain
    ``json.loads`` accepted it unchanged. Raises ValueError with a short reason otherwise."""
    raw = text.strip()
    if not raw:
        raise ValueError("empty tool call")
    try:
        return json.loads(raw), True
    except ValueError as err:
        first_error = (
            f"{err.msg} at line {err.lineno} column {err.colno}"
            if isinstance(err, json.JSONDecodeError)
            else str(err)
        )
    candidates = []
    fenced = _FENCE.match(raw)
    if fenced:
        raw = fenced.group(1).strip()
        candidates.append(raw)
    start = raw.find("{")
    if start != -1:
        end, owed, open_quote = _scan_object(raw, start)
        if end is not None:
            candidates.append(raw[start : end + 1])  # trailing text dropped
        else:
            candidates.append(raw[start:].rstrip().rstrip(",") + (open_quote or "") + "".join(owed))
    candidates.append(raw)
    for cand in candidates:
        try:
            return _loads_lenient(cand), False
        except ValueError:
            continue
    raise ValueError(first_error)


def parse_tool_call(body: str) -> tuple[ToolCall | None, str | None, str | None]:
    """``body`` (between the tags) -> ``(call, None, None)`` or ``(None, error_kind, error)``."""
    try:
        value, strict = repair_json(body)
    except ValueError as err:
        return None, MALFORMED_JSON, malformed_json_error(str(err))
    repaired = not strict
    if not isinstance(value, dict):
        return None, BAD_CALL, bad_call_error(f"expected a JSON object, got {_kind(value)}")
    if isinstance(value.get("function"), dict) and "name" not in value:
        value, repaired = value["function"], True  # OpenAI's {"function": {...}} nesting
    name = value.get("name")
    if not isinstance(name, str) or not name.strip():
        return None, BAD_CALL, bad_call_error('the JSON object needs a string "name"')
    if "arguments" in value:
        args = value["arguments"]
    elif "parameters" in value:
        args, repaired = value["parameters"], True
    else:
        args, repaired = {}, True
    if isinstance(args, str):  # OpenAI style: arguments as a JSON string
        try:
            args, _ = repair_json(args) if args.strip() else ({}, True)
        except ValueError as err:
            return None, MALFORMED_JSON, malformed_json_error(f"arguments: {err}")
        repaired = True
    if args is None:
        args, repaired = {}, True
    if not isinstance(args, dict):
        return None, BAD_CALL, bad_call_error(f'"arguments" must be an object, got {_kind(args)}')
    return ToolCall(name.strip(), args, body, strict_json=strict, repaired=repaired), None, None


def _kind(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}.get(
        type(value), "null" if value is None else "a number"
    )


_THINK = re.compile(r"<think>(.*?)</think>", re.S)


def parse_turn(text: str) -> ParsedTurn:
    """Parse one assistant turn (already cut or not: the cut is applied here too)."""
    text = cut_after_tool_call(text)
    turn = ParsedTurn(text=text, think=[t.strip() for t in _THINK.findall(text)])
    body = tool_call_body(text)
    if body is None:
        return turn
    turn.has_tool_call = True
    turn.raw_call = body
    turn.call, turn.error_kind, turn.error = parse_tool_call(body)
    return turn


def format_tool_response(text: str) -> str:
    """The observation text the model reads (Qwen's tool-response block)."""
    return f"{TOOL_RESPONSE_OPEN}\n{text}\n{TOOL_RESPONSE_CLOSE}"


def truncate_chars(text: str, max_chars: int | None, side: str = "middle") -> str:
    """At most ``max_chars`` characters of ``text`` plus a marker. ``middle`` keeps the head and
    the tail (veRL's tool-response truncation); ``end`` keeps the head."""
    if max_chars is None or max_chars < 0 or len(text) <= max_chars:
        return text
    if side == "end":
        return text[:max_chars] + "...(truncated)"
    if side != "middle":
        raise ValueError(f"truncation side must be 'middle' or 'end', got {side!r}")
    head = max_chars // 2
    tail = max_chars - head
    return text[:head] + "...(truncated)..." + (text[-tail:] if tail else "")


def tags_balanced(text: str, tag: str) -> bool:
    """``<tag>`` and ``</tag>`` occur equally often and never close before they open."""
    depth = 0
    for m in re.finditer(rf"</?{re.escape(tag)}>", text):
        depth += -1 if m.group(0).startswith("</") else 1
        if depth < 0:
            return False
    return depth == 0


SEARCH_TOOL = "search"
IMAGE_TOOL = "web_image_to_image_search"


@dataclass
class FormatCheck:
    ok: bool
    issues: list[str]


def check_format(
    assistant_texts: Sequence[str], tool_names: Sequence[str] = (SEARCH_TOOL, IMAGE_TOOL)
) -> FormatCheck:
    """The Executor reward's format rules (docs/reference.md §7.1) over the assistant turns of a
    trajectory, last turn = the final answer. Strict where the loop is lenient: repaired JSON and
    aliases count as invalid, search args must be exactly ``{"query_list": [non-empty str, ...]}``
    and image args exactly ``{"img_idx": "0"}``, at most one image search."""
    issues: list[str] = []
    image_calls = 0
    for i, raw in enumerate(assistant_texts):
        text = cut_after_tool_call(raw)
        if not tags_balanced(text, "think"):
            issues.append(f"turn {i + 1}: unbalanced <think> tags")
        body = tool_call_body(text)
        if body is None:
            continue
        try:
            value = json.loads(body.strip())
        except ValueError:
            issues.append(f"turn {i + 1}: tool call is not valid JSON")
            continue
        name = value.get("name") if isinstance(value, dict) else None
        args = value.get("arguments") if isinstance(value, dict) else None
        if name not in tool_names:
            issues.append(f"turn {i + 1}: unknown tool {name!r}")
        elif name == SEARCH_TOOL:
            ok = (
                isinstance(args, dict)
                and set(args) == {"query_list"}
                and isinstance(args["query_list"], list)
                and bool(args["query_list"])
                and all(isinstance(q, str) and q.strip() for q in args["query_list"])
            )
            if not ok:
                issues.append(f"turn {i + 1}: search arguments must be {{query_list: [str, ...]}}")
        elif name == IMAGE_TOOL:
            image_calls += 1
            if args != {"img_idx": "0"}:
                issues.append(f'turn {i + 1}: image search arguments must be {{"img_idx": "0"}}')
    if image_calls > 1:
        issues.append(f"{image_calls} image-search calls (at most one)")
    final = assistant_texts[-1] if assistant_texts else ""
    tail = final.split(THINK_CLOSE)[-1]
    if not tags_balanced(tail, "answer"):
        issues.append("unbalanced <answer> tags after the last </think>")
    found = re.findall(r"<answer>(.*?)</answer>", tail, re.S)
    if not found:
        issues.append("no <answer> block")
    elif not found[-1].strip():
        issues.append("empty answer")
    return FormatCheck(ok=not issues, issues=issues)
