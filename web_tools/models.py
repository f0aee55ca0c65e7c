"""Request and response models of ``/search`` (one shape for one query or many)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, field_validator

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
