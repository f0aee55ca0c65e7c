"""MIA as a drop-in memory layer: an unmodified ``openai`` client pointed at memory_serve's
proxy (real uvicorn, real SQLite, real embedder), a local fake upstream model and a local fake
Manager/Planner LLM (both OpenAI-compatible HTTP servers, tests/fake_openai.py). A first task is
planned, answered over two turns (a tool call), reported correct and written to memory; a
similar second task, streamed, is planned from that memory and credits it."""

from __future__ import annotations

import contextlib
import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from memory_serve.app import build_app
from memory_serve.config import load_config
from memory_serve.service import MemoryService
from memory_serve.store import MemoryStore
from mia.embedding import shared_embedder
from mia.http import ServerThread
from mia.llm.openai_backend import OpenAIChat
from mia.memory import Client
from mia.prompts.planner import PLANNER_SYSTEM_PROMPT
from mia.services import ServiceError
from mia.trace import content_text
from tests.fake_openai import FakeOpenAI

TOKEN = "mia-proxy-token"
UPSTREAM_KEY = "upstream-secret-key"
FIRST = "Where is the Eiffel Tower?"
SECOND = "Where is the Eiffel Tower located?"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "web search",
            "parameters": {"type": "object", "properties": {"query": {"type": "string"}}},
        },
    }
]


def manager_reply(body: dict[str, Any]) -> dict[str, Any]:
    """The Manager/Planner LLM: plans (reusing a remembered workflow when the memory block
    holds one) and workflow summaries."""
    messages = body["messages"]
    if messages[0]["role"] == "system" and messages[0]["content"] == PLANNER_SYSTEM_PROMPT:
        prompt = messages[-1]["content"]
        if "search (query 'Eiffel Tower location' -> Paris)" in prompt:
            return {"content": "1. Reuse the remembered workflow: search 'Eiffel Tower location'."}
        return {"content": "1. Search the web for the landmark's city."}
    trace = messages[-1]["content"]
    if "Eiffel Tower location" in trace and "Paris" in trace:
        return {"content": "1. search (query 'Eiffel Tower location' -> Paris)"}
    return {"content": "1. answer directly"}


def upstream_reply(body: dict[str, Any]) -> dict[str, Any]:
    """The agent's model: first a tool call, then the answer after the tool result."""
    if body.get("model") == "no-such-model":
        return {"error": (404, "The model `no-such-model` does not exist")}
    if body["messages"][-1]["role"] == "tool":
        return {"content": "The Eiffel Tower is in Paris, France."}
    if body.get("tools"):
        args = json.dumps({"query": "Eiffel Tower location"})
        return {
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "search", "arguments": args},
                }
            ]
        }
    return {"content": "It stands in Paris, on the Champ de Mars."}


@contextlib.contextmanager
def proxy_stack(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    overrides: tuple[str, ...] = (),
    upstream_key: str | None = UPSTREAM_KEY,
) -> Iterator[tuple[str, FakeOpenAI, FakeOpenAI, MemoryService]]:
    if upstream_key is None:
        monkeypatch.delenv("MIA_PROXY_API_KEY", raising=False)
    else:
        monkeypatch.setenv("MIA_PROXY_API_KEY", upstream_key)
    manager_llm = FakeOpenAI(manager_reply)
    upstream = FakeOpenAI(upstream_reply)
    with ServerThread(manager_llm.app) as llm_url, ServerThread(upstream.app) as up_url:
        cfg = load_config(
            None,
            [
                f"proxy.upstream={up_url}/v1",
                "store.retrieval.top_k=1",
                f"ui.runs_dir={tmp_path / 'runs'}",
                *overrides,
            ],
        )
        manager = OpenAIChat(f"{llm_url}/v1", "manager", max_retries=0, timeout=30)
        planner = OpenAIChat(f"{llm_url}/v1", "planner", max_retries=0, timeout=30)
        store = MemoryStore(tmp_path / "memory.sqlite", shared_embedder(), cfg.store)
        service = MemoryService(cfg, store, manager, planner)
        app = build_app(service, token=TOKEN)
        try:
            with ServerThread(app) as url:
                yield url, manager_llm, upstream, service
        finally:
            app.state.proxy.tasks.close()
            store.close()


