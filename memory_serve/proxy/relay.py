"""The proxy's work per request: plan a new task from memory, forward the request upstream,
check and relay the answer (streamed events as they complete), record it with the task; and
the client's feedback, which writes the task to memory."""

from __future__ import annotations

import asyncio
import logging
import os
import uuid
import weakref
from collections.abc import AsyncIterator
from dataclasses import dataclass
from http.cookiejar import CookieJar, DefaultCookiePolicy
from typing import Any

import httpx
from fastapi import Request
from fastapi.responses import Response, StreamingResponse
from pydantic import ValidationError

from memory_serve.config import ProxyConfig
from memory_serve.proxy.tasks import (
    Task,
    TaskStore,
    conversation_key,
    inject,
    trajectory_messages,
)
from memory_serve.proxy.upstream import (
    MALFORMED,
    Malformed,
    StreamAnswer,
    completion_answer,
    forwarded_headers,
    relayed_headers,
    sse_error,
    undecodable,
)
from memory_serve.service import MemoryService
from mia.http import ApiError, error_response
from mia.services import memory as memory_api
from mia.trace import content_text

log = logging.getLogger("memory_serve.proxy")

TASK_HEADER = "X-MIA-Task-Id"
PLAN_HEADER = "X-MIA-Plan"  # planned | memories | none | failed | continued | untracked
PLAN_BLOCK = (
    "Here is a plan from the memory of similar past tasks (a guide; adapt it where it does "
    "not fit):\n{plan}"
)


@dataclass
class _Turn:
    """One request on its way upstream, and what its answer is recorded with."""

    request: Request
    body: dict[str, Any]  # as forwarded (plan included)
    headers: dict[str, str]  # the proxy's own answer headers
    task: Task | None
    messages: list[dict[str, Any]]  # as the client sent them


class Proxy:
    """One upstream model behind the memory: what the proxy routes do per request."""

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
        headers = forwarded_headers(request.headers.items())
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
        if undecodable(resp):
            await resp.aclose()
            raise ApiError(502, "the upstream answer has an unknown Content-Encoding", MALFORMED)
        return resp

    # ---- planning

    async def _prepare(self, question: str) -> tuple[str, str, list[int], str]:
        """``(plan, injected block, memory ids, how)`` for a new task."""
        mode = self.cfg.inject
        if mode == "none":
            return "", "", [], "none"
        q = memory_api.MemoryQuery(question=question)
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
            parsed = memory_api.ProxyChatRequest.model_validate(body)
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
        self,
        parsed: memory_api.ProxyChatRequest,
        raw_messages: list[dict[str, Any]],
        first_user: int,
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
            except Malformed as err:
                raise ApiError(
                    502, f"the upstream answer is not a chat completion ({err})", MALFORMED
                ) from None
            await self._add_turn(turn, answer, completion_id)
        else:
            await self._fail(turn.task, "upstream_status", f"HTTP {resp.status_code}")
        return Response(resp.content, resp.status_code, relayed_headers(resp, turn.headers))

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
            return Response(content, resp.status_code, relayed_headers(resp, turn.headers))
        headers = relayed_headers(resp, {**turn.headers, "Cache-Control": "no-cache"})
        headers["content-type"] = "text/event-stream; charset=utf-8"  # only checked events go out
        return StreamingResponse(self._relay(turn, resp), resp.status_code, headers)

    async def _relay(self, turn: _Turn, resp: httpx.Response) -> AsyncIterator[bytes]:
        # One step behind the upstream: the last events (the stream's end) go out only after
        # the turn is recorded, so feedback sent right after [DONE] finds the task.
        answer = StreamAnswer()
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

    async def _events(self, resp: httpx.Response, answer: StreamAnswer) -> AsyncIterator[bytes]:
        """The upstream's events, checked, as they complete; a broken stream ends them early
        and sets ``answer.failure``."""
        try:
            async for chunk in resp.aiter_bytes():
                answer.feed(chunk)
                if events := answer.take():
                    yield events
            answer.close()
        except Malformed as err:
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
        return Response(resp.content, resp.status_code, relayed_headers(resp, {}))

    async def feedback(self, req: memory_api.FeedbackRequest) -> memory_api.FeedbackResponse:
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
        item = memory_api.TrajectoryItem.model_validate(
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
        return memory_api.FeedbackResponse(status="recorded", task_id=task.task_id, result=outcome)

    async def task(self, task_id: str) -> memory_api.TaskInfo:
        task = await asyncio.to_thread(self.tasks.get, task_id)
        if task is None:
            raise ApiError(404, "no such task (unknown, or expired)", "no_such_task")
        return memory_api.TaskInfo(
            task_id=task.task_id,
            question=task.question,
            plan=task.plan,
            memory_ids=task.memory_ids,
            turns=task.turns,
            status=task.status,
            result=memory_api.WriteOutcome(**task.result) if task.result else None,
            created_at=task.created_at,
        )
