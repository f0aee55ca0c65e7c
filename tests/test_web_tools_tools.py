"""web_tools beyond Serper text search: the ``ddgs`` engine (through its injectable network
call), ``GET /image_search`` and ``GET /web_scrape``, all in the reference's envelope, against
local fakes only (tests/fake_serper.py, tests/fake_web.py, a fake ddgs call): nothing here
reaches the internet."""

from __future__ import annotations

import base64
import io
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fake_serper import FakeSerper
from fake_web import ARTICLE_MARKDOWN, COLOURS, IMAGE_SIZE, FakeWeb
from gateway_fixtures import live_clients, quick_settings
from PIL import Image

from mia.http import ServerThread
from web_tools.config import WebToolsConfig
from web_tools.ddgs_engine import INSTALL_HINT, parse_images, parse_text
from web_tools.server import build_app

try:  # the real exception types when ddgs is installed, look-alikes by name otherwise
    from ddgs.exceptions import DDGSException, RatelimitException, TimeoutException
except ImportError:  # pragma: no cover - depends on the web extra

    class DDGSException(Exception):  # type: ignore[no-redef]
        pass

    class RatelimitException(DDGSException):  # type: ignore[no-redef]
        pass

    class TimeoutException(DDGSException):  # type: ignore[no-redef]
        pass


KEY = "sk-images-0a1b2c"
HEX32 = "0123456789abcdef"


class FakeDdgs:
    """Stands in for ddgs' network call: records ``(kind, query, kwargs)`` and answers dicts
    in ddgs' own shape; ``fail`` holds exceptions to raise on the next calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, dict[str, Any]]] = []
        self.fail: list[Exception] = []
        self.image_base = ""
        self._lock = threading.Lock()

    def __call__(self, kind: str, query: str, kwargs: dict[str, Any]) -> list[dict[str, Any]]:
        with self._lock:
            self.calls.append((kind, query, dict(kwargs)))
            if self.fail:
                raise self.fail.pop(0)
        if kind == "images":
            return [
                {
                    "title": f"{name.capitalize()} {query}",
                    "image": f"{self.image_base}/img/{name}.png",
                    "thumbnail": "https://tse.example/th?id=1",
                    "url": f"https://pages.example/{name}",
                    "height": 30,
                    "width": 40,
                    "source": "Bing",
                }
                for name in ("blue", "broken", "red")
            ][: kwargs["max_results"]]
        return [
            {
                "title": f"{query} - page {i}",
                "href": f"https://ddg.example/{i}",
                "body": f"Body {i} of {query}.",
            }
            for i in range(1, kwargs["max_results"] + 1)
        ]


@pytest.fixture(scope="module")
def web() -> Iterator[tuple[FakeWeb, str]]:
    fake = FakeWeb()
    with ServerThread(fake.app) as url:
        yield fake, url


@pytest.fixture(scope="module")
def serper() -> Iterator[tuple[FakeSerper, str]]:
    fake = FakeSerper()
    with ServerThread(fake.app) as url:
        yield fake, url


Gateway = Callable[..., httpx.Client]


@pytest.fixture
def gateway(
    web: tuple[FakeWeb, str], serper: tuple[FakeSerper, str], tmp_path: Path
) -> Iterator[Gateway]:
    web[0].reset()
    serper[0].reset()
    with live_clients(timeout=60) as open_app:

        def start(
            *, ddgs: FakeDdgs | None = None, key: str | None = KEY, **overrides
        ) -> httpx.Client:
            settings = {
                "serper_url": f"{serper[1]}/search",
                "serper_images_url": f"{serper[1]}/images",
                **quick_settings(tmp_path),
                # The fake web listens on loopback, which fetches refuse unless allow-listed:
                # open exactly its port (tests/test_ssrf.py checks the refusal itself).
                "fetch_allow_hosts": [web[1].removeprefix("http://")],
                **overrides,
            }
            return open_app(build_app(WebToolsConfig(**settings), serper_key=key, ddgs_call=ddgs))

        yield start


def check_envelope(body: dict[str, Any], tool: str, cache: str) -> dict[str, Any]:
    """The reference's envelope around ``result``; returns ``result``."""
    assert set(body) == {"request_id", "tool", "result", "stat"}
    assert len(body["request_id"]) == 32 and set(body["request_id"]) <= set(HEX32)
    assert body["tool"] == {"name": tool, "version": "1.0"}
    assert body["stat"] == {"cache": cache}
    return body["result"]


def decode(image: str) -> Image.Image:
    return Image.open(io.BytesIO(base64.b64decode(image)))


