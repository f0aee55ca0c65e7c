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

from typing import Any

from fastapi import APIRouter, Body, FastAPI, Request
from fastapi.responses import Response
from pydantic import BaseModel

from memory_serve.proxy.relay import Proxy
from memory_serve.proxy.tasks import TaskStore, conversation_key, inject, tasks_path
from memory_serve.service import MemoryService
from mia.services import memory as memory_api


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
    """The proxy in front of ``service.cfg.proxy.upstream``, its routes added to ``app``."""
    cfg = service.cfg.proxy
    tasks = TaskStore(tasks_path(cfg, service.store.db_path), cfg.task_ttl_s)
    proxy = Proxy(cfg, service, tasks)
    app.state.proxy = proxy
    app.include_router(proxy_routes(proxy))
    return proxy


def proxy_routes(proxy: Proxy) -> APIRouter:
    router = APIRouter(tags=["proxy"])
    chat_body = {
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": _inline_schema(memory_api.ProxyChatRequest)}
            },
        }
    }

    @router.post("/v1/chat/completions", openapi_extra=chat_body)
    async def chat_completions(request: Request, body: dict[str, Any] = Body(...)) -> Response:
        """OpenAI-compatible chat: a new task is planned from memory, then forwarded upstream."""
        return await proxy.chat(request, body)

    @router.get("/v1/models")
    async def models(request: Request) -> Response:
        """The upstream's model list."""
        return await proxy.models(request)

    @router.post("/v1/feedback", response_model=memory_api.FeedbackResponse)
    async def feedback(body: memory_api.FeedbackRequest) -> Any:
        """The outcome of a task: its conversation is written to memory (once)."""
        return await proxy.feedback(body)

    @router.get("/v1/tasks/{task_id}", response_model=memory_api.TaskInfo)
    async def task(task_id: str) -> Any:
        """A task's question, plan, memories used, turns and status."""
        return await proxy.task(task_id)

    return router


__all__ = ["Proxy", "TaskStore", "add_proxy", "conversation_key", "inject"]
