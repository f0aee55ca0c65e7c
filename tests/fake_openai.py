"""A local OpenAI-compatible chat server for tests: ``/v1/chat/completions`` (JSON or SSE
streaming) and ``/v1/models``, answering with ``reply(body) -> {"content"} | {"tool_calls"}``
and keeping every request body and header it got.

To play a misbehaving upstream, set (any time): ``gzip`` (``"when_allowed"``: compress when
the request's Accept-Encoding allows gzip; ``"always"``), ``extra_headers`` (added to every
answer), ``inject`` (bytes: a stream sends them after its first word; a plain answer is
them, status 200) and ``stall_s`` (a stream pauses that long after its first word; a plain
answer before it starts)."""

from __future__ import annotations

import asyncio
import gzip
import json
import zlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

Reply = Callable[[dict[str, Any]], dict[str, Any]]


class FakeOpenAI:
    def __init__(self, reply: Reply, chunk_delay_s: float = 0.01) -> None:
        self.reply = reply
        self.chunk_delay_s = chunk_delay_s
        self.bodies: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.count = 0
        self.gzip = "never"  # | "when_allowed" | "always"
        self.extra_headers: dict[str, str] = {}
        self.inject: bytes | None = None
        self.stall_s = 0.0
        self.app = FastAPI()
        self.app.post("/v1/chat/completions")(self._chat)
        self.app.get("/v1/models")(self._models)

    async def _models(self, request: Request) -> Response:
        self.headers.append(dict(request.headers))
        return JSONResponse({"object": "list", "data": [{"id": "fake-model", "object": "model"}]})

    async def _chat(self, request: Request) -> Response:
        body = await request.json()
        self.bodies.append(body)
        self.headers.append(dict(request.headers))
        self.count += 1
        out = self.reply(body)
        if "error" in out:
            status, message = out["error"]
            return self._out(
                request,
                JSONResponse(
                    {"error": {"message": message, "type": "invalid_request_error", "code": None}},
                    status_code=status,
                ),
            )
        cid = f"chatcmpl-fake-{self.count}"
        finish = "tool_calls" if out.get("tool_calls") else "stop"
        if not body.get("stream"):
            await asyncio.sleep(self.stall_s)
            if self.inject is not None:
                return self._out(request, Response(self.inject, media_type="application/json"))
            message: dict[str, Any] = {"role": "assistant", "content": out.get("content")}
            if out.get("tool_calls"):
                message["tool_calls"] = out["tool_calls"]
            completion = JSONResponse(
                {
                    "id": cid,
                    "object": "chat.completion",
                    "created": 0,
                    "model": body.get("model", "fake"),
                    "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                    "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
                }
            )
            return self._out(request, completion)

        async def events():
            def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
                data = {
                    "id": cid,
                    "object": "chat.completion.chunk",
                    "created": 0,
                    "model": body.get("model", "fake"),
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
                }
                return f"data: {json.dumps(data)}\n\n".encode()

            yield chunk({"role": "assistant", "content": ""})
            words = (out.get("content") or "").split(" ")
            for i, word in enumerate(words):
                await asyncio.sleep(self.chunk_delay_s)
                yield chunk({"content": word if i == 0 else " " + word})
                if i == 0:
                    await asyncio.sleep(self.stall_s)
                    if self.inject is not None:
                        yield self.inject
            for i, call in enumerate(out.get("tool_calls") or []):
                yield chunk({"tool_calls": [{"index": i, **call}]})
            yield chunk({}, finish)
            yield b"data: [DONE]\n\n"

        return self._out_stream(request, events())

    def _gzips(self, request: Request) -> bool:
        if self.gzip == "always":
            return True
        for part in request.headers.get("accept-encoding", "").split(","):
            name, _, weight = part.partition(";")
            if name.strip().lower() in ("gzip", "*") and weight.replace(" ", "") != "q=0":
                return self.gzip == "when_allowed"
        return False

    def _out(self, request: Request, response: Response) -> Response:
        if self._gzips(request):
            response = Response(
                gzip.compress(response.body),
                response.status_code,
                headers={"content-encoding": "gzip"},
                media_type=response.media_type,
            )
        response.headers.update(self.extra_headers)
        return response

    def _out_stream(self, request: Request, events: AsyncIterator[bytes]) -> Response:
        headers = dict(self.extra_headers)
        if self._gzips(request):
            headers["content-encoding"] = "gzip"
            events = _gzipped(events)
        return StreamingResponse(events, media_type="text/event-stream", headers=headers)


async def _gzipped(events: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """One gzip stream, flushed after every event so each arrives when sent."""
    packer = zlib.compressobj(wbits=31)
    async for event in events:
        yield packer.compress(event) + packer.flush(zlib.Z_SYNC_FLUSH)
    yield packer.flush()
