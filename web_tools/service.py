"""The search service: cache first, then Serper (deduplicated, rate limited, retried)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from mia.services.web import QueryResults, SearchResponse, SearchResult, normalise_query
from web_tools.cache import SearchCache, cache_key
from web_tools.config import WebToolsConfig
from web_tools.ratelimit import TokenBucket
from web_tools.serper import RetryPolicy, SerperClient, SerperError, detect_locale, parse_response

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
    errors: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


@dataclass
class _Lookup:
    results: list[dict[str, Any]]
    cached: bool


@dataclass
class SearchService:
    config: WebToolsConfig
    serper_key: str | None
    cache: SearchCache | None = None
    sleep: Callable[[float], Awaitable[object]] = asyncio.sleep
    stats: Stats = field(default_factory=Stats)

    def __post_init__(self) -> None:
        cfg = self.config
        self._http: httpx.AsyncClient | None = None
        self._serper: SerperClient | None = None
        self._limiter = TokenBucket(cfg.rate_limit_qps, cfg.rate_limit_burst)
        # Identical lookups in flight share one Serper call (two agents asking the same thing).
        self._inflight: dict[str, asyncio.Task[list[dict[str, Any]]]] = {}

    @property
    def serper_configured(self) -> bool:
        return bool(self.serper_key)

    def _client(self) -> SerperClient:
        # Created on first use so the httpx pool belongs to the serving event loop.
        if self._serper is None:
            cfg = self.config
            self._http = httpx.AsyncClient(
                limits=httpx.Limits(max_connections=cfg.max_concurrency),
                headers={"Content-Type": "application/json"},
            )
            self._serper = SerperClient(
                cfg.serper_url,
                self.serper_key or "",
                self._http,
                limiter=self._limiter,
                max_concurrency=cfg.max_concurrency,
                retry=RetryPolicy(
                    cfg.max_retries, cfg.backoff_base_s, cfg.backoff_max_s, cfg.retry_after_max_s
                ),
                timeout_s=cfg.timeout_s,
                sleep=self.sleep,
                on_call=self._count_call,
            )
        return self._serper

    def _count_call(self) -> None:
        self.stats.serper_calls += 1

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None
            self._serper = None

    async def search(self, queries: list[str], max_results: int) -> SearchResponse:
        """Results for every query, in order. Any failing query fails the whole request (the
        others are cached, so a retry by the caller is cheap)."""
        self.stats.requests += 1
        self.stats.queries += len(queries)
        started = time.perf_counter()
        try:
            lookups = await asyncio.gather(*(self._lookup(q, max_results) for q in queries))
        except SerperError:
            self.stats.errors += 1
            raise
        per_query = [
            QueryResults(
                query=q,
                results=[SearchResult(**r) for r in lk.results],
                cached=lk.cached,
            )
            for q, lk in zip(queries, lookups, strict=True)
        ]
        log.info(
            "search: %d queries, %d cached, %.0f ms",
            len(queries),
            sum(lk.cached for lk in lookups),
            (time.perf_counter() - started) * 1000,
        )
        return SearchResponse.build(per_query)

    async def _lookup(self, query: str, max_results: int) -> _Lookup:
        text = normalise_query(query)
        locale = detect_locale(text)
        key = cache_key(text, max_results, locale.name)
        if self.cache is not None:
            hit = await asyncio.to_thread(self.cache.get, key)
            if hit is not None:
                self.stats.cache_hits += 1
                return _Lookup(hit, cached=True)
        if not self.serper_configured:
            raise SerperError(503, "unavailable", MISSING_KEY_MESSAGE)
        task = self._inflight.get(key)
        if task is None:
            task = asyncio.ensure_future(self._fetch(key, text, max_results, locale.name))
            self._inflight[key] = task
            task.add_done_callback(lambda t: self._finished(key, t))
        # shield: one caller going away must not cancel the call others are waiting for.
        return _Lookup(await asyncio.shield(task), cached=False)

    def _finished(self, key: str, task: asyncio.Task[list[dict[str, Any]]]) -> None:
        self._inflight.pop(key, None)
        if not task.cancelled():
            task.exception()  # mark retrieved: waiters that went away must not warn about it

    async def _fetch(
        self, key: str, text: str, max_results: int, locale: str
    ) -> list[dict[str, Any]]:
        cfg = self.config
        data = await self._client().search(text, max_results)
        results = parse_response(
            data,
            text,
            max_results,
            include_answer_box=cfg.include_answer_box,
            include_knowledge_graph=cfg.include_knowledge_graph,
        )
        if self.cache is not None:
            await asyncio.to_thread(self.cache.put, key, text, max_results, locale, results)
        return results

    def health(self) -> dict[str, Any]:
        return {
            "serper_configured": self.serper_configured,
            "serper_url": self.config.serper_url,
            "cache": None
            if self.cache is None
            else {"path": str(self.cache.path), "entries": self.cache.count()},
            "stats": self.stats.as_dict(),
        }