# --- ddgs ------------------------------------------------------------------------------------


def test_ddgs_dicts_are_parsed():
    items = [
        {"title": " A ", "href": "https://a.example/", "body": "about a"},
        {"title": "no url", "body": "skipped"},
        {
            "date": "2024-05-01T10:00:00",
            "title": "News",
            "body": "b",
            "url": "https://n.example",
            "image": "",
            "source": "Reuters",
        },  # fmt: skip
        "garbage",
    ]
    assert parse_text(items, 5) == [
        {"title": "A", "url": "https://a.example/", "snippet": "about a", "kind": "organic"},
        {
            "title": "News",
            "url": "https://n.example",
            "snippet": "b",
            "kind": "organic",
            "date": "2024-05-01T10:00:00",
            "source": "Reuters",
        },  # fmt: skip
    ]
    assert parse_text(items, 1) == parse_text(items, 5)[:1]
    assert parse_text({"not": "a list"}, 3) == []
    images = [
        {
            "title": "T",
            "image": "https://i.example/1.jpg",
            "thumbnail": "x",
            "url": "https://p",
            "height": 1,
            "width": 2,
            "source": "Bing",
        },  # fmt: skip
        {"title": "no image"},
    ]
    assert parse_images(images, 5) == [
        {"title": "T", "image_url": "https://i.example/1.jpg", "source_url": "https://p"}
    ]


def test_ddgs_search_exact_envelope_and_cache(gateway: Gateway):
    ddgs = FakeDdgs()
    client = gateway(ddgs=ddgs, key=None)  # keyless: no Serper key needed for ddgs
    resp = client.get("/search", params={"q": "seine length", "engine": "ddgs", "max_results": 2})
    assert resp.status_code == 200, resp.text
    result = check_envelope(resp.json(), "search", "MISS")
    items = [
        {"title": f"seine length - page {i}", "url": f"https://ddg.example/{i}",
         "snippet": f"Body {i} of seine length.", "kind": "organic"}
        for i in (1, 2)
    ]  # fmt: skip
    blocks = [
        f"Title: seine length - page {i}\nURL: https://ddg.example/{i}\n"
        f"Snippet: Body {i} of seine length."
        for i in (1, 2)
    ]
    assert result.pop("latency_ms") >= 0
    assert result == {
        "success": True,
        "engine": "ddgs",
        "results": [{**item, "formatted": b} for item, b in zip(items, blocks, strict=True)],
        "formatted": f"[1] {blocks[0]}\n\n[2] {blocks[1]}",
        "queries": [{"query": "seine length", "results": items, "cached": False}],
    }
    assert ddgs.calls == [
        ("text", "seine length", {"region": "us-en", "max_results": 2, "backend": "brave"})
    ]
    again = client.get("/search", params={"q": "Seine  Length", "engine": "ddgs", "max_results": 2})
    assert check_envelope(again.json(), "search", "HIT")["queries"][0]["cached"] is True
    assert len(ddgs.calls) == 1
    # Same query on Serper is another cache entry; no key -> 503, ddgs' entry does not leak.
    assert client.get("/search", params={"q": "seine length", "max_results": 2}).status_code == 503


def test_ddgs_as_default_engine_several_queries_and_chinese_region(gateway: Gateway):
    ddgs = FakeDdgs()
    client = gateway(ddgs=ddgs, key=None, default_engine="ddgs", ddgs_backend="auto")
    resp = client.get("/search", params={"q": ["塞纳河", "seine"], "max_results": 1})
    result = check_envelope(resp.json(), "search", "MISS")
    assert result["engine"] == "ddgs" and "formatted" not in result
    assert result["results"] == (
        "[1] Title: 塞纳河 - page 1\nURL: https://ddg.example/1\nSnippet: Body 1 of 塞纳河."
        "\n=======\n"
        "[1] Title: seine - page 1\nURL: https://ddg.example/1\nSnippet: Body 1 of seine."
    )
    assert sorted(c[2]["region"] for c in ddgs.calls) == ["cn-zh", "us-en"]
    assert {c[2]["backend"] for c in ddgs.calls} == {"auto"}
    # POST /search (our shape) takes the engine too.
    body = client.post("/search", json={"queries": ["seine"], "max_results": 1}).json()
    assert body["cached"] is True and body["results"][0]["url"] == "https://ddg.example/1"


