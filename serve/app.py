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
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI
from PIL import Image

from mia.agent import ChatPolicy, ExecutorLoop, ReplanLimitError, ToolSet, Trajectory
from mia.agent.config import AgentConfig
from mia.agent.images import is_image_part, part_url, prepare_image
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
from mia.vision import ImageError, data_url_bytes, decode_image, image_size, is_data_url
from serve.config import MAX_REQUEST_IMAGES, MAX_REQUEST_PIXELS

# ---------------------------------------------------------------------------- images


@dataclass(frozen=True)
class EncodedImage:
    """One image of a request, still encoded: where the request holds it (named in errors), its
    bytes, and what they are (``"data URL"`` or ``"image bytes"``, for vision's messages)."""

    where: str
    data: bytes
    what: str


def _bad_image(where: str, err: ImageError) -> ApiError:
    return ApiError(422, f"{where}: {err}", "bad_image")


def _request_image(item: str, where: str) -> EncodedImage:
    text = item.strip()
    try:
        if text.startswith("data:"):
            return EncodedImage(where, data_url_bytes(text), "data URL")
        try:
            data = base64.b64decode("".join(text.split()), validate=True)
        except (binascii.Error, ValueError):
            raise ImageError("not base64 or a data URL") from None
        if not data:
            raise ImageError("empty image")
        return EncodedImage(where, data, "image bytes")
    except ImageError as err:
        raise _bad_image(where, err) from None


def request_images(images: list[str] | str | None) -> list[EncodedImage]:
    """Request images (base64 or data URLs), undecoded; 422 names the bad one. Paths and URLs
    are refused: the service never reads files or fetches URLs for a client."""
    if images is None:
        return []
    items = [images] if isinstance(images, str) else images
    return [_request_image(item, f"images[{i}]") for i, item in enumerate(items)]


def message_images(messages: list[dict[str, Any]]) -> list[EncodedImage]:
    """The images inside ``/continue``'s messages, undecoded. An image part must carry its data
    (a base64 ``data:`` URL) or be a bare placeholder filled from ``images``: a path,
    ``file://`` or ``http(s)://`` URL is refused (422), so a client can never make the service
    read a local file or fetch a URL."""
    out = []
    for i, message in enumerate(messages):
        content = message.get("content")
        if not isinstance(content, list):
            continue
        for j, part in enumerate(content):
            url = part_url(part) if is_image_part(part) else None
            if url is None:
                continue
            where = f"messages[{i}].content[{j}]"
            if not is_data_url(url):
                raise ApiError(
                    422,
                    f"{where}: an image part must hold a base64 data: URL (or be a bare "
                    "placeholder filled from 'images'); the service never reads paths or "
                    "fetches URLs",
                    "bad_image",
                )
            try:
                out.append(EncodedImage(where, data_url_bytes(url), "data URL"))
            except ImageError as err:
                raise _bad_image(where, err) from None
    return out


def check_image_budget(images: Sequence[EncodedImage], max_pixels: int, max_images: int) -> None:
    """Refuse (413) more than ``max_images`` images, or images whose headers declare more than
    ``max_pixels`` pixels in all, before any is decoded. A header that cannot be read or that
    declares more than the per-image limit is 422 naming the image."""
    if len(images) > max_images:
        raise ApiError(
            413,
            f"the request holds {len(images)} images, over the limit of {max_images} images per "
            "request (serve config max_request_images)",
        )
    total = 0
    for image in images:
        try:
            width, height = image_size(image.data, image.what)
        except ImageError as err:
            raise _bad_image(image.where, err) from None
        total += width * height
    if total > max_pixels:
        raise ApiError(
            413,
            f"the request's {len(images)} image(s) declare {total} pixels in all, over the "
            f"budget of {max_pixels} pixels per request (serve config max_request_pixels)",
        )


def decode_prepared(images: Sequence[EncodedImage], size: int | None) -> list[Image.Image]:
    """Decode the images and resize each to ``size`` (the loop's ``image_size``) as soon as it
    is decoded, so at most one full-size image is held at a time; 422 names a bad one."""
    out = []
    for image in images:
        try:
            out.append(prepare_image(decode_image(image.data, image.what), size))
        except ImageError as err:
            raise _bad_image(image.where, err) from None
    return out


# ---------------------------------------------------------------------------- service

Request = ExecuteRequest | ContinueRequest | ReferenceReplanRequest


