"""Hostile inputs to the services: oversized image requests to ``serve`` (the per-request image
budget, decoding off the event loop) and hostile OpenAI-compatible replies (lone surrogates,
JSON nested thousands deep, empty completions) through the real client, ``serve`` and
``memory_serve``. Every service runs for real on an ephemeral loopback port."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.responses import Response
from PIL import Image

import serve.app
from memory_serve.app import build_app
from memory_serve.config import load_config
from memory_serve.service import MemoryService
from memory_serve.store import MemoryStore
from mia.agent import AgentConfig, build_tools
from mia.embedding import shared_embedder
from mia.errors import MiaError
from mia.http import ServerThread, create_app
from mia.llm import LLMError
from mia.llm.config import LLMConfig, build_backend
from mia.llm.openai_backend import OpenAIChat
from mia.llm.scripted import ScriptedChat
from serve import ExecutorService, create_serve_app, load_serve_config

ANSWER = "<think>easy</think>\n<answer>Paris</answer>"
# An OpenAI-style reply whose texts hold lone surrogates, as JSON escapes (json.dumps of such a
# str writes exactly these escapes).
SURROGATE_MESSAGE = {
    "role": "assistant",
    "content": "abc \ud800 def",
    "reasoning_content": "why \udfff",
    "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f\ud800", "arguments": "{}"}}
    ],
}


def completion(message: dict[str, Any]) -> bytes:
    """A chat completion body holding ``message`` (ASCII JSON: surrogates stay escapes)."""
    body = {"choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}
    return json.dumps(body).encode()


def deep_completion(levels: int = 3000) -> bytes:
    """A chat completion whose ``choices`` nests ``levels`` arrays deep."""
    return b'{"choices": ' + b"[" * levels + b"]" * levels + b"}"


class RawOpenAI:
    """An OpenAI-compatible ``/v1/chat/completions`` answering ``body`` byte for byte (what a
    hostile or broken upstream may send; FastAPI's JSONResponse cannot write a lone surrogate)."""

    def __init__(self) -> None:
        self.body = completion({"role": "assistant", "content": ANSWER})
        self.calls = 0
        self.app = create_app("fake-openai")
        self.app.post("/v1/chat/completions")(self._chat)

    async def _chat(self) -> Response:
        self.calls += 1
        return Response(self.body, media_type="application/json")


@pytest.fixture(scope="module")
def upstream() -> Iterator[tuple[RawOpenAI, str]]:
    fake = RawOpenAI()
    with ServerThread(fake.app) as url:
        yield fake, f"{url}/v1"


def client(base_url: str) -> OpenAIChat:
    """The client as the services build it, without retries (a hostile reply is final)."""
    cfg = LLMConfig(backend="openai", base_url=base_url, model="fake", max_retries=0)
    backend = build_backend(cfg, name="hostile")
    assert isinstance(backend, OpenAIChat)
    return backend


# ------------------------------------------------------------------------------ the LLM client


def test_client_replaces_lone_surrogates(upstream: tuple[RawOpenAI, str]) -> None:
    fake, url = upstream
    fake.body = completion(SURROGATE_MESSAGE)
    assert b"\\ud800" in fake.body
    result = asyncio.run(client(url).chat([{"role": "user", "content": "q"}]))
    assert result.text == "abc \ufffd def"
    assert result.extra == {
        "reasoning_content": "why \ufffd",
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f\ufffd", "arguments": "{}"}}
        ],
    }
    json.dumps(result.extra, ensure_ascii=False).encode("utf-8")  # valid Unicode throughout
    # An escaped pair (an emoji) is one valid character, kept as is.
    fake.body = completion({"role": "assistant", "content": "ok \U0001f600"})
    assert b"\\ud83d\\ude00" in fake.body
    assert asyncio.run(client(url).chat([{"role": "user", "content": "q"}])).text == "ok \U0001f600"


def test_client_deep_nesting_is_an_upstream_error(upstream: tuple[RawOpenAI, str]) -> None:
    fake, url = upstream
    fake.body = deep_completion()
    with pytest.raises(LLMError) as info:
        asyncio.run(client(url).chat([{"role": "user", "content": "q"}]))
    assert str(info.value) == (
        f"LLM endpoint {url}/chat/completions (model 'fake') failed after 1 attempt(s): "
        "malformed reply: body is JSON nested too deep to parse"
    )
    # Parseable, but a kept part nested past MAX_REPLY_DEPTH is garbage too.
    deep = json.loads(b"[" * 100 + b"]" * 100)
    fake.body = completion({"role": "assistant", "content": "x", "tool_calls": deep})
    with pytest.raises(LLMError, match="malformed reply: tool_calls is nested over 32 levels"):
        asyncio.run(client(url).chat([{"role": "user", "content": "q"}]))