def user_text(body: dict[str, Any]) -> str:
    return next(content_text(m["content"]) for m in body["messages"] if m["role"] == "user")


def test_openai_client_through_the_proxy_plans_remembers_and_reuses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    with proxy_stack(tmp_path, monkeypatch) as (url, llm, upstream, service):
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=TOKEN, max_retries=0)
        api = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60)

        # ---- task 1: a new task (no assistant turn yet) is planned, then forwarded.
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": "You are a helpful agent."},
            {"role": "user", "content": FIRST},
        ]
        raw = client.chat.completions.with_raw_response.create(
            model="agent-model", messages=messages, tools=TOOLS
        )
        first = raw.parse()
        task1 = raw.headers["x-mia-task-id"]
        assert raw.headers["x-mia-plan"] == "planned"
        assert first.choices[0].message.tool_calls[0].function.name == "search"
        assert llm.count == 1  # one plan (a cold start: the manager planned)
        sent = upstream.bodies[-1]
        plan1 = "1. Search the web for the landmark's city."
        assert user_text(sent) == f"{FIRST}\n\nHere is a plan from the memory of similar past " + (
            f"tasks (a guide; adapt it where it does not fit):\n{plan1}"
        )
        assert sent["tools"] == TOOLS and sent["model"] == "agent-model"
        assert sent["messages"][0] == messages[0]  # the rest goes as the client sent it
        # The upstream gets its own key, never the client's MIA token.
        assert upstream.headers[-1]["authorization"] == f"Bearer {UPSTREAM_KEY}"
        assert all(TOKEN not in json.dumps(h) for h in upstream.headers)

        # Turn 2 of the same conversation: the plan goes again, no new planning.
        call = first.choices[0].message.tool_calls[0]
        messages += [
            first.choices[0].message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": "(Title: Eiffel Tower) Paris"},
        ]
        raw = client.chat.completions.with_raw_response.create(
            model="agent-model", messages=messages, tools=TOOLS
        )
        answer = raw.parse()
        assert raw.headers["x-mia-task-id"] == task1 and raw.headers["x-mia-plan"] == "continued"
        assert answer.choices[0].message.content == "The Eiffel Tower is in Paris, France."
        assert llm.count == 1
        assert plan1 in user_text(upstream.bodies[-1])
        assert api.get(f"/v1/tasks/{task1}").json()["turns"] == 2

        # The client reports the outcome by the completion id it already has.
        r = api.post("/v1/feedback", json={"completion_id": answer.id, "correct": True})
        assert r.status_code == 200, r.text
        out = r.json()
        assert (out["status"], out["task_id"]) == ("recorded", task1)
        assert (out["result"]["action"], out["result"]["id"]) == ("inserted", 1)
        assert out["result"]["credited_ids"] == []  # nothing was retrieved on a cold start
        again = api.post("/v1/feedback", json={"task_id": task1, "correct": False})
        assert again.status_code == 409 and again.json()["error"]["code"] == "already_recorded"
        # The Manager summarised the whole conversation: the tool call and its result.
        trace = llm.bodies[-1]["messages"][-1]["content"]
        assert (
            '<tool_call>{"name": "search", "arguments": {"query": "Eiffel Tower location"}}'
            in trace
        )
        assert "(Title: Eiffel Tower) Paris" in trace
        assert "<answer>The Eiffel Tower is in Paris, France.</answer>" in trace
        mem = api.get("/memories/1").json()["memory"]
        assert (mem["question"], mem["judgement"], mem["source"]) == (FIRST, "correct", "proxy")
        assert mem["workflow_summary"] == "1. search (query 'Eiffel Tower location' -> Paris)"
        assert mem["data_id"] == task1

        # ---- task 2: similar, streamed; planned from task 1's memory.
        stream = client.chat.completions.create(
            model="agent-model", messages=[{"role": "user", "content": SECOND}], stream=True
        )
        chunks = list(stream)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == "It stands in Paris, on the Champ de Mars."
        assert len(chunks) > 5  # relayed chunk by chunk, not buffered into one
        plan_prompt = llm.bodies[-1]["messages"][-1]["content"]
        assert f"- Question: {FIRST}" in plan_prompt  # the memory the Planner read
        assert "1. search (query 'Eiffel Tower location' -> Paris)" in plan_prompt
        sent = upstream.bodies[-1]
        assert sent["stream"] is True
        reuse = "1. Reuse the remembered workflow: search 'Eiffel Tower location'."
        assert user_text(sent).endswith(reuse)
        r = api.post("/v1/feedback", json={"completion_id": chunks[0].id, "correct": False})
        assert r.status_code == 200, r.text
        assert r.json()["result"]["credited_ids"] == [1]  # the memory it was planned from
        second_task = r.json()["task_id"]
        info = api.get(f"/v1/tasks/{second_task}").json()
        assert (info["status"], info["memory_ids"], info["plan"]) == ("recorded", [1], reuse)
        # The reused memory's history and win-rate show it.
        d = api.get("/memories/1").json()
        assert (d["memory"]["usage_count"], d["memory"]["success_count"]) == (2, 1)
        assert [(h["question"], h["success"], h["source"]) for h in d["history"]] == [
            (SECOND, False, "proxy")
        ]
        assert api.get("/stats").json()["memories"] == 2

        # ---- the rest of the surface
        assert [m.id for m in client.models.list().data] == ["fake-model"]
        with pytest.raises(openai.NotFoundError, match="does not exist"):
            client.chat.completions.create(
                model="no-such-model", messages=[{"role": "user", "content": "hello there"}]
            )
        # A conversation the proxy never saw begin: forwarded untouched, untracked.
        raw = client.chat.completions.with_raw_response.create(
            model="m",
            messages=[
                {"role": "user", "content": "an old chat"},
                {"role": "assistant", "content": "yes"},
                {"role": "user", "content": "go on"},
            ],
        )
        assert raw.headers["x-mia-plan"] == "untracked" and "x-mia-task-id" not in raw.headers
        assert upstream.bodies[-1]["messages"][0]["content"] == "an old chat"
        # Bad input and unknown tasks answer with the envelope.
        for body, status in (
            ({"task_id": "nope", "correct": True}, 404),
            ({"correct": True}, 422),
            ({"task_id": task1}, 422),
        ):
            r = api.post("/v1/feedback", json=body)
            assert r.status_code == status and "error" in r.json(), body
        r = api.post("/v1/chat/completions", json={"model": "m", "messages": []})
        assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_request"
        assert httpx.post(f"{url}/v1/chat/completions", json={}).status_code == 401
        api.close()
    logged = caplog.text + "".join(str(r.args) for r in caplog.records)
    assert UPSTREAM_KEY not in logged and TOKEN not in logged


