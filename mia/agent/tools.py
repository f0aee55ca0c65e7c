"""Executor tools: the ``Tool`` interface, a registry built from config, and the built-ins.

A tool has a name, an OpenAI-style function schema and ``async __call__(args, ctx) ->
ToolOutput``. Tools are built from config entries ``{type | _target_, params, name?}``, so a user
adds a tool by writing its class and one YAML entry (``_target_: my_pkg.tools:Calculator``)::

    tools:
      search: {type: search, params: {backend: local, url: "http://127.0.0.1:8001"}}
      calc: {_target_: "my_pkg.tools:Calculator", params: {precision: 6}}

Built-ins:

- ``search`` (``query_list``; ``query``/``queries``, str or list, also accepted): ``backend:
  local`` posts to a Search-R1 ``/retrieve`` service (``local_search``), ``backend: web`` to the
  ``web_tools`` gateway. Results per query as ``Doc k(Title: ...) text``, queries joined with
  ``\\n=======\\n`` (the reference's serve-time format). Switch backends in config, never in code.
- ``web_image_to_image_search`` (``img_idx``): reads the precomputed image-search cache of the
  question (``cache_id = data_id``), at most 3 results as ``k. title: ... <image>`` lines plus the
  images; once per question.

Errors: bad arguments raise :class:`ToolArgumentError` (the model's mistake), an unreachable or
failing service raises :class:`ToolServiceError` (flagged on the trajectory). Neither crashes the
loop: both become observations.
"""

from __future__ import annotations

import asyncio
import importlib
import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
from PIL import Image
from pydantic import ValidationError

from mia.errors import MiaError
from mia.prompts.executor import IMAGE_TOKEN
from mia.services.base import first_error, wire
from mia.services.search import Document, RetrieveRequest, RetrieveResponse, ScoredDocument
from mia.services.web import SearchResult, WebSearchClient, WebSearchError

from . import protocol


class ToolArgumentError(MiaError):
    """The arguments of a call are unusable; the message tells the model what to fix."""


class ToolServiceError(MiaError):
    """The service behind a tool is down, timed out or answered with an error."""


class ToolConfigError(MiaError):
    """A tool entry in the config is wrong (unknown type, bad params)."""


@dataclass
class ToolOutput:
    """What a call returns: text for the model, images referenced by ``<image>`` placeholders in
    the text (in order), and an error flag with its kind (see :mod:`mia.agent.protocol`)."""

    text: str
    images: list[Image.Image] = field(default_factory=list)
    error: bool = False
    kind: str | None = None


@dataclass
class ToolContext:
    """Per-call context. ``counts``: calls of each tool earlier in this trajectory; ``state``:
    per-trajectory scratch space shared by the tools (never shared between rollouts)."""

    data_id: str | None = None
    num_images: int = 0
    counts: dict[str, int] = field(default_factory=dict)
    state: dict[str, Any] = field(default_factory=dict)


