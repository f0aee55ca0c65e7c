"""The memory inspector: ``GET /ui``, a page over memory_serve's own JSON routes.

Everything it loads ships in this package (``memory_serve/ui/``: one HTML file, one script, one
style sheet; no build step, no CDN), served under a Content-Security-Policy that allows nothing
else. The page reads ``GET /memories`` (server-side paging), ``GET /memories/{id}`` (history),
``POST /memory`` with ``explain`` (the retrieval preview: the store's own scoring) and
``GET /runs``. Authentication is the API's: with a token, the browser signs in once and holds a
session cookie (:mod:`mia.http`, "browser sessions"); docs/inspector.md.
"""

from __future__ import annotations

from importlib import resources

from fastapi import FastAPI
from fastapi.responses import Response

from mia.http import PAGE_CSP, ApiError

PAGES = ("/ui",)
ASSETS = {
    "app.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
}


def asset(name: str) -> bytes:
    return resources.files("memory_serve").joinpath("ui", name).read_bytes()


def _page_headers() -> dict[str, str]:
    return {
        "Content-Security-Policy": PAGE_CSP,
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
        "Cache-Control": "no-store",
    }


def add_inspector(app: FastAPI) -> None:
    @app.get("/ui", include_in_schema=False)
    async def inspector_page() -> Response:
        return Response(asset("index.html"), media_type="text/html", headers=_page_headers())

    @app.get("/ui/static/{name}", include_in_schema=False)
    async def inspector_asset(name: str) -> Response:
        if name not in ASSETS:
            raise ApiError(404, f"no asset {name[:100]!r}")
        return Response(asset(name), media_type=ASSETS[name], headers=_page_headers())
