"""Typed async clients for MIA's own services (memory_serve, serve, the reward server).

The role trainers (Executor and Planner GRPO, TTRL, streaming) talk to the services only through
these, so a route's payload is written once. Every client takes a base URL and an optional
bearer token; a 4xx/5xx answer raises :class:`ServiceError` carrying the service's error
envelope (``{"error": {"code", "message"}}``); connection failures are retried a few times
(a service that is restarting), HTTP errors are not (the service answered).

An ``httpx.AsyncClient`` belongs to the event loop that first used it, and the trainers run
their rollouts on a private loop while orchestration code runs elsewhere, so each client keeps
one connection pool per loop and a plain synchronous pool for ``*_sync`` calls.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from typing import Any

import httpx

from mia.errors import MiaError

DEFAULT_TIMEOUT_S = 600.0


class ServiceError(MiaError):
    """A service answered with an error, or could not be reached."""

    def __init__(self, message: str, status: int | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


def _error_of(service: str, path: str, resp: httpx.Response) -> ServiceError:
    code, message = None, resp.text[:500]
    try:
        body = resp.json()
        if isinstance(body, dict) and isinstance(body.get("error"), dict):
            code = body["error"].get("code")
            message = str(body["error"].get("message", message))
    except ValueError:
        pass
    return ServiceError(
        f"{service} {path}: HTTP {resp.status_code}: {message}", resp.status_code, code
    )


class ServiceClient:
    """``await client.post(path, body)`` / ``client.post_sync(path, body)`` -> parsed JSON."""

    service = "service"

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        connect_retries: int = 3,
    ) -> None:
        if not url:
            raise MiaError(f"{self.service}: no URL configured")
        self.url = url.rstrip("/")
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.timeout = httpx.Timeout(timeout_s, connect=min(10.0, timeout_s))
        self.connect_retries = max(0, int(connect_retries))
        self._pools: dict[int, tuple[asyncio.AbstractEventLoop, httpx.AsyncClient]] = {}
        self._sync: httpx.Client | None = None

    # ---- pools
    def _async_pool(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        entry = self._pools.get(id(loop))
        if entry is None or entry[0] is not loop or entry[1].is_closed:
            client = httpx.AsyncClient(
                base_url=self.url, headers=self.headers, timeout=self.timeout
            )
            self._pools[id(loop)] = (loop, client)
            return client
        return entry[1]

    def _sync_pool(self) -> httpx.Client:
        if self._sync is None or self._sync.is_closed:
            self._sync = httpx.Client(base_url=self.url, headers=self.headers, timeout=self.timeout)
        return self._sync

    # ---- calls
    async def request(self, method: str, path: str, body: Any = None) -> Any:
        for attempt in range(self.connect_retries + 1):
            try:
                resp = await self._async_pool().request(method, path, json=body)
                break
            except (httpx.ConnectError, httpx.RemoteProtocolError) as err:
                if attempt == self.connect_retries:
                    raise ServiceError(f"{self.service} {self.url}{path}: {err}") from None
                await asyncio.sleep(0.5 * 2**attempt)
            except httpx.TimeoutException as err:
                raise ServiceError(f"{self.service} {self.url}{path}: timed out ({err})") from None
        return self._parse(path, resp)

    def request_sync(self, method: str, path: str, body: Any = None) -> Any:
        for attempt in range(self.connect_retries + 1):
            try:
                resp = self._sync_pool().request(method, path, json=body)
                break
            except (httpx.ConnectError, httpx.RemoteProtocolError) as err:
                if attempt == self.connect_retries:
                    raise ServiceError(f"{self.service} {self.url}{path}: {err}") from None
                time.sleep(0.5 * 2**attempt)
            except httpx.TimeoutException as err:
                raise ServiceError(f"{self.service} {self.url}{path}: timed out ({err})") from None
        return self._parse(path, resp)

    def _parse(self, path: str, resp: httpx.Response) -> Any:
        if resp.status_code >= 400:
            raise _error_of(self.service, path, resp)
        try:
            return resp.json()
        except ValueError:
            raise ServiceError(f"{self.service} {path}: the answer is not JSON") from None

    async def post(self, path: str, body: Any = None) -> Any:
        return await self.request("POST", path, body)

    def post_sync(self, path: str, body: Any = None) -> Any:
        return self.request_sync("POST", path, body)

    def get_sync(self, path: str) -> Any:
        return self.request_sync("GET", path)

    def health(self) -> dict[str, Any]:
        return self.get_sync("/health")

    async def aclose(self) -> None:
        """Close this loop's pool (other loops' pools close with :meth:`close`)."""
        loop = asyncio.get_running_loop()
        entry = self._pools.pop(id(loop), None)
        if entry is not None:
            await entry[1].aclose()

    def close(self) -> None:
        if self._sync is not None:
            self._sync.close()
            self._sync = None
        for loop, client in list(self._pools.values()):
            if not loop.is_closed() and not loop.is_running():
                loop.run_until_complete(client.aclose())
        self._pools.clear()


def _caption(value: str | Sequence[str] | None) -> str | list[str] | None:
    return list(value) if isinstance(value, list | tuple) else value


class MemoryClient(ServiceClient):
    """memory_serve (ARCHITECTURE §4): retrieval, plans, the TTRL buffer, persistence."""

    service = "memory_serve"

    @staticmethod
    def query(
        question: str,
        *,
        image_caption: str | Sequence[str] | None = None,
        data_id: str | None = None,
        top_k: int | None = None,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"question": question, "data_id": data_id or ""}
        if image_caption:
            body["image_caption"] = _caption(image_caption)
        if top_k is not None:
            body["mem_top_k"] = top_k
        return body

    async def memory(self, question: str, **kw: Any) -> dict[str, Any]:
        """``{context, positive_ids, negative_ids, ...}`` for one question."""
        return await self.post("/memory", self.query(question, **kw))

    def memory_sync(self, question: str, **kw: Any) -> dict[str, Any]:
        return self.post_sync("/memory", self.query(question, **kw))

    def memories_sync(self, queries: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """``/memory`` for many questions in one request (answers in order)."""
        if not queries:
            return []
        return self.post_sync("/memory", [dict(q) for q in queries])

    async def plan(self, question: str, **kw: Any) -> dict[str, Any]:
        """``{plan, messages, memory_ids, context, ...}``: a plan written with memories."""
        return await self.post("/plan", self.query(question, **kw))

    async def replan_train(
        self,
        question: str,
        plan: str,
        trace: str,
        mem_context: str = "",
        *,
        data_id: str | None = None,
        image_caption: str | Sequence[str] | None = None,
    ) -> str:
        """The supplementary plan of Executor training (the answer was judged wrong)."""
        body: dict[str, Any] = {
            "question": question,
            "plan": plan,
            "trace": trace,
            "mem_context1": mem_context,
            "data_id": data_id or "",
        }
        if image_caption:
            body["image_caption"] = _caption(image_caption)
        out = await self.post("/replan_train", body)
        return str(out.get("content", ""))

    def bank_save_sync(self, items: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        return self.post_sync("/memory_bank_save", [dict(i) for i in items])

    def batch_evaluate_sync(
        self, output_dir: str | None = None, step: int | None = None
    ) -> dict[str, Any]:
        body: dict[str, Any] = {}
        if output_dir is not None:
            body["output_dir"] = output_dir
        if step is not None:
            body["step"] = step
        return self.post_sync("/batch_evaluate", body)

    def consolidate_sync(self) -> dict[str, Any]:
        return self.post_sync("/consolidate_memories", {})

    def save_memory_sync(self, path: str | None = None) -> dict[str, Any]:
        return self.post_sync("/save_memory", {"path": path} if path else {})

    def stats_sync(self) -> dict[str, Any]:
        return self.get_sync("/stats")


class ExecutorClient(ServiceClient):
    """serve: the (frozen) Executor runs a plan (``/execute``) and continues (``/continue``)."""

    service = "serve"

    async def execute(
        self,
        question: str,
        plan: str,
        *,
        data_id: str | None = None,
        images: Sequence[str] | None = None,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"question": question, "plan": plan}
        if data_id is not None:
            body["data_id"] = data_id
        if images:
            body["images"] = list(images)
        return await self.post("/execute", body)

    async def continue_(
        self,
        question: str,
        messages: Sequence[Mapping[str, Any]],
        replan: str,
        *,
        data_id: str | None = None,
        images: Sequence[str] | None = None,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "question": question,
            "messages": [dict(m) for m in messages],
            "replan": replan,
        }
        if data_id is not None:
            body["data_id"] = data_id
        if images:
            body["images"] = list(images)
        return await self.post("/continue", body)


class RewardClient(ServiceClient):
    """The pluggable reward server (``/register_gts``, ``/compute_gt_reward``)."""

    service = "reward_server"

    def register_sync(self, entries: Sequence[tuple[str, Sequence[str] | str]]) -> dict[str, Any]:
        body = {
            "entries": [
                {"data_id": str(i), "ground_truth": list(g) if not isinstance(g, str) else g}
                for i, g in entries
            ]
        }
        return self.post_sync("/register_gts", body)

    async def compute(
        self, data_id: str, record: Mapping[str, Any], question: str = "", **extra: Any
    ) -> dict[str, Any]:
        body = {"data_id": data_id, "record": dict(record), "question": question, **extra}
        return await self.post("/compute_gt_reward", body)
