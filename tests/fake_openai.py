"""A local OpenAI-compatible chat server for tests: ``/v1/chat/completions`` (JSON or SSE
streaming) and ``/v1/models``, answering with ``reply(body) -> {"content"} | {"tool_calls"}``
and keeping every request body and header it got."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
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
            return JSONResponse(
                {"error": {"message": message, "type": "invalid_request_error", "code": None}},
                status_code=status,
            )
        cid = f"chatcmpl-fake-{self.count}"
        finish = "tool_calls" if out.get("tool_calls") else "stop"
        if not body.get("stream"):
            message: dict[str, Any] = {"role": "assistant", "content": out.get("content")}
            if out.get("tool_calls"):
                message["tool_calls"] = out["tool_calls"]
            return JSONResponse(
                {
                    "id": cid,
                    "object": "chat.completion",
                    "created": 0,
                    "model": body.get("model", "fake"),
                    "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                    "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
                }
            )

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
            for i, call in enumerate(out.get("tool_calls") or []):
                yield chunk({"tool_calls": [{"index": i, **call}]})
            yield chunk({}, finish)
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")
