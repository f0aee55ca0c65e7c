"""The FastAPI app on :mod:`mia.http` machinery: the reference's ``GET /search``,
``GET /image_search`` and ``GET /web_scrape`` (its envelope), our ``POST /search`` and
``GET /health``; one router per tool, composed by :func:`build_app`."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from fastapi import APIRouter, FastAPI, Query
from pydantic import ValidationError

from mia.http import ApiError, create_app
from mia.paths import mia_home
from mia.services.web import (
    DEFAULT_IMAGE_RESULTS,
    DEFAULT_MAX_RESULTS,
    MAX_RESULTS_LIMIT,
    TOOL_VERSION,
    Envelope,
    ImageSearchResult,
    ScrapeResult,
    SearchRequest,
    SearchResponse,
    SearchToolResult,
    check_query,
    check_url,
)
from web_tools.cache import SearchCache
from web_tools.config import ENGINES, WebToolsConfig
from web_tools.ddgs_engine import DdgsCall
from web_tools.retry import UpstreamError
from web_tools.service import SearchService

TITLE = "web_tools"
MAX_GOAL_CHARS = 2000


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


def _envelope(tool: str, result: Any, cached: bool) -> dict[str, Any]:
    return {
        "request_id": uuid.uuid4().hex,
        "tool": {"name": tool, "version": TOOL_VERSION},
        "result": result,
        "stat": {"cache": "HIT" if cached else "MISS"},
    }


def _engine(engine: str | None) -> str | None:
    if engine is not None and engine not in ENGINES:
        raise ApiError(422, f"engine {engine!r} is not supported; use one of {', '.join(ENGINES)}")
    return engine


ENGINE_HELP = "serper or ddgs; default: the gateway's default_engine"
DETERMINISTIC_HELP = "true: answer only from the cache (a miss is 404 not_cached), as the reference"


def build_app(
    config: WebToolsConfig | None = None,
    *,
    serper_key: str | None = None,
    token: str | None = None,
    max_body_bytes: int = 1024 * 1024,
    clock: Callable[[], float] = time.time,
    ddgs_call: DdgsCall | None = None,
) -> FastAPI:
    """The gateway app. ``serper_key`` is passed in (read from ``SERPER_KEY_ID`` by the CLI) so
    the key never sits in the config; ``clock`` drives the cache TTL and ``ddgs_call`` replaces
    ddgs' network call (tests inject both)."""
    config = (config or WebToolsConfig()).validate()
    service = SearchService(
        config, serper_key, cache=open_cache(config, clock), ddgs_call=ddgs_call
    )
    app = create_app(TITLE, token=token, max_body_bytes=max_body_bytes, health=service.health)
    app.state.service = service
    _close_on_shutdown(app, service)
    for router in (search_routes(service), image_search_routes(service), scrape_routes(service)):
        app.include_router(router)
    return app


def _close_on_shutdown(app: FastAPI, service: SearchService) -> None:
    """Wrap the app's lifespan so that shutdown closes the service's clients and its cache."""
    inner_lifespan = app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(app_: FastAPI) -> AsyncIterator[None]:
        async with inner_lifespan(app_):
            yield
        await service.aclose()
        if service.cache is not None:
            service.cache.close()

    app.router.lifespan_context = lifespan


@contextlib.asynccontextmanager
async def _upstream_errors() -> AsyncIterator[None]:
    """An upstream failure (engine, page) as the API error of its status and code."""
    try:
        yield
    except UpstreamError as err:
        raise ApiError(err.status, err.message, err.code) from None


def search_routes(service: SearchService) -> APIRouter:
    """``GET /search`` (the reference's envelope, one query or several) and ``POST /search``
    (our typed request and response)."""
    router = APIRouter()

    @router.get(
        "/search",
        response_model=Envelope[SearchToolResult],
        response_model_exclude_none=True,
        summary="The reference's search: its envelope, one query or several",
    )
    async def search_get(
        q: list[str] = Query(description="query; repeat for several: ?q=a&q=b"),
        max_results: int = Query(DEFAULT_MAX_RESULTS, description="1..10 results per query"),
        engine: str | None = Query(None, description=ENGINE_HELP),
        deterministic: bool = Query(False, description=DETERMINISTIC_HELP),
    ) -> dict[str, Any]:
        try:
            request = SearchRequest(queries=q, max_results=max_results, engine=_engine(engine))
        except ValidationError as err:
            raise ApiError(422, _validation_message(err, {"queries": "q"})) from None
        started = time.perf_counter()
        async with _upstream_errors():
            per_query = await service.search(
                request.queries, request.max_results, request.engine, cached_only=deterministic
            )
        result = SearchToolResult.build(
            service.engine_name(request.engine),
            per_query,
            round((time.perf_counter() - started) * 1000, 1),
            single=len(per_query) == 1,
        )
        return _envelope("search", result, all(e.cached for e in per_query))

    @router.post("/search", response_model=SearchResponse, response_model_exclude_none=True)
    async def search_post(request: SearchRequest) -> SearchResponse:
        async with _upstream_errors():
            per_query = await service.search(request.queries, request.max_results, request.engine)
        return SearchResponse.build(per_query)

    return router


def image_search_routes(service: SearchService) -> APIRouter:
    """``GET /image_search``: images for one query, in the reference's envelope."""
    router = APIRouter()

    @router.get(
        "/image_search",
        response_model=Envelope[ImageSearchResult],
        response_model_exclude_none=True,
        summary="Images for a query, downloaded and resized, in the reference's envelope",
    )
    async def image_search(
        q: str = Query(description="one query"),
        max_results: int = Query(DEFAULT_IMAGE_RESULTS, description="1..10 images"),
        engine: str | None = Query(None, description=ENGINE_HELP),
        deterministic: bool = Query(False, description=DETERMINISTIC_HELP),
    ) -> dict[str, Any]:
        try:
            check_query(q)
        except ValueError as err:
            raise ApiError(422, f"q: {err}") from None
        if not 1 <= max_results <= MAX_RESULTS_LIMIT:
            raise ApiError(422, f"max_results: must be in 1..{MAX_RESULTS_LIMIT}")
        async with _upstream_errors():
            result, cached = await service.image_search(
                q, max_results, _engine(engine), cached_only=deterministic
            )
        return _envelope("image_search", result, cached)

    return router


def scrape_routes(service: SearchService) -> APIRouter:
    """``GET /web_scrape``: a page's main content, in the reference's envelope."""
    router = APIRouter()

    @router.get(
        "/web_scrape",
        response_model=Envelope[ScrapeResult],
        response_model_exclude_none=True,
        summary="A page's main content as Markdown (trafilatura), in the reference's envelope",
    )
    async def web_scrape(
        url: str = Query(description="absolute http(s) URL"),
        goal: str | None = Query(None, description="accepted and echoed (no LLM extraction)"),
        deterministic: bool = Query(False, description=DETERMINISTIC_HELP),
    ) -> dict[str, Any]:
        try:
            url = check_url(url)
        except ValueError as err:
            raise ApiError(422, str(err)) from None
        if goal is not None and len(goal) > MAX_GOAL_CHARS:
            raise ApiError(422, f"goal has {len(goal)} characters (max {MAX_GOAL_CHARS})")
        async with _upstream_errors():
            result, cached = await service.scrape(url, goal, cached_only=deterministic)
        return _envelope("web_scrape", result, cached)

    return router