def test_proxy_without_a_planner_injects_memories_and_survives_planner_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with proxy_stack(tmp_path, monkeypatch, ("proxy.inject=memories",)) as (url, _, up, service):
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=TOKEN, max_retries=0)
        api = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60)
        r = api.post(
            "/memories",
            json={"question": FIRST, "judgement": "correct", "workflow_summary": "1. look it up"},
        )
        assert r.status_code == 200
        raw = client.chat.completions.with_raw_response.create(
            model="m", messages=[{"role": "user", "content": SECOND}]
        )
        assert raw.headers["x-mia-plan"] == "memories"
        block = api.post("/memory", json={"question": SECOND}).json()["context"]
        assert user_text(up.bodies[-1]) == f"{SECOND}\n\n{block}"
        api.close()
        # The outcome through mia.memory.Client (the shared wire models of mia.services.memory).
        task_id = raw.headers["x-mia-task-id"]
        with Client(url, token=TOKEN) as mem:
            rec = mem.feedback(task_id, correct=True, feedback="checked by hand")
            assert (rec.action, rec.id, rec.credited_ids) == ("inserted", 2, [1])
            info = mem.service.sync.task(task_id)
            assert info.result is not None
            assert (info.status, info.memory_ids, info.result.id) == ("recorded", [1], 2)
            with pytest.raises(ServiceError) as err:
                mem.feedback(task_id, correct=False)
            assert err.value.status == 409 and "already recorded" in str(err.value)
    # The Planner LLM down: the task is still forwarded, without a plan (on_plan_error=forward).
    with proxy_stack(tmp_path / "b", monkeypatch) as (url, _, up, service):
        service.manager.base_url = service.planner.base_url = "http://127.0.0.1:9/v1"  # type: ignore[union-attr]
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=TOKEN, max_retries=0)
        raw = client.chat.completions.with_raw_response.create(
            model="m", messages=[{"role": "user", "content": FIRST}]
        )
        assert raw.headers["x-mia-plan"] == "failed"
        assert user_text(up.bodies[-1]) == FIRST


