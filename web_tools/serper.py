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

from dataclasses import dataclass
from typing import Any

import httpx

from web_tools.retry import (  # noqa: F401  (re-exported: the helpers used to live here)
    RetryPolicy,
    Upstream,
    UpstreamError,
    parse_retry_after,
    retry_delay,
)


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


# Serper failures are upstream failures like any other (kept under its old name).
SerperError = UpstreamError


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


def parse_images(data: Any, max_results: int) -> list[dict[str, Any]]:
    """Serper ``/images`` JSON (``{"images": [{"title", "imageUrl", "imageWidth",
    "imageHeight", "link", ...}]}``) -> ``[{title, image_url, source_url}]``."""
    if not isinstance(data, dict):
        raise SerperError(502, "upstream_error", "Serper answered with JSON that is not an object")
    images = data.get("images")
    out = []
    for entry in images if isinstance(images, list) else []:
        if isinstance(entry, dict) and _text(entry.get("imageUrl")):
            out.append(
                {
                    "title": _text(entry.get("title")),
                    "image_url": _text(entry.get("imageUrl")),
                    "source_url": _text(entry.get("link")),
                }
            )
    return out[:max_results]


class SerperClient:
    """One search = one or more POSTs to Serper (retries), each through the shared
    :class:`~web_tools.retry.Upstream` (rate limit, concurrency cap, retry policy)."""

    def __init__(
        self,
        url: str,
        key: str,
        http: httpx.AsyncClient,
        upstream: Upstream,
        *,
        timeout_s: float,
        images_url: str | None = None,
    ) -> None:
        self.url = url
        self.images_url = images_url
        self._key = key
        self._http = http
        self._upstream = upstream
        self._timeout_s = timeout_s

    def _scrub(self, text: str) -> str:
        return text.replace(self._key, "***") if self._key else text

    async def search(self, query: str, max_results: int) -> dict[str, Any]:
        """Serper's JSON for ``query``; raises :class:`SerperError` once retries are spent."""
        return await self._post(self.url, build_payload(query, max_results))

    async def images(self, query: str, max_results: int) -> dict[str, Any]:
        """Serper's image search JSON (``images_url``) for ``query``."""
        if not self.images_url:
            raise SerperError(503, "unavailable", "no Serper image endpoint configured")
        return await self._post(self.images_url, build_payload(query, max_results))

    async def _post(self, url: str, payload: dict[str, Any]) -> dict[str, Any]:
        async def attempt() -> dict[str, Any]:
            try:
                resp = await self._http.post(
                    url, json=payload, headers={"X-API-KEY": self._key}, timeout=self._timeout_s
                )
            except httpx.TimeoutException:
                raise SerperError(
                    504,
                    "upstream_timeout",
                    f"Serper did not answer within {self._timeout_s}s",
                    retryable=True,
                ) from None
            except httpx.TransportError as err:
                raise SerperError(
                    502,
                    "upstream_error",
                    f"cannot reach Serper at {url}: {type(err).__name__}: {self._scrub(str(err))}",
                    retryable=True,
                ) from None
            return self._answer(resp)

        return await self._upstream.run("serper", attempt)

    def _answer(self, resp: httpx.Response) -> dict[str, Any]:
        if resp.status_code == 200:
            try:
                return resp.json()
            except ValueError:
                raise SerperError(
                    502, "upstream_error", "Serper answered 200 with a body that is not JSON"
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
        raise SerperError(
            502,
            "upstream_rate_limited" if resp.status_code == 429 else "upstream_error",
            f"Serper answered HTTP {resp.status_code}{detail}",
            retryable=True,
            retry_after=parse_retry_after(resp.headers.get("retry-after")),
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
