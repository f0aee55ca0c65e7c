"""The keyless ``ddgs`` engine (the reference gateway's default), behind a small adapter.

``ddgs`` scrapes public search pages (Brave, DuckDuckGo, Bing, ...) at URLs it hard-codes, so it
cannot be pointed at a local fake. The adapter therefore takes its one network call as a
parameter, :data:`DdgsCall` -- ``call(kind, query, kwargs)`` returning ddgs' own result dicts --
and everything around that call is ours and tested: mapping ddgs' dicts to our results, mapping
its exceptions to retryable / final errors, the timeout, and the route end to end (the tests
inject a fake call; nothing reaches the internet). The real call imports ``ddgs`` lazily, so the
package is only needed when the engine is used (``pip install 'mia[web]'``).

ddgs' dicts (9.x): text ``{"title", "href", "body"}``; news-like text adds ``"date"``,
``"source"`` and uses ``"url"``; images ``{"title", "image", "thumbnail", "url", "height",
"width", "source"}``.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from typing import Any

from web_tools.retry import Upstream, UpstreamError
from web_tools.serper import Locale

DdgsCall = Callable[[str, str, dict[str, Any]], list[dict[str, Any]]]

INSTALL_HINT = "engine 'ddgs' needs the ddgs package: pip install 'mia[web]' (or pip install ddgs)"
# ddgs' region codes for our two locales (the reference picks Chinese by the same rule).
REGIONS = {"cn": "cn-zh", "us": "us-en"}


def real_ddgs_call(timeout_s: float) -> DdgsCall:
    """The call that really goes to the internet (never used by the tests)."""

    def call(kind: str, query: str, kwargs: dict[str, Any]) -> list[dict[str, Any]]:
        try:
            from ddgs import DDGS
        except ImportError:
            raise UpstreamError(503, "unavailable", INSTALL_HINT) from None
        return getattr(DDGS(timeout=max(1, math.ceil(timeout_s))), kind)(query, **kwargs)

    return call


def _text(value: Any) -> str:
    return value.strip() if isinstance(value, str) else ""


def parse_text(items: Any, max_results: int) -> list[dict[str, Any]]:
    """ddgs text/news dicts -> ``[{title, url, snippet, [date], [source], kind}]``."""
    out: list[dict[str, Any]] = []
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, dict):
            continue
        url = _text(item.get("href")) or _text(item.get("url"))
        if not url:
            continue
        result = {
            "title": _text(item.get("title")),
            "url": url,
            "snippet": _text(item.get("body")),
            "kind": "organic",
        }
        for name in ("date", "source"):
            if _text(item.get(name)):
                result[name] = _text(item.get(name))
        out.append(result)
    return out[:max_results]


def parse_images(items: Any, max_results: int) -> list[dict[str, Any]]:
    """ddgs image dicts -> ``[{title, image_url, source_url}]``."""
    out = []
    for item in items if isinstance(items, list) else []:
        if isinstance(item, dict) and _text(item.get("image")):
            out.append(
                {
                    "title": _text(item.get("title")),
                    "image_url": _text(item.get("image")),
                    "source_url": _text(item.get("url")),
                }
            )
    return out[:max_results]


def _map_error(err: Exception) -> UpstreamError | None:
    """ddgs' exceptions by class name (so a fake need not import ddgs); None = no results."""
    names = {cls.__name__ for cls in type(err).__mro__}
    text = f"{type(err).__name__}: {err}"[:300]
    if "RatelimitException" in names:
        return UpstreamError(
            502, "upstream_rate_limited", f"ddgs was rate limited: {text}", retryable=True
        )
    if "TimeoutException" in names:
        return UpstreamError(504, "upstream_timeout", f"ddgs timed out: {text}", retryable=True)
    if "DDGSException" in names and "no results found" in str(err).lower():
        return None  # ddgs raises when every backend came back empty: that is zero results
    return UpstreamError(502, "upstream_error", f"ddgs failed: {text}", retryable=True)


class DdgsEngine:
    """``text``/``images`` through ddgs, run in a worker thread (ddgs is synchronous) under the
    shared rate limit, concurrency cap and retry policy."""

    def __init__(
        self, call: DdgsCall, upstream: Upstream, *, backend: str, timeout_s: float
    ) -> None:
        self._call = call
        self._upstream = upstream
        self.backend = backend
        self._timeout_s = timeout_s

    async def _run(self, kind: str, query: str, kwargs: dict[str, Any]) -> list[dict[str, Any]]:
        async def attempt() -> list[dict[str, Any]]:
            try:
                # A little over ddgs' own per-request timeout: its engines run in parallel.
                return await asyncio.wait_for(
                    asyncio.to_thread(self._call, kind, query, kwargs), self._timeout_s * 2
                )
            except UpstreamError:
                raise
            except TimeoutError:
                raise UpstreamError(
                    504,
                    "upstream_timeout",
                    f"ddgs did not answer within {self._timeout_s * 2}s",
                    retryable=True,
                ) from None
            except Exception as err:  # ddgs and its HTTP stack raise many types
                mapped = _map_error(err)
                if mapped is None:
                    return []
                raise mapped from None

        return await self._upstream.run("ddgs", attempt)

    async def text(self, query: str, max_results: int, locale: Locale) -> list[dict[str, Any]]:
        kwargs = {"region": REGIONS[locale.name], "max_results": max_results}
        kwargs["backend"] = self.backend
        return parse_text(await self._run("text", query, kwargs), max_results)

    async def images(self, query: str, max_results: int, locale: Locale) -> list[dict[str, Any]]:
        kwargs = {"region": REGIONS[locale.name], "max_results": max_results}
        return parse_images(await self._run("images", query, kwargs), max_results)
