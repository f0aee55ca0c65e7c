"""web_tools: the Serper gateway against a real fake Serper HTTP server (tests/fake_serper.py)."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from fake_serper import FakeSerper, organic
from gateway_fixtures import live_clients, quick_settings

from mia.errors import MiaError
from mia.http import ServerThread, wait_for_port_file
from mia.services.web import SearchResult, WebSearchClient, WebSearchError
from web_tools.cache import cache_key
from web_tools.config import WebToolsConfig, load_config
from web_tools.ratelimit import TokenBucket
from web_tools.serper import (
    SerperError,
    build_payload,
    parse_response,
    parse_retry_after,
    retry_delay,
)
from web_tools.server import build_app
from web_tools.service import MISSING_KEY_MESSAGE

REPO = Path(__file__).resolve().parents[1]
KEY = "sk-test-7f3a9c1e5b2d4f60"


@pytest.fixture(scope="module")
def fake_server() -> Iterator[tuple[FakeSerper, str]]:
    fake = FakeSerper()
    with ServerThread(fake.app) as url:
        yield fake, f"{url}/search"


@pytest.fixture
def fake(fake_server: tuple[FakeSerper, str]) -> FakeSerper:
    fake_server[0].reset()
    return fake_server[0]


@pytest.fixture
def fake_url(fake_server: tuple[FakeSerper, str]) -> str:
    return fake_server[1]


Gateway = Callable[..., httpx.Client]


@pytest.fixture
def gateway(fake_url: str, tmp_path: Path) -> Iterator[Gateway]:
    """``gateway(key=..., token=..., clock=..., **config)`` -> an httpx client on a live app."""
    with live_clients(timeout=30) as open_app:

        def start(
            *, key: str | None = KEY, token: str | None = None, clock=None, **overrides
        ) -> httpx.Client:
            settings = {"serper_url": fake_url, **quick_settings(tmp_path), **overrides}
            extra = {"clock": clock} if clock is not None else {}
            return open_app(
                build_app(WebToolsConfig(**settings), serper_key=key, token=token, **extra)
            )

        yield start


def expected_results(query: str, n: int) -> list[dict]:
    out = []
    for item in organic(query, n):
        result = {
            "title": item["title"],
            "url": item["link"],
            "snippet": item["snippet"],
            "kind": "organic",
        }
        if "date" in item:
            result["date"] = item["date"]
        out.append(result)
    return out


def typed_results(query: str, n: int) -> list[SearchResult]:
    """:func:`expected_results` as :class:`WebSearchClient` answers them."""
    return [SearchResult.model_validate(r) for r in expected_results(query, n)]


# --- happy paths -------------------------------------------------------------------------------


def test_single_query_exact_payload_and_serper_request(gateway: Gateway, fake: FakeSerper):
    client = gateway()
    resp = client.post("/search", json={"queries": ["python asyncio"], "max_results": 2})
    assert resp.status_code == 200
    entry = {
        "query": "python asyncio",
        "results": [
            {
                "title": "python asyncio - result 1",
                "url": "https://example.com/python-asyncio/1",
                "snippet": "Snippet 1 about python asyncio.",
                "date": "Jan 2, 2024",
                "kind": "organic",
            },
            {
                "title": "python asyncio - result 2",
                "url": "https://example.com/python-asyncio/2",
                "snippet": "Snippet 2 about python asyncio.",
                "kind": "organic",
            },
        ],
        "cached": False,
    }
    assert resp.json() == {"queries": [entry], **entry}
    assert [(c.key, c.body) for c in fake.calls] == [
        (KEY, {"q": "python asyncio", "num": 2, "gl": "us", "hl": "en"})
    ]


def test_default_max_results_is_three(gateway: Gateway, fake: FakeSerper):
    body = gateway().post("/search", json={"queries": ["default count"]}).json()
    assert body["results"] == expected_results("default count", 3)
    assert fake.calls[0].body["num"] == 3


def test_multi_query_get_and_post_with_chinese_locale(gateway: Gateway, fake: FakeSerper):
    client = gateway()
    queries = ["mount everest height", "珠穆朗玛峰 高度"]
    resp = client.get("/search", params={"q": queries, "max_results": 1})
    assert resp.status_code == 200
    expected = {
        "queries": [
            {"query": q, "results": expected_results(q, 1), "cached": False} for q in queries
        ]
    }
    # GET answers the reference's envelope; our per-query entries ride in result.queries.
    body = resp.json()
    assert body["result"]["queries"] == expected["queries"]
    assert body["stat"] == {"cache": "MISS"}
    assert {c.body["q"]: c.body for c in fake.calls} == {
        queries[0]: {"q": queries[0], "num": 1, "gl": "us", "hl": "en"},
        queries[1]: {"q": queries[1], "num": 1, "gl": "cn", "hl": "zh-cn", "location": "China"},
    }
    # POST with the same queries: served from the cache, our shape, no new Serper call.
    resp = client.post("/search", json={"queries": queries, "max_results": 1})
    assert resp.status_code == 200
    for entry in expected["queries"]:
        entry["cached"] = True
    assert resp.json() == expected
    assert fake.call_count == 2
    again = client.get("/search", params={"q": queries, "max_results": 1}).json()
    assert again["stat"] == {"cache": "HIT"}


def test_duplicate_queries_share_one_serper_call(gateway: Gateway, fake: FakeSerper):
    body = gateway().post("/search", json={"queries": ["same thing", "same  thing"]}).json()
    assert fake.call_count == 1
    assert [e["results"] for e in body["queries"]] == [expected_results("same thing", 3)] * 2
    assert [e["query"] for e in body["queries"]] == ["same thing", "same  thing"]


def test_answer_box_and_knowledge_graph_come_first(gateway: Gateway, fake: FakeSerper):
    fake.responses["apple ceo"] = {
        "answerBox": {
            "title": "Apple Inc. / CEO",
            "answer": "Tim Cook",
            "snippet": "Timothy Donald Cook is the CEO of Apple.",
            "link": "https://en.wikipedia.org/wiki/Tim_Cook",
        },
        "knowledgeGraph": {
            "title": "Apple",
            "type": "Technology company",
            "website": "https://www.apple.com/",
            "description": "Apple Inc. designs consumer electronics.",
            "attributes": {"CEO": "Tim Cook", "Founded": "April 1, 1976"},
        },
        "organic": [
            {
                "title": "Tim Cook - Apple",
                "link": "https://www.apple.com/leadership/",
                "snippet": "s1",
            },
            {"title": "no link, skipped", "snippet": "x"},
            {"title": "Second", "link": "https://example.org/2", "snippet": "s2", "date": "2d ago"},
        ],
    }
    client = gateway()
    body = client.post("/search", json={"queries": ["apple ceo"], "max_results": 4}).json()
    assert body["results"] == [
        {
            "title": "Apple Inc. / CEO",
            "url": "https://en.wikipedia.org/wiki/Tim_Cook",
            "snippet": "Tim Cook; Timothy Donald Cook is the CEO of Apple.",
            "kind": "answer_box",
        },
        {
            "title": "Apple (Technology company)",
            "url": "https://www.apple.com/",
            "snippet": "Apple Inc. designs consumer electronics.; CEO: Tim Cook; "
            "Founded: April 1, 1976",
            "kind": "knowledge_graph",
        },
        {
            "title": "Tim Cook - Apple",
            "url": "https://www.apple.com/leadership/",
            "snippet": "s1",
            "kind": "organic",
        },
        {
            "title": "Second",
            "url": "https://example.org/2",
            "snippet": "s2",
            "date": "2d ago",
            "kind": "organic",
        },
    ]
    # max_results counts the boxes too.
    body = client.post("/search", json={"queries": ["apple ceo"], "max_results": 2}).json()
    assert [r["kind"] for r in body["results"]] == ["answer_box", "knowledge_graph"]


def test_answer_box_can_be_switched_off():
    data = {
        "answerBox": {"snippetHighlighted": ["42"], "title": "T"},
        "knowledgeGraph": {"title": "K"},
        "organic": [{"title": "o", "link": "https://o", "snippet": "s"}],
    }
    assert parse_response(data, "q", 5)[0] == {
        "title": "T",
        "url": "",
        "snippet": "42",
        "kind": "answer_box",
    }
    assert parse_response(data, "q", 5, include_answer_box=False)[0]["kind"] == "knowledge_graph"
    only = parse_response(data, "q", 5, include_answer_box=False, include_knowledge_graph=False)
    assert only == [{"title": "o", "url": "https://o", "snippet": "s", "kind": "organic"}]
    assert parse_response({"organic": "garbage"}, "q", 5) == []
    with pytest.raises(SerperError):
        parse_response(["not", "an", "object"], "q", 5)


def test_build_payload_locales():
    assert build_payload("hello", 5) == {"q": "hello", "num": 5, "gl": "us", "hl": "en"}
    assert build_payload("北京 weather", 1) == {
        "q": "北京 weather",
        "num": 1,
        "gl": "cn",
        "hl": "zh-cn",
        "location": "China",
    }


# --- cache ---------------------------------------------------------------------------------


def test_cache_hit_and_ttl_expiry(gateway: Gateway, fake: FakeSerper, tmp_path: Path):
    now = [1_000_000.0]
    client = gateway(clock=lambda: now[0], ttl_s=60)
    first = client.post("/search", json={"queries": ["Cache Me"], "max_results": 2}).json()
    assert first["cached"] is False and fake.call_count == 1
    # Same query modulo case and spacing: a hit, Serper not called.
    again = client.post("/search", json={"queries": ["  cache   me "], "max_results": 2}).json()
    assert again["cached"] is True
    assert again["results"] == first["results"]
    assert again["query"] == "  cache   me "
    assert fake.call_count == 1
    # Another max_results is another key.
    client.post("/search", json={"queries": ["Cache Me"], "max_results": 3})
    assert fake.call_count == 2
    now[0] += 61
    expired = client.post("/search", json={"queries": ["Cache Me"], "max_results": 2}).json()
    assert expired["cached"] is False and fake.call_count == 3
    health = client.get("/health").json()
    assert health["cache"] == {"path": str(tmp_path / "cache.sqlite"), "entries": 2}
    assert health["stats"] == {
        "requests": 4,
        "queries": 4,
        "cache_hits": 1,
        "serper_calls": 3,
        "ddgs_calls": 0,
        "fetches": 0,
        "errors": 0,
    }
    with sqlite3.connect(tmp_path / "cache.sqlite") as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_cache_survives_restart_and_can_be_disabled(gateway: Gateway, fake: FakeSerper):
    gateway().post("/search", json={"queries": ["persist"]})
    assert gateway().post("/search", json={"queries": ["persist"]}).json()["cached"] is True
    assert fake.call_count == 1
    nocache = gateway(cache_path="none")
    assert nocache.post("/search", json={"queries": ["persist"]}).json()["cached"] is False
    assert nocache.post("/search", json={"queries": ["persist"]}).json()["cached"] is False
    assert fake.call_count == 3
    assert nocache.get("/health").json()["cache"] is None


def test_cache_key_normalisation():
    assert cache_key("Hello World", 3, "us") == cache_key("hello world", 3, "us")
    assert cache_key("hello world", 3, "us") != cache_key("hello world", 4, "us")
    assert cache_key("hello world", 3, "us") != cache_key("hello world", 3, "cn")


# --- upstream failures -----------------------------------------------------------------------


def test_retries_500s_then_succeeds(gateway: Gateway, fake: FakeSerper):
    fake.fail_next(2, 500)
    client = gateway(max_retries=3)
    resp = client.post("/search", json={"queries": ["flaky"], "max_results": 1})
    assert resp.status_code == 200
    assert resp.json()["results"] == expected_results("flaky", 1)
    assert fake.call_count == 3
    assert client.get("/health").json()["stats"]["serper_calls"] == 3


def test_429_retry_after_is_respected(gateway: Gateway, fake: FakeSerper):
    # A huge backoff would blow the client timeout; Retry-After: 0 must win over it.
    fake.fail_next(1, 429, headers={"Retry-After": "0"})
    client = gateway(backoff_base_s=60.0, backoff_max_s=60.0)
    resp = client.post("/search", json={"queries": ["busy"]}, timeout=10)
    assert resp.status_code == 200
    assert fake.call_count == 2


def test_persistent_500_gives_502_envelope_and_service_stays_up(gateway: Gateway, fake: FakeSerper):
    fake.fail_next(3, 500)
    client = gateway(max_retries=2)
    resp = client.post("/search", json={"queries": ["down"]})
    assert resp.status_code == 502
    assert resp.json() == {
        "error": {
            "code": "upstream_error",
            "message": "Serper answered HTTP 500: fake failure 500 (after 3 attempts)",
        }
    }
    assert fake.call_count == 3
    # Nothing cached from the failure; the next call works.
    resp = client.post("/search", json={"queries": ["down"]})
    assert resp.status_code == 200 and resp.json()["cached"] is False
    assert client.get("/health").json()["stats"]["errors"] == 1


def test_persistent_429_is_rate_limited_502(gateway: Gateway, fake: FakeSerper):
    fake.fail_next(2, 429, headers={"Retry-After": "0"}, body={"message": "Too many requests"})
    resp = gateway(max_retries=1).post("/search", json={"queries": ["x"]})
    assert resp.status_code == 502
    assert resp.json()["error"] == {
        "code": "upstream_rate_limited",
        "message": "Serper answered HTTP 429: Too many requests (after 2 attempts)",
    }


def test_timeouts_give_504(gateway: Gateway, fake: FakeSerper):
    fake.stall_next(2, 1.0)
    resp = gateway(timeout_s=0.2, max_retries=1).post("/search", json={"queries": ["slow"]})
    assert resp.status_code == 504
    assert resp.json()["error"] == {
        "code": "upstream_timeout",
        "message": "Serper did not answer within 0.2s (after 2 attempts)",
    }
    assert fake.call_count == 2


def test_unreachable_serper_gives_502(gateway: Gateway):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/search"
    resp = gateway(serper_url=url, max_retries=1).post("/search", json={"queries": ["x"]})
    assert resp.status_code == 502
    error = resp.json()["error"]
    assert error["code"] == "upstream_error"
    assert error["message"].startswith(f"cannot reach Serper at {url}: ConnectError")
    assert error["message"].endswith("(after 2 attempts)")


def test_rejected_key_gives_502_without_retries(gateway: Gateway, fake: FakeSerper):
    fake.expected_key = "the-right-key"
    resp = gateway(max_retries=3).post("/search", json={"queries": ["x"]})
    assert resp.status_code == 502
    assert resp.json()["error"] == {
        "code": "upstream_auth",
        "message": "Serper rejected the API key (HTTP 403: Unauthorized.); check SERPER_KEY_ID",
    }
    assert fake.call_count == 1


def test_other_4xx_is_not_retried(gateway: Gateway, fake: FakeSerper):
    fake.fail_next(1, 400, body={"message": "Not enough credits"})
    resp = gateway().post("/search", json={"queries": ["x"]})
    assert resp.status_code == 502
    assert resp.json()["error"]["message"] == (
        "Serper refused the request (HTTP 400: Not enough credits)"
    )
    assert fake.call_count == 1


def test_missing_key_503_but_cache_still_served(gateway: Gateway, fake: FakeSerper):
    gateway().post("/search", json={"queries": ["known"]})  # fills the shared cache file
    client = gateway(key=None)
    resp = client.post("/search", json={"queries": ["unknown"]})
    assert resp.status_code == 503
    assert resp.json() == {"error": {"code": "unavailable", "message": MISSING_KEY_MESSAGE}}
    assert MISSING_KEY_MESSAGE.startswith("SERPER_KEY_ID is not set")
    health = client.get("/health")
    assert health.status_code == 200 and health.json()["serper_configured"] is False
    cached = client.post("/search", json={"queries": ["known"]}).json()
    assert cached["cached"] is True and cached["results"] == expected_results("known", 3)
    assert fake.call_count == 1
    assert gateway().get("/health").json()["serper_configured"] is True


# --- input validation and auth ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"q": "x", "max_results": 0}, "max_results: Input should be greater than or equal to 1"),
        ({"q": "x", "max_results": 11}, "max_results: Input should be less than or equal to 10"),
        ({"q": ""}, "q: query 0 is empty"),
        ({"q": ["ok", "   "]}, "q: query 1 is empty"),
        ({"q": "y" * 401}, "q: query 0 has 401 characters (max 400)"),
        ({"q": ["q"] * 33}, "q: List should have at most 32 items after validation, not 33"),
        ({"q": "x", "engine": "bing"}, "engine 'bing' is not supported; use one of serper, ddgs"),
    ],
)
def test_bad_get_params(gateway: Gateway, fake: FakeSerper, params: dict, message: str):
    resp = gateway().get("/search", params=params)
    assert resp.status_code == 422
    assert resp.json() == {"error": {"code": "invalid_request", "message": message}}
    assert fake.call_count == 0


def test_bad_requests_other_shapes(gateway: Gateway, fake: FakeSerper):
    client = gateway()
    resp = client.get("/search")
    assert resp.status_code == 422 and resp.json()["error"]["message"] == "query.q: Field required"
    resp = client.get("/search", params={"q": "x", "max_results": "lots"})
    assert resp.status_code == 422 and resp.json()["error"]["code"] == "invalid_request"
    resp = client.post("/search", json={"queries": []})
    assert resp.status_code == 422
    assert resp.json()["error"]["message"].startswith("queries: List should have at least 1 item")
    resp = client.post("/search", json={"queries": ["x"], "max_results": 11})
    assert resp.status_code == 422
    resp = client.post(
        "/search", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "bad_json"
    assert client.get("/search", params={"q": "y" * 400, "max_results": 10}).status_code == 200
    assert fake.call_count == 1


def test_bearer_token_enforced(gateway: Gateway, fake: FakeSerper):
    client = gateway(token="s3cret")
    resp = client.post("/search", json={"queries": ["x"]})
    assert resp.status_code == 401
    assert resp.json() == {
        "error": {"code": "unauthorized", "message": "missing or wrong bearer token"}
    }
    wrong = client.post(
        "/search", json={"queries": ["x"]}, headers={"Authorization": "Bearer nope"}
    )
    assert wrong.status_code == 401
    assert fake.call_count == 0
    ok = client.post("/search", json={"queries": ["x"]}, headers={"Authorization": "Bearer s3cret"})
    assert ok.status_code == 200
    assert client.get("/health").status_code == 200


def test_key_never_in_responses_or_logs(
    gateway: Gateway, fake: FakeSerper, caplog: pytest.LogCaptureFixture
):
    caplog.set_level(logging.DEBUG)
    client = gateway(max_retries=1)
    bodies = [client.post("/search", json={"queries": ["leak check"]}).text]
    fake.fail_next(1, 500, body={"message": f"internal error for key {KEY}"})
    bodies.append(client.post("/search", json={"queries": ["leak check 2"]}).text)
    # An upstream that echoes the key in its error: we quote it scrubbed.
    fake.fail_next(1, 400, body={"message": f"invalid key {KEY}"})
    resp = client.post("/search", json={"queries": ["leak check 3"]})
    assert (
        resp.json()["error"]["message"] == "Serper refused the request (HTTP 400: invalid key ***)"
    )
    bodies += [resp.text, client.get("/health").text, client.get("/openapi.json").text]
    assert fake.calls[0].key == KEY  # it was really sent...
    assert all(KEY not in body for body in bodies)  # ...and never shown
    assert "retrying" in caplog.text  # the logs did capture the failing call
    assert KEY not in caplog.text


# --- helpers: client, rate limiter, retry arithmetic, config, CLI ----------------------------


def test_web_search_client(gateway: Gateway, fake: FakeSerper):
    client = gateway(token="tok")
    base = str(client.base_url)

    async def run() -> tuple[list[list[SearchResult]], WebSearchError]:
        async with WebSearchClient(base, token="tok") as wsc:
            results = await wsc.search(["alpha", "beta"], max_results=2)
        async with WebSearchClient(base) as no_token:
            with pytest.raises(WebSearchError) as err:
                await no_token.search(["alpha"])
        return results, err.value

    results, err = asyncio.run(run())
    assert results == [typed_results("alpha", 2), typed_results("beta", 2)]
    assert (err.status, err.code) == (401, "unauthorized")
    assert isinstance(err, MiaError)


def test_web_search_client_splits_big_batches(gateway: Gateway, fake: FakeSerper):
    base = str(gateway().base_url)
    queries = [f"q{i}" for i in range(40)]

    async def run() -> list[list[SearchResult]]:
        async with WebSearchClient(base) as wsc:
            return await wsc.search(queries, max_results=1)

    results = asyncio.run(run())
    assert results == [typed_results(q, 1) for q in queries]


def test_concurrency_is_bounded(gateway: Gateway, fake: FakeSerper):
    fake.stall_next(6, 0.1)
    resp = gateway(max_concurrency=2).get("/search", params={"q": [f"c{i}" for i in range(6)]})
    assert resp.status_code == 200
    assert fake.call_count == 6
    assert fake.max_inflight == 2


def test_token_bucket_waits_for_tokens():
    now = [0.0]
    slept: list[float] = []

    async def fake_sleep(seconds: float) -> None:
        slept.append(round(seconds, 6))
        now[0] += seconds

    async def run() -> None:
        bucket = TokenBucket(4.0, burst=2, clock=lambda: now[0], sleep=fake_sleep)
        for _ in range(4):
            await bucket.acquire()
        unlimited = TokenBucket(0, clock=lambda: now[0], sleep=fake_sleep)
        for _ in range(10):
            await unlimited.acquire()

    asyncio.run(run())
    assert slept == [0.25, 0.25]  # the burst of 2 is free, then one token per 1/4 s
    assert now[0] == pytest.approx(0.5)


def test_retry_arithmetic():
    assert parse_retry_after("2") == 2.0
    assert parse_retry_after("0.5") == 0.5
    assert parse_retry_after(None) is None
    assert parse_retry_after("soon") is None
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:10 GMT", now=1445412480.0) == 10.0
    assert retry_delay(0, 3.0, base=1, cap=8, retry_after_cap=30) == 3.0
    assert retry_delay(0, 300.0, base=1, cap=8, retry_after_cap=30) == 30.0
    for attempt, top in [(0, 1.0), (1, 2.0), (2, 4.0), (5, 8.0)]:
        delay = retry_delay(attempt, None, base=1, cap=8, retry_after_cap=30)
        assert 0.8 * top <= delay <= top


def test_config_yaml_mirrors_defaults(tmp_path: Path):
    assert load_config(REPO / "configs" / "web_tools" / "serve.yaml") == WebToolsConfig()
    assert load_config(None, ttl_s=5, max_retries=None).ttl_s == 5
    bad = tmp_path / "bad.yaml"
    bad.write_text("ttl: 5\n")
    with pytest.raises(MiaError, match=r"unknown key\(s\) \['ttl'\]"):
        load_config(bad)
    with pytest.raises(MiaError, match="timeout_s must be > 0"):
        load_config(None, timeout_s=0)


def test_cli_serves_and_rejects_bad_flags(fake: FakeSerper, fake_url: str, tmp_path: Path):
    env = {
        **os.environ,
        "SERPER_KEY_ID": KEY,
        "SERPER_URL": fake_url,
        "MIA_HOME": str(tmp_path / "home"),
        "PYTHONPATH": str(REPO),
    }
    port_file = tmp_path / "port"
    cmd = [sys.executable, "-m", "web_tools", "serve", "--port", "0", "--port-file", str(port_file)]
    proc = subprocess.Popen(
        [*cmd, "--log-level", "DEBUG"],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        port = wait_for_port_file(port_file, timeout=60, proc=proc)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            body = client.get("/search", params={"q": "from the cli", "max_results": 1}).json()
            health = client.get("/health").json()
    finally:
        proc.terminate()
        output, _ = proc.communicate(timeout=30)
    assert body["result"]["queries"][0]["results"] == expected_results("from the cli", 1)
    assert body["tool"]["name"] == "search" and body["stat"] == {"cache": "MISS"}
    assert fake.calls[0].key == KEY
    assert health["serper_configured"] is True
    assert health["cache"]["path"] == str(tmp_path / "home" / "web_tools" / "search_cache.sqlite")
    assert "web_tools listening on http://127.0.0.1:" in output
    assert KEY not in output

    bad = subprocess.run(
        [*cmd, "--ttl", "-1"], env=env, cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert bad.returncode == 2
    assert bad.stderr.strip() == "web_tools: error: web_tools config: ttl_s must be >= 0"
