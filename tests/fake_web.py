"""A local fake of "the web" for web_tools tests: HTML pages, a JSON file, images, redirects and
failures on a real HTTP server (uvicorn on loopback). Nothing here reaches the internet.

    web = FakeWeb()
    with ServerThread(web.app) as url:
        ... url + "/article.html" ...   # web.hits["/article.html"] counts the GETs
"""

from __future__ import annotations

import io
import threading
from collections import Counter

from fastapi import FastAPI, Request, Response
from fastapi.responses import RedirectResponse
from PIL import Image

ARTICLE = """<!doctype html><html><head><title>River Seine - Facts</title></head><body>
<nav>Home | About | Contact</nav>
<article><h1>The River Seine</h1>
<p>The Seine is a 777-kilometre river in northern France. It flows through Paris into the
English Channel at Le Havre.</p>
<h2>Bridges</h2>
<p>Paris has 37 bridges over the Seine, including the <a href="/pont-neuf">Pont Neuf</a>, which is
the oldest standing bridge.</p>
<ul><li>Pont Neuf</li><li>Pont Alexandre III</li></ul></article>
<footer>Copyright 2024 Example</footer></body></html>"""

ARTICLE_MARKDOWN = (
    "# The River Seine\n\nThe Seine is a 777-kilometre river in northern France. It flows "
    "through Paris into the English Channel at Le Havre.\n\n## Bridges\n\nParis has 37 bridges "
    "over the Seine, including the Pont Neuf, which is the oldest standing bridge.\n\n"
    "- Pont Neuf\n- Pont Alexandre III"
)

LATIN1 = """<html><head><title>Caf\u00e9</title></head><body><article><p>The caf\u00e9 on the
corner of the square serves cr\u00eapes and coffee every morning from seven o'clock.</p>
</article></body></html>"""

COLOURS = {"red": (255, 0, 0), "green": (0, 160, 0), "blue": (0, 0, 255)}
IMAGE_SIZE = (40, 30)  # width, height of every fake image


def png(colour: tuple[int, int, int]) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", IMAGE_SIZE, colour).save(buf, format="PNG")
    return buf.getvalue()


class FakeWeb:
    def __init__(self) -> None:
        self.hits: Counter[str] = Counter()
        self._fail: Counter[str] = Counter()  # path -> how many more 503s to answer
        self._lock = threading.Lock()
        self.app = self._build()

    def reset(self) -> None:
        with self._lock:
            self.hits.clear()
            self._fail.clear()

    def fail_next(self, path: str, n: int) -> None:
        with self._lock:
            self._fail[path] += n

    def _build(self) -> FastAPI:
        app = FastAPI(title="fake-web")
        html = "text/html; charset=utf-8"

        @app.middleware("http")
        async def count(request: Request, call_next):  # type: ignore[no-untyped-def]
            path = request.url.path
            with self._lock:
                self.hits[path] += 1
                failing = self._fail[path] > 0
                if failing:
                    self._fail[path] -= 1
            if failing:
                return Response("busy", status_code=503, media_type="text/plain")
            return await call_next(request)

        @app.get("/article.html")
        async def article() -> Response:
            return Response(ARTICLE, media_type=html)

        @app.get("/latin1.html")
        async def latin1() -> Response:
            return Response(
                LATIN1.encode("latin-1"),
                headers={"content-type": "text/html; charset=iso-8859-1"},
            )

        @app.get("/empty.html")
        async def empty() -> Response:
            return Response("<html><body></body></html>", media_type=html)

        @app.get("/big.html")
        async def big() -> Response:
            return Response(
                "<html><body>" + "<p>word</p>" * 2000 + "</body></html>", media_type=html
            )

        @app.get("/data.json")
        async def data() -> Response:
            return Response('{"a": 1}', media_type="application/json")

        @app.get("/undeclared")
        async def undeclared() -> Response:
            return Response(b"just some bytes", media_type=None)

        @app.get("/redirect")
        async def redirect() -> Response:
            return RedirectResponse("/article.html", status_code=302)

        @app.get("/to-ftp")
        async def to_ftp() -> Response:
            return RedirectResponse("ftp://127.0.0.1/file.html", status_code=302)

        @app.get("/flaky.html")
        async def flaky() -> Response:
            return Response(ARTICLE, media_type=html)

        @app.get("/img/{name}.png")
        async def image(name: str) -> Response:
            if name == "broken":
                return Response(b"this is not a png", media_type="image/png")
            if name not in COLOURS:
                return Response("no such image", status_code=404, media_type="text/plain")
            return Response(png(COLOURS[name]), media_type="image/png")

        return app