def test_python_client_plan_record_search(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with proxy_stack(tmp_path, monkeypatch) as (url, _, _, _), Client(url, token=TOKEN) as mem:
        plan = mem.plan(FIRST)
        assert plan.text == "1. Search the web for the landmark's city."
        assert plan.memory_ids == [] and plan.planner == "manager"
        rec = mem.record(
            FIRST,
            correct=True,
            plan=plan,
            messages=[
                {"role": "assistant", "content": "<answer>Paris</answer>"},
            ],
            summary="1. search (query 'Eiffel Tower location' -> Paris)",
        )
        assert (rec.action, rec.id, rec.credited_ids) == ("inserted", 1, [])
        found = mem.search(SECOND)
        assert [h.id for h in found.positives] == [1] and found.negatives == []
        hit = found.positives[0]
        assert hit.question == FIRST and hit.score == pytest.approx(
            0.7 * hit.normalised + 0.3 * hit.win_rate
        )
        plan2 = mem.plan(SECOND)
        assert plan2.text.startswith("1. Reuse the remembered workflow")
        assert plan2.memory_ids == [1] and "- Question: " + FIRST in plan2.context
        rec2 = mem.record(SECOND, correct=False, plan=plan2, summary="1. guessed")
        assert rec2.credited_ids == [1]
        page = mem.memories(query="located")
        assert [m["id"] for m in page["memories"]] == [2]


@pytest.mark.slow
def test_proxy_tasks_in_the_inspector(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two proxied tasks, then the inspector in a real browser: the remembered task and the
    second task that reused it (the screenshot of docs/proxy.md)."""
    from selenium.webdriver.common.by import By

    from tests.browser import chromium, screenshot_dir, severe_logs, wait

    with proxy_stack(tmp_path, monkeypatch) as (url, _, _, _), chromium() as driver:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=TOKEN, max_retries=0)
        api = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60)
        for question, correct in ((FIRST, True), (SECOND, False)):
            done = client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": question}]
            )
            r = api.post("/v1/feedback", json={"completion_id": done.id, "correct": correct})
            assert r.status_code == 200, r.text
        api.close()
        driver.get(f"{url}/ui?token={TOKEN}")  # exchanged for the session cookie
        wait(
            driver,
            lambda d: d.find_element(By.ID, "memories").get_attribute("data-state") == "ready",
        )
        assert driver.current_url == f"{url}/ui"
        driver.find_element(By.CSS_SELECTOR, "#memories tbody tr[data-id='1']").click()
        wait(driver, lambda d: d.find_element(By.ID, "detail").get_attribute("data-id") == "1")
        cells = driver.find_elements(By.CSS_SELECTOR, "#detail-history tbody tr td")
        assert [c.text for c in cells[1:]] == [SECOND, "failed", "proxy", "2"]
        source = driver.find_element(By.CSS_SELECTOR, "#detail-fields dd[data-field='source']")
        assert source.text == "proxy"
        driver.save_screenshot(str(screenshot_dir(tmp_path) / "proxy-inspector.png"))
        assert severe_logs(driver) == []


# ----------------------------------------------------------------- a misbehaving upstream

ANSWER = "It stands in Paris, on the Champ de Mars."


def mia_api(url: str) -> httpx.Client:
    return httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60)


def ask(question: str = FIRST, stream: bool = False) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": question}], "stream": stream}


def streamed(api: httpx.Client, body: dict[str, Any]) -> tuple[httpx.Headers, bytes]:
    """The answer's headers and its bytes exactly as they came over the wire."""
    with api.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        return r.headers, b"".join(r.iter_raw())


def sse_text(raw: bytes) -> str:
    """The content deltas of a relayed stream, joined."""
    events = [e.removeprefix("data: ") for e in raw.decode().split("\n\n") if e]
    chunks = [json.loads(e) for e in events if e != "[DONE]"]
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])


