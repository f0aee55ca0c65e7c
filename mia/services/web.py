"""The web_tools contract: request and response models of ``GET /search`` (one shape for one
query or many), shared by the gateway (``web_tools``) and its client, :class:`WebSearchClient`
(the agent's online ``search`` tool)."""

from __future__ import annotations

from typing import Any, Literal

import httpx
from pydantic import BaseModel, Field, field_validator

from mia.errors import MiaError

MAX_QUERY_CHARS = 400  # as the reference gateway
MAX_QUERIES = 32  # per request; larger batches should be split by the caller
MAX_RESULTS_LIMIT = 10
DEFAULT_MAX_RESULTS = 3  # the reference's default

ResultKind = Literal["answer_box", "knowledge_graph", "organic"]


class SearchResult(BaseModel):
    title: str
    url: str
    snippet: str
    # Only present when Serper gives one (organic results of news-like pages).
    date: str | None = None
    kind: ResultKind = "organic"


class QueryResults(BaseModel):
    query: str
    results: list[SearchResult]
    cached: bool = Field(description="served from the SQLite cache without calling Serper")


class SearchResponse(BaseModel):
    """Always ``queries`` (one entry per query, in request order).

    For a single query the same entry is repeated at the top level (``query``, ``results``,
    ``cached``) for convenience; for several queries those keys are absent.
    """

    queries: list[QueryResults]
    query: str | None = None
    results: list[SearchResult] | None = None
    cached: bool | None = None

    @classmethod
    def build(cls, per_query: list[QueryResults]) -> SearchResponse:
        if len(per_query) == 1:
            one = per_query[0]
            return cls(queries=per_query, query=one.query, results=one.results, cached=one.cached)
        return cls(queries=per_query)


class SearchRequest(BaseModel):
    """Body of ``POST /search``; ``GET /search?q=..&q=..&max_results=N`` is validated the same."""

    queries: list[str] = Field(min_length=1, max_length=MAX_QUERIES)
    max_results: int = Field(DEFAULT_MAX_RESULTS, ge=1, le=MAX_RESULTS_LIMIT)

    @field_validator("queries")
    @classmethod
    def _check_queries(cls, queries: list[str]) -> list[str]:
        for i, q in enumerate(queries):
            if not q.strip():
                raise ValueError(f"query {i} is empty")
            if len(q) > MAX_QUERY_CHARS:
                raise ValueError(f"query {i} has {len(q)} characters (max {MAX_QUERY_CHARS})")
        return queries


def normalise_query(query: str) -> str:
    """The form sent to Serper: surrounding and repeated whitespace removed."""
    return " ".join(query.split())


class WebSearchError(MiaError):
    """The gateway answered with its error envelope (or could not be reached)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"web search failed ({status} {code}): {message}")
        self.status = status
        self.code = code
        self.message = message


class WebSearchClient:
    """``await WebSearchClient(url).search(["q1", "q2"], 3)`` -> one result list per query.

    Each result is ``{"title", "url", "snippet", "kind", ["date"]}``. Batches larger than the
    gateway's per-request limit are split transparently. Use as ``async with`` or call
    :meth:`aclose`.
    """

    def __init__(self, base_url: str, token: str | None = None, timeout: float = 120.0) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.AsyncClient(
            base_url=base_url.rstrip("/"), headers=headers, timeout=timeout
        )

    async def search(
        self, queries: list[str], max_results: int = DEFAULT_MAX_RESULTS
    ) -> list[list[dict[str, Any]]]:
        out: list[list[dict[str, Any]]] = []
        for start in range(0, len(queries), MAX_QUERIES):
            chunk = queries[start : start + MAX_QUERIES]
            body = await self._post({"queries": chunk, "max_results": max_results})
            out += [entry["results"] for entry in body["queries"]]
        return out

    async def health(self) -> dict[str, Any]:
        try:
            resp = await self._http.get("/health")
        except httpx.HTTPError as err:
            raise WebSearchError(0, "unreachable", f"{type(err).__name__}: {err}") from None
        return resp.json()

    async def _post(self, payload: dict[str, Any]) -> dict[str, Any]:
        try:
            resp = await self._http.post("/search", json=payload)
        except httpx.HTTPError as err:
            raise WebSearchError(
                0, "unreachable", f"{self._http.base_url}: {type(err).__name__}: {err}"
            ) from None
        try:
            body = resp.json()
        except ValueError:
            body = None
        if resp.status_code != 200 or not isinstance(body, dict):
            error = body.get("error") if isinstance(body, dict) else None
            if isinstance(error, dict):
                raise WebSearchError(
                    resp.status_code, str(error.get("code")), str(error.get("message"))
                )
            raise WebSearchError(resp.status_code, "bad_response", resp.text[:200])
        return body

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> WebSearchClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