def test_ddgs_failures_retried_then_mapped(gateway: Gateway):
    ddgs = FakeDdgs()
    client = gateway(ddgs=ddgs, key=None, max_retries=2)
    ddgs.fail = [RatelimitException("202 Ratelimit"), TimeoutException("timed out")]
    ok = client.get("/search", params={"q": "retry me", "engine": "ddgs", "max_results": 1})
    assert ok.status_code == 200 and len(ddgs.calls) == 3
    ddgs.fail = [TimeoutException("timed out")] * 3
    resp = client.get("/search", params={"q": "slow", "engine": "ddgs"})
    assert resp.status_code == 504
    assert resp.json()["error"] == {
        "code": "upstream_timeout",
        "message": "ddgs timed out: TimeoutException: timed out (after 3 attempts)",
    }
    ddgs.fail = [RatelimitException("r")] * 3
    resp = client.get("/search", params={"q": "busy", "engine": "ddgs"})
    assert (resp.status_code, resp.json()["error"]["code"]) == (502, "upstream_rate_limited")
    # ddgs raises "No results found." when every backend came back empty: zero results.
    ddgs.fail = [DDGSException("No results found.")]
    empty = client.get("/search", params={"q": "nothing", "engine": "ddgs"}).json()
    assert check_envelope(empty, "search", "MISS")["results"] == []
    ddgs.fail = [ValueError("boom")] * 3
    resp = client.get("/search", params={"q": "broken", "engine": "ddgs"})
    assert resp.json()["error"] == {
        "code": "upstream_error",
        "message": "ddgs failed: ValueError: boom (after 3 attempts)",
    }
    stats = client.get("/health").json()["stats"]
    assert (stats["ddgs_calls"], stats["serper_calls"], stats["errors"]) == (13, 0, 3)


