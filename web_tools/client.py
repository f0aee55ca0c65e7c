"""Async client for the gateway, for the agent's online ``search`` tool."""

from __future__ import annotations

from typing import Any

import httpx

from mia.errors import MiaError
from web_tools.models import DEFAULT_MAX_RESULTS, MAX_QUERIES


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
