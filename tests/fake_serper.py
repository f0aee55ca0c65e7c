"""A local fake of Serper's ``POST /search`` for tests (real HTTP, Serper's JSON).

It records every call (headers key, JSON body), answers deterministic results derived from the
query, and can be told to misbehave for its next calls: fail with a status (500, 429 with
``Retry-After``, 403, ...), or stall longer than the client's timeout. ``responses[q]`` replaces
the answer for one query (e.g. with an ``answerBox``).

    fake = FakeSerper(expected_key="k")
    with ServerThread(fake.app) as url:
        ... url + "/search" ...
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse


@dataclass
class Call:
    key: str | None
    body: dict[str, Any]
    path: str = "/search"


@dataclass
class _Failure:
    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: dict[str, Any] | None = None
    delay_s: float = 0.0  # >0: stall this long, then answer normally


def organic(query: str, num: int) -> list[dict[str, Any]]:
    """The fake's organic results for ``query``: ``num`` items, the first one dated."""
    slug = "-".join(query.lower().split())
    items = []
    for i in range(1, num + 1):
        item = {
            "title": f"{query} - result {i}",
            "link": f"https://example.com/{slug}/{i}",
            "snippet": f"Snippet {i} about {query}.",
            "position": i,
        }
        if i == 1:
            item["date"] = "Jan 2, 2024"
        items.append(item)
    return items


class FakeSerper:
    def __init__(self, expected_key: str | None = None) -> None:
        self.expected_key = expected_key
        self.calls: list[Call] = []
        self.responses: dict[str, dict[str, Any]] = {}
        self.images: dict[str, dict[str, Any]] = {}
        self.inflight = 0
        self.max_inflight = 0
        self._failures: list[_Failure] = []
        self._lock = threading.Lock()
        self.app = self._build()

    def reset(self) -> None:
        with self._lock:
            self.calls.clear()
            self.responses.clear()
            self.images.clear()
            self._failures.clear()
            self.expected_key = None
            self.inflight = self.max_inflight = 0

    @property
    def call_count(self) -> int:
        with self._lock:
            return len(self.calls)

    def fail_next(
        self,
        n: int,
        status: int = 500,
        *,
        headers: dict[str, str] | None = None,
        body: dict[str, Any] | None = None,
    ) -> None:
        with self._lock:
            self._failures += [_Failure(status, dict(headers or {}), body) for _ in range(n)]

    def stall_next(self, n: int, seconds: float) -> None:
        with self._lock:
            self._failures += [_Failure(200, delay_s=seconds) for _ in range(n)]

    def _build(self) -> FastAPI:
        app = FastAPI(title="fake-serper")

        @app.post("/search")
        async def search(request: Request) -> JSONResponse:
            body = await request.json()
            key = request.headers.get("x-api-key")
            with self._lock:
                self.calls.append(Call(key, body))
                failure = self._failures.pop(0) if self._failures else None
                self.inflight += 1
                self.max_inflight = max(self.max_inflight, self.inflight)
            try:
                return await self._answer(body, key, failure)
            finally:
                with self._lock:
                    self.inflight -= 1

        @app.post("/images")
        async def images(request: Request) -> JSONResponse:
            body = await request.json()
            key = request.headers.get("x-api-key")
            with self._lock:
                self.calls.append(Call(key, body, "/images"))
            if self.expected_key is not None and key != self.expected_key:
                return JSONResponse({"message": "Unauthorized."}, status_code=403)
            return JSONResponse(self.images.get(body["q"], {"images": []}))

        return app

    async def _answer(
        self, body: dict[str, Any], key: str | None, failure: _Failure | None
    ) -> JSONResponse:
        await asyncio.sleep(0.02)  # long enough for concurrent calls to overlap
        if self.expected_key is not None and key != self.expected_key:
            return JSONResponse({"message": "Unauthorized.", "statusCode": 403}, status_code=403)
        if failure is not None and failure.delay_s:
            await asyncio.sleep(failure.delay_s)
        elif failure is not None:
            content = failure.body or {"message": f"fake failure {failure.status}"}
            return JSONResponse(content, status_code=failure.status, headers=failure.headers)
        query, num = body["q"], int(body.get("num", 10))
        if query in self.responses:
            return JSONResponse(self.responses[query])
        params = {k: body[k] for k in ("q", "num", "gl", "hl", "location") if k in body}
        return JSONResponse(
            {"searchParameters": {**params, "type": "search"}, "organic": organic(query, num)}
        )
