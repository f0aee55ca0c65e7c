"""MIA as a drop-in memory layer: an OpenAI-compatible ``/v1/chat/completions`` in front of any
OpenAI-compatible model (docs/proxy.md).

An agent changes only its base URL. For a **new task** (a conversation whose messages hold no
assistant turn yet) the proxy retrieves memories, asks the Planner for a plan (``/plan``'s code)
and appends it to the task's first user message, then forwards the request upstream (streaming
included: each SSE event is checked and relayed as it completes). Later requests of the same
conversation (same messages up to the first user message) get the same plan again, since the
client's own history never held it. Every answer is kept with the task; when the client
reports the outcome (``POST /v1/feedback`` with the task id from the ``X-MIA-Task-Id`` header,
or the completion's ``id``), the conversation is written to memory like any trajectory
(``/memories``), crediting the memories the plan was built from. Open tasks live in a small
SQLite file of their own.

An upstream answer that is not a chat completion (malformed JSON or SSE, a stall, a broken
connection) never reaches the client as such: it gets the service's error envelope, or a
stream's error event, and the task is kept as ``failed``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import re
import sqlite3
import threading
import time
import uuid
import weakref
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from http.cookiejar import CookieJar, DefaultCookiePolicy
from pathlib import Path
from typing import Any

import httpx
from fastapi import Body, FastAPI, Request
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, ValidationError

from memory_serve.config import ProxyConfig
from memory_serve.service import MemoryService
from mia.http import ApiError, error_response
from mia.services import memory as S
from mia.trace import content_text

log = logging.getLogger("memory_serve.proxy")

TASK_HEADER = "X-MIA-Task-Id"
PLAN_HEADER = "X-MIA-Plan"  # planned | memories | none | failed | continued | untracked
PLAN_BLOCK = (
    "Here is a plan from the memory of similar past tasks (a guide; adapt it where it does "
    "not fit):\n{plan}"
)
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
MAX_EVENT_BYTES = 8 * 1024 * 1024  # one streamed event (chat chunks are far smaller)
MALFORMED = "upstream_malformed"  # the error code of an answer that is not a chat completion
_SURROGATES = re.compile("[\ud800-\udfff]")

_TASKS_SCHEMA = """
CREATE TABLE IF NOT EXISTS tasks (
    task_id TEXT PRIMARY KEY,
    conv_key TEXT NOT NULL,
    question TEXT NOT NULL,
    plan TEXT NOT NULL DEFAULT '',
    injection TEXT NOT NULL DEFAULT '',
    memory_ids TEXT NOT NULL DEFAULT '[]',
    messages TEXT NOT NULL DEFAULT '[]',
    model TEXT NOT NULL DEFAULT '',
    turns INTEGER NOT NULL DEFAULT 0,
    status TEXT NOT NULL DEFAULT 'open',
    result TEXT,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS tasks_conv ON tasks (conv_key, created_at);
CREATE INDEX IF NOT EXISTS tasks_updated ON tasks (updated_at);
CREATE TABLE IF NOT EXISTS completions (
    completion_id TEXT PRIMARY KEY,
    task_id TEXT NOT NULL
);
"""


@dataclass
class Task:
    task_id: str
    conv_key: str
    question: str
    plan: str = ""
    injection: str = ""
    memory_ids: list[int] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    model: str = ""
    turns: int = 0
    status: str = "open"  # open | failed (the last exchange did) | recording | recorded
    result: dict[str, Any] | None = None
    created_at: float = 0.0


class TaskStore:
    """Open tasks (and which completion ids belong to them) in their own SQLite file."""

    def __init__(self, path: str | Path, ttl_s: float) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.ttl_s = ttl_s
        self._lock = threading.Lock()
        self._conn = sqlite3.connect(str(self.path), check_same_thread=False, timeout=30.0)
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.executescript(_TASKS_SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    _COLS = (
        "task_id, conv_key, question, plan, injection, memory_ids, messages, model, turns, "
        "status, result, created_at"
    )

    @staticmethod
    def _task(row: tuple[Any, ...]) -> Task:
        return Task(
            task_id=row[0],
            conv_key=row[1],
            question=row[2],
            plan=row[3],
            injection=row[4],
            memory_ids=json.loads(row[5]),
            messages=json.loads(row[6]),
            model=row[7],
            turns=int(row[8]),
            status=row[9],
            result=json.loads(row[10]) if row[10] else None,
            created_at=float(row[11]),
        )

    def create(self, task: Task) -> None:
        now = time.time()
        with self._lock, self._conn:
            self._conn.execute(
                "DELETE FROM completions WHERE task_id IN "
                "(SELECT task_id FROM tasks WHERE updated_at < ?)",
                (now - self.ttl_s,),
            )
            self._conn.execute("DELETE FROM tasks WHERE updated_at < ?", (now - self.ttl_s,))
            self._conn.execute(
                f"INSERT INTO tasks ({self._COLS}, updated_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    task.task_id,
                    task.conv_key,
                    task.question,
                    task.plan,
                    task.injection,
                    json.dumps(task.memory_ids),
                    "[]",
                    task.model,
                    0,
                    "open",
                    None,
                    now,
                    now,
                ),
            )

    def get(self, task_id: str) -> Task | None:
        with self._lock:
            row = self._conn.execute(
                f"SELECT {self._COLS} FROM tasks WHERE task_id = ?", (task_id,)
            ).fetchone()
        return self._task(row) if row else None

    def by_completion(self, completion_id: str) -> Task | None:
        with self._lock:
            row = self._conn.execute(
                "SELECT task_id FROM completions WHERE completion_id = ?", (completion_id,)
            ).fetchone()
        return self.get(row[0]) if row else None

    def latest(self, conv_key: str) -> Task | None:
        """The newest task of a conversation (a repeated first message starts a new one)."""
        with self._lock:
            row = self._conn.execute(
                f"SELECT {self._COLS} FROM tasks WHERE conv_key = ? "
                "ORDER BY created_at DESC, rowid DESC LIMIT 1",
                (conv_key,),
            ).fetchone()
        return self._task(row) if row else None

    def add_turn(
        self, task_id: str, messages: list[dict[str, Any]], completion_id: str | None
    ) -> None:
        """The conversation so far, ending with the model's latest answer (a failed task whose
        turn is retried successfully is open again)."""
        with self._lock, self._conn:
            self._conn.execute(
                "UPDATE tasks SET messages = ?, turns = turns + 1, status = 'open', "
                "updated_at = ? WHERE task_id = ? AND status IN ('open', 'failed')",
                (json.dumps(messages, ensure_ascii=False), time.time(), task_id),
            )
            if completion_id:
                self._conn.execute(
                    "INSERT OR REPLACE INTO completions (completion_id, task_id) VALUES (?, ?)",
                    (completion_id, task_id),
                )

    def fail(self, task_id: str) -> None:
        """The latest exchange with the upstream failed; the answers before it stay."""
        with self._lock, self._conn:
            self._conn.execute(
                "UPDATE tasks SET status = 'failed', updated_at = ? "
                "WHERE task_id = ? AND status IN ('open', 'failed')",
                (time.time(), task_id),
            )

    def claim(self, task_id: str) -> bool:
        """open/failed -> recording; False when another feedback got there first."""
        with self._lock, self._conn:
            cur = self._conn.execute(
                "UPDATE tasks SET status = 'recording' "
                "WHERE task_id = ? AND status IN ('open', 'failed')",
                (task_id,),
            )
            return cur.rowcount == 1

    def finish(self, task_id: str, result: dict[str, Any] | None, before: str = "open") -> None:
        """recording -> recorded (with the write's result), or back to ``before`` (None: the
        write failed)."""
        with self._lock, self._conn:
            if result is None:
                self._conn.execute(
                    "UPDATE tasks SET status = ? WHERE task_id = ?", (before, task_id)
                )
            else:
                self._conn.execute(
                    "UPDATE tasks SET status = 'recorded', result = ?, updated_at = ? "
                    "WHERE task_id = ?",
                    (json.dumps(result), time.time(), task_id),
                )


# ----------------------------------------------------------------------------- messages


def conversation_key(messages: list[dict[str, Any]], first_user: int) -> str:
    """A conversation is named by its messages up to and including the first user message."""
    prefix = [
        {"role": m.get("role"), "content": m.get("content")} for m in messages[: first_user + 1]
    ]
    return hashlib.sha256(json.dumps(prefix, sort_keys=True).encode()).hexdigest()


def inject(messages: list[dict[str, Any]], at: int, block: str) -> list[dict[str, Any]]:
    """``messages`` with ``block`` appended to message ``at`` (a copy)."""
    out = [dict(m) for m in messages]
    content = out[at].get("content")
    if isinstance(content, list):
        out[at]["content"] = [*content, {"type": "text", "text": "\n\n" + block}]
    else:
        out[at]["content"] = f"{content or ''}\n\n{block}"
    return out


def _tool_call_text(call: dict[str, Any]) -> str:
    fn = call.get("function") or {}
    args: Any = fn.get("arguments", "")
    with contextlib.suppress(ValueError):
        args = json.loads(args) if isinstance(args, str) and args else args
    return f"<tool_call>{json.dumps({'name': fn.get('name', ''), 'arguments': args})}</tool_call>"


def trajectory_messages(messages: list[dict[str, Any]], first_user: int) -> list[dict[str, Any]]:
    """The conversation after the task's first user message, in the Executor's text layout
    that the trace formatter and the rule summariser read: tool calls as ``<tool_call>`` JSON,
    the final answer in ``<answer>`` (when the model did not tag it itself)."""
    out: list[dict[str, Any]] = []
    rest = messages[first_user + 1 :]
    for i, m in enumerate(rest):
        role = m.get("role")
        text = content_text(m.get("content"))
        if role == "assistant":
            calls = [c for c in m.get("tool_calls") or [] if isinstance(c, dict)]
            if calls:
                text = "\n".join([text, *(_tool_call_text(c) for c in calls)]).strip()
            elif i == len(rest) - 1 and "<answer>" not in text:
                text = f"<answer>{text.strip()}</answer>"
            out.append({"role": "assistant", "content": text})
        elif role in ("tool", "user", "function"):
            out.append({"role": "user" if role == "user" else "tool", "content": text})
    return out


class _Malformed(Exception):
    """The upstream answered 2xx with something that is not a chat completion (the reason)."""


def _scrub(text: str) -> str:
    """``text`` storable as UTF-8: lone surrogates (JSON allows ``"\\ud800"``) become U+FFFD."""
    return _SURROGATES.sub("\ufffd", text)


def _json(data: str | bytes) -> Any:
    try:
        return json.loads(data)
    except RecursionError:
        raise _Malformed("JSON nested too deep") from None
    except ValueError:  # UnicodeDecodeError included
        raise _Malformed("not JSON") from None


_KINDS = {dict: "a JSON object", list: "a list", str: "a string", int: "an integer"}


def _typed(value: Any, kind: type, what: str) -> Any:
    """``value`` when it is a ``kind`` or absent (None), else the reply is malformed."""
    if value is None or (isinstance(value, kind) and not isinstance(value, bool)):
        return value
    raise _Malformed(f"{what} is not {_KINDS[kind]}")


def _call(call: Any) -> tuple[int, str, str, str]:
    """``(index, id, name, arguments)`` of a (streamed part of a) tool call."""
    call = _typed(call, dict, "a tool call") or {}
    fn = _typed(call.get("function"), dict, "a tool call's function") or {}
    args = fn.get("arguments")
    if isinstance(args, dict):  # some servers send the arguments as an object
        try:
            args = json.dumps(args)
        except RecursionError:
            raise _Malformed("JSON nested too deep") from None
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
    """``(assistant message, completion id)`` of a chat completion; raises ``_Malformed``."""
    try:
        data = _json(body)
        if not isinstance(data, dict):
            raise _Malformed("not a JSON object")
        choices = _typed(data.get("choices"), list, "choices")
        if not choices:
            raise _Malformed("no choices")
        choice = _typed(choices[0], dict, "a choice") or {}
        message = _typed(choice.get("message"), dict, "a message")
        if message is None:
            raise _Malformed("no message")
        content = message.get("content")
        if not isinstance(content, str | list | None):
            raise _Malformed("content is not text")
        text = content_text(content)
        calls = [_call(c)[1:] for c in _typed(message.get("tool_calls"), list, "tool_calls") or []]
        cid = data.get("id")
    except RecursionError:
        raise _Malformed("JSON nested too deep") from None
    return _recorded(text or "", calls), _scrub(cid) if isinstance(cid, str) else None


class _StreamAnswer:
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
        """Read ``chunk``; raises ``_Malformed`` (the events before it stay ready)."""
        self.partial += chunk
        *lines, self.partial = self.partial.split(b"\n")
        for line in lines:
            self._line(line)
        # Events are held until whole: one that never ends must not fill the memory.
        if len(self.partial) + sum(map(len, self.lines)) > MAX_EVENT_BYTES:
            raise _Malformed(f"an event over {MAX_EVENT_BYTES} bytes")

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
            raise _Malformed("not UTF-8") from None
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
            raise _Malformed("not an SSE line")
        if name == "data":
            self.data.append(value[1:] if value.startswith(" ") else value)

    def _event(self, data: str) -> None:
        if data == "[DONE]":
            return
        event = _json(data)
        if not isinstance(event, dict):
            raise _Malformed("an event is not a JSON object")
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


# ----------------------------------------------------------------------------- the proxy


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


def _relayed_headers(resp: httpx.Response, ours: dict[str, str]) -> dict[str, str]:
    """The upstream answer's headers that the client may see, then the proxy's own."""
    relayed = dict(_end_to_end(resp.headers.multi_items(), _relayable))
    relayed.setdefault("content-type", "application/json")
    return relayed | {k.lower(): v for k, v in ours.items()}


@dataclass
class _Turn:
    """One request on its way upstream, and what its answer is recorded with."""

    request: Request
    body: dict[str, Any]  # as forwarded (plan included)
    headers: dict[str, str]  # the proxy's own answer headers
    task: Task | None
    messages: list[dict[str, Any]]  # as the client sent them


class Proxy:
    def __init__(self, cfg: ProxyConfig, service: MemoryService, tasks: TaskStore) -> None:
        assert cfg.upstream
        self.cfg = cfg
        self.upstream = cfg.upstream.rstrip("/")
        self.service = service
        self.tasks = tasks
        # The upstream key: read once, kept out of reprs and logs.
        self._key = os.environ.get(cfg.api_key_env) if cfg.api_key_env else None
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient]
        self._clients = weakref.WeakKeyDictionary()

    def __repr__(self) -> str:
        return f"Proxy(upstream={self.upstream!r})"

    def _client(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None or client.is_closed:
            client = httpx.AsyncClient(
                timeout=httpx.Timeout(self.cfg.timeout_s, connect=min(15.0, self.cfg.timeout_s)),
                trust_env=False,
                # One client serves every caller: a cookie one answer set must not ride along
                # on everyone's later requests.
                cookies=CookieJar(policy=DefaultCookiePolicy(allowed_domains=[])),
            )
            self._clients[loop] = client
        return client

    def _headers(self, request: Request) -> list[tuple[str, str]]:
        headers = _end_to_end(request.headers.items(), _to_upstream)
        headers += [("content-type", "application/json"), ("accept-encoding", "identity")]
        if self._key:
            headers.append(("authorization", f"Bearer {self._key}"))
        elif not request.app.state.token and request.headers.get("authorization"):
            # No key of our own and no token of ours in that header: the client's key goes on.
            headers.append(("authorization", request.headers["authorization"]))
        return headers

    async def _send(self, request: Request, path: str, body: Any, stream: bool) -> httpx.Response:
        client = self._client()
        req = client.build_request(
            request.method, f"{self.upstream}{path}", json=body, headers=self._headers(request)
        )
        try:
            resp = await client.send(req, stream=stream)
        except httpx.TimeoutException:
            raise ApiError(
                504, f"the upstream model gave no answer within {self.cfg.timeout_s:g}s"
            ) from None
        except httpx.DecodingError:
            raise ApiError(502, "the upstream answer could not be decoded", MALFORMED) from None
        except httpx.HTTPError as err:
            raise ApiError(
                502, f"the upstream model is unreachable ({type(err).__name__})", "upstream_error"
            ) from None
        codings = {c.strip().lower() for c in resp.headers.get("content-encoding", "").split(",")}
        if codings - _DECODABLE - {""}:
            await resp.aclose()
            raise ApiError(502, "the upstream answer has an unknown Content-Encoding", MALFORMED)
        return resp

    # ---- planning

    async def _prepare(self, question: str) -> tuple[str, str, list[int], str]:
        """``(plan, injected block, memory ids, how)`` for a new task."""
        mode = self.cfg.inject
        if mode == "none":
            return "", "", [], "none"
        q = S.MemoryQuery(question=question)
        try:
            if mode == "plan" and self.service.planner is not None:
                out = await self.service.planning.plan(q)
                return out.plan, PLAN_BLOCK.format(plan=out.plan), out.memory_ids, "planned"
            found = await self.service.memory(q)
            ids = found.positive_ids + found.negative_ids
            return "", found.context, ids, "memories"
        except ApiError as err:
            if self.cfg.on_plan_error == "error":
                raise
            log.warning("proxy: no plan for a new task (%s); forwarding without one", err.message)
            return "", "", [], "failed"

    # ---- routes

    async def chat(self, request: Request, body: dict[str, Any]) -> Response:
        try:
            parsed = S.ProxyChatRequest.model_validate(body)
        except ValidationError as err:
            where = ".".join(str(x) for x in err.errors()[0].get("loc", ()))
            raise ApiError(422, f"{where or 'body'}: {err.errors()[0].get('msg')}") from None
        raw_messages = body["messages"]
        first_user = next((i for i, m in enumerate(parsed.messages) if m.role == "user"), None)
        task, how = None, "untracked"
        if first_user is not None:
            task, how = await self._task_for(parsed, raw_messages, first_user)
        forwarded = dict(body)
        if task is not None and task.injection and first_user is not None:
            forwarded["messages"] = inject(raw_messages, first_user, task.injection)
        turn = _Turn(request, forwarded, {PLAN_HEADER: how}, task, raw_messages)
        if task is not None:
            turn.headers[TASK_HEADER] = task.task_id
        try:
            return await (self._stream(turn) if parsed.stream else self._complete(turn))
        except ApiError as err:
            # The task is kept as failed, and the client learns which one it was.
            await self._fail(task, err.code, err.message)
            answer = error_response(err.status, err.message, err.code)
            answer.headers.update(turn.headers)
            return answer

    async def _task_for(
        self, parsed: S.ProxyChatRequest, raw_messages: list[dict[str, Any]], first_user: int
    ) -> tuple[Task | None, str]:
        """The request's task and how it was planned: a new one (planned now) while no
        assistant turn exists yet, else the conversation's latest."""
        key = conversation_key(raw_messages, first_user)
        if any(m.role == "assistant" for m in parsed.messages):
            task = await asyncio.to_thread(self.tasks.latest, key)
            return task, "continued" if task is not None else "untracked"
        question = content_text(parsed.messages[first_user].content).strip()
        if not question:
            return None, "untracked"
        plan, block, ids, how = await self._prepare(question)
        task = Task(
            task_id=uuid.uuid4().hex,
            conv_key=key,
            question=question,
            plan=plan,
            injection=block,
            memory_ids=ids,
            model=parsed.model or "",
        )
        await asyncio.to_thread(self.tasks.create, task)
        return task, how

    async def _complete(self, turn: _Turn) -> Response:
        resp = await self._send(turn.request, "/chat/completions", turn.body, stream=False)
        if resp.is_success:
            try:
                answer, completion_id = completion_answer(resp.content)
            except _Malformed as err:
                raise ApiError(
                    502, f"the upstream answer is not a chat completion ({err})", MALFORMED
                ) from None
            await self._add_turn(turn, answer, completion_id)
        else:
            await self._fail(turn.task, "upstream_status", f"HTTP {resp.status_code}")
        return Response(resp.content, resp.status_code, _relayed_headers(resp, turn.headers))

    async def _fail(self, task: Task | None, code: str, message: str) -> None:
        if task is None:
            return
        log.warning(
            "proxy: task %s: the upstream exchange failed: %s (%s)", task.task_id, code, message
        )
        await asyncio.to_thread(self.tasks.fail, task.task_id)

    async def _add_turn(
        self, turn: _Turn, answer: dict[str, Any], completion_id: str | None
    ) -> None:
        if turn.task is None:
            return
        convo = [*turn.messages, answer]
        await asyncio.to_thread(self.tasks.add_turn, turn.task.task_id, convo, completion_id)

    async def _stream(self, turn: _Turn) -> Response:
        resp = await self._send(turn.request, "/chat/completions", turn.body, stream=True)
        if not resp.is_success:
            content = await resp.aread()
            await resp.aclose()
            await self._fail(turn.task, "upstream_status", f"HTTP {resp.status_code}")
            return Response(content, resp.status_code, _relayed_headers(resp, turn.headers))
        headers = _relayed_headers(resp, {**turn.headers, "Cache-Control": "no-cache"})
        headers["content-type"] = "text/event-stream; charset=utf-8"  # only checked events go out
        return StreamingResponse(self._relay(turn, resp), resp.status_code, headers)

    async def _relay(self, turn: _Turn, resp: httpx.Response) -> AsyncIterator[bytes]:
        # One step behind the upstream: the last events (the stream's end) go out only after
        # the turn is recorded, so feedback sent right after [DONE] finds the task.
        answer = _StreamAnswer()
        pending = b""
        async for events in self._events(resp, answer):
            if pending:
                yield pending
            pending = events
        tail = answer.take()  # the events checked before the stream ended or broke
        if answer.failure is not None:
            await self._fail(turn.task, *answer.failure)
            tail += sse_error(*answer.failure)
        elif answer.upstream_error:  # relayed as the upstream sent it
            await self._fail(turn.task, "upstream_error", "an error event in the stream")
        else:
            await self._add_turn(turn, answer.message(), answer.completion_id)
        yield pending + tail

    async def _events(self, resp: httpx.Response, answer: _StreamAnswer) -> AsyncIterator[bytes]:
        """The upstream's events, checked, as they complete; a broken stream ends them early
        and sets ``answer.failure``."""
        try:
            async for chunk in resp.aiter_bytes():
                answer.feed(chunk)
                if events := answer.take():
                    yield events
            answer.close()
        except _Malformed as err:
            answer.failure = (MALFORMED, f"the upstream model sent a malformed stream ({err})")
        except httpx.DecodingError:
            answer.failure = (MALFORMED, "the upstream stream could not be decoded")
        except httpx.TimeoutException:
            answer.failure = (
                "upstream_timeout",
                f"the upstream model sent nothing for {self.cfg.timeout_s:g}s",
            )
        except httpx.HTTPError as err:
            answer.failure = ("upstream_error", f"the upstream stream broke ({type(err).__name__})")
        finally:
            await resp.aclose()

    async def models(self, request: Request) -> Response:
        resp = await self._send(request, "/models", None, stream=False)
        return Response(resp.content, resp.status_code, _relayed_headers(resp, {}))

    async def feedback(self, req: S.FeedbackRequest) -> S.FeedbackResponse:
        if req.correct is None and req.judgement is None:
            raise ApiError(422, "give the outcome: correct (true/false) or judgement")
        if req.task_id:
            task = await asyncio.to_thread(self.tasks.get, req.task_id)
        elif req.completion_id:
            task = await asyncio.to_thread(self.tasks.by_completion, req.completion_id)
        else:
            raise ApiError(422, "give task_id (the X-MIA-Task-Id header) or completion_id")
        if task is None:
            raise ApiError(404, "no such task (unknown, or expired)", "no_such_task")
        if task.turns == 0:
            raise ApiError(409, "the task has no answer yet", "no_answer")
        if not await asyncio.to_thread(self.tasks.claim, task.task_id):
            raise ApiError(409, "this task's outcome was already recorded", "already_recorded")
        judgement = req.judgement if req.judgement is not None else bool(req.correct)
        first_user = next(i for i, m in enumerate(task.messages) if m.get("role") == "user")
        item = S.TrajectoryItem.model_validate(
            {
                "question": task.question,
                "judgement": judgement,
                "data_id": task.task_id,
                "plan": task.plan,
                "messages": trajectory_messages(task.messages, first_user),
                "used_memory_ids": task.memory_ids,
                "source": "proxy",
                "evaluator_1_feedback": req.feedback,
                "extra": {"model": task.model} if task.model else {},
            }
        )
        try:
            saved = await self.service.save_memories([item])
        except BaseException:
            await asyncio.to_thread(self.tasks.finish, task.task_id, None, task.status)
            raise
        outcome = saved.results[0]
        await asyncio.to_thread(self.tasks.finish, task.task_id, outcome.model_dump())
        return S.FeedbackResponse(status="recorded", task_id=task.task_id, result=outcome)

    async def task(self, task_id: str) -> S.TaskInfo:
        task = await asyncio.to_thread(self.tasks.get, task_id)
        if task is None:
            raise ApiError(404, "no such task (unknown, or expired)", "no_such_task")
        return S.TaskInfo(
            task_id=task.task_id,
            question=task.question,
            plan=task.plan,
            memory_ids=task.memory_ids,
            turns=task.turns,
            status=task.status,
            result=S.WriteOutcome(**task.result) if task.result else None,
            created_at=task.created_at,
        )


