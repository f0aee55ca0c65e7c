"""Talking to Serper (``POST /search``): payload, response mapping, retries.

Serper's answer (the fields we read; everything else is ignored)::

    {"answerBox": {"title", "answer", "snippet", "snippetHighlighted": [..], "link"},
     "knowledgeGraph": {"title", "type", "website", "description", "descriptionLink",
                        "attributes": {name: value}},
     "organic": [{"title", "link", "snippet", "date", "position", ...}], ...}

The key travels only in the ``X-API-KEY`` header; any upstream text we quote in an error is
scrubbed of it first.
"""

from __future__ import annotations

import asyncio
import email.utils
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx

from web_tools.ratelimit import TokenBucket

log = logging.getLogger("web_tools.serper")


@dataclass(frozen=True)
class Locale:
    name: str  # part of the cache key
    params: dict[str, str]


# As the reference: a query with any CJK Unified Ideograph is searched from China in Chinese.
LOCALE_CN = Locale("cn", {"gl": "cn", "hl": "zh-cn", "location": "China"})
LOCALE_US = Locale("us", {"gl": "us", "hl": "en"})


def detect_locale(query: str) -> Locale:
    return LOCALE_CN if any("\u4e00" <= ch <= "\u9fff" for ch in query) else LOCALE_US


def build_payload(query: str, num: int) -> dict[str, Any]:
    return {"q": query, "num": num, **detect_locale(query).params}