def test_error_detail_with_lone_surrogate_is_valid_unicode() -> None:
    app = create_app("fake-openai")

    @app.post("/v1/chat/completions")
    async def refuse() -> Response:
        body = json.dumps({"error": {"message": "bad \udc00 model"}})
        return Response(body, status_code=400, media_type="application/json")

    with ServerThread(app) as url, pytest.raises(LLMError) as info:
        asyncio.run(client(f"{url}/v1").chat([{"role": "user", "content": "q"}]))
    assert str(info.value).endswith("rejected the request: HTTP 400: bad \ufffd model")


# ------------------------------------------------------------------------- through the services


@contextlib.contextmanager
def serve_on(backend: Any, **kw: Any) -> Iterator[str]:
    tools = build_tools({"search": {"type": "search", "params": {"url": "http://127.0.0.1:9"}}})
    service = ExecutorService(backend, tools, AgentConfig(image_size=16), **kw)
    with ServerThread(create_serve_app(service)) as url:
        yield url


def test_serve_execute_hostile_replies_are_200_or_502(upstream: tuple[RawOpenAI, str]) -> None:
    fake, url = upstream
    with serve_on(client(url)) as serve_url:
        body = {"question": "Where is the tower?", "plan": ""}
        fake.body = completion({"role": "assistant", "content": "<answer>abc \ud800 def</answer>"})
        r = httpx.post(f"{serve_url}/execute", json=body, timeout=60)
        assert r.status_code == 200, r.text
        assert r.json()["answer"] == "abc \ufffd def"
        for route in ("/execute", "/plan"):
            fake.body = deep_completion()
            r = httpx.post(f"{serve_url}{route}", json=body, timeout=60)
            assert r.status_code == 502, r.text
            error = r.json()["error"]
            assert error["code"] == "llm_error"
            assert error["message"].endswith(
                "malformed reply: body is JSON nested too deep to parse"
            )
        assert httpx.get(f"{serve_url}/health", timeout=30).json()["status"] == "ok"


@contextlib.contextmanager
def memory_on(tmp_path: Path, planner: Any, *overrides: str) -> Iterator[str]:
    cfg = load_config(None, ["planner.cold_start=false", *overrides])
    store = MemoryStore(tmp_path / "memory.sqlite", shared_embedder(), cfg.store)
    try:
        with ServerThread(build_app(MemoryService(cfg, store, planner, planner))) as url:
            yield url
    finally:
        store.close()


REPLAN_TRAIN = {"question": "When?", "plan": "1. Search", "trace": "T", "mem_context1": "M"}


def test_memory_serve_hostile_replies_are_200_or_502(
    tmp_path: Path, upstream: tuple[RawOpenAI, str]
) -> None:
    fake, url = upstream
    with memory_on(tmp_path, client(url)) as mem_url:
        fake.body = completion({"role": "assistant", "content": "1. Search abc \ud800 def"})
        r = httpx.post(f"{mem_url}/plan", json={"question": "Where?"}, timeout=60)
        assert r.status_code == 200, r.text
        assert r.json()["plan"] == "1. Search abc \ufffd def"
        r = httpx.post(f"{mem_url}/replan_train", json=REPLAN_TRAIN, timeout=60)
        assert r.json() == {"replan": True, "content": "1. Search abc \ufffd def"}
        fake.body = deep_completion()
        for route, body in (("/plan", {"question": "Where?"}), ("/replan_train", REPLAN_TRAIN)):
            r = httpx.post(f"{mem_url}{route}", json=body, timeout=60)
            assert r.status_code == 502, r.text
            assert r.json()["error"]["code"] == "llm_error"
            assert "body is JSON nested too deep to parse" in r.json()["error"]["message"]


def test_replan_train_empty_completion_is_502(tmp_path: Path) -> None:
    planner = ScriptedChat(["", "<think>only thinking</think>", "  "])
    with memory_on(tmp_path, planner) as mem_url:
        r = httpx.post(f"{mem_url}/replan_train", json=REPLAN_TRAIN, timeout=60)
    assert r.status_code == 502
    assert r.json() == {
        "error": {
            "code": "llm_empty",
            "message": "the planner LLM gave no revised plan in 3 attempt(s) (reply '  ')",
        }
    }
    assert len(planner.calls) == 3  # planner.empty_retries=2: asked again twice


def test_executor_training_goes_on_without_an_empty_replan(tmp_path: Path) -> None:
    from mia.services.memory import MemoryClient

    planner = ScriptedChat(["", "", ""])
    with memory_on(tmp_path, planner) as mem_url:
        replan = asyncio.run(_replan(MemoryClient(mem_url)))
    assert replan == "" and len(planner.calls) == 3


async def _replan(memory: Any) -> str:
    try:
        return (await memory.replan_train("When?", "1. Search", "T", "M")).content
    finally:
        await memory.aclose()


# ------------------------------------------------------------------------------ image budget


