"""MIA as a drop-in memory layer: an OpenAI-compatible ``/v1/chat/completions`` in front of any
OpenAI-compatible model (docs/proxy.md).

An agent changes only its base URL. For a **new task** (a conversation whose messages hold no
assistant turn yet) the proxy retrieves memories, asks the Planner for a plan (``/plan``'s code)
and appends it to the task's first user message, then forwards the request upstream (streaming
included: the SSE bytes are relayed as they come). Later requests of the same conversation
(same messages up to the first user message) get the same plan again, since the client's own
history never held it. Every answer is kept with the task; when the client reports the outcome
(``POST /v1/feedback`` with the task id from the ``X-MIA-Task-Id`` header, or the completion's
``id``), the conversation is written to memory like any trajectory (``/memories``), crediting
the memories the plan was built from. Open tasks live in a small SQLite file of their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import sqlite3
import threading
import time
import uuid
import weakref
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from fastapi import Body, FastAPI, Request
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, ValidationError

from memory_serve.config import ProxyConfig
from memory_serve.service import MemoryService
from mia.http import ApiError
from mia.services import memory as S
from mia.trace import content_text

log = logging.getLogger("memory_serve.proxy")

TASK_HEADER = "X-MIA-Task-Id"
PLAN_HEADER = "X-MIA-Plan"  # planned | memories | none | failed | continued | untracked
PLAN_BLOCK = (
    "Here is a plan from the memory of similar past tasks (a guide; adapt it where it does "
    "not fit):\n{plan}"
)
# Request headers that describe the client's own connection, never forwarded upstream.
_HOP_HEADERS = {
    "host",
    "content-length",
    "authorization",
    "cookie",
    "connection",
    "accept-encoding",
}

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
    status: str = "open"  # open | recording | recorded
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
        """The conversation so far, ending with the model's latest answer."""
        with self._lock, self._conn:
            self._conn.execute(
                "UPDATE tasks SET messages = ?, turns = turns + 1, updated_at = ? "
                "WHERE task_id = ? AND status = 'open'",
                (json.dumps(messages, ensure_ascii=False), time.time(), task_id),
            )
            if completion_id:
                self._conn.execute(
                    "INSERT OR REPLACE INTO completions (completion_id, task_id) VALUES (?, ?)",
                    (completion_id, task_id),
                )

    def claim(self, task_id: str) -> bool:
        """open -> recording; False when another feedback got there first."""
        with self._lock, self._conn:
            cur = self._conn.execute(
                "UPDATE tasks SET status = 'recording' WHERE task_id = ? AND status = 'open'",
                (task_id,),
            )
            return cur.rowcount == 1

    def finish(self, task_id: str, result: dict[str, Any] | None) -> None:
        """recording -> recorded (with the write's result), or back to open (None: failed)."""
        with self._lock, self._conn:
            if result is None:
                self._conn.execute("UPDATE tasks SET status = 'open' WHERE task_id = ?", (task_id,))
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


class _StreamAnswer:
    """The assistant message being streamed, rebuilt from SSE ``data:`` chunks."""

    def __init__(self) -> None:
        self.buffer = b""
        self.completion_id: str | None = None
        self.content: list[str] = []
        self.tool_calls: dict[int, dict[str, Any]] = {}

    def feed(self, chunk: bytes) -> None:
        self.buffer += chunk
        *lines, self.buffer = self.buffer.split(b"\n")
        for line in lines:
            self._line(line.strip())

    def close(self) -> None:
        if self.buffer.strip():
            self._line(self.buffer.strip())
        self.buffer = b""

    def _line(self, line: bytes) -> None:
        if not line.startswith(b"data:"):
            return
        data = line[5:].strip()
        if not data or data == b"[DONE]":
            return
        try:
            event = json.loads(data)
        except ValueError:
            return
        if not isinstance(event, dict):
            return
        if isinstance(event.get("id"), str):
            self.completion_id = event["id"]
        choices = event.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return
        delta = choices[0].get("delta") or {}
        if isinstance(delta.get("content"), str):
            self.content.append(delta["content"])
        for call in delta.get("tool_calls") or []:
            if not isinstance(call, dict):
                continue
            slot = self.tool_calls.setdefault(
                int(call.get("index", 0)),
                {"id": "", "type": "function", "function": {"name": "", "arguments": ""}},
            )
            if call.get("id"):
                slot["id"] = call["id"]
            fn = call.get("function") or {}
            slot["function"]["name"] += fn.get("name") or ""
            slot["function"]["arguments"] += fn.get("arguments") or ""

    def message(self) -> dict[str, Any]:
        msg: dict[str, Any] = {"role": "assistant", "content": "".join(self.content)}
        if self.tool_calls:
            msg["tool_calls"] = [self.tool_calls[i] for i in sorted(self.tool_calls)]
        return msg


