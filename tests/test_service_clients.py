"""The typed service clients (mia.services): request models out, response models back, one
coroutine per route and one blocking wrapper (``client.sync``), against a mocked transport."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from mia.planner.flow import PlannerFlow, Task
from mia.planner.planners import NoPlanner
from mia.services import ExecutorClient, MemoryClient, RequestFailed, SyncClient
from mia.services.memory import MemoryResponse, PlanResponse, StatsResponse
from mia.services.serve import ExecuteResponse

STATS = {
    "memories": 4,
    "plan_pairs": 0,
    "buckets": {},
    "buffered_rollouts": 2,
    "buffered_questions": 1,
    "embedder": "hash",
    "dim": 8,
    "db_path": "m.sqlite",
    "compress_mode": "identity",
    "classifier": False,
}
MEMORY = {
    "context": "CTX",
    "positive_ids": [1],
    "negative_ids": [2],
    "pos_indices": [1],
    "neg_indices": [2],
    "prompt": "CTX",
    "indices": [1, 2],
}
PLAN = {
    "plan": "1. Search.",
    "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "1. Search."}],
    "memory_ids": [1, 2],
    "positive_ids": [1],
    "negative_ids": [2],
    "pos_indices": [1],
    "neg_indices": [2],
    "context": "CTX",
    "planner": "planner",
}
EXECUTE = {
    "answer": "Paris",
    "trace": "T",
    "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "Paris"}],
    "tool_calls": [
        {
            "turn": 1,
            "attempt": 0,
            "name": "search",
            "arguments": {"query_list": ["a"]},
            "ok": True,
            "error_kind": None,
            "error": None,
        }
    ],
    "turns": 1,
    "usage": {"prompt_tokens": 3, "completion_tokens": 4},
    "tool_errors": [],
    "tool_error": False,
    "stop_reason": "answer",
    "forced_answer": False,
    "replanned": False,
    "data_id": None,
}


class Service:
    """A mocked service: records each request's method, path and body bytes."""

    def __init__(self, answer: Callable[[str, str, Any], httpx.Response]) -> None:
        self.answer = answer
        self.sent: list[tuple[str, str, bytes]] = []
        self.threads: set[str] = set()

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.raw_path.decode()
        self.sent.append((request.method, path, request.content))
        self.threads.add(threading.current_thread().name)
        body = json.loads(request.content) if request.content else None
        return self.answer(request.method, path, body)

    def client(self, cls: type[Any] = MemoryClient) -> Any:
        transport = httpx.MockTransport(self)

        class Mocked(cls):  # type: ignore[misc, valid-type]
            def _client_kwargs(self) -> dict[str, Any]:
                return {**super()._client_kwargs(), "transport": transport}

        return Mocked("http://memory.test", connect_retries=0)


def routes(table: dict[tuple[str, str], Any]) -> Callable[[str, str, Any], httpx.Response]:
    def answer(method: str, path: str, body: Any) -> httpx.Response:
        if (method, path) == ("POST", "/memory") and isinstance(body, list):
            return httpx.Response(200, json=[MEMORY for _ in body])
        status, data = table[(method, path)]
        return httpx.Response(status, json=data)

    return answer


def test_requests_and_answers_are_the_models() -> None:
    svc = Service(
        routes(
            {
                ("POST", "/plan"): (200, PLAN),
                ("POST", "/memory"): (200, MEMORY),
                ("GET", "/stats"): (200, STATS),
            }
        )
    )
    memory = svc.client()

    async def calls() -> tuple[PlanResponse, list[MemoryResponse], list[MemoryResponse]]:
        try:
            plan = await memory.plan("Where?", image_caption=["a tower"], top_k=2, plan_if="memory")
            many = await memory.memories([memory.query("A"), {"question": "B", "top_k": 0}])
            return plan, many, await memory.memories([])
        finally:
            await memory.aclose()

    plan, many, none = asyncio.run(calls())
    assert isinstance(plan, PlanResponse) and (plan.plan, plan.memory_ids) == ("1. Search.", [1, 2])
    assert plan.messages == PLAN["messages"] and plan.planner == "planner"
    assert [m.context for m in many] == ["CTX", "CTX"] and many[0].explain is None
    assert none == []  # nothing sent for no questions
    # Only the fields given go out, by their wire names (the ``top_k`` alias as ``mem_top_k``).
    assert [(m, p, json.loads(b)) for m, p, b in svc.sent] == [
        (
            "POST",
            "/plan",
            {
                "question": "Where?",
                "image_caption": ["a tower"],
                "data_id": "",
                "mem_top_k": 2,
                "plan_if": "memory",
            },
        ),
        (
            "POST",
            "/memory",
            [{"question": "A", "data_id": ""}, {"question": "B", "mem_top_k": 0}],
        ),
    ]