def error_event(code: str, message: str) -> bytes:
    return f'data: {{"error": {{"code": "{code}", "message": "{message}"}}}}\n\n'.encode()


def assert_store_writable(api: httpx.Client, stream: bool = True) -> None:
    """A fresh task still goes through, is recorded and its outcome written to memory."""
    if stream:
        headers, raw = streamed(api, ask(SECOND, stream=True))
        assert sse_text(raw) == ANSWER
    else:
        r = api.post("/v1/chat/completions", json=ask(SECOND))
        assert r.status_code == 200, r.text
        headers = r.headers
    task = headers["x-mia-task-id"]
    assert api.get(f"/v1/tasks/{task}").json()["turns"] == 1
    r = api.post("/v1/feedback", json={"task_id": task, "correct": True})
    assert r.status_code == 200 and r.json()["status"] == "recorded", r.text


def test_proxy_asks_for_identity_and_never_relays_compressed_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with proxy_stack(tmp_path, monkeypatch) as (url, _, upstream, service), mia_api(url) as api:
        upstream.gzip = "when_allowed"
        direct = httpx.post(f"{service.cfg.proxy.upstream}/chat/completions", json=ask())
        assert direct.headers["content-encoding"] == "gzip"  # the fake gzips when allowed
        for mode in ("when_allowed", "always"):  # "always": an upstream ignoring the request
            upstream.gzip = mode
            r = api.post("/v1/chat/completions", json=ask())  # the client itself allows gzip
            assert upstream.headers[-1]["accept-encoding"] == "identity"
            assert r.status_code == 200 and "content-encoding" not in r.headers
            assert json.loads(r.content)["choices"][0]["message"]["content"] == ANSWER
            assert api.get(f"/v1/tasks/{r.headers['x-mia-task-id']}").json()["turns"] == 1
            headers, raw = streamed(api, ask(stream=True))
            assert upstream.headers[-1]["accept-encoding"] == "identity"
            assert "content-encoding" not in headers and raw.startswith(b"data: {")
            assert raw.endswith(b"data: [DONE]\n\n") and sse_text(raw) == ANSWER
            assert api.get(f"/v1/tasks/{headers['x-mia-task-id']}").json()["turns"] == 1
        # An encoding httpx cannot undo is refused rather than passed on unlabelled.
        upstream.gzip, upstream.extra_headers = "never", {"Content-Encoding": "br"}
        r = api.post("/v1/chat/completions", json=ask())
        assert r.status_code == 502 and r.json() == {
            "error": {
                "code": "upstream_malformed",
                "message": "the upstream answer has an unknown Content-Encoding",
            }
        }
        assert api.get(f"/v1/tasks/{r.headers['x-mia-task-id']}").json()["status"] == "failed"