def test_ddgs_missing_package_is_a_clear_503(gateway: Gateway, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(sys.modules, "ddgs", None)  # import ddgs -> ImportError; no network
    resp = gateway(key=None).get("/search", params={"q": "x", "engine": "ddgs"})
    assert resp.status_code == 503
    assert resp.json() == {"error": {"code": "unavailable", "message": INSTALL_HINT}}


def test_deterministic_answers_only_from_cache(gateway: Gateway, web: tuple[FakeWeb, str]):
    ddgs = FakeDdgs()
    client = gateway(ddgs=ddgs, key=None)
    params = {"q": "replay", "engine": "ddgs", "deterministic": "true"}
    miss = client.get("/search", params=params)
    assert miss.status_code == 404
    assert miss.json()["error"] == {
        "code": "not_cached",
        "message": "deterministic=true and 'replay' is not in the cache",
    }
    assert ddgs.calls == []
    client.get("/search", params={"q": "replay", "engine": "ddgs"})
    assert check_envelope(client.get("/search", params=params).json(), "search", "HIT")
    page = {"url": f"{web[1]}/article.html", "deterministic": "true"}
    assert client.get("/web_scrape", params=page).status_code == 404
    assert web[0].hits["/article.html"] == 0


# --- /image_search ---------------------------------------------------------------------------


def _serper_images(base: str) -> dict[str, Any]:
    names = ["red", "missing", "broken", "green"]
    return {
        "images": [
            {"title": f"{n.capitalize()} square", "imageUrl": f"{base}/img/{n}.png",
             "imageWidth": 40, "imageHeight": 30, "link": f"https://pages.example/{n}",
             "position": i}
            for i, n in enumerate(names, 1)
        ]
        + [{"title": "no url"}, {"title": "ftp", "imageUrl": "ftp://127.0.0.1/x.png"}]
    }  # fmt: skip


def test_image_search_serper_downloads_resizes_and_caches(
    gateway: Gateway, serper: tuple[FakeSerper, str], web: tuple[FakeWeb, str]
):
    fake, base = serper[0], web[1]
    fake.images["red square"] = _serper_images(base)
    client = gateway()
    resp = client.get("/image_search", params={"q": "red square", "max_results": 5})
    assert resp.status_code == 200, resp.text
    result = check_envelope(resp.json(), "image_search", "MISS")
    images = result.pop("images")
    assert result.pop("latency_ms") >= 0
    assert result == {
        "text": "Red square\nGreen square",
        "stat": {"found": 5, "returned": 2},
        "engine": "serper",
        "query": "red square",
        "results": [
            {
                "title": f"{n.capitalize()} square",
                "image_url": f"{base}/img/{n}.png",
                "source_url": f"https://pages.example/{n}",
                "width": IMAGE_SIZE[0],
                "height": IMAGE_SIZE[1],
            }
            for n in ("red", "green")
        ],  # fmt: skip
    }
    for image, name in zip(images, ("red", "green"), strict=True):
        img = decode(image)
        assert (img.format, img.size, img.mode) == ("JPEG", (256, 256), "RGB")
        assert all(
            abs(a - b) <= 3 for a, b in zip(img.getpixel((128, 128)), COLOURS[name], strict=True)
        )
    assert [(c.path, c.key, c.body) for c in fake.calls] == [
        ("/images", KEY, {"q": "red square", "num": 5, "gl": "us", "hl": "en"})
    ]
    hits = dict(web[0].hits)
    assert hits == {"/img/red.png": 1, "/img/missing.png": 1, "/img/broken.png": 1,
                    "/img/green.png": 1}  # fmt: skip
    again = client.get("/image_search", params={"q": "red square", "max_results": 5}).json()
    assert check_envelope(again, "image_search", "HIT")["images"] == images
    assert len(fake.calls) == 1 and dict(web[0].hits) == hits
    assert client.get("/health").json()["stats"]["fetches"] == 4


def test_image_search_ddgs_and_bad_input(gateway: Gateway, web: tuple[FakeWeb, str]):
    ddgs = FakeDdgs()
    ddgs.image_base = web[1]
    client = gateway(ddgs=ddgs, key=None, image_size=32)
    resp = client.get("/image_search", params={"q": "flags", "engine": "ddgs", "max_results": 3})
    result = check_envelope(resp.json(), "image_search", "MISS")
    assert result["text"] == "Blue flags\nRed flags" and result["stat"] == {
        "found": 3,
        "returned": 2,
    }
    assert [decode(i).size for i in result["images"]] == [(32, 32), (32, 32)]
    assert ddgs.calls == [("images", "flags", {"region": "us-en", "max_results": 3})]
    for params, message in [
        ({"q": " "}, "q: query is empty"),
        ({"q": "x" * 401}, "q: query has 401 characters (max 400)"),
        ({"q": "x", "max_results": 11}, "max_results: must be in 1..10"),
        (
            {"q": "x", "engine": "google"},
            "engine 'google' is not supported; use one of serper, ddgs",
        ),
    ]:
        bad = client.get("/image_search", params=params)
        assert bad.status_code == 422
        assert bad.json() == {"error": {"code": "invalid_request", "message": message}}
    # Serper without a key: the same 503 as search.
    assert client.get("/image_search", params={"q": "x"}).json()["error"]["code"] == "unavailable"


# --- /web_scrape -----------------------------------------------------------------------------


def test_web_scrape_extracts_markdown_follows_redirects_and_caches(
    gateway: Gateway, web: tuple[FakeWeb, str]
):
    client = gateway(key=None)
    url = f"{web[1]}/redirect"
    resp = client.get("/web_scrape", params={"url": url, "goal": "bridges"})
    assert resp.status_code == 200, resp.text
    result = check_envelope(resp.json(), "web_scrape", "MISS")
    assert result.pop("latency_ms") >= 0
    assert result == {
        "success": True,
        "url": url,
        "markdown_content": ARTICLE_MARKDOWN,
        "final_url": f"{web[1]}/article.html",
        "title": "The River Seine",
        "content_type": "text/html",
        "goal": "bridges",
    }
    again = client.get("/web_scrape", params={"url": url}).json()
    assert check_envelope(again, "web_scrape", "HIT")["markdown_content"] == ARTICLE_MARKDOWN
    assert web[0].hits["/article.html"] == 1
    latin = client.get("/web_scrape", params={"url": f"{web[1]}/latin1.html"}).json()["result"]
    assert latin["markdown_content"] == (
        "The caf\u00e9 on the corner of the square serves cr\u00eapes and coffee every morning "
        "from seven o'clock."
    )
    empty = client.get("/web_scrape", params={"url": f"{web[1]}/empty.html"}).json()["result"]
    assert (empty["success"], empty["markdown_content"]) == (False, "")


def test_web_scrape_retries_flaky_pages(gateway: Gateway, web: tuple[FakeWeb, str]):
    web[0].fail_next("/flaky.html", 2)
    client = gateway(key=None, max_retries=2)
    resp = client.get("/web_scrape", params={"url": f"{web[1]}/flaky.html"})
    assert resp.status_code == 200 and resp.json()["result"]["success"] is True
    assert web[0].hits["/flaky.html"] == 3
    web[0].fail_next("/flaky.html", 3)
    down = client.get("/web_scrape", params={"url": f"{web[1]}/flaky.html?v=2"})
    assert down.status_code == 502
    assert down.json()["error"] == {
        "code": "upstream_error",
        "message": f"page {web[1]}/flaky.html?v=2 answered HTTP 503 (after 3 attempts)",
    }


def test_web_scrape_refuses_bad_urls_and_non_html(gateway: Gateway, web: tuple[FakeWeb, str]):
    base = web[1]
    client = gateway(key=None, scrape_max_bytes=4096, max_retries=1)
    cases = [
        ("ftp://127.0.0.1/file.html", 422, "invalid_request",
         "url must be http:// or https://, not 'ftp'"),
        ("file:///etc/passwd", 422, "invalid_request", "url must be http:// or https://, not 'file'"),
        ("not a url", 422, "invalid_request", "url must be http:// or https://, not 'relative'"),
        ("http://", 422, "invalid_request", "url has no host"),
        ("http://x/" + "a" * 2048, 422, "invalid_request", "url has 2057 characters (max 2048)"),
        (f"{base}/data.json", 415, "not_html",
         f"{base}/data.json is not an HTML page (application/json)"),
        (f"{base}/undeclared", 415, "not_html", f"{base}/undeclared is not an HTML page "
         "(undeclared content that does not look like HTML)"),
        (f"{base}/big.html", 502, "upstream_too_large",
         f"page {base}/big.html is larger than the 4096 bytes cap"),
        (f"{base}/nowhere", 502, "upstream_error", f"page {base}/nowhere answered HTTP 404"),
        (f"{base}/to-ftp", 502, "upstream_error", None),
    ]  # fmt: skip
    for url, status, code, message in cases:
        resp = client.get("/web_scrape", params={"url": url})
        assert resp.status_code == status, (url, resp.text)
        error = resp.json()["error"]
        assert error["code"] == code, url
        if message is not None:
            assert error["message"] == message
    assert "redirected to a URL that is not http(s)" in error["message"]
    assert web[0].hits["/nowhere"] == 1  # a 404 is not retried
    assert client.get("/web_scrape").status_code == 422
    long_goal = client.get("/web_scrape", params={"url": f"{base}/x", "goal": "g" * 2001})
    assert long_goal.json()["error"]["message"] == "goal has 2001 characters (max 2000)"
    assert client.get("/health").json()["cache"]["entries"] == 0  # no failure was cached


def test_web_search_client_picks_the_engine(gateway: Gateway):
    import asyncio

    from mia.services.web import SearchResult, WebSearchClient

    ddgs = FakeDdgs()
    base = str(gateway(ddgs=ddgs).base_url)

    async def run() -> list[list[SearchResult]]:
        async with WebSearchClient(base) as wsc:
            return await wsc.search(["keyless"], max_results=1, engine="ddgs")

    assert asyncio.run(run()) == [
        [
            SearchResult(
                title="keyless - page 1",
                url="https://ddg.example/1",
                snippet="Body 1 of keyless.",
                kind="organic",
            )
        ]  # fmt: skip
    ]
    assert [c[0] for c in ddgs.calls] == ["text"]


def test_web_search_client_image_search_and_web_scrape(gateway: Gateway, web: tuple[FakeWeb, str]):
    """The typed client methods return the envelope's ``result``; errors keep their code."""
    import asyncio

    from mia.services.web import ImageSearchResult, ScrapeResult, WebSearchClient, WebSearchError

    ddgs = FakeDdgs()
    ddgs.image_base = web[1]
    base = str(gateway(ddgs=ddgs, key=None, image_size=32).base_url)
    page = f"{web[1]}/article.html"

    async def run() -> tuple[ImageSearchResult, ScrapeResult, ScrapeResult, WebSearchError]:
        async with WebSearchClient(base) as wsc:
            images = await wsc.image_search("flags", max_results=3, engine="ddgs")
            scraped = await wsc.web_scrape(page, goal="bridges")
            replay = await wsc.web_scrape(page, deterministic=True)
            try:
                await wsc.web_scrape("ftp://127.0.0.1/x")
            except WebSearchError as err:
                return images, scraped, replay, err
            raise AssertionError("a ftp:// URL was accepted")

    images, scraped, replay, err = asyncio.run(run())
    assert (images.text, images.engine, images.query) == ("Blue flags\nRed flags", "ddgs", "flags")
    assert [decode(i).size for i in images.images] == [(32, 32), (32, 32)]
    assert (images.stat.found, images.stat.returned) == (3, 2)
    assert (scraped.success, scraped.title, scraped.goal) == (True, "The River Seine", "bridges")
    assert scraped.markdown_content == ARTICLE_MARKDOWN == replay.markdown_content
    assert web[0].hits["/article.html"] == 1  # the replay came from the cache
    assert (err.status, err.code) == (422, "invalid_request")
    assert err.message == "url must be http:// or https://, not 'ftp'"
