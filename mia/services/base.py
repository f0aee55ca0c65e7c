"""Typed async clients for MIA's own services (memory_serve, serve, the reward server).

The role trainers (Executor and Planner GRPO, TTRL, streaming) talk to the services only through
these, so a route's payload is written once: a client method takes typed arguments (or the
route's request model), sends the request model's JSON and returns the route's response model
(``await memory.plan(q) -> PlanResponse``). Every client takes a base URL and an optional
bearer token; a 4xx/5xx answer raises :class:`ServiceError` carrying the service's error
envelope (``{"error": {"code", "message"}}``); connection failures are retried a few times
(a service that is restarting), HTTP errors are not (the service answered).

An ``httpx.AsyncClient`` belongs to the event loop that first used it, and the trainers run
their rollouts on a private loop while orchestration code runs elsewhere, so each client keeps
one connection pool per loop. Blocking code calls the same methods through :class:`SyncClient`
(``client.sync.plan(q)``), which runs them on one private event loop in a daemon thread: each
method is written once, as a coroutine.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import os
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Generic, TypeVar

import httpx
from pydantic import BaseModel, TypeAdapter, ValidationError

from mia.errors import MiaError

DEFAULT_TIMEOUT_S = 600.0

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")
C = TypeVar("C")


class ServiceError(MiaError):
    """A service answered with an error, or could not be used. ``status``: the HTTP status of
    an error answer (the service decided: nothing was done; 422 also for a request its model
    refuses, which is not sent), None when there was no answer (or one that does not fit the
    route's response model: what the service did is unknown)."""

    def __init__(self, message: str, status: int | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


class ServiceUnavailable(ServiceError):
    """The service cannot be used at all: unreachable, the token refused, or no such route.
    Retrying the same request will not help; a run stops here."""


class RouteMissing(ServiceUnavailable):
    """404/405: it is not the service (or the mode) the caller expected."""


class RequestFailed(ServiceError):
    """This one request failed (an error answer, a timeout, a dropped connection); the work
    that made it fails, the rest can go on."""


def _envelope(resp: httpx.Response) -> tuple[str | None, str]:
    """``(code, message)`` of the ``{"error": {"code", "message"}}`` envelope (else the text)."""
    try:
        body = resp.json()
    except ValueError:
        return None, " ".join(resp.text.split())[:500] or resp.reason_phrase
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        err = body["error"]
        return err.get("code"), str(err.get("message", ""))
    return None, " ".join(str(body).split())[:500]


def _error_of(service: str, url: str, method: str, path: str, resp: httpx.Response) -> ServiceError:
    code, message = _envelope(resp)
    status = resp.status_code
    if status in (401, 403):
        return ServiceUnavailable(
            f"{service} at {url} refused the request ({status} {message}); check the token",
            status,
            code,
        )
    if status in (404, 405):
        return RouteMissing(
            f"{service} at {url} has no route {method} {path} ({status}); is it the right "
            "service and mode?",
            status,
            code,
        )
    label = f"HTTP {status} {code}" if code else f"HTTP {status}"
    return RequestFailed(f"{service} {path}: {label}: {message}", status, code)


def first_error(err: ValidationError) -> str:
    """``loc: message`` of a validation error's first problem (as the services word a 422)."""
    first = err.errors()[0]
    loc = ".".join(str(x) for x in first.get("loc", ()))
    msg = str(first.get("msg", "invalid")).removeprefix("Value error, ")
    more = err.error_count() - 1
    return f"{loc or 'body'}: {msg}" + (f" (and {more} more)" if more else "")


@functools.cache
def _adapter(tp: Any) -> TypeAdapter[Any]:
    return TypeAdapter(tp)


def wire(body: BaseModel | Sequence[BaseModel] | None) -> Any:
    """A request model's JSON (a list of them: a JSON list): only the fields that were given,
    so the service's defaults stay the service's."""
    if body is None:
        return None
    if isinstance(body, BaseModel):
        return body.model_dump(mode="json", exclude_unset=True)
    return [wire(b) for b in body]


class ServiceClient:
    """One service's typed async client. Subclasses write each route once, as a coroutine:
    :meth:`build` the request model, :meth:`send` it and get the response model back; blocking
    code calls the same methods through :attr:`sync`.

    Connection failures are retried ``connect_retries`` times with backoff (a service that is
    restarting), then :class:`ServiceUnavailable`; an error answer is not retried (the service
    decided) and raises :class:`RequestFailed` (:class:`ServiceUnavailable` for 401/403/404/405).
    A request that its own model refuses is not sent: :class:`RequestFailed` with the 422 the
    service would answer. Loopback services are never routed through an environment proxy.
    """

    service = "service"

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        connect_retries: int = 3,
    ) -> None:
        if not url:
            raise MiaError(f"{self.service}: no URL configured")
        if not url.startswith(("http://", "https://")):
            raise MiaError(f"{self.service} URL must start with http:// or https://, got {url!r}")
        self.url = url.rstrip("/")
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.timeout_s = timeout_s
        self.timeout = httpx.Timeout(timeout_s, connect=min(15.0, timeout_s))
        self.connect_retries = max(0, int(connect_retries))
        self._pools: dict[int, tuple[asyncio.AbstractEventLoop, httpx.AsyncClient]] = {}

    @property
    def sync(self) -> SyncClient[Any]:
        """This client for blocking code: ``client.sync.plan(q)`` runs ``await client.plan(q)``
        (:class:`SyncClient`)."""
        return SyncClient(self)

    # ---- pools
    def _client_kwargs(self) -> dict[str, Any]:
        return {
            "base_url": self.url,
            "headers": self.headers,
            "timeout": self.timeout,
            "trust_env": False,
        }

    def _async_pool(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        entry = self._pools.get(id(loop))
        if entry is None or entry[0] is not loop or entry[1].is_closed:
            client = httpx.AsyncClient(**self._client_kwargs())
            self._pools[id(loop)] = (loop, client)
            return client
        return entry[1]

    # ---- typed calls
    def build(self, model: type[M], data: M | Mapping[str, Any], path: str) -> M:
        """``data`` as the request model of ``path`` (a model is taken as it is). One its model
        refuses raises :class:`RequestFailed` with the service's 422 (``invalid_request``):
        the same model validates it there, so sending it would change nothing."""
        if isinstance(data, model):
            return data
        try:
            return model.model_validate(data)
        except ValidationError as err:
            raise RequestFailed(
                f"{self.service} {path}: HTTP 422 invalid_request (not sent): {first_error(err)}",
                422,
                "invalid_request",
            ) from None

    def parse(self, path: str, answer: Any, data: Any) -> Any:
        """``data`` (an answer's JSON) as the type ``answer`` (a model, ``list[Model]``, a
        union); an answer that does not fit raises :class:`RequestFailed` (status None: what
        the service did is unknown)."""
        try:
            return _adapter(answer).validate_python(data)
        except ValidationError as err:
            raise RequestFailed(
                f"{self.service} {path}: unexpected answer: {first_error(err)}"
            ) from None

    async def send(
        self,
        method: str,
        path: str,
        body: BaseModel | Sequence[BaseModel] | None,
        answer: Any,
    ) -> Any:
        """``body`` (request model(s), or None) sent to ``path``; its answer as ``answer``."""
        return self.parse(path, answer, await self.request(method, path, wire(body)))

    # ---- calls
    def _unreachable(self, path: str, err: Exception) -> ServiceUnavailable:
        return ServiceUnavailable(f"{self.service} at {self.url} is unreachable ({path}: {err})")

    def _failed(self, path: str, err: Exception) -> RequestFailed:
        if isinstance(err, httpx.TimeoutException):
            return RequestFailed(f"{self.service} {path}: no answer within {self.timeout_s:.0f}s")
        return RequestFailed(f"{self.service} {path}: {type(err).__name__}: {err}")

    async def request(self, method: str, path: str, body: Any = None) -> Any:
        """``method path`` with the JSON ``body`` -> the answer's parsed JSON."""
        for attempt in range(self.connect_retries + 1):
            try:
                resp = await self._async_pool().request(method, path, json=body)
                break
            except httpx.ConnectError as err:
                if attempt == self.connect_retries:
                    raise self._unreachable(path, err) from None
                await asyncio.sleep(0.5 * 2**attempt)
            except httpx.HTTPError as err:
                raise self._failed(path, err) from None
        return self._parse(method, path, resp)

    def _parse(self, method: str, path: str, resp: httpx.Response) -> Any:
        if resp.status_code >= 400:
            raise _error_of(self.service, self.url, method, path, resp)
        try:
            return resp.json()
        except ValueError:
            raise RequestFailed(
                f"{self.service} {path}: the answer is not JSON", resp.status_code
            ) from None

    async def post(self, path: str, body: Any = None) -> Any:
        return await self.request("POST", path, body)

    async def get(self, path: str) -> Any:
        return await self.request("GET", path)

    async def health(self) -> dict[str, Any]:
        """``GET /health`` as the service answers it."""
        return await self.get("/health")

    async def check_health(self) -> dict[str, Any]:
        """``GET /health``; anything but ``{"status": "ok", ...}`` means not usable."""
        try:
            body = await self.get("/health")
        except RequestFailed as err:
            raise ServiceUnavailable(
                f"{self.service} at {self.url} is not healthy: {err}"
            ) from None
        if not isinstance(body, dict) or body.get("status") != "ok":
            raise ServiceUnavailable(f"{self.service} at {self.url}: unexpected /health {body!r}")
        return body

    async def routes(self) -> set[str] | None:
        """The paths the service offers (its OpenAPI schema); None when it does not say."""
        try:
            schema = await self.get("/openapi.json")
        except (RequestFailed, RouteMissing):
            return None
        paths = schema.get("paths") if isinstance(schema, dict) else None
        return set(paths) if isinstance(paths, dict) else None

    async def aclose(self) -> None:
        """Close this loop's pool (other loops' pools close with :meth:`close`)."""
        loop = asyncio.get_running_loop()
        entry = self._pools.pop(id(loop), None)
        if entry is not None:
            await entry[1].aclose()

    def close(self) -> None:
        """Close the pools of the loops that are not running (the blocking calls' loop
        included)."""
        for loop, client in list(self._pools.values()):
            if loop.is_closed():
                continue
            if _BLOCKING.owns(loop):
                if not _BLOCKING.here():  # from a coroutine on it: that loop closes it
                    _BLOCKING.run(client.aclose())
            elif not loop.is_running():
                loop.run_until_complete(client.aclose())
        self._pools.clear()


# ----------------------------------------------------------------------------- blocking calls


class _BlockingLoop:
    """The one event loop that blocking calls run on: a daemon thread, started on first use
    (again in a forked child, where the parent's thread does not exist)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._pid = 0

    def _get(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            alive = self._thread is not None and self._thread.is_alive()
            if self._loop is None or self._pid != os.getpid() or not alive:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=loop.run_forever, name="mia-service-client", daemon=True
                )
                thread.start()
                self._loop, self._thread, self._pid = loop, thread, os.getpid()
            return self._loop

    def owns(self, loop: asyncio.AbstractEventLoop) -> bool:
        return loop is self._loop and self._pid == os.getpid() and loop.is_running()

    def here(self) -> bool:
        """This thread is the loop's."""
        return threading.current_thread() is self._thread

    def run(self, awaitable: Awaitable[T]) -> T:
        """``await awaitable`` on the loop, blocking this thread until it is done."""
        loop = self._get()
        if self.here():
            if inspect.iscoroutine(awaitable):
                awaitable.close()
            raise RuntimeError("a blocking service call from the blocking loop itself: await it")
        future = asyncio.run_coroutine_threadsafe(_awaited(awaitable), loop)
        try:
            return future.result()
        except BaseException:  # an interrupt here stops the request too
            future.cancel()
            raise


async def _awaited(awaitable: Awaitable[T]) -> T:
    return await awaitable


_BLOCKING = _BlockingLoop()


class SyncClient(Generic[C]):
    """An async client for blocking code: ``SyncClient(client).plan(q)`` (also
    ``client.sync.plan(q)`` for a :class:`ServiceClient`) runs ``await client.plan(q)`` on one
    private event loop in a daemon thread and returns what it returns (raises what it raises).
    Any coroutine method of the client is available so, and nothing else; ``sync(coroutine)``
    runs one awaitable so (typed: ``memory.sync(memory.plan(q)) -> PlanResponse``).

    The loop is shared by every wrapper of the process; calls from several threads run
    concurrently on it. Calling from a coroutine blocks that coroutine's loop (as any blocking
    call does): in async code, await the client."""

    __slots__ = ("_client",)

    def __init__(self, client: C) -> None:
        self._client = client

    def __getattr__(self, name: str) -> Callable[..., Any]:
        if name.startswith("_"):
            raise AttributeError(name)
        method = getattr(self._client, name)
        if not inspect.iscoroutinefunction(method):
            raise AttributeError(f"{type(self._client).__name__}.{name} is not a coroutine method")

        @functools.wraps(method)
        def blocking(*args: Any, **kwargs: Any) -> Any:
            return _BLOCKING.run(method(*args, **kwargs))

        return blocking

    def __call__(self, awaitable: Awaitable[T]) -> T:
        return _BLOCKING.run(awaitable)

    def __repr__(self) -> str:
        return f"SyncClient({self._client!r})"

    def close(self) -> None:
        """Close the client (its connections on the blocking loop included)."""
        close = getattr(self._client, "close", None)
        if callable(close) and not inspect.iscoroutinefunction(close):
            close()
        elif callable(aclose := getattr(self._client, "aclose", None)):
            _BLOCKING.run(aclose())
