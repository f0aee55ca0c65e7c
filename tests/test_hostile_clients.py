"""A hostile web page, client or connection against every service (docs/security.md).

Each test is one repro of an attack, run against the real app on an ephemeral loopback port
(uvicorn in a thread, real SQLite): the attack gets a 4xx (or its connection is closed), and the
store is intact and writable afterwards.
"""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from mia.http import ServerThread, ServiceLimits
from mia.http_guard import json_depth
from mia.llm.scripted import ScriptedChat

JSON = {"content-type": "application/json"}


# ------------------------------------------------------------------------------ the services


@contextlib.contextmanager
def memory_app(tmp_path: Path, token: str | None = None, **limits: Any) -> Iterator[Any]:
    """memory_serve with a scripted Planner (planner routes on), real SQLite and embedder."""
    from memory_serve.app import build_app
    from memory_serve.config import load_config
    from memory_serve.service import MemoryService
    from memory_serve.store import MemoryStore
    from mia.embedding import shared_embedder

    cfg = load_config(None, ["compress.mode=identity"])
    store = MemoryStore(tmp_path / "m.sqlite", shared_embedder(), cfg.store)
    calls: list[int] = []

    def planner(messages: Any) -> str:
        calls.append(1)
        return "1. Search the question (q -> a)"

    reply = ScriptedChat(planner)
    app = build_app(MemoryService(cfg, store, reply, reply), token=token)
    app.state.limits = ServiceLimits(**limits)
    app.state.planner_calls = calls
    try:
        yield app
    finally:
        store.close()


def _search_app(tmp_path: Path) -> Any:
    from local_search import build_index, open_index
    from local_search.server import create_search_app

    (tmp_path / "c.jsonl").write_text(json.dumps({"id": 0, "contents": "Paris\nA city."}) + "\n")
    build_index(tmp_path / "c.jsonl", tmp_path / "idx", "bm25")
    retriever = open_index(tmp_path / "idx")
    return create_search_app(retriever), retriever.close


def _serve_app(tmp_path: Path) -> Any:
    from mia.agent import AgentConfig, build_tools
    from serve import ExecutorService, create_serve_app

    executor = ScriptedChat(lambda _m: "<answer>Paris</answer>")
    service = ExecutorService(executor, build_tools({}), AgentConfig(image_size=16))
    return create_serve_app(service), None


def _web_app(tmp_path: Path) -> Any:
    from web_tools.config import WebToolsConfig
    from web_tools.server import build_app

    config = WebToolsConfig(cache_path=str(tmp_path / "cache.sqlite"), rate_limit_qps=0.0)
    return build_app(config, serper_key="k", ddgs_call=lambda *_: []), None


def _reward_app(tmp_path: Path) -> Any:
    from mia.judge import RuleJudge
    from mia.rewards.hooks import planner_gt_reward
    from ttrl_streaming.reward_server import GTStore, create_reward_app

    store = GTStore(tmp_path / "gts.sqlite")
    return create_reward_app(store, RuleJudge(), planner_gt_reward), store.close


def _memory_app(tmp_path: Path) -> Any:
    stack = contextlib.ExitStack()
    return stack.enter_context(memory_app(tmp_path)), stack.close


# service -> (factory, a POST route with a JSON body)
SERVICES = {
    "local_search": (_search_app, "/retrieve"),
    "serve": (_serve_app, "/execute"),
    "memory_serve": (_memory_app, "/memory"),
    "web_tools": (_web_app, "/search"),
    "reward_server": (_reward_app, "/compute_gt_reward"),
}


