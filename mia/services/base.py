"""Typed async clients for MIA's own services (memory_serve, serve, the reward server).

The role trainers (Executor and Planner GRPO, TTRL, streaming) talk to the services only through
these, so a route's payload is written once. Every client takes a base URL and an optional
bearer token; a 4xx/5xx answer raises :class:`ServiceError` carrying the service's error
envelope (``{"error": {"code", "message"}}``); connection failures are retried a few times
(a service that is restarting), HTTP errors are not (the service answered).

An ``httpx.AsyncClient`` belongs to the event loop that first used it, and the trainers run
their rollouts on a private loop while orchestration code runs elsewhere, so each client keeps
one connection pool per loop and a plain synchronous pool for ``*_sync`` calls.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx

from mia.errors import MiaError

DEFAULT_TIMEOUT_S = 600.0


class ServiceError(MiaError):
    """A service answered with an error, or could not be used. ``status``: the HTTP status of
    an error answer (the service decided: nothing was done), None when there was no answer."""

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


class ServiceClient:
    """``await client.post(path, body)`` / ``client.post_sync(path, body)`` -> parsed JSON.

    Connection failures are retried ``connect_retries`` times with backoff (a service that is
    restarting), then :class:`ServiceUnavailable`; an error answer is not retried (the service
    decided) and raises :class:`RequestFailed` (:class:`ServiceUnavailable` for 401/403/404/405).
    Loopback services are never routed through an environment proxy.
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
        self._sync: httpx.Client | None = None

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

    def _sync_pool(self) -> httpx.Client:
        if self._sync is None or self._sync.is_closed:
            self._sync = httpx.Client(**self._client_kwargs())
        return self._sync

    # ---- calls
    def _unreachable(self, path: str, err: Exception) -> ServiceUnavailable:
        return ServiceUnavailable(f"{self.service} at {self.url} is unreachable ({path}: {err})")

    def _failed(self, path: str, err: Exception) -> RequestFailed:
        if isinstance(err, httpx.TimeoutException):
            return RequestFailed(f"{self.service} {path}: no answer within {self.timeout_s:.0f}s")
        return RequestFailed(f"{self.service} {path}: {type(err).__name__}: {err}")

    async def request(self, method: str, path: str, body: Any = None) -> Any:
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

    def request_sync(self, method: str, path: str, body: Any = None) -> Any:
        for attempt in range(self.connect_retries + 1):
            try:
                resp = self._sync_pool().request(method, path, json=body)
                break
            except httpx.ConnectError as err:
                if attempt == self.connect_retries:
                    raise self._unreachable(path, err) from None
                time.sleep(0.5 * 2**attempt)
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

    def post_sync(self, path: str, body: Any = None) -> Any:
        return self.request_sync("POST", path, body)

    def get_sync(self, path: str) -> Any:
        return self.request_sync("GET", path)

    def health(self) -> dict[str, Any]:
        return self.get_sync("/health")

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
        if self._sync is not None:
            self._sync.close()
            self._sync = None
        for loop, client in list(self._pools.values()):
            if not loop.is_closed() and not loop.is_running():
                loop.run_until_complete(client.aclose())
        self._pools.clear()
