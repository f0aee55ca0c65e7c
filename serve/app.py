"""The Executor service: runs the Executor loop on a plan (``/execute``) and continues it with a
revised plan (``/continue``). The reference's routes (``/plan``, ``/replan``, docs/reference.md
§3.2-3.3) run the same loop and answer in its shape (``prompt``, ``trace``,
``history_messages``) plus our fields; a request without images takes its question's images
from ``data_id`` (the ``images_from`` files), as the reference did.

Stateless: ``/continue`` receives the conversation ``/execute`` returned. A tool service that is
down gives the model an error observation and sets ``tool_error`` in the response; a failing LLM
answers 502.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI

from mia.agent import ChatPolicy, ExecutorLoop, ReplanLimitError, ToolSet, Trajectory
from mia.agent.config import AgentConfig
from mia.agent.images import is_image_part, part_url
from mia.agent.loop import ExecutorTask
from mia.errors import MiaError
from mia.http import DEFAULT_MAX_BODY_BYTES, ApiError, create_app
from mia.llm.base import ChatBackend, LLMError
from mia.prompts.planner import judge_prompt
from mia.services.serve import (
    ContinueRequest,
    ExecuteRequest,
    ExecuteResponse,
    ReferenceReplanRequest,
    ReferenceResponse,
)
from mia.vision import ImageError, is_data_url, load_image

# ---------------------------------------------------------------------------- service


def decode_images(images: list[str] | str | None) -> list[Any]:
    """Request images (base64 or data URLs) -> PIL images; 422 names the bad one. Paths and
    URLs are refused: the service never reads files or fetches URLs for a client."""
    if images is None:
        return []
    items = [images] if isinstance(images, str) else images
    out = []
    for i, item in enumerate(items):
        text = item.strip()
        try:
            if text.startswith("data:"):
                if not is_data_url(text):
                    raise ImageError("not a base64 data URL")
                out.append(load_image(text))
                continue
            try:
                data = base64.b64decode("".join(text.split()), validate=True)
            except (binascii.Error, ValueError):
                raise ImageError("not base64 or a data URL") from None
            if not data:
                raise ImageError("empty image")
            out.append(load_image(data))
        except ImageError as err:
            raise ApiError(422, f"images[{i}]: {err}", "bad_image") from None
    return out


def check_message_images(messages: list[dict[str, Any]]) -> None:
    """Image parts sent back in ``/continue`` must carry their data (a base64 ``data:`` URL) or
    be bare placeholders filled from ``images``: a path, ``file://`` or ``http(s)://`` URL is
    refused (422), so a client can never make the service read a local file or fetch a URL."""
    for i, message in enumerate(messages):
        content = message.get("content")
        if not isinstance(content, list):
            continue
        for j, part in enumerate(content):
            if not is_image_part(part):
                continue
            url = part_url(part)
            if url is not None and not is_data_url(url):
                raise ApiError(
                    422,
                    f"messages[{i}].content[{j}]: an image part must hold a base64 data: URL "
                    "(or be a bare placeholder filled from 'images'); the service never reads "
                    "paths or fetches URLs",
                    "bad_image",
                )


class ExecutorService:
    """The loop behind the routes: a :class:`ChatPolicy` over ``backend`` and ``tools``."""

    def __init__(
        self,
        backend: ChatBackend,
        tools: ToolSet,
        agent: AgentConfig | None = None,
        *,
        max_concurrency: int = 8,
        chars_per_token: float = 3.0,
        image_tokens: int = 256,
        images_by_id: Mapping[str, Sequence[bytes]] | None = None,
    ) -> None:
        self.backend = backend
        # data_id -> the question's encoded images (the reference kept only the first).
        self.images_by_id = dict(images_by_id or {})
        self.tools = tools
        policy = ChatPolicy(backend, chars_per_token=chars_per_token, image_tokens=image_tokens)
        self.loop = ExecutorLoop(policy, tools, agent)
        self.max_concurrency = max_concurrency
        self._sem: asyncio.Semaphore | None = None
        self.requests = 0

    def _semaphore(self) -> asyncio.Semaphore:
        if self._sem is None:  # created on the server's loop, at first use
            self._sem = asyncio.Semaphore(self.max_concurrency)
        return self._sem

    async def _guard(self, coro: Any) -> Trajectory:
        self.requests += 1
        async with self._semaphore():
            try:
                return await coro
            except ReplanLimitError as err:
                raise ApiError(409, str(err), "replan_limit") from None
            except LLMError as err:
                raise ApiError(502, f"executor LLM failed: {err}", "llm_error") from None
            except ImageError as err:
                raise ApiError(422, str(err), "bad_image") from None
            except MiaError as err:
                raise ApiError(422, str(err)) from None

    def _images(self, req: ExecuteRequest | ContinueRequest | ReferenceReplanRequest) -> list[Any]:
        """The request's images, else those registered for its ``data_id``, else none."""
        if req.images:
            return decode_images(req.images)
        stored = self.images_by_id.get(str(req.data_id)) if req.data_id is not None else None
        try:
            return [load_image(data) for data in stored or ()]
        except ImageError as err:
            raise ApiError(422, f"data_id {req.data_id}: {err}", "bad_image") from None

    async def execute(self, req: ExecuteRequest) -> dict[str, Any]:
        images = self._images(req)
        task = ExecutorTask(
            question=req.question,
            images=images,
            plan=req.plan,
            data_id=None if req.data_id is None else str(req.data_id),
            temperature=req.temperature,
            seed=req.seed,
        )
        traj = await self._guard(self.loop.run(task))
        return _response(traj, trace=traj.trace, turns=traj.turns, calls=traj.tool_calls)

    async def continue_(self, req: ContinueRequest) -> dict[str, Any]:
        check_message_images(req.messages)
        return await self._continue(req, req.messages, self._images(req), None)

    async def _continue(
        self,
        req: ContinueRequest | ReferenceReplanRequest,
        messages: list[dict[str, Any]],
        images: list[Any],
        plan: str | None,
    ) -> dict[str, Any]:
        data_id = None if req.data_id is None else str(req.data_id)

        async def work() -> Trajectory:
            traj = self.loop.resume(
                req.question, messages, images=images, data_id=data_id, plan=plan
            )
            return await self.loop.continue_with_plan(traj, req.replan)

        traj = await self._guard(work())
        attempt = traj.attempts[-1]
        calls = [c for c in traj.tool_calls if c.attempt == len(traj.attempts) - 1]
        out = _response(traj, trace=traj.attempt_trace(-1), turns=attempt.turns, calls=calls)
        out["history_messages"] = traj.history()
        return out

    async def plan_reference(self, req: ExecuteRequest) -> dict[str, Any]:
        """The reference's ``/plan``: run the plan; answer with the reflection prompt too."""
        images = self._images(req)
        task = {
            "question": req.question,
            "images": images,
            "plan": req.plan,
            "data_id": None if req.data_id is None else str(req.data_id),
        }
        traj = await self._guard(self.loop.run(task))
        out = _response(traj, trace=traj.trace, turns=traj.turns, calls=traj.tool_calls)
        return {"prompt": judge_prompt(traj.trace), "history_messages": traj.history(), **out}

    async def replan_reference(self, req: ReferenceReplanRequest) -> dict[str, Any]:
        """The reference's ``/replan``: ``messages`` is the history after the first prompt, which
        is rebuilt from ``question``, ``plan`` and the images (``data_id``) as ``/plan`` made it."""
        check_message_images(req.messages)
        images = self._images(req)
        messages = req.messages
        if messages[0].get("role") == "assistant":
            task = ExecutorTask(question=req.question, images=images, plan=req.plan or None)
            try:
                prefix, _ = self.loop.build_messages(task)
            except ImageError as err:
                raise ApiError(422, str(err), "bad_image") from None
            messages, images = [*prefix, *messages], []
        out = await self._continue(req, messages, images, req.plan or None)
        return {"prompt": judge_prompt(out["trace"]), **out}

    def health(self) -> dict[str, Any]:
        cfg = self.loop.cfg
        return {
            "llm": getattr(self.backend, "name", type(self.backend).__name__),
            "tools": self.tools.names,
            "max_turns": cfg.max_turns,
            "max_tool_calls": cfg.max_tool_calls,
            "context_budget": self.loop.budget(),
            "requests": self.requests,
        }