@pytest.fixture(params=sorted(SERVICES))
def service(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    factory, route = SERVICES[request.param]
    app, close = factory(tmp_path)
    try:
        with ServerThread(app) as url:
            yield url, route
    finally:
        if close is not None:
            close()


def _seed(url: str, n: int) -> None:
    items = [{"question": f"Where is landmark {i}?", "judgement": "correct"} for i in range(n)]
    for start in range(0, n, 200):
        r = httpx.post(f"{url}/memories", json=items[start : start + 200], timeout=120)
        assert r.status_code == 200, r.text


def _count(url: str) -> int:
    return httpx.get(f"{url}/stats", timeout=30).json()["memories"]


def _error(resp: httpx.Response, status: int, code: str) -> str:
    assert resp.status_code == status, (resp.status_code, resp.text)
    body = resp.json()
    assert set(body) == {"error"} and body["error"]["code"] == code, body
    return body["error"]["message"]


# ------------------------------------------------------------------------------ cross-site


def test_a_web_page_cannot_wipe_or_read_the_store(tmp_path: Path) -> None:
    with memory_app(tmp_path) as app, ServerThread(app) as url:
        _seed(url, 300)
        form = {"content-type": "application/x-www-form-urlencoded"}
        # The form post of the repro, with and without the Origin a browser adds.
        for extra in ({"origin": "http://evil.example"}, {}):
            r = httpx.post(f"{url}/clear_memory", content=b"", headers={**form, **extra})
            assert r.status_code in (403, 415), r.text
        msg = _error(httpx.post(f"{url}/clear_memory", content=b"x=1", headers=form), 415,
                     "unsupported_media_type")  # fmt: skip
        assert msg == "request bodies must be application/json"
        # text/plain (what fetch(no-cors) sends for a string body) is no better.
        r = httpx.post(f"{url}/clear_memory", content=b"{}", headers={"content-type": "text/plain"})
        assert r.status_code == 415
        # A JSON body from a foreign origin, or marked cross-site by the browser.
        for hdr in ({"origin": "http://evil.example"}, {"origin": "null"},
                    {"sec-fetch-site": "cross-site"}):  # fmt: skip
            r = httpx.post(f"{url}/clear_memory", json={}, headers=hdr)
            assert _error(r, 403, "cross_origin") == "cross-origin requests are refused" or (
                hdr.get("sec-fetch-site")
            )
        # DNS rebinding: the attacker's name in Host, for reads and writes alike.
        rebound = {"host": "attacker.example"}
        assert _error(httpx.get(f"{url}/memories", headers=rebound), 400, "bad_host") == (
            "the Host header does not name this service"
        )
        assert httpx.post(f"{url}/clear_memory", json={}, headers=rebound).status_code == 400
        assert _count(url) == 300
        # The same origin (the inspector page) and plain clients still work.
        port = url.rsplit(":", 1)[1]
        for origin in (url, f"http://localhost:{port}"):
            hdr = {"origin": origin, "host": origin.split("//")[1]}
            r = httpx.post(f"{url}/memory", json={"question": "Where?"}, headers=hdr)
            assert r.status_code == 200, r.text
        r = httpx.get(f"{url}/memories", headers={"host": f"localhost:{port}"})
        assert r.status_code == 200
        assert httpx.post(f"{url}/clear_memory", json={}).status_code == 200
        assert _count(url) == 0


def test_allowed_hosts_reopen_a_name(tmp_path: Path) -> None:
    with memory_app(tmp_path, allowed_hosts=("memory.lan",)) as app, ServerThread(app) as url:
        hdr = {"host": "memory.lan:5000", "origin": "http://memory.lan:5000"}
        assert httpx.get(f"{url}/stats", headers=hdr).status_code == 200
        hdr = {"host": "other.lan:5000"}
        assert httpx.get(f"{url}/stats", headers=hdr).status_code == 400


# ------------------------------------------------------------------------------ JSON bodies


def test_deep_json_with_an_escaped_emoji_is_422_everywhere(service: tuple[str, str]) -> None:
    url, route = service
    deep = b"[" * 3000 + b'"\\ud83d\\ude00"' + b"]" * 3000
    msg = _error(httpx.post(url + route, content=deep, headers=JSON), 422, "too_deep")
    assert msg == "JSON nested 3000 deep; at most 64 levels"
    deep = b'{"question": ' + b'{"a": ' * 500 + b"1" + b"}" * 500 + b"}"
    assert httpx.post(url + route, content=deep, headers=JSON).status_code == 422
    assert httpx.get(f"{url}/health").status_code == 200


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-32", "utf-32-be"])
def test_non_utf8_json_is_refused(service: tuple[str, str], encoding: str) -> None:
    url, route = service
    text = '{"question": "Where\\ud800?", "queries": ["x"], "plan": "", "q": "x"}'
    for body in (text.encode(encoding), '{"question": "\ud800"}'.encode(encoding, "surrogatepass")):
        msg = _error(httpx.post(url + route, content=body, headers=JSON), 415,
                     "unsupported_media_type")  # fmt: skip
        assert msg.startswith("JSON bodies must be UTF-8, not UTF-")


def test_json_depth_counts_brackets_outside_strings() -> None:
    assert json_depth(b'{"a": "[[[[", "b": [{"c": "\\"]]"}]}') == 3
    assert json_depth(b"1") == 0 and json_depth(b"[" * 70 + b"]" * 70) == 70


# ------------------------------------------------------------------------------ batch caps


def test_batch_caps(tmp_path: Path) -> None:
    with memory_app(tmp_path) as app, ServerThread(app) as url:
        questions = [{"question": f"q{i}?"} for i in range(300)]
        msg = _error(httpx.post(f"{url}/plan", json=questions), 413, "too_many_items")
        assert msg == "300 items in one request; at most 32"
        assert app.state.planner_calls == []  # refused before any LLM call
        many = [{"question": "q?"}] * 20_000
        started = time.monotonic()
        r = httpx.post(f"{url}/memory", json=many, timeout=60)
        assert _error(r, 413, "too_many_items") == "20000 items in one request; at most 256"
        assert time.monotonic() - started < 30  # refused, not computed (344 s before)
        rows = [{"question": "q", "judgement": "correct"}] * 257
        assert httpx.post(f"{url}/memories", json=rows).status_code == 413
        assert _count(url) == 0
        assert httpx.post(f"{url}/plan", json=questions[:32]).status_code == 200


# ------------------------------------------------------------------------------ slow clients


def _connect(url: str) -> socket.socket:
    host, port = url.split("//")[1].rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=10)


