"""What crosses between the proxy and the upstream model: the headers each way, and the
checks of its answers (a chat completion, or an SSE stream of chunks) with the assistant
message each one is recorded as.

An answer that is not a chat completion raises :class:`Malformed`; the proxy turns it into
its error envelope (or a stream's error event, :func:`sse_error`)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from typing import Any

import httpx

from mia.trace import content_text

# ----------------------------------------------------------------------------- answers

MAX_EVENT_BYTES = 8 * 1024 * 1024  # one streamed event (chat chunks are far smaller)
MALFORMED = "upstream_malformed"  # the error code of an answer that is not a chat completion
_SURROGATES = re.compile("[\ud800-\udfff]")


class Malformed(Exception):
    """The upstream answered 2xx with something that is not a chat completion (the reason)."""


def _scrub(text: str) -> str:
    """``text`` storable as UTF-8: lone surrogates (JSON allows ``"\\ud800"``) become U+FFFD."""
    return _SURROGATES.sub("\ufffd", text)


def _json(data: str | bytes) -> Any:
    try:
        return json.loads(data)
    except RecursionError:
        raise Malformed("JSON nested too deep") from None
    except ValueError:  # UnicodeDecodeError included
        raise Malformed("not JSON") from None


_KINDS = {dict: "a JSON object", list: "a list", str: "a string", int: "an integer"}


def _typed(value: Any, kind: type, what: str) -> Any:
    """``value`` when it is a ``kind`` or absent (None), else the reply is malformed."""
    if value is None or (isinstance(value, kind) and not isinstance(value, bool)):
        return value
    raise Malformed(f"{what} is not {_KINDS[kind]}")


def _call(call: Any) -> tuple[int, str, str, str]:
    """``(index, id, name, arguments)`` of a (streamed part of a) tool call."""
    call = _typed(call, dict, "a tool call") or {}
    fn = _typed(call.get("function"), dict, "a tool call's function") or {}
    args = fn.get("arguments")
    if isinstance(args, dict):  # some servers send the arguments as an object
        try:
            args = json.dumps(args)
        except RecursionError:
            raise Malformed("JSON nested too deep") from None
    return (
        _typed(call.get("index"), int, "a tool call's index") or 0,
        _typed(call.get("id"), str, "a tool call's id") or "",
        _typed(fn.get("name"), str, "a tool call's name") or "",
        _typed(args, str, "a tool call's arguments") or "",
    )


def _recorded(content: str, calls: list[tuple[str, str, str]]) -> dict[str, Any]:
    """The assistant message as the task keeps it (storable text only)."""
    msg: dict[str, Any] = {"role": "assistant", "content": _scrub(content)}
    if calls:
        msg["tool_calls"] = [
            {
                "id": _scrub(i),
                "type": "function",
                "function": {"name": _scrub(n), "arguments": _scrub(a)},
            }
            for i, n, a in calls
        ]
    return msg


def completion_answer(body: bytes) -> tuple[dict[str, Any], str | None]:
    """``(assistant message, completion id)`` of a chat completion; raises ``Malformed``."""
    try:
        data = _json(body)
        if not isinstance(data, dict):
            raise Malformed("not a JSON object")
        choices = _typed(data.get("choices"), list, "choices")
        if not choices:
            raise Malformed("no choices")
        choice = _typed(choices[0], dict, "a choice") or {}
        message = _typed(choice.get("message"), dict, "a message")
        if message is None:
            raise Malformed("no message")
        content = message.get("content")
        if not isinstance(content, str | list | None):
            raise Malformed("content is not text")
        text = content_text(content)
        calls = [_call(c)[1:] for c in _typed(message.get("tool_calls"), list, "tool_calls") or []]
        cid = data.get("id")
    except RecursionError:
        raise Malformed("JSON nested too deep") from None
    return _recorded(text or "", calls), _scrub(cid) if isinstance(cid, str) else None


class StreamAnswer:
    """Upstream SSE bytes in, whole checked events out (as received), and the assistant
    message rebuilt on the side. Events are relayed whole so that an error event the proxy
    adds never lands inside a half-sent one."""

    _FIELDS = ("data", "event", "id", "retry")

    def __init__(self) -> None:
        self.partial = b""  # a line not yet ended
        self.lines: list[bytes] = []  # the raw lines of the event being read
        self.data: list[str] = []
        self.ready: list[bytes] = []  # checked events not yet relayed
        self.completion_id: str | None = None
        self.content: list[str] = []
        self.tool_calls: dict[int, list[str]] = {}  # index -> [id, name, arguments]
        self.upstream_error = False  # the upstream sent an error event of its own
        self.failure: tuple[str, str] | None = None  # (code, message) of a broken stream

    def feed(self, chunk: bytes) -> None:
        """Read ``chunk``; raises ``Malformed`` (the events before it stay ready)."""
        self.partial += chunk
        *lines, self.partial = self.partial.split(b"\n")
        for line in lines:
            self._line(line)
        # Events are held until whole: one that never ends must not fill the memory.
        if len(self.partial) + sum(map(len, self.lines)) > MAX_EVENT_BYTES:
            raise Malformed(f"an event over {MAX_EVENT_BYTES} bytes")

    def close(self) -> None:
        """The stream ended: what is left counts as a last, ended event."""
        if self.partial:
            self._line(self.partial)
            self.partial = b""
        if self.lines:
            self._line(b"")

    def take(self) -> bytes:
        out, self.ready = b"".join(self.ready), []
        return out

    def _line(self, raw: bytes) -> None:
        self.lines.append(raw + b"\n")
        try:
            line = raw.rstrip(b"\r").decode("utf-8")
        except UnicodeDecodeError:
            raise Malformed("not UTF-8") from None
        if line:
            self._field(line)
            return
        if self.data:
            self._event("\n".join(self.data))
        self.ready.append(b"".join(self.lines))
        self.lines, self.data = [], []

    def _field(self, line: str) -> None:
        if line.startswith(":"):  # a comment (keep-alive)
            return
        name, _, value = line.partition(":")
        if name not in self._FIELDS:
            raise Malformed("not an SSE line")
        if name == "data":
            self.data.append(value[1:] if value.startswith(" ") else value)

    def _event(self, data: str) -> None:
        if data == "[DONE]":
            return
        event = _json(data)
        if not isinstance(event, dict):
            raise Malformed("an event is not a JSON object")
        if event.get("error"):
            self.upstream_error = True
            return
        if isinstance(event.get("id"), str):
            self.completion_id = _scrub(event["id"])
        choices = _typed(event.get("choices"), list, "choices") or [{}]
        delta = _typed((_typed(choices[0], dict, "a choice") or {}).get("delta"), dict, "a delta")
        delta = delta or {}
        self.content.append(_typed(delta.get("content"), str, "content") or "")
        for call in _typed(delta.get("tool_calls"), list, "tool_calls") or []:
            index, cid, name, args = _call(call)
            slot = self.tool_calls.setdefault(index, ["", "", ""])
            slot[0] = cid or slot[0]
            slot[1] += name
            slot[2] += args

    def message(self) -> dict[str, Any]:
        calls = [(c[0], c[1], c[2]) for _, c in sorted(self.tool_calls.items())]
        return _recorded("".join(self.content), calls)


def sse_error(code: str, message: str) -> bytes:
    """The event that ends a broken stream: OpenAI's SDKs raise ``APIError(message)`` on it,
    and ``[DONE]`` ends it for clients that read to the end."""
    event = json.dumps({"error": {"code": code, "message": message}})
    return f"data: {event}\n\ndata: [DONE]\n\n".encode()


# ----------------------------------------------------------------------------- headers


# Hop-by-hop headers (RFC 9110 7.6.1) describe one connection, never the next one.
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
# Request headers not copied upstream: besides the hop-by-hop ones, the client's credentials
# and cookies (the upstream's key is set by the proxy), and those describing a body or
# connection that httpx builds anew (re-serialised JSON, asked for uncompressed).
_NOT_UPSTREAM = _HOP_BY_HOP | {
    "host",
    "content-length",
    "content-encoding",
    "content-type",
    "accept-encoding",
    "expect",
    "authorization",
    "cookie",
}
# Answer headers relayed to the client: the body's type and what OpenAI clients read to pace
# retries and to log requests. The others belong to the upstream's origin or connection.
_RELAYED = frozenset(
    {"content-type", "retry-after", "retry-after-ms", "x-request-id", "x-should-retry"}
)
_RELAYED_PREFIXES = ("x-ratelimit-", "openai-")
# What httpx can undo when an upstream compresses despite ``Accept-Encoding: identity``.
_DECODABLE = frozenset({"identity", "gzip", "deflate"})


def _end_to_end(
    headers: Iterable[tuple[str, str]], keep: Callable[[str], bool]
) -> list[tuple[str, str]]:
    """The headers whose (lower-case) name ``keep`` accepts, less those the Connection header
    names: the sender declared them hop-by-hop too."""
    items = [(k.lower(), v) for k, v in headers]
    named = {t.strip().lower() for k, v in items if k == "connection" for t in v.split(",")}
    return [(k, v) for k, v in items if k not in named and keep(k)]


def _to_upstream(name: str) -> bool:
    return name not in _NOT_UPSTREAM and not name.startswith("x-mia")


def _relayable(name: str) -> bool:
    return name in _RELAYED or name.startswith(_RELAYED_PREFIXES)


def relayed_headers(resp: httpx.Response, ours: dict[str, str]) -> dict[str, str]:
    """The upstream answer's headers that the client may see, then the proxy's own."""
    relayed = dict(_end_to_end(resp.headers.multi_items(), _relayable))
    relayed.setdefault("content-type", "application/json")
    return relayed | {k.lower(): v for k, v in ours.items()}


def forwarded_headers(headers: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """The client's request headers that go on upstream."""
    return _end_to_end(headers, _to_upstream)


def undecodable(resp: httpx.Response) -> bool:
    """The answer is compressed in a way httpx cannot undo."""
    codings = {c.strip().lower() for c in resp.headers.get("content-encoding", "").split(",")}
    return bool(codings - _DECODABLE - {""})