def tasks_path(cfg: ProxyConfig, db_path: Path) -> Path:
    return Path(cfg.tasks_db) if cfg.tasks_db else db_path.with_name(f"{db_path.stem}-proxy.sqlite")


def _inline_schema(model: type[BaseModel]) -> dict[str, Any]:
    """``model``'s JSON schema with its ``$defs`` inlined, for a route that reads the raw body
    (it forwards it as sent) but should still document, and be fuzzed with, the real shape."""
    schema = model.model_json_schema()
    defs = schema.pop("$defs", {})

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                return walk(defs[ref.removeprefix("#/$defs/")])
            return {k: walk(v) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node

    return walk(schema)


def add_proxy(app: FastAPI, service: MemoryService) -> Proxy:
    cfg = service.cfg.proxy
    tasks = TaskStore(tasks_path(cfg, service.store.db_path), cfg.task_ttl_s)
    proxy = Proxy(cfg, service, tasks)
    app.state.proxy = proxy

    chat_body = {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": _inline_schema(S.ProxyChatRequest)}},
        }
    }

    @app.post("/v1/chat/completions", tags=["proxy"], openapi_extra=chat_body)
    async def chat_completions(request: Request, body: dict[str, Any] = Body(...)) -> Response:
        """OpenAI-compatible chat: a new task is planned from memory, then forwarded upstream."""
        return await proxy.chat(request, body)

    @app.get("/v1/models", tags=["proxy"])
    async def models(request: Request) -> Response:
        """The upstream's model list."""
        return await proxy.models(request)

    @app.post("/v1/feedback", response_model=S.FeedbackResponse, tags=["proxy"])
    async def feedback(body: S.FeedbackRequest) -> Any:
        """The outcome of a task: its conversation is written to memory (once)."""
        return await proxy.feedback(body)

    @app.get("/v1/tasks/{task_id}", response_model=S.TaskInfo, tags=["proxy"])
    async def task(task_id: str) -> Any:
        """A task's question, plan, memories used, turns and status."""
        return await proxy.task(task_id)

    return proxy


__all__ = ["Proxy", "TaskStore", "add_proxy", "conversation_key", "inject"]
