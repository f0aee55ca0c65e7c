"""The web_tools contract, shared by the gateway (``web_tools``) and its client,
:class:`WebSearchClient` (the agent's online ``search`` tool).

Two families of routes (docs/web_tools.md):

- the reference's ``GET /search``, ``GET /image_search`` and ``GET /web_scrape`` answer its
  envelope :class:`Envelope` (``request_id``, ``tool``, ``result``, ``stat``) with the reference's
  field names and types inside ``result``, plus our typed extras under names it does not use;
- our ``POST /search`` answers :class:`SearchResponse` (one shape for one query or many).
"""

from __future__ import annotations

from typing import Any, Generic, Literal, TypeVar
from urllib.parse import urlsplit

import httpx
from pydantic import BaseModel, Field, ValidationError, field_validator

from mia.errors import MiaError
from mia.services.base import M, first_error, wire

MAX_QUERY_CHARS = 400  # as the reference gateway
MAX_QUERIES = 32  # per request; larger batches should be split by the caller
MAX_RESULTS_LIMIT = 10
DEFAULT_MAX_RESULTS = 3  # the reference's default
DEFAULT_IMAGE_RESULTS = 5  # the reference's default for /image_search
MAX_URL_CHARS = 2048
TOOL_VERSION = "1.0"  # ``tool.version`` of the envelope; bumped when a result shape changes
QUERY_SEPARATOR = "\n=======\n"  # between per-query blocks (the reference's separator)

Engine = Literal["serper", "ddgs"]
ResultKind = Literal["answer_box", "knowledge_graph", "organic"]


class SearchResult(BaseModel):
    title: str
    url: str
    snippet: str
    # Only present when Serper gives one (organic results of news-like pages).
    date: str | None = None
    # Only present when the engine names one (ddgs' news-like results).
    source: str | None = None
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
    engine: Engine | None = Field(None, description="null = the gateway's default_engine")

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


def check_query(query: str) -> str:
    if not query.strip():
        raise ValueError("query is empty")
    if len(query) > MAX_QUERY_CHARS:
        raise ValueError(f"query has {len(query)} characters (max {MAX_QUERY_CHARS})")
    return query


def check_url(url: str) -> str:
    """An absolute http(s) URL with a host, at most 2048 characters (``/web_scrape``)."""
    url = url.strip()
    if len(url) > MAX_URL_CHARS:
        raise ValueError(f"url has {len(url)} characters (max {MAX_URL_CHARS})")
    try:
        parts = urlsplit(url)
        httpx.URL(url)
    except (ValueError, httpx.InvalidURL) as err:
        raise ValueError(f"url is not a valid URL: {err}") from None
    if parts.scheme.lower() not in ("http", "https"):
        raise ValueError(f"url must be http:// or https://, not {parts.scheme or 'relative'!r}")
    if not parts.hostname:
        raise ValueError("url has no host")
    return url


# --- the reference's envelope (GET /search, /image_search, /web_scrape) ----------------------

R = TypeVar("R")


class ToolInfo(BaseModel):
    name: str
    version: str


class CacheStat(BaseModel):
    cache: Literal["HIT", "MISS"] = Field(
        description="HIT when the whole answer came from the cache without an upstream call"
    )


class Envelope(BaseModel, Generic[R]):
    """``{request_id, tool: {name, version}, result, stat: {cache}}`` as the reference."""

    request_id: str
    tool: ToolInfo
    result: R
    stat: CacheStat


class FormattedResult(SearchResult):
    formatted: str = Field(description="this result as one text block (format_result)")


def format_result(result: SearchResult | dict[str, Any]) -> str:
    """One result as text: title, URL, snippet, then date/source lines when known."""
    r = result if isinstance(result, dict) else result.model_dump()
    lines = [f"Title: {r.get('title') or ''}", f"URL: {r.get('url') or ''}"]
    lines.append(f"Snippet: {r.get('snippet') or ''}")
    lines += [f"{k.capitalize()}: {r[k]}" for k in ("date", "source") if r.get(k)]
    return "\n".join(lines)


def format_results(results: list[SearchResult]) -> str:
    """One query's results as one block: numbered, blank line between results."""
    return "\n\n".join(f"[{k}] {format_result(r)}" for k, r in enumerate(results, 1))


class SearchToolResult(BaseModel):
    """``result`` of ``GET /search``. One query: ``results`` is a list and ``formatted`` the
    whole block; several (``?q=a&q=b``): ``results`` is one string, the per-query blocks joined
    by ``QUERY_SEPARATOR``, and ``formatted`` is absent. ``queries`` is our extra: the typed
    per-query results with their cache flag, in request order, for one query or many."""

    success: bool = True
    engine: Engine
    results: list[FormattedResult] | str
    formatted: str | None = None
    latency_ms: float
    queries: list[QueryResults]

    @classmethod
    def build(
        cls, engine: Engine, per_query: list[QueryResults], latency_ms: float, single: bool
    ) -> SearchToolResult:
        if single:
            one = per_query[0].results
            items = [FormattedResult(**r.model_dump(), formatted=format_result(r)) for r in one]
            return cls(
                engine=engine,
                results=items,
                formatted=format_results(one),
                latency_ms=latency_ms,
                queries=per_query,
            )
        blocks = [format_results(q.results) for q in per_query]
        return cls(
            engine=engine,
            results=QUERY_SEPARATOR.join(blocks),
            latency_ms=latency_ms,
            queries=per_query,
        )