# ----------------------------------------------------------------------------- the proxy


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
            )
            self._clients[loop] = client
        return client

    def _headers(self, request: Request) -> dict[str, str]:
        headers = {
            k: v
            for k, v in request.headers.items()
            if k.lower() not in _HOP_HEADERS and not k.lower().startswith("x-mia")
        }
        headers["content-type"] = "application/json"
        if self._key:
            headers["authorization"] = f"Bearer {self._key}"
        elif not request.app.state.token and request.headers.get("authorization"):
            # No key of our own and no token of ours in that header: the client's key goes on.
            headers["authorization"] = request.headers["authorization"]
        return headers

    async def _send(self, request: Request, path: str, body: Any, stream: bool) -> httpx.Response:
        client = self._client()
        req = client.build_request(
            request.method, f"{self.upstream}{path}", json=body, headers=self._headers(request)
        )
        try:
            return await client.send(req, stream=stream)
        except httpx.TimeoutException:
            raise ApiError(
                504, f"the upstream model gave no answer within {self.cfg.timeout_s:g}s"
            ) from None
        except httpx.HTTPError as err:
            raise ApiError(
                502, f"the upstream model is unreachable ({type(err).__name__})", "upstream_error"
            ) from None

    # ---- planning

    async def _prepare(self, question: str) -> tuple[str, str, list[int], str]:
        """``(plan, injected block, memory ids, how)`` for a new task."""
        mode = self.cfg.inject
        if mode == "none":
            return "", "", [], "none"
        q = S.MemoryQuery(question=question)
        try:
            if mode == "plan" and self.service.planner is not None:
                out = await self.service.plan(q)
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
        messages = [m.model_dump(exclude_unset=False) for m in parsed.messages]
        raw_messages = body["messages"]
        first_user = next((i for i, m in enumerate(messages) if m["role"] == "user"), None)
        task: Task | None = None
        how = "untracked"
        if first_user is not None:
            key = conversation_key(raw_messages, first_user)
            if not any(m["role"] == "assistant" for m in messages):
                question = content_text(messages[first_user]["content"]).strip()
                if question:
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
            else:
                task = await asyncio.to_thread(self.tasks.latest, key)
                how = "continued" if task is not None else "untracked"
        forwarded = dict(body)
        if task is not None and task.injection and first_user is not None:
            forwarded["messages"] = inject(raw_messages, first_user, task.injection)
        headers = {PLAN_HEADER: how}
        if task is not None:
            headers[TASK_HEADER] = task.task_id
        if parsed.stream:
            return await self._stream(request, forwarded, headers, task, raw_messages, first_user)
        resp = await self._send(request, "/chat/completions", forwarded, stream=False)
        if task is not None and resp.status_code < 400:
            await self._remember(task, raw_messages, first_user, resp)
        return Response(
            resp.content,
            status_code=resp.status_code,
            media_type=resp.headers.get("content-type", "application/json"),
            headers=headers,
        )

    async def _remember(
        self,
        task: Task,
        messages: list[dict[str, Any]],
        first_user: int | None,
        resp: httpx.Response,
    ) -> None:
        try:
            data = resp.json()
            message = data["choices"][0]["message"]
        except (ValueError, KeyError, IndexError, TypeError):
            log.warning(
                "proxy: task %s: the upstream answer is not a chat completion", task.task_id
            )
            return
        if not isinstance(message, dict):
            return
        completion_id = data.get("id") if isinstance(data.get("id"), str) else None
        await self._add_turn(task, messages, first_user, message, completion_id)

    async def _add_turn(
        self,
        task: Task,
        messages: list[dict[str, Any]],
        first_user: int | None,
        answer: dict[str, Any],
        completion_id: str | None,
    ) -> None:
        convo = [
            *messages,
            {k: answer[k] for k in ("role", "content", "tool_calls") if k in answer},
        ]
        await asyncio.to_thread(self.tasks.add_turn, task.task_id, convo, completion_id)

    async def _stream(
        self,
        request: Request,
        body: dict[str, Any],
        headers: dict[str, str],
        task: Task | None,
        messages: list[dict[str, Any]],
        first_user: int | None,
    ) -> Response:
        resp = await self._send(request, "/chat/completions", body, stream=True)
        if resp.status_code >= 400:
            content = await resp.aread()
            await resp.aclose()
            return Response(
                content,
                status_code=resp.status_code,
                media_type=resp.headers.get("content-type", "application/json"),
                headers=headers,
            )
        answer = _StreamAnswer()

        async def relay() -> AsyncIterator[bytes]:
            # One chunk behind the upstream: the last chunk (the stream's end) goes out only
            # after the turn is recorded, so feedback sent right after [DONE] finds the task.
            complete = False
            pending: bytes | None = None
            try:
                async for chunk in resp.aiter_raw():
                    answer.feed(chunk)
                    if pending is not None:
                        yield pending
                    pending = chunk
                complete = True
            finally:
                await resp.aclose()
                answer.close()
            if complete and task is not None:
                await self._add_turn(
                    task, messages, first_user, answer.message(), answer.completion_id
                )
            if pending is not None:
                yield pending

        return StreamingResponse(
            relay(),
            status_code=resp.status_code,
            media_type=resp.headers.get("content-type", "text/event-stream"),
            headers={**headers, "Cache-Control": "no-cache"},
        )

    async def models(self, request: Request) -> Response:
        resp = await self._send(request, "/models", None, stream=False)
        return Response(
            resp.content,
            status_code=resp.status_code,
            media_type=resp.headers.get("content-type", "application/json"),
        )

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
            await asyncio.to_thread(self.tasks.finish, task.task_id, None)
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