HOP_REQUEST_HEADERS = {
    "Connection": "keep-alive, X-Client-Hop",
    "X-Client-Hop": "named by Connection",
    "Keep-Alive": "timeout=5",
    "Proxy-Authorization": "Basic cHJveHk6c2VjcmV0",
    "Proxy-Connection": "keep-alive",
    "TE": "trailers",
    "Trailer": "X-Checksum",
    "Upgrade": "h2c",
    "Content-Encoding": "identity",
    "Cookie": "mia_session=abc",
}
HOP_ANSWER_HEADERS = {
    "Connection": "X-Upstream-Hop, X-Ratelimit-Limit-Requests",
    "X-Upstream-Hop": "1",
    "X-Ratelimit-Limit-Requests": "9",  # relayable, but this time named by Connection
    "Keep-Alive": "timeout=99",
    "Proxy-Authenticate": "Basic realm=upstream",
    "Trailer": "X-Checksum",
    "Upgrade": "h2c",
    "Set-Cookie": "upstream=1",
    "X-Request-Id": "req-1",
    "X-Ratelimit-Remaining-Requests": "7",
}


def assert_no_upstream_hops(headers: httpx.Headers) -> None:
    for name in ("x-upstream-hop", "x-ratelimit-limit-requests", "keep-alive", "upgrade"):
        assert name not in headers, name
    for name in ("proxy-authenticate", "trailer", "set-cookie", "content-encoding"):
        assert name not in headers, name
    assert "x-upstream-hop" not in headers.get("connection", "").lower()
    assert (headers["x-request-id"], headers["x-ratelimit-remaining-requests"]) == ("req-1", "7")