class ExecutorService:
    """The loop behind the routes: a :class:`ChatPolicy` over ``backend`` and ``tools``.

    Image work stays off the event loop: headers are checked against the request's budget
    (``max_request_pixels``, ``max_request_images``) and images decoded in worker threads, the
    decoding inside the ``max_concurrency`` slots so it is bounded too."""

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
        max_request_pixels: int = MAX_REQUEST_PIXELS,
        max_request_images: int = MAX_REQUEST_IMAGES,
    ) -> None:
        self.backend = backend
        # data_id -> the question's encoded images (the reference kept only the first).
        self.images_by_id = dict(images_by_id or {})
        self.tools = tools
        policy = ChatPolicy(backend, chars_per_token=chars_per_token, image_tokens=image_tokens)
        self.loop = ExecutorLoop(policy, tools, agent)
        self.max_concurrency = max_concurrency
        self.max_request_pixels = max_request_pixels
        self.max_request_images = max_request_images
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

    def _encoded(self, req: Request) -> list[EncodedImage]:
        """The request's images, else those registered for its ``data_id``, else none."""
        if req.images:
            return request_images(req.images)
        stored = self.images_by_id.get(str(req.data_id)) if req.data_id is not None else None
        return [
            EncodedImage(f"data_id {req.data_id}", bytes(d), "image bytes") for d in stored or ()
        ]

    def _admit(self, req: Request, messages: list[dict[str, Any]]) -> list[EncodedImage]:
        """The request's images (not those of ``messages``), once all are within its budget."""
        inline = message_images(messages)
        images = self._encoded(req)
        check_image_budget([*images, *inline], self.max_request_pixels, self.max_request_images)
        return images

    async def _run(
        self,
        req: Request,
        then: Callable[[list[Image.Image]], Awaitable[Trajectory]],
        messages: list[dict[str, Any]] | None = None,
    ) -> Trajectory:
        """Admit the request's images, then in a concurrency slot decode them and ``then``."""
        encoded = await asyncio.to_thread(self._admit, req, messages or [])

        async def work() -> Trajectory:
            size = self.loop.cfg.image_size
            return await then(await asyncio.to_thread(decode_prepared, encoded, size))

        return await self._guard(work())

    async def execute(self, req: ExecuteRequest) -> dict[str, Any]:
        def run(images: list[Image.Image]) -> Awaitable[Trajectory]:
            task = ExecutorTask(
                question=req.question,
                images=list(images),
                plan=req.plan,
                data_id=None if req.data_id is None else str(req.data_id),
                temperature=req.temperature,
                seed=req.seed,
            )
            return self.loop.run(task)

        traj = await self._run(req, run)
        return _response(traj, trace=traj.trace, turns=traj.turns, calls=traj.tool_calls)

    async def continue_(self, req: ContinueRequest) -> dict[str, Any]:
        return await self._continue(req, None, rebuild=False)

    async def _continue(
        self, req: ContinueRequest | ReferenceReplanRequest, plan: str | None, *, rebuild: bool
    ) -> dict[str, Any]:
        """Resume ``req.messages`` and run the revised plan. With ``rebuild``, a history that
        starts with the Executor's turn (the reference's ``/replan``) gets its first prompt
        rebuilt from ``question``, ``plan`` and the images, as ``/plan`` made it."""
        data_id = None if req.data_id is None else str(req.data_id)

        async def work(images: list[Image.Image]) -> Trajectory:
            messages = req.messages
            if rebuild and messages[0].get("role") == "assistant":
                task = ExecutorTask(question=req.question, images=list(images), plan=plan)
                prefix, _ = await asyncio.to_thread(self.loop.build_messages, task)
                messages, images = [*prefix, *messages], []
            # Rebuilding decodes the image parts of the messages: a worker thread's job.
            traj = await asyncio.to_thread(
                self.loop.resume, req.question, messages, images=images, data_id=data_id, plan=plan
            )
            return await self.loop.continue_with_plan(traj, req.replan)

        traj = await self._run(req, work, req.messages)
        attempt = traj.attempts[-1]
        calls = [c for c in traj.tool_calls if c.attempt == len(traj.attempts) - 1]
        out = _response(traj, trace=traj.attempt_trace(-1), turns=attempt.turns, calls=calls)
        out["history_messages"] = traj.history()
        return out

    async def plan_reference(self, req: ExecuteRequest) -> dict[str, Any]:
        """The reference's ``/plan``: run the plan; answer with the reflection prompt too."""

        def run(images: list[Image.Image]) -> Awaitable[Trajectory]:
            task = {
                "question": req.question,
                "images": images,
                "plan": req.plan,
                "data_id": None if req.data_id is None else str(req.data_id),
            }
            return self.loop.run(task)

        traj = await self._run(req, run)
        out = _response(traj, trace=traj.trace, turns=traj.turns, calls=traj.tool_calls)
        return {"prompt": judge_prompt(traj.trace), "history_messages": traj.history(), **out}

    async def replan_reference(self, req: ReferenceReplanRequest) -> dict[str, Any]:
        """The reference's ``/replan``: ``messages`` is the history after the first prompt, which
        is rebuilt from ``question``, ``plan`` and the images (``data_id``) as ``/plan`` made it."""
        out = await self._continue(req, req.plan or None, rebuild=True)
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