def _closed(sock: socket.socket, within_s: float) -> bytes:
    """What the server sent before closing the connection (fails if it stays open)."""
    sock.settimeout(within_s)
    got = b""
    try:
        while chunk := sock.recv(4096):
            got += chunk
    except TimeoutError:
        pytest.fail(f"connection still open after {within_s} s; got {got[:200]!r}")
    return got


def test_stalled_bodies_and_heads_are_closed(tmp_path: Path) -> None:
    limits = {"header_timeout_s": 0.5, "body_timeout_s": 0.5}
    with memory_app(tmp_path, **limits) as app:
        server = ServerThread(app)
        with server as url:
            host = url.split("//")[1]
            stalled_bodies = [_connect(url) for _ in range(200)]  # the repro: 200 connections
            for sock in stalled_bodies:
                sock.sendall(
                    f"POST /memories HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json"
                    '\r\nContent-Length: 1000\r\n\r\n{"question":'.encode()
                )
            stalled_heads = [_connect(url) for _ in range(20)]
            for sock in stalled_heads:
                sock.sendall(f"GET /stats HTTP/1.1\r\nHost: {host}\r\nX-Slow: ".encode())
            for sock in stalled_bodies:
                answer = _closed(sock, 10)
                assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
                assert b'"code":"request_timeout"' in answer
            for sock in stalled_heads:
                assert _closed(sock, 10) == b""
            for sock in stalled_bodies + stalled_heads:
                sock.close()
            # A slow but steady client within the timeouts, and the service, are fine.
            assert httpx.get(f"{url}/stats").status_code == 200
            assert httpx.post(f"{url}/memories", json={"question": "q", "judgement": "correct"})
            assert _count(url) == 1


def test_a_keep_alive_connection_gets_the_head_timeout_too(tmp_path: Path) -> None:
    with memory_app(tmp_path, header_timeout_s=0.5) as app, ServerThread(app) as url:
        sock = _connect(url)
        host = url.split("//")[1]
        sock.sendall(f"GET /health HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        sock.settimeout(10)
        first = b""
        while not first.endswith(b"}"):  # the whole first answer (its JSON body ends in "}")
            first += sock.recv(4096)
        assert first.startswith(b"HTTP/1.1 200 ")
        sock.sendall(f"GET /health HTTP/1.1\r\nHost: {host}\r\n".encode())  # never finished
        assert _closed(sock, 10) == b""
        sock.close()