class Tool(ABC):
    """Base class of a tool. Subclasses set ``name``, ``description`` and ``parameters`` (a JSON
    schema object) and implement ``__call__``; ``validate`` normalises arguments."""

    name: str = ""
    description: str = ""
    parameters: dict[str, Any] = {"type": "object", "properties": {}}
    # Per-call time limit enforced by the loop (None: the loop's tool_timeout_s).
    timeout_s: float | None = None
    # Offered only to questions that come with an image.
    needs_image: bool = False

    def schema(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }

    def validate(self, args: dict[str, Any]) -> dict[str, Any]:
        """Normalised arguments, or :class:`ToolArgumentError`."""
        return args

    @abstractmethod
    async def __call__(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput: ...

    async def aclose(self) -> None:
        return None


# ---------------------------------------------------------------------------- registry

TOOL_TYPES: dict[str, Callable[..., Tool]] = {}


def register_tool(type_name: str) -> Callable[[type[Tool]], type[Tool]]:
    """Class decorator: make a tool class buildable as ``{type: type_name}``."""

    def deco(cls: type[Tool]) -> type[Tool]:
        TOOL_TYPES[type_name] = cls
        return cls

    return deco


def _import_target(target: str) -> Callable[..., Tool]:
    module, sep, attr = target.partition(":")
    if not sep:
        module, _, attr = target.rpartition(".")
    if not module or not attr:
        raise ToolConfigError(f"_target_ must be 'module:Class' or 'module.Class', got {target!r}")
    try:
        obj = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as err:
        raise ToolConfigError(f"cannot import tool {target!r}: {err}") from None
    if not callable(obj):
        raise ToolConfigError(f"tool {target!r} is not a class or factory")
    return obj


_ENTRY_KEYS = {"type", "_target_", "params", "name"}


def build_tool(entry: Mapping[str, Any], name: str | None = None) -> Tool:
    """A tool from ``{type | _target_, params?, name?}`` (``name`` overrides the tool's own)."""
    entry = dict(entry)
    unknown = sorted(set(entry) - _ENTRY_KEYS)
    where = f"tool {name!r}" if name else "tool"
    if unknown:
        raise ToolConfigError(f"{where}: unknown key(s) {unknown} (known: {sorted(_ENTRY_KEYS)})")
    if ("type" in entry) == ("_target_" in entry):
        raise ToolConfigError(f"{where}: give exactly one of 'type' or '_target_'")
    if "type" in entry:
        factory = TOOL_TYPES.get(str(entry["type"]))
        if factory is None:
            raise ToolConfigError(
                f"{where}: unknown type {entry['type']!r} (known: {sorted(TOOL_TYPES)}; or use "
                "_target_: module:Class)"
            )
    else:
        factory = _import_target(str(entry["_target_"]))
    params = dict(entry.get("params") or {})
    try:
        tool = factory(**params)
    except TypeError as err:
        raise ToolConfigError(f"{where}: bad params: {err}") from None
    if not isinstance(tool, Tool):
        raise ToolConfigError(f"{where}: {factory!r} did not build a mia.agent.tools.Tool")
    override = entry.get("name") or name
    if override:
        tool.name = str(override)
    if not tool.name:
        raise ToolConfigError(f"{where}: the tool has no name")
    return tool


class ToolSet:
    """Tools by name, in order."""

    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        for tool in tools:
            if tool.name in self._tools:
                raise ToolConfigError(f"two tools are named {tool.name!r}")
            self._tools[tool.name] = tool

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    @property
    def names(self) -> list[str]:
        return list(self._tools)

    def available(self, num_images: int) -> list[Tool]:
        """The tools offered to a question with ``num_images`` images."""
        return [t for t in self._tools.values() if num_images > 0 or not t.needs_image]

    def __iter__(self) -> Iterator[Tool]:
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    async def aclose(self) -> None:
        for tool in self._tools.values():
            await tool.aclose()


def build_tools(entries: Mapping[str, Any] | Iterable[Mapping[str, Any]] | None) -> ToolSet:
    """A :class:`ToolSet` from ``{name: entry}`` (an entry of ``null`` disables that tool) or a
    list of entries."""
    if entries is None:
        return ToolSet()
    if isinstance(entries, Mapping):
        return ToolSet(
            build_tool(entry, name=str(name)) for name, entry in entries.items() if entry
        )
    return ToolSet(build_tool(entry) for entry in entries)


# ---------------------------------------------------------------------------- search


def _query_list(args: dict[str, Any], max_queries: int, max_chars: int) -> list[str]:
    for key in ("query_list", "queries", "query"):
        if key in args:
            value = args[key]
            break
    else:
        raise ToolArgumentError('missing "query_list" (a list of search queries)')
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value:
        raise ToolArgumentError('"query_list" must be a non-empty list of strings')
    queries = []
    for i, q in enumerate(value):
        if not isinstance(q, str) or not q.strip():
            raise ToolArgumentError(f"query {i} must be a non-empty string")
        if len(q) > max_chars:
            raise ToolArgumentError(f"query {i} has {len(q)} characters (at most {max_chars})")
        queries.append(q.strip())
    if len(queries) > max_queries:
        raise ToolArgumentError(f"at most {max_queries} queries per call, got {len(queries)}")
    return queries


def format_passages(docs: Sequence[ScoredDocument | Document | Mapping[str, Any]]) -> str:
    """Search-R1's passage block: ``Doc k(Title: <first line>) <rest>`` per passage."""
    lines = []
    for k, doc in enumerate(docs, 1):
        if isinstance(doc, ScoredDocument):
            doc = doc.document
        elif isinstance(doc, Mapping) and isinstance(doc.get("document"), Mapping):
            doc = doc["document"]
        if isinstance(doc, Document):
            contents = doc.contents
        else:
            contents = str(doc.get("contents", "")) if isinstance(doc, Mapping) else str(doc)
        title, _, text = contents.partition("\n")
        lines.append(f"Doc {k}(Title: {title}) {text}")
    return "\n".join(lines)


def format_web_results(results: Sequence[SearchResult | Mapping[str, Any]]) -> str:
    lines = []
    for k, result in enumerate(results, 1):
        r = result.model_dump() if isinstance(result, SearchResult) else result
        url = r.get("url") or ""
        source = f" (source: {url})" if url else ""
        lines.append(f"Doc {k}(Title: {r.get('title', '')}) {r.get('snippet', '')}{source}")
    return "\n".join(lines)


QUERY_SEPARATOR = "\n=======\n"
NO_RESULTS = "No results found for '{query}'."


class _PerLoop:
    """One HTTP client per event loop: httpx clients bind to the loop that first uses them, and
    a tool may be shared by several ``asyncio.run`` calls (tests, reward functions)."""

    def __init__(self, factory: Callable[[], Any]) -> None:
        self._factory = factory
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = (
            weakref.WeakKeyDictionary()
        )

    def get(self) -> Any:
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            client = self._clients[loop] = self._factory()
        return client

    async def aclose(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # pragma: no cover - aclose is async
            return
        client = self._clients.pop(loop, None)
        if client is not None:
            await client.aclose()


@register_tool("search")
class SearchTool(Tool):
    """Text search over a local index (``backend: local``) or the web (``backend: web``)."""

    description = (
        "Searches for information relevant to the question. Give one or more search queries; "
        "each returns the top matching passages (title and text)."
    )
    parameters = {
        "type": "object",
        "properties": {
            "query_list": {
                "type": "array",
                "items": {"type": "string"},
                "description": "A list of search queries.",
            }
        },
        "required": ["query_list"],
    }

    def __init__(
        self,
        backend: str = "local",
        url: str = "http://127.0.0.1:8001",
        topk: int = 3,
        timeout_s: float = 30.0,
        token: str | None = None,
        max_queries: int = 8,
        max_query_chars: int = 400,
        name: str = "search",
    ) -> None:
        if backend not in ("local", "web"):
            raise ToolConfigError(f"search: backend must be 'local' or 'web', got {backend!r}")
        if topk < 1 or max_queries < 1:
            raise ToolConfigError("search: topk and max_queries must be >= 1")
        self.name = name
        self.backend = backend
        self.url = url.rstrip("/")
        self.topk = topk
        self.http_timeout = timeout_s
        self.max_queries = max_queries
        self.max_query_chars = max_query_chars
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        if backend == "local":
            self._clients = _PerLoop(
                lambda: httpx.AsyncClient(base_url=self.url, headers=headers, timeout=timeout_s)
            )
        else:
            self._clients = _PerLoop(lambda: WebSearchClient(self.url, token, timeout_s))

    def validate(self, args: dict[str, Any]) -> dict[str, Any]:
        return {"query_list": _query_list(args, self.max_queries, self.max_query_chars)}

    async def __call__(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        queries = args["query_list"]
        if self.backend == "local":
            per_query = await self._local(queries)
            blocks = [format_passages(docs) for docs in per_query]
        else:
            per_query = await self._web(queries)
            blocks = [format_web_results(results) for results in per_query]
        blocks = [b or NO_RESULTS.format(query=q) for b, q in zip(blocks, queries, strict=True)]
        return ToolOutput(QUERY_SEPARATOR.join(blocks))

    async def _local(self, queries: list[str]) -> list[list[ScoredDocument]] | list[list[Document]]:
        try:
            request = RetrieveRequest(queries=queries, topk=self.topk, return_scores=True)
        except ValidationError as err:  # what the service would refuse (422)
            raise ToolServiceError(
                f"search service unavailable: bad request: {first_error(err)}"
            ) from None
        try:
            resp = await self._clients.get().post("/retrieve", json=wire(request))
        except httpx.HTTPError as err:
            raise ToolServiceError(
                f"search service unavailable: {self.url}: {type(err).__name__}: {err}"
            ) from None
        if resp.status_code != 200:
            raise ToolServiceError(
                f"search service unavailable: {self.url} answered HTTP {resp.status_code}: "
                f"{resp.text[:200]}"
            )
        try:
            result = RetrieveResponse.model_validate_json(resp.content).result
        except ValidationError as err:
            raise ToolServiceError(
                f"search service returned a bad response: {first_error(err)}"
            ) from None
        if len(result) != len(queries):
            raise ToolServiceError(
                "search service returned a bad response: wrong number of result lists"
            )
        return result

    async def _web(self, queries: list[str]) -> list[list[SearchResult]]:
        try:
            return await self._clients.get().search(queries, self.topk)
        except WebSearchError as err:
            raise ToolServiceError(f"search service unavailable: {err}") from None
        except (httpx.HTTPError, KeyError, TypeError, ValueError) as err:
            raise ToolServiceError(
                f"search service unavailable: {self.url}: {type(err).__name__}: {err}"
            ) from None

    async def aclose(self) -> None:
        await self._clients.aclose()


# ---------------------------------------------------------------------------- image search

ONCE_ERROR = "Error: {name} can be called only once per question."
NO_IMAGE_HITS = "No similar images were found."


@register_tool("web_image_to_image_search")
class ImageSearchTool(Tool):
    """Image-to-image search read from precomputed caches (the reference never searches live)."""

    description = (
        "Searches the web for images similar to the question's image and returns the titles "
        "of the matching pages with their images. Can be called only once per question."
    )
    parameters = {
        "type": "object",
        "properties": {
            "img_idx": {
                "type": "string",
                "description": "Index of the question image to search with, starting from 0.",
            }
        },
        "required": ["img_idx"],
    }
    needs_image = True

    def __init__(
        self,
        cache_roots: list[str] | str | None = None,
        max_results: int = 3,
        once: bool = True,
        image_size: int | None = 448,
        name: str = "web_image_to_image_search",
    ) -> None:
        from mia.data.image_cache import ImageSearchCache

        if isinstance(cache_roots, str):
            cache_roots = [r for r in cache_roots.split(",") if r]
        if not 1 <= max_results <= 3:
            raise ToolConfigError("web_image_to_image_search: max_results must be 1..3")
        self.name = name
        self.cache = ImageSearchCache(list(cache_roots or []), max_results=max_results)
        self.once = once
        self.image_size = image_size

    def validate(self, args: dict[str, Any]) -> dict[str, Any]:
        idx = args.get("img_idx", 0)
        if isinstance(idx, bool) or not isinstance(idx, int | str):
            raise ToolArgumentError('"img_idx" must be an image index such as "0"')
        try:
            return {"img_idx": int(str(idx).strip())}
        except ValueError:
            raise ToolArgumentError(
                f'"img_idx" must be an image index such as "0", got {idx!r}'
            ) from None

    async def __call__(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        if self.once and ctx.counts.get(self.name, 0) >= 1:
            return ToolOutput(ONCE_ERROR.format(name=self.name), error=True, kind=protocol.LIMIT)
        idx = args["img_idx"]
        if not 0 <= idx < max(ctx.num_images, 1):
            raise ToolArgumentError(
                f"img_idx {idx} is out of range (the question has "
                f"{ctx.num_images} image(s), indices from 0)"
            )
        if not ctx.data_id:
            raise ToolServiceError("image search unavailable: the question has no data_id")
        from mia.data.image_cache import ImageCacheError

        try:
            hits = await asyncio.to_thread(self.cache.search, str(ctx.data_id))
        except ImageCacheError as err:
            raise ToolServiceError(f"image search unavailable: {err}") from None
        if not hits:
            return ToolOutput(NO_IMAGE_HITS)
        lines, images = [], []
        for k, hit in enumerate(hits, 1):
            if hit.image is None:
                lines.append(f"{k}. title: {hit.title} (image unavailable)")
                continue
            img = hit.image
            if self.image_size is not None:
                img = img.resize((self.image_size, self.image_size), Image.Resampling.BICUBIC)
            images.append(img)
            lines.append(f"{k}. title: {hit.title} {IMAGE_TOKEN}")
        return ToolOutput("\n".join(lines), images=images)