class ImageResult(BaseModel):
    title: str
    image_url: str
    source_url: str = Field(description="the page the image is on ('' when unknown)")
    width: int = Field(description="original width in pixels")
    height: int = Field(description="original height in pixels")


class ImageStat(BaseModel):
    found: int = Field(description="images the engine listed")
    returned: int = Field(description="images downloaded and decoded (the others are dropped)")


class ImageSearchResult(BaseModel):
    """``result`` of ``GET /image_search``: ``text`` (the titles, one line each) and ``images``
    (base64 JPEG, ``image_size`` square) as the reference; ``results`` is our extra, one per
    image, in the same order."""

    text: str
    images: list[str]
    stat: ImageStat
    engine: Engine
    query: str
    results: list[ImageResult]
    latency_ms: float


class ScrapeResult(BaseModel):
    """``result`` of ``GET /web_scrape``. ``success`` is false when the page had no extractable
    main text. ``extracted_info`` (the reference's goal-directed LLM summary) is never produced:
    the gateway has no LLM; ``goal`` is echoed."""

    success: bool
    url: str
    markdown_content: str
    extracted_info: str | None = None
    latency_ms: float
    final_url: str = Field(description="the URL after redirects")
    title: str
    content_type: str
    goal: str | None = None


class WebSearchError(MiaError):
    """The gateway answered with its error envelope (or could not be reached)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"web search failed ({status} {code}): {message}")
        self.status = status
        self.code = code
        self.message = message


def _valid(model: type[M], data: Any, code: str, status: int) -> M:
    """``data`` as ``model``; :class:`WebSearchError` ``code`` when it does not fit (a request:
    not sent, as the gateway would refuse it; an answer: not the gateway's shape)."""
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise WebSearchError(status, code, first_error(err)) from None


class WebSearchClient:
    """``await WebSearchClient(url).search(["q1", "q2"], 3)`` -> one :class:`SearchResult`
    list per query; ``image_search`` and ``web_scrape`` answer :class:`ImageSearchResult` and
    :class:`ScrapeResult`.

    Batches larger than the gateway's per-request limit are split transparently. Use as
    ``async with`` or call :meth:`aclose`; blocking code wraps it in
    :class:`mia.services.base.SyncClient`.
    """

    def __init__(self, base_url: str, token: str | None = None, timeout: float = 120.0) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.AsyncClient(
            base_url=base_url.rstrip("/"), headers=headers, timeout=timeout
        )

    async def search(
        self,
        queries: list[str],
        max_results: int = DEFAULT_MAX_RESULTS,
        engine: Engine | None = None,
    ) -> list[list[SearchResult]]:
        """``POST /search`` (:class:`SearchRequest` -> :class:`SearchResponse`): one result list
        per query, in order. ``engine`` None = the gateway's ``default_engine``."""
        out: list[list[SearchResult]] = []
        for start in range(0, len(queries), MAX_QUERIES):
            fields: dict[str, Any] = {
                "queries": queries[start : start + MAX_QUERIES],
                "max_results": max_results,
            }
            if engine is not None:
                fields["engine"] = engine
            request = _valid(SearchRequest, fields, "invalid_request", 422)
            body = await self._request("POST", "/search", json=wire(request))
            answer = _valid(SearchResponse, body, "bad_response", 200)
            out += [entry.results for entry in answer.queries]
        return out

    async def image_search(
        self,
        query: str,
        max_results: int = DEFAULT_IMAGE_RESULTS,
        engine: Engine | None = None,
        deterministic: bool = False,
    ) -> ImageSearchResult:
        """``GET /image_search``: the images (base64 JPEG) with their titles and pages.
        ``deterministic`` answers from the cache only (a miss is an error)."""
        params = {"q": query, "max_results": max_results, "engine": engine}
        body = await self._get("/image_search", params, deterministic)
        return _valid(Envelope[ImageSearchResult], body, "bad_response", 200).result

    async def web_scrape(
        self, url: str, goal: str | None = None, deterministic: bool = False
    ) -> ScrapeResult:
        """``GET /web_scrape``: the page's main content as Markdown (``success`` false when the
        page had no extractable text)."""
        body = await self._get("/web_scrape", {"url": url, "goal": goal}, deterministic)
        return _valid(Envelope[ScrapeResult], body, "bad_response", 200).result

    async def _get(self, path: str, params: dict[str, Any], deterministic: bool) -> dict[str, Any]:
        query = {k: v for k, v in params.items() if v is not None}
        if deterministic:
            query["deterministic"] = "true"
        return await self._request("GET", path, params=query)

    async def health(self) -> dict[str, Any]:
        try:
            resp = await self._http.get("/health")
        except httpx.HTTPError as err:
            raise WebSearchError(0, "unreachable", f"{type(err).__name__}: {err}") from None
        return resp.json()

    async def _request(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        try:
            resp = await self._http.request(method, path, **kwargs)
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