def _response(traj: Trajectory, *, trace: str, turns: int, calls: list[Any]) -> dict[str, Any]:
    return {
        "answer": traj.answer,
        "trace": trace,
        "messages": traj.messages,
        "tool_calls": [
            {
                "turn": c.turn,
                "attempt": c.attempt,
                "name": c.name,
                "arguments": c.arguments,
                "ok": c.ok,
                "error_kind": c.error_kind,
                "error": c.error,
            }
            for c in calls
        ],
        "turns": turns,
        "usage": {"prompt_tokens": traj.prompt_tokens, "completion_tokens": traj.completion_tokens},
        "tool_errors": list(traj.tool_errors),
        "tool_error": traj.tool_error,
        "stop_reason": traj.stop_reason,
        "forced_answer": traj.forced_answer,
        "replanned": traj.replanned,
        "data_id": traj.data_id,
    }


def create_serve_app(
    service: ExecutorService,
    *,
    token: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> FastAPI:
    app = create_app("serve", token=token, max_body_bytes=max_body_bytes, health=service.health)
    app.state.service = service

    async def execute(req: ExecuteRequest) -> dict[str, Any]:
        return await service.execute(req)

    async def continue_(req: ContinueRequest) -> dict[str, Any]:
        return await service.continue_(req)

    app.post("/execute", response_model=ExecuteResponse, summary="run the Executor on a plan")(
        execute
    )
    app.post("/continue", response_model=ExecuteResponse, summary="continue with a revised plan")(
        continue_
    )

    @app.post("/plan", response_model=ReferenceResponse, summary="the reference's /plan")
    async def plan(req: ExecuteRequest) -> dict[str, Any]:
        """``{"data_id", "question", "plan"}`` -> ``{prompt, trace, history_messages, ...}``:
        the run of ``/execute`` plus the reflection prompt wrapping its trace."""
        return await service.plan_reference(req)

    @app.post("/replan", response_model=ReferenceResponse, summary="the reference's /replan")
    async def replan(req: ReferenceReplanRequest) -> dict[str, Any]:
        """``{"data_id", "question", "plan", "messages": <history_messages>, "replan"}`` ->
        ``{prompt, trace (new turns), history_messages (the whole extended chat), ...}``."""
        return await service.replan_reference(req)

    return app