def png(size: tuple[int, int], mode: str = "1") -> str:
    """A base64 PNG of a blank ``size`` image (a 9000x9000 one is about 10 KB)."""
    buf = io.BytesIO()
    Image.new(mode, size).save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


def forbid_decoding(*_: Any) -> Image.Image:
    raise AssertionError("an image over the budget was decoded")


def test_images_over_the_pixel_budget_are_413_before_decoding(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(serve.app, "decode_image", forbid_decoding)
    big = png((9000, 9000))  # under PIL's per-image limit; eight are 648 megapixels
    with serve_on(ScriptedChat(lambda _m: ANSWER)) as url:
        body = {"question": "q", "plan": "", "images": [big] * 8}
        for route in ("/execute", "/plan"):
            r = httpx.post(f"{url}{route}", json=body, timeout=60)
            assert r.status_code == 413, r.text
            assert r.json() == {
                "error": {
                    "code": "payload_too_large",
                    "message": "the request's 8 image(s) declare 648000000 pixels in all, over "
                    "the budget of 50000000 pixels per request (serve config max_request_pixels)",
                }
            }
        health = httpx.get(f"{url}/health", timeout=30).json()
        assert health["status"] == "ok" and health["requests"] == 0


def test_budget_counts_message_and_stored_images_and_caps_the_count() -> None:
    small = png((10, 10), "RGB")  # 100 pixels
    stored = {"q1": [base64.b64decode(png((20, 20), "RGB"))]}  # 400 pixels
    executor = ScriptedChat(lambda _m: ANSWER)
    limits = {"max_request_pixels": 250, "max_request_images": 3, "images_by_id": stored}
    with serve_on(executor, **limits) as url:
        two = {"question": "q", "plan": "", "images": [small, small]}
        ok = httpx.post(f"{url}/execute", json=two, timeout=60)
        assert ok.status_code == 200, ok.text
        # The user turn holds both images inline, resized to agent.image_size (16x16).
        messages = ok.json()["messages"]
        again = {"question": "q", "messages": messages, "replan": "r", "images": [small]}
        cases = [
            ("/execute", {"question": "q", "plan": "", "data_id": "q1"}, 1, 400),
            ("/continue", again, 3, 2 * 16 * 16 + 100),
        ]
        for route, body, count, pixels in cases:
            r = httpx.post(f"{url}{route}", json=body, timeout=60)
            assert r.status_code == 413, r.text
            assert r.json()["error"] == {
                "code": "payload_too_large",
                "message": f"the request's {count} image(s) declare {pixels} pixels in all, over "
                "the budget of 250 pixels per request (serve config max_request_pixels)",
            }
        four = {"question": "q", "plan": "", "images": [small] * 4}
        r = httpx.post(f"{url}/execute", json=four, timeout=60)
        assert r.status_code == 413
        assert r.json()["error"] == {
            "code": "payload_too_large",
            "message": "the request holds 4 images, over the limit of 3 images per request "
            "(serve config max_request_images)",
        }


def test_health_answers_while_an_image_is_decoding(monkeypatch: pytest.MonkeyPatch) -> None:
    """Decoding runs in a worker thread: with one held mid-decode, /health still answers (were
    decoding on the event loop, /health would wait for the gate and time out)."""
    decoding, release = threading.Event(), threading.Event()
    real = serve.app.decode_image

    def slow_decode(data: bytes, what: str) -> Image.Image:
        decoding.set()
        release.wait(60)
        return real(data, what)

    monkeypatch.setattr(serve.app, "decode_image", slow_decode)
    result: dict[str, httpx.Response] = {}
    with serve_on(ScriptedChat(lambda _m: ANSWER)) as url:
        body = {"question": "q", "plan": "", "images": [png((3000, 3000), "L")]}

        def execute() -> None:
            result["r"] = httpx.post(f"{url}/execute", json=body, timeout=120)

        worker = threading.Thread(target=execute)
        worker.start()
        try:
            assert decoding.wait(60)
            health = httpx.get(f"{url}/health", timeout=20)
            assert health.status_code == 200 and health.json()["status"] == "ok"
            assert worker.is_alive() and "r" not in result  # the request is still in flight
        finally:
            release.set()
            worker.join(120)
    assert result["r"].status_code == 200, result["r"].text
    assert result["r"].json()["answer"] == "Paris"


def test_serve_config_image_budget_keys() -> None:
    cfg = load_serve_config(None, ["max_request_pixels=1000", "max_request_images=2"])
    assert (cfg.max_request_pixels, cfg.max_request_images) == (1000, 2)
    default = load_serve_config()
    assert (default.max_request_pixels, default.max_request_images) == (50_000_000, 16)
    for bad in ("max_request_pixels=0", "max_request_images=0"):
        with pytest.raises(MiaError, match="max_request_pixels and max_request_images"):
            load_serve_config(None, [bad])
