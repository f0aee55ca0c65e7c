"""Async JSON clients of the two services an evaluation talks to (memory_serve and serve).

Two kinds of failure, because they call for different reactions:

- :class:`ServiceUnavailable` (a :class:`MiaError`): the service cannot be used at all
  (connection refused, wrong token, missing route). The run stops with one line; rerunning the
  same command resumes it.
- :class:`RequestFailed`: this one question failed (an LLM error answered 502, a timeout, a
  rejected image). The question's row records the error and the run goes on; a resumed run
  retries it.
"""

from __future__ import annotations

from typing import Any

import httpx

from mia.errors import MiaError


class ServiceUnavailable(MiaError):
    """A service that every question needs cannot be used."""


class RouteMissing(ServiceUnavailable):
    """The service answered 404/405: it is not the service (or mode) the caller expected."""


class RequestFailed(Exception):
    """One request failed; the question that made it fails, the run continues.

    ``status`` is the HTTP status of an error answer (the service decided: nothing was done),
    or None when the outcome is unknown (timeout, connection dropped mid-request)."""

    def __init__(self, message: str, status: int | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code  # the error envelope's code, when the service sent one


def _error_code(resp: httpx.Response) -> str | None:
    try:
        body = resp.json()
    except ValueError:
        return None
    err = body.get("error") if isinstance(body, dict) else None
    return str(err["code"]) if isinstance(err, dict) and err.get("code") else None


def _error_message(resp: httpx.Response) -> str:
    try:
        body = resp.json()
    except ValueError:
        return " ".join(resp.text.split())[:300] or resp.reason_phrase
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        err = body["error"]
        return f"{err.get('code', '')}: {err.get('message', '')}".strip(": ")
    return " ".join(str(body).split())[:300]


class ServiceClient:
    """POST/GET JSON to one service. ``name`` appears in every error message."""

    def __init__(
        self, name: str, url: str, token: str | None = None, timeout_s: float = 1800.0
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise MiaError(f"{name} URL must start with http:// or https://, got {url!r}")
        self.name = name
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._client = httpx.AsyncClient(
            base_url=self.url,
            headers=headers,
            timeout=httpx.Timeout(timeout_s, connect=15.0),
            # Loopback services: never route them through an environment proxy.
            trust_env=False,
        )

    async def aclose(self) -> None:
        await self._client.aclose()

    async def request(self, method: str, path: str, payload: Any = None) -> Any:
        try:
            resp = await self._client.request(method, path, json=payload)
        except httpx.ConnectError as err:
            raise ServiceUnavailable(f"{self.name} at {self.url} is unreachable ({err})") from None
        except httpx.TimeoutException:
            raise RequestFailed(
                f"{self.name} {path}: no answer within {self.timeout_s:.0f}s"
            ) from None
        except httpx.HTTPError as err:
            raise RequestFailed(f"{self.name} {path}: {type(err).__name__}: {err}") from None
        if resp.status_code in (401, 403):
            raise ServiceUnavailable(
                f"{self.name} at {self.url} refused the request "
                f"({resp.status_code} {_error_message(resp)}); check the token"
            )
        if resp.status_code in (404, 405):
            raise RouteMissing(
                f"{self.name} at {self.url} has no route {method} {path} "
                f"({resp.status_code}); is it the right service and mode?"
            )
        if resp.status_code >= 400:
            raise RequestFailed(
                f"{self.name} {path}: HTTP {resp.status_code} {_error_message(resp)}",
                status=resp.status_code,
                code=_error_code(resp),
            )
        try:
            return resp.json()
        except ValueError:
            raise RequestFailed(
                f"{self.name} {path}: the answer is not JSON", status=resp.status_code
            ) from None

    async def post(self, path: str, payload: Any) -> Any:
        return await self.request("POST", path, payload)

    async def get(self, path: str) -> Any:
        return await self.request("GET", path)

    async def health(self) -> dict[str, Any]:
        """``GET /health``; any failure here means the service is not usable."""
        try:
            body = await self.get("/health")
        except RequestFailed as err:
            raise ServiceUnavailable(f"{self.name} at {self.url} is not healthy: {err}") from None
        if not isinstance(body, dict) or body.get("status") != "ok":
            raise ServiceUnavailable(f"{self.name} at {self.url}: unexpected /health {body!r}")
        return body

    async def routes(self) -> set[str] | None:
        """The paths the service offers (from its OpenAPI schema); None when it does not say."""
        try:
            schema = await self.get("/openapi.json")
        except (RequestFailed, RouteMissing):
            return None
        paths = schema.get("paths") if isinstance(schema, dict) else None
        return set(paths) if isinstance(paths, dict) else None