def test_proxy_strips_hop_by_hop_headers_both_ways(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No upstream key set: the client's Authorization (MIA's own token) stays home too."""
    with (
        proxy_stack(tmp_path, monkeypatch, upstream_key=None) as (url, _, upstream, service),
        mia_api(url) as api,
    ):
        upstream.extra_headers = HOP_ANSWER_HEADERS
        extra = {**HOP_REQUEST_HEADERS, "X-Custom": "kept", "OpenAI-Organization": "org-1"}
        extra["Content-Type"] = "application/json"
        for stream in (False, True):
            body = json.dumps(ask(stream=stream)).encode()
            # A chunked upload: the client's Transfer-Encoding must not travel on either.
            req = api.build_request(
                "POST", "/v1/chat/completions", content=iter([body]), headers=extra
            )
            assert req.headers["transfer-encoding"] == "chunked"
            r = api.send(req)
            assert r.status_code == 200, r.text
            got = upstream.headers[-1]
            for name in HOP_REQUEST_HEADERS:
                if name != "Connection":
                    assert name.lower() not in got, name
            assert "authorization" not in got and "transfer-encoding" not in got
            assert got["connection"] == "keep-alive"  # the proxy's own connection's
            assert got["host"] == httpx.URL(service.cfg.proxy.upstream or "").netloc.decode()
            assert got["accept-encoding"] == "identity"
            assert (got["x-custom"], got["openai-organization"]) == ("kept", "org-1")
            assert_no_upstream_hops(r.headers)
            if stream:
                assert sse_text(r.content) == ANSWER
            else:
                assert "transfer-encoding" not in r.headers
                assert r.json()["choices"][0]["message"]["content"] == ANSWER


BAD_EVENTS = {
    "not_json": (b"data: {not json\n\n", "not JSON"),
    "not_sse": (b"<html>502 Bad Gateway</html>\n\n", "not an SSE line"),
    "not_utf8": (b'data: {"id": "\xff\xfe"}\n\n', "not UTF-8"),
    "nested_3000_deep": (b"data: " + b"[" * 3000 + b"]" * 3000 + b"\n\n", "JSON nested too deep"),
    "not_an_object": (b"data: 42\n\n", "an event is not a JSON object"),
    "bad_delta": (b'data: {"choices": [{"delta": {"content": 7}}]}\n\n', "content is not a string"),
}


@pytest.mark.parametrize("bad", BAD_EVENTS, ids=list(BAD_EVENTS))
def test_proxy_stream_malformed_upstream_event_ends_with_an_error_event(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bad: str
) -> None:
    inject, reason = BAD_EVENTS[bad]
    message = f"the upstream model sent a malformed stream ({reason})"
    with proxy_stack(tmp_path, monkeypatch) as (url, _, upstream, _), mia_api(url) as api:
        upstream.inject = inject
        headers, raw = streamed(api, ask(stream=True))
        # The events before the bad one, then the error and [DONE]; never the bad bytes.
        events = raw.split(b"\n\n")
        assert [json.loads(e[6:])["choices"][0]["delta"]["content"] for e in events[:2]] == [
            "",
            "It",
        ]
        assert raw.endswith(error_event("upstream_malformed", message) + b"data: [DONE]\n\n")
        assert len(events) == 5 and inject.strip() not in raw
        task = api.get(f"/v1/tasks/{headers['x-mia-task-id']}").json()
        assert (task["status"], task["turns"], task["question"]) == ("failed", 0, FIRST)
        r = api.post("/v1/feedback", json={"task_id": task["task_id"], "correct": False})
        assert r.status_code == 409 and r.json()["error"]["code"] == "no_answer"
        # An OpenAI client raises the message instead of choking on the bad bytes.
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=TOKEN, max_retries=0)
        with pytest.raises(openai.APIError, match=re.escape(message)):
            list(client.chat.completions.create(**ask(stream=True)))
        upstream.inject = None
        assert_store_writable(api)


def test_proxy_stream_stall_ends_with_a_timeout_event_and_a_retry_reopens_the_task(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with (
        proxy_stack(tmp_path, monkeypatch, ("proxy.timeout_s=1",)) as (url, _, upstream, _),
        mia_api(url) as api,
    ):
        first = api.post("/v1/chat/completions", json={**ask(), "tools": TOOLS})
        assert first.status_code == 200
        task_id = first.headers["x-mia-task-id"]
        later = {
            "model": "m",
            "tools": TOOLS,
            "stream": True,
            "messages": [
                {"role": "user", "content": FIRST},
                first.json()["choices"][0]["message"],
                {"role": "tool", "tool_call_id": "call_1", "content": "Paris"},
            ],
        }
        upstream.stall_s = 3.0
        headers, raw = streamed(api, later)
        assert headers["x-mia-task-id"] == task_id and headers["x-mia-plan"] == "continued"
        stalled = error_event("upstream_timeout", "the upstream model sent nothing for 1s")
        assert raw.endswith(
            b'"content": "The"}, "finish_reason": null}]}\n\n' + stalled + (b"data: [DONE]\n\n")
        )
        task = api.get(f"/v1/tasks/{task_id}").json()
        assert (task["status"], task["turns"]) == ("failed", 1)  # the first answer stays
        upstream.stall_s = 0.0
        _, raw = streamed(api, later)  # the client retries the turn
        assert sse_text(raw) == "The Eiffel Tower is in Paris, France."
        task = api.get(f"/v1/tasks/{task_id}").json()
        assert (task["status"], task["turns"]) == ("open", 2)
        r = api.post("/v1/feedback", json={"task_id": task_id, "correct": True})
        assert r.status_code == 200 and r.json()["result"]["action"] == "inserted", r.text
        assert_store_writable(api)


def test_proxy_stream_upstream_error_event_is_relayed_and_fails_the_task(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    upstream_error = b'data: {"error": {"message": "overloaded", "type": "server_error"}}\n\n'
    with proxy_stack(tmp_path, monkeypatch) as (url, _, upstream, _), mia_api(url) as api:
        upstream.inject = upstream_error
        headers, raw = streamed(api, ask(stream=True))
        assert upstream_error in raw and b"upstream_malformed" not in raw
        task = api.get(f"/v1/tasks/{headers['x-mia-task-id']}").json()
        assert (task["status"], task["turns"]) == ("failed", 0)
        upstream.inject = None
        assert_store_writable(api)


BAD_ANSWERS = {
    "not_json": (b"{not json", "not JSON"),
    "not_utf8": (b'{"id": "\xff\xfe"}', "not JSON"),
    "nested_3000_deep": (b"[" * 3000 + b"]" * 3000, "JSON nested too deep"),
    "deep_in_a_message": (
        b'{"choices": [{"message": {"content": ' + b"[" * 3000 + b"]" * 3000 + b"}}]}",
        "JSON nested too deep",
    ),
    "no_choices": (b'{"id": "chatcmpl-1", "choices": []}', "no choices"),
    "bad_tool_call": (
        b'{"choices": [{"message": {"content": null, "tool_calls": [{"function": 3}]}}]}',
        "a tool call's function is not a JSON object",
    ),
}


@pytest.mark.parametrize("bad", BAD_ANSWERS, ids=list(BAD_ANSWERS))
def test_proxy_malformed_upstream_answer_is_502_and_fails_the_task(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bad: str
) -> None:
    body, reason = BAD_ANSWERS[bad]
    with proxy_stack(tmp_path, monkeypatch) as (url, _, upstream, _), mia_api(url) as api:
        upstream.inject = body
        r = api.post("/v1/chat/completions", json=ask())
        assert r.status_code == 502 and r.json() == {
            "error": {
                "code": "upstream_malformed",
                "message": f"the upstream answer is not a chat completion ({reason})",
            }
        }
        task = api.get(f"/v1/tasks/{r.headers['x-mia-task-id']}").json()
        assert (task["status"], task["turns"]) == ("failed", 0)
        upstream.inject = None
        assert_store_writable(api, stream=False)


def test_proxy_stalled_upstream_answer_is_504_and_fails_the_task(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with (
        proxy_stack(tmp_path, monkeypatch, ("proxy.timeout_s=1",)) as (url, _, upstream, _),
        mia_api(url) as api,
    ):
        upstream.stall_s = 3.0
        r = api.post("/v1/chat/completions", json=ask())
        assert r.status_code == 504 and r.json() == {
            "error": {
                "code": "upstream_timeout",
                "message": "the upstream model gave no answer within 1s",
            }
        }
        task = api.get(f"/v1/tasks/{r.headers['x-mia-task-id']}").json()
        assert (task["status"], task["turns"]) == ("failed", 0)
        upstream.stall_s = 0.0
        assert_store_writable(api, stream=False)


def test_proxy_lone_surrogate_answer_is_relayed_and_recorded_with_u_fffd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plain = (
        b'{"id": "chatcmpl-s", "object": "chat.completion", "choices": [{"index": 0, '
        b'"message": {"role": "assistant", "content": "Paris \\ud800 France"}}]}'
    )
    chunk = b'data: {"id": "chatcmpl-t", "choices": [{"delta": {"content": " \\udfff"}}]}\n\n'
    with proxy_stack(tmp_path, monkeypatch) as (url, llm, upstream, _), mia_api(url) as api:
        upstream.inject = plain
        r = api.post("/v1/chat/completions", json=ask())
        assert r.status_code == 200 and r.content == plain  # relayed as the upstream sent it
        fb = api.post("/v1/feedback", json={"completion_id": "chatcmpl-s", "correct": True})
        assert fb.status_code == 200, fb.text
        assert "<answer>Paris \ufffd France</answer>" in llm.bodies[-1]["messages"][-1]["content"]
        upstream.inject = chunk
        headers, raw = streamed(api, ask(SECOND, stream=True))
        assert chunk in raw and raw.endswith(b"data: [DONE]\n\n")
        fb = api.post("/v1/feedback", json={"task_id": headers["x-mia-task-id"], "correct": True})
        assert fb.status_code == 200, fb.text
        assert (
            f"<answer>It \ufffd{ANSWER[2:]}</answer>" in llm.bodies[-1]["messages"][-1]["content"]
        )
        upstream.inject = None
        assert_store_writable(api)