def test_one_blocking_wrapper_runs_the_coroutines() -> None:
    svc = Service(routes({("GET", "/stats"): (200, STATS)}))
    memory = svc.client()
    stats = memory.sync.stats()
    assert isinstance(stats, StatsResponse) and stats.buffered_rollouts == 2
    assert isinstance(memory.sync, SyncClient)
    assert memory.sync(memory.stats()).memories == 4  # the typed form: sync(coroutine) -> T
    with pytest.raises(AttributeError, match="not a coroutine method"):
        memory.sync.query("q")  # a plain method stays on the client

    async def from_a_coroutine() -> int:  # blocks this loop, but works (another thread)
        return memory.sync.stats().memories

    assert asyncio.run(from_a_coroutine()) == 4
    got: list[int] = []
    threads = [
        threading.Thread(target=lambda: got.append(memory.sync.stats().dim)) for _ in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == [8] * 8
    assert svc.threads == {"mia-service-client"}  # one private loop ran every blocking call
    memory.close()  # its pool on that loop too
    assert memory._pools == {}
    assert memory.sync.stats().memories == 4  # and it opens again


def test_a_refused_request_is_not_sent_and_a_wrong_answer_fails() -> None:
    svc = Service(routes({("GET", "/stats"): (200, {"memories": "many"})}))
    memory = svc.client()
    with pytest.raises(RequestFailed) as refused:
        memory.sync.plan("", top_k=2)
    assert (refused.value.status, refused.value.code) == (422, "invalid_request")
    assert "question" in str(refused.value) and svc.sent == []
    with pytest.raises(RequestFailed, match="unexpected answer") as wrong:
        memory.sync.stats()
    assert wrong.value.status is None  # what the service did is unknown
    memory.close()


def test_error_envelopes_and_an_empty_replan() -> None:
    empty = {"error": {"code": "llm_empty", "message": "no revised plan"}}
    svc = Service(
        routes(
            {
                ("POST", "/replan_train"): (502, empty),
                ("POST", "/save_memory"): (409, {"error": {"code": "busy", "message": "later"}}),
            }
        )
    )
    memory = svc.client()
    assert memory.sync.replan_train("When?", "1. Search", "T").content == ""
    with pytest.raises(RequestFailed) as err:
        memory.sync.save_memory("/tmp/m")
    assert (err.value.status, err.value.code) == (409, "busy")
    memory.close()


def test_the_flow_keeps_serves_answer_as_its_json() -> None:
    svc = Service(
        routes({("POST", "/execute"): (200, EXECUTE), ("POST", "/continue"): (200, EXECUTE)})
    )
    serve = svc.client(ExecutorClient)

    async def flow() -> tuple[ExecuteResponse, Any]:
        try:
            typed = await serve.execute("q", "", data_id="d1", temperature=0.5)
            return typed, await PlannerFlow(NoPlanner(), serve).run(Task(question="q"))
        finally:
            await serve.aclose()

    typed, run = asyncio.run(flow())
    assert isinstance(typed, ExecuteResponse) and typed.tool_calls[0].name == "search"
    assert run.first == EXECUTE and run.final_answer == "Paris"
    assert run.usage()["prompt"] == 3
    assert json.loads(svc.sent[0][2]) == {
        "question": "q",
        "data_id": "d1",
        "plan": "",
        "temperature": 0.5,
    }
