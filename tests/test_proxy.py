"""MIA as a drop-in memory layer: an unmodified ``openai`` client pointed at memory_serve's
proxy (real uvicorn, real SQLite, real embedder), a local fake upstream model and a local fake
Manager/Planner LLM (both OpenAI-compatible HTTP servers, tests/fake_openai.py). A first task is
planned, answered over two turns (a tool call), reported correct and written to memory; a
similar second task, streamed, is planned from that memory and credits it."""

from __future__ import annotations

import contextlib
import json
import logging
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
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, overrides: tuple[str, ...] = ()
) -> Iterator[tuple[str, FakeOpenAI, FakeOpenAI, MemoryService]]:
    monkeypatch.setenv("MIA_PROXY_API_KEY", UPSTREAM_KEY)
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
            info = mem.service.task_sync(task_id)
            assert (info["status"], info["memory_ids"], info["result"]["id"]) == (
                "recorded",
                [1],
                2,
            )
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
