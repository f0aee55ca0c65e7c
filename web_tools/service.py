"""The gateway's tools: search, image search and page scraping, each cache first, then the
upstream (deduplicated while in flight; rate limited, capped and retried by one
:class:`~web_tools.retry.Upstream`)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from mia.services.web import (
    Engine,
    ImageResult,
    ImageSearchResult,
    ImageStat,
    QueryResults,
    ScrapeResult,
    SearchResult,
    normalise_query,
)
from web_tools.cache import CACHE_VERSION, SearchCache, cache_key
from web_tools.config import WebToolsConfig
from web_tools.ddgs_engine import DdgsCall, DdgsEngine, real_ddgs_call
from web_tools.fetch import encode_image, extract_markdown, fetch, is_html
from web_tools.ratelimit import TokenBucket
from web_tools.retry import RetryPolicy, Upstream, UpstreamError
from web_tools.serper import Locale, SerperClient, detect_locale, parse_images, parse_response
from web_tools.ssrf import guarded_client

log = logging.getLogger("web_tools")

MISSING_KEY_MESSAGE = (
    "SERPER_KEY_ID is not set: export your Serper API key (https://serper.dev) as SERPER_KEY_ID "
    "before starting web_tools; cached results are still served"
)


@dataclass
class Stats:
    requests: int = 0
    queries: int = 0
    cache_hits: int = 0
    serper_calls: int = 0  # HTTP calls, retries included
    ddgs_calls: int = 0  # ddgs calls, retries included
    fetches: int = 0  # page and image GETs, retries included
    errors: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


@dataclass
class Lookup:
    value: Any
    cached: bool


def tool_key(tool: str, *parts: Any) -> str:
    """Cache key of a non-search tool (case kept: URL paths are case-sensitive)."""
    material = json.dumps([CACHE_VERSION, tool, *parts])
    return hashlib.sha256(material.encode("utf-8")).hexdigest()


@dataclass
class SearchService:
    config: WebToolsConfig
    serper_key: str | None
    cache: SearchCache | None = None
    sleep: Callable[[float], Awaitable[object]] = asyncio.sleep
    ddgs_call: DdgsCall | None = None  # None = the real ddgs (tests inject a fake)
    stats: Stats = field(default_factory=Stats)

    def __post_init__(self) -> None:
        cfg = self.config
        self._http: httpx.AsyncClient | None = None  # Serper: the operator's URL
        self._fetch_http: httpx.AsyncClient | None = None  # pages and images: callers' URLs
        self._serper: SerperClient | None = None
        self._ddgs: DdgsEngine | None = None
        retry = RetryPolicy(
            cfg.max_retries, cfg.backoff_base_s, cfg.backoff_max_s, cfg.retry_after_max_s
        )
        self._upstream_args = (TokenBucket(cfg.rate_limit_qps, cfg.rate_limit_burst), retry)
        self._upstream: Upstream | None = None
        # Identical lookups in flight share one upstream call (two agents asking the same thing).
        self._inflight: dict[str, asyncio.Task[Any]] = {}

    @property
    def serper_configured(self) -> bool:
        return bool(self.serper_key)

    def _count_call(self, kind: str) -> None:
        if kind == "serper":
            self.stats.serper_calls += 1
        elif kind == "ddgs":
            self.stats.ddgs_calls += 1
        else:
            self.stats.fetches += 1

    def _client(self) -> httpx.AsyncClient:
        # Created on first use so the httpx pool (and the semaphore) belong to the serving loop.
        if self._http is None:
            cfg = self.config
            self._http = httpx.AsyncClient(
                limits=httpx.Limits(max_connections=cfg.max_concurrency),
                headers={"User-Agent": cfg.user_agent},
                max_redirects=5,
            )
            limiter, retry = self._upstream_args
            self._upstream = Upstream(
                limiter, cfg.max_concurrency, retry, sleep=self.sleep, on_call=self._count_call
            )
        return self._http

    def _fetch_client(self) -> httpx.AsyncClient:
        # A client of its own: callers choose these URLs, so only public addresses (and the
        # operator's fetch_allow_hosts) may be reached; Serper's client is not restricted.
        if self._fetch_http is None:
            cfg = self.config
            self._fetch_http = guarded_client(
                cfg.fetch_allow_hosts,
                max_connections=cfg.max_concurrency,
                user_agent=cfg.user_agent,
            )
        return self._fetch_http

    def _up(self) -> Upstream:
        self._client()
        assert self._upstream is not None
        return self._upstream

    def _serper_client(self) -> SerperClient:
        if self._serper is None:
            cfg = self.config
            self._serper = SerperClient(
                cfg.serper_url,
                self.serper_key or "",
                self._client(),
                self._up(),
                timeout_s=cfg.timeout_s,
                images_url=cfg.serper_images_url,
            )
        return self._serper

    def _ddgs_engine(self) -> DdgsEngine:
        if self._ddgs is None:
            cfg = self.config
            call = self.ddgs_call or real_ddgs_call(cfg.timeout_s)
            self._ddgs = DdgsEngine(
                call, self._up(), backend=cfg.ddgs_backend, timeout_s=cfg.timeout_s
            )
        return self._ddgs

    def engine_name(self, engine: str | None) -> Engine:
        name = engine or self.config.default_engine
        assert name in ("serper", "ddgs"), name  # requests are validated, so is the config
        return name  # type: ignore[return-value]

    def _need_key(self, engine: Engine) -> None:
        if engine == "serper" and not self.serper_configured:
            raise UpstreamError(503, "unavailable", MISSING_KEY_MESSAGE)

    async def aclose(self) -> None:
        if self._fetch_http is not None:
            await self._fetch_http.aclose()
            self._fetch_http = None
        if self._http is not None:
            await self._http.aclose()
            self._http = None
            self._serper = None
            self._ddgs = None

    # --- the cache-first lookup shared by every tool -----------------------------------------

    async def _cached(
        self,
        key: str,
        label: tuple[str, int, str],
        fetch_value: Callable[[], Awaitable[Any]],
        *,
        cached_only: bool = False,
        precheck: Callable[[], None] | None = None,
    ) -> Lookup:
        """The cached value of ``key``, or ``fetch_value()`` stored under it. ``label`` is the
        (query or URL, count, kind) kept in the row for people reading the cache file."""
        if self.cache is not None:
            hit = await asyncio.to_thread(self.cache.get, key)
            if hit is not None:
                self.stats.cache_hits += 1
                return Lookup(hit, cached=True)
        if cached_only:
            raise UpstreamError(
                404, "not_cached", f"deterministic=true and {label[0]!r} is not in the cache"
            )
        if precheck is not None:
            precheck()
        task = self._inflight.get(key)
        if task is None:
            task = asyncio.ensure_future(self._fetch_and_store(key, label, fetch_value))
            self._inflight[key] = task
            task.add_done_callback(lambda t: self._finished(key, t))
        # shield: one caller going away must not cancel the call others are waiting for.
        return Lookup(await asyncio.shield(task), cached=False)

    async def _fetch_and_store(
        self, key: str, label: tuple[str, int, str], fetch_value: Callable[[], Awaitable[Any]]
    ) -> Any:
        value = await fetch_value()
        if self.cache is not None:
            await asyncio.to_thread(self.cache.put, key, *label, value)
        return value

    def _finished(self, key: str, task: asyncio.Task[Any]) -> None:
        self._inflight.pop(key, None)
        if not task.cancelled():
            task.exception()  # mark retrieved: waiters that went away must not warn about it

    async def _counted(self, work: Awaitable[Any]) -> Any:
        try:
            return await work
        except UpstreamError:
            self.stats.errors += 1
            raise

    # --- search --------------------------------------------------------------------------------

    async def search(
        self,
        queries: list[str],
        max_results: int,
        engine: str | None = None,
        *,
        cached_only: bool = False,
    ) -> list[QueryResults]:
        """Results for every query, in order. Any failing query fails the whole request (the
        others are cached, so a retry by the caller is cheap)."""
        name = self.engine_name(engine)
        self.stats.requests += 1
        self.stats.queries += len(queries)
        started = time.perf_counter()
        lookups = await self._counted(
            asyncio.gather(*(self._lookup(q, max_results, name, cached_only) for q in queries))
        )
        log.info(
            "search (%s): %d queries, %d cached, %.0f ms",
            name,
            len(queries),
            sum(lk.cached for lk in lookups),
            (time.perf_counter() - started) * 1000,
        )
        return [
            QueryResults(query=q, results=[SearchResult(**r) for r in lk.value], cached=lk.cached)
            for q, lk in zip(queries, lookups, strict=True)
        ]

    async def _lookup(self, query: str, max_results: int, engine: Engine, cached_only: bool):
        text = normalise_query(query)
        locale = detect_locale(text)
        # Serper rows keep their original key (no engine in it): caches made before ddgs
        # existed stay valid.
        where = locale.name if engine == "serper" else f"{engine}-{locale.name}"
        return await self._cached(
            cache_key(text, max_results, where),
            (text, max_results, where),
            lambda: self._fetch_text(engine, text, max_results, locale),
            cached_only=cached_only,
            precheck=lambda: self._need_key(engine),
        )

    async def _fetch_text(
        self, engine: Engine, text: str, max_results: int, locale: Locale
    ) -> list[dict[str, Any]]:
        if engine == "ddgs":
            return await self._ddgs_engine().text(text, max_results, locale)
        cfg = self.config
        data = await self._serper_client().search(text, max_results)
        return parse_response(
            data,
            text,
            max_results,
            include_answer_box=cfg.include_answer_box,
            include_knowledge_graph=cfg.include_knowledge_graph,
        )

    # --- image search ----------------------------------------------------------------------

    async def image_search(
        self, query: str, max_results: int, engine: str | None = None, *, cached_only=False
    ) -> tuple[ImageSearchResult, bool]:
        """The engine's images for ``query``, downloaded, resized and base64-encoded; images
        that cannot be fetched or decoded are dropped (``stat`` counts them)."""
        name = self.engine_name(engine)
        self.stats.requests += 1
        self.stats.queries += 1
        started = time.perf_counter()
        text = normalise_query(query)
        locale = detect_locale(text)
        size = self.config.image_size
        lookup = await self._counted(
            self._cached(
                tool_key("image_search", name, text.casefold(), max_results, locale.name, size),
                (text, max_results, f"images-{name}-{locale.name}"),
                lambda: self._fetch_images(name, text, max_results, locale),
                cached_only=cached_only,
                precheck=lambda: self._need_key(name),
            )
        )
        value = lookup.value
        result = ImageSearchResult(
            text="\n".join(r["title"] for r in value["results"]),
            images=value["images"],
            stat=ImageStat(found=value["found"], returned=len(value["images"])),
            engine=name,
            query=query,
            results=[ImageResult(**r) for r in value["results"]],
            latency_ms=round((time.perf_counter() - started) * 1000, 1),
        )
        return result, lookup.cached

    async def _fetch_images(
        self, engine: Engine, text: str, max_results: int, locale: Locale
    ) -> dict[str, Any]:
        if engine == "ddgs":
            items = await self._ddgs_engine().images(text, max_results, locale)
        else:
            items = parse_images(await self._serper_client().images(text, max_results), max_results)
        encoded = await asyncio.gather(*(self._one_image(item) for item in items))
        kept = [(item, enc) for item, enc in zip(items, encoded, strict=True) if enc is not None]
        return {
            "found": len(items),
            "images": [enc[0] for _, enc in kept],
            "results": [{**item, "width": enc[1], "height": enc[2]} for item, enc in kept],
        }

    async def _one_image(self, item: dict[str, Any]) -> tuple[str, int, int] | None:
        url = item["image_url"]
        if not url.lower().startswith(("http://", "https://")):
            return None
        cfg = self.config
        try:
            got = await fetch(
                self._fetch_client(),
                self._up(),
                url,
                max_bytes=cfg.image_max_bytes,
                timeout_s=cfg.timeout_s,
                what="image",
            )
        except UpstreamError as err:
            log.info("image dropped: %s", err.message)
            return None
        encoded = await asyncio.to_thread(encode_image, got.body, cfg.image_size)
        if encoded is None:
            log.info("image dropped: %s is not a decodable image", url)
        return encoded

    # --- scrape ----------------------------------------------------------------------------

    async def scrape(
        self, url: str, goal: str | None = None, *, cached_only: bool = False
    ) -> tuple[ScrapeResult, bool]:
        """The page's main content as Markdown (trafilatura)."""
        self.stats.requests += 1
        started = time.perf_counter()
        lookup = await self._counted(
            self._cached(
                tool_key("web_scrape", url),
                (url, 0, "web_scrape"),
                lambda: self._fetch_page(url),
                cached_only=cached_only,
            )
        )
        page = lookup.value
        result = ScrapeResult(
            success=bool(page["markdown"]),
            url=url,
            markdown_content=page["markdown"],
            latency_ms=round((time.perf_counter() - started) * 1000, 1),
            final_url=page["final_url"],
            title=page["title"],
            content_type=page["content_type"],
            goal=goal,
        )
        return result, lookup.cached

    async def _fetch_page(self, url: str) -> dict[str, Any]:
        cfg = self.config
        got = await fetch(
            self._fetch_client(),
            self._up(),
            url,
            max_bytes=cfg.scrape_max_bytes,
            timeout_s=cfg.timeout_s,
        )
        if not is_html(got):
            what = got.content_type or "undeclared content that does not look like HTML"
            raise UpstreamError(415, "not_html", f"{url} is not an HTML page ({what})")
        extracted = await asyncio.to_thread(extract_markdown, got)
        return {"final_url": got.url, "content_type": got.content_type, **extracted}

    def health(self) -> dict[str, Any]:
        return {
            "serper_configured": self.serper_configured,
            "serper_url": self.config.serper_url,
            "default_engine": self.config.default_engine,
            "cache": None
            if self.cache is None
            else {"path": str(self.cache.path), "entries": self.cache.count()},
            "stats": self.stats.as_dict(),
        }
