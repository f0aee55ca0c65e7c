"""The FastAPI app: ``GET/POST /search`` and ``GET /health`` on :mod:`mia.http` machinery."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from fastapi import FastAPI, Query
from pydantic import ValidationError

from mia.http import ApiError, create_app
from mia.paths import mia_home
from mia.services.web import DEFAULT_MAX_RESULTS, SearchRequest, SearchResponse
from web_tools.cache import SearchCache
from web_tools.config import WebToolsConfig
from web_tools.serper import SerperError
from web_tools.service import SearchService

TITLE = "web_tools"


def default_cache_path() -> Path:
    return mia_home() / "web_tools" / "search_cache.sqlite"


def open_cache(
    config: WebToolsConfig, clock: Callable[[], float] = time.time
) -> SearchCache | None:
    if config.cache_path is not None and config.cache_path.strip().lower() == "none":
        return None
    path = Path(config.cache_path) if config.cache_path else default_cache_path()
    return SearchCache(path, config.ttl_s, clock=clock)


def _validation_message(err: ValidationError, rename: dict[str, str]) -> str:
    parts = []
    for e in err.errors()[:5]:
        loc = ".".join(rename.get(str(x), str(x)) for x in e.get("loc", ()))
        msg = str(e.get("msg", "invalid")).removeprefix("Value error, ")
        parts.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(parts)


def build_app(
    config: WebToolsConfig | None = None,
    *,
    serper_key: str | None = None,
    token: str | None = None,
    max_body_bytes: int = 1024 * 1024,
    clock: Callable[[], float] = time.time,
) -> FastAPI:
    """The gateway app. ``serper_key`` is passed in (read from ``SERPER_KEY_ID`` by the CLI) so
    the key never sits in the config; ``clock`` drives the cache TTL (tests inject one)."""
    config = (config or WebToolsConfig()).validate()
    service = SearchService(config, serper_key, cache=open_cache(config, clock))
    app = create_app(TITLE, token=token, max_body_bytes=max_body_bytes, health=service.health)
    app.state.service = service

    inner_lifespan = app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(app_: FastAPI) -> AsyncIterator[None]:
        async with inner_lifespan(app_):
            yield
        await service.aclose()
        if service.cache is not None:
            service.cache.close()

    app.router.lifespan_context = lifespan

    async def run(request: SearchRequest) -> SearchResponse:
        try:
            return await service.search(request.queries, request.max_results)
        except SerperError as err:
            raise ApiError(err.status, err.message, err.code) from None

    @app.get("/search", response_model=SearchResponse, response_model_exclude_none=True)
    async def search_get(
        q: list[str] = Query(description="query; repeat for several: ?q=a&q=b"),
        max_results: int = Query(DEFAULT_MAX_RESULTS, description="1..10 results per query"),
        engine: str = Query("serper", description="accepted for reference compatibility"),
    ) -> SearchResponse:
        if engine != "serper":
            raise ApiError(422, f"engine {engine!r} is not supported; only 'serper'")
        try:
            request = SearchRequest(queries=q, max_results=max_results)
        except ValidationError as err:
            raise ApiError(422, _validation_message(err, {"queries": "q"})) from None
        return await run(request)

    @app.post("/search", response_model=SearchResponse, response_model_exclude_none=True)
    async def search_post(request: SearchRequest) -> SearchResponse:
        return await run(request)

    return app