class SerperError(Exception):
    """A failed search, already mapped to the status and error code we answer with."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


def _text(value: Any) -> str:
    return value.strip() if isinstance(value, str) else ""


def _answer_box(box: dict[str, Any], query: str) -> dict[str, Any] | None:
    parts = [_text(box.get("answer")), _text(box.get("snippet"))]
    highlighted = box.get("snippetHighlighted")
    if not any(parts) and isinstance(highlighted, list):
        parts = [", ".join(_text(h) for h in highlighted if _text(h))]
    parts = list(dict.fromkeys(p for p in parts if p))  # drop empties and repeats
    if not parts:
        return None
    return {
        "title": _text(box.get("title")) or query,
        "url": _text(box.get("link")),
        "snippet": "; ".join(parts),
        "kind": "answer_box",
    }


def _knowledge_graph(graph: dict[str, Any]) -> dict[str, Any] | None:
    title = _text(graph.get("title"))
    if not title:
        return None
    kind = _text(graph.get("type"))
    parts = [_text(graph.get("description"))]
    attributes = graph.get("attributes")
    if isinstance(attributes, dict):
        parts += [f"{_text(k) or k}: {_text(v)}" for k, v in attributes.items() if _text(v)]
    return {
        "title": f"{title} ({kind})" if kind else title,
        "url": _text(graph.get("website")) or _text(graph.get("descriptionLink")),
        "snippet": "; ".join(p for p in parts if p),
        "kind": "knowledge_graph",
    }


def parse_response(
    data: Any,
    query: str,
    max_results: int,
    *,
    include_answer_box: bool = True,
    include_knowledge_graph: bool = True,
) -> list[dict[str, Any]]:
    """Serper JSON -> ``[{title, url, snippet, [date], kind}]``, at most ``max_results``.

    The answer box and the knowledge graph (when present and enabled) come first and count
    towards ``max_results``; organic results follow in Serper's order.
    """
    if not isinstance(data, dict):
        raise SerperError(502, "upstream_error", "Serper answered with JSON that is not an object")
    results: list[dict[str, Any]] = []
    box = data.get("answerBox")
    if include_answer_box and isinstance(box, dict) and (item := _answer_box(box, query)):
        results.append(item)
    graph = data.get("knowledgeGraph")
    if include_knowledge_graph and isinstance(graph, dict) and (item := _knowledge_graph(graph)):
        results.append(item)
    organic = data.get("organic")
    for entry in organic if isinstance(organic, list) else []:
        if not isinstance(entry, dict) or not _text(entry.get("link")):
            continue
        item = {
            "title": _text(entry.get("title")),
            "url": _text(entry.get("link")),
            "snippet": _text(entry.get("snippet")),
            "kind": "organic",
        }
        if _text(entry.get("date")):
            item["date"] = _text(entry.get("date"))
        results.append(item)
    return results[:max_results]


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or an HTTP date)."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def retry_delay(
    attempt: int,
    retry_after: float | None,
    *,
    base: float,
    cap: float,
    retry_after_cap: float,
) -> float:
    """Wait before retry number ``attempt + 1``: Retry-After when given, else jittered backoff."""
    if retry_after is not None:
        return min(retry_after, retry_after_cap)
    backoff = min(cap, base * (2**attempt))
    return backoff * random.uniform(0.8, 1.0)  # jitter so parallel retries do not align


@dataclass
class RetryPolicy:
    max_retries: int = 3
    backoff_base_s: float = 0.5
    backoff_max_s: float = 8.0
    retry_after_max_s: float = 30.0


class SerperClient:
    """One search = one or more POSTs to Serper (retries), each through the rate limiter and
    the concurrency cap."""

    def __init__(
        self,
        url: str,
        key: str,
        http: httpx.AsyncClient,
        *,
        limiter: TokenBucket,
        max_concurrency: int,
        retry: RetryPolicy,
        timeout_s: float,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
        on_call: Callable[[], None] | None = None,
    ) -> None:
        self.url = url
        self._key = key
        self._http = http
        self._limiter = limiter
        self._slots = asyncio.Semaphore(max_concurrency)
        self._retry = retry
        self._timeout_s = timeout_s
        self._sleep = sleep
        self._on_call = on_call

    def _scrub(self, text: str) -> str:
        return text.replace(self._key, "***") if self._key else text

    async def search(self, query: str, max_results: int) -> dict[str, Any]:
        """Serper's JSON for ``query``; raises :class:`SerperError` once retries are spent."""
        payload = build_payload(query, max_results)
        last: SerperError | None = None
        for attempt in range(self._retry.max_retries + 1):
            retry_after: float | None = None
            await self._limiter.acquire()
            async with self._slots:
                if self._on_call is not None:
                    self._on_call()
                try:
                    resp = await self._http.post(
                        self.url,
                        json=payload,
                        headers={"X-API-KEY": self._key},
                        timeout=self._timeout_s,
                    )
                except httpx.TimeoutException:
                    resp = None
                    last = SerperError(
                        504, "upstream_timeout", f"Serper did not answer within {self._timeout_s}s"
                    )
                except httpx.TransportError as err:
                    resp = None
                    last = SerperError(
                        502,
                        "upstream_error",
                        f"cannot reach Serper at {self.url}: "
                        f"{type(err).__name__}: {self._scrub(str(err))}",
                    )
            if resp is not None:
                if resp.status_code == 200:
                    try:
                        return resp.json()
                    except ValueError:
                        raise SerperError(
                            502,
                            "upstream_error",
                            "Serper answered 200 with a body that is not JSON",
                        ) from None
                detail = self._detail(resp)
                if resp.status_code in (401, 403):
                    raise SerperError(
                        502,
                        "upstream_auth",
                        f"Serper rejected the API key (HTTP {resp.status_code}{detail}); "
                        "check SERPER_KEY_ID",
                    )
                if resp.status_code != 429 and resp.status_code < 500:
                    raise SerperError(
                        502,
                        "upstream_error",
                        f"Serper refused the request (HTTP {resp.status_code}{detail})",
                    )
                retry_after = parse_retry_after(resp.headers.get("retry-after"))
                last = SerperError(
                    502,
                    "upstream_rate_limited" if resp.status_code == 429 else "upstream_error",
                    f"Serper answered HTTP {resp.status_code}{detail}",
                )
            assert last is not None
            if attempt < self._retry.max_retries:
                delay = retry_delay(
                    attempt,
                    retry_after,
                    base=self._retry.backoff_base_s,
                    cap=self._retry.backoff_max_s,
                    retry_after_cap=self._retry.retry_after_max_s,
                )
                log.info(
                    "serper attempt %d failed (%s); retrying in %.2fs", attempt + 1, last, delay
                )
                await self._sleep(delay)
        assert last is not None
        raise SerperError(
            last.status, last.code, f"{last.message} (after {self._retry.max_retries + 1} attempts)"
        )

    def _detail(self, resp: httpx.Response) -> str:
        """A short quote of Serper's error message (``{"message": ...}``), key scrubbed."""
        try:
            body = resp.json()
            text = body.get("message") if isinstance(body, dict) else None
        except ValueError:
            text = resp.text
        text = self._scrub(str(text or "").strip())[:200]
        return f": {text}" if text else ""
