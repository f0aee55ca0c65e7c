"""Property-based fuzzing of every route of every HTTP service (schemathesis over each live
OpenAPI schema): valid and invalid requests alike must never get a 5xx (other than a documented
upstream fault), every error must come in the ``{"error": {"code", "message"}}`` envelope, and
no route may hit the unhandled-exception handler. Every service is fuzzed twice: without a
token, and with one (the fuzzer sends it; each route must also refuse a request without it).

Each service runs for real on an ephemeral loopback port (uvicorn in a thread) with real SQLite
and indexes; the LLMs are scripted and Serper is the local fake. The budget is small and
derandomized (the same cases every run) so the whole module takes well under a minute on two
cores. memory_serve without an LLM is also fuzzed as a subprocess in test_memory_reliability.py.
The TTRL streaming server is left out: a valid ``/submit_sample`` runs training steps, and its
malformed submissions are covered by test_streaming.py.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from mia.http import ServerThread
from mia.llm.scripted import ScriptedChat

MAX_EXAMPLES = 12  # per operation and generation mode
# The 5xx a service may answer by design: an upstream (Serper, ddgs, a web page) that is down
# or refusing.
UPSTREAM = {"web_tools": {502, 503, 504}}


TOKENS = [None, "fuzz-t0ken"]


def fuzz(
    url: str, service: str, prefix: str = "/", token: str | None = None
) -> dict[str, Counter[int]]:
    """Fuzz every operation of the service at ``url`` (whose path starts with ``prefix``);
    returns the status codes seen per route. With ``token``, requests carry it, and a request
    without it must get 401 on every route but ``/health``."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    schema = schemathesis.openapi.from_url(f"{url}/openapi.json", headers=headers)
    seen: dict[str, Counter[int]] = {}
    problems: list[str] = []
    for result in schema.get_all_operations():
        op = result.ok()
        if not op.label.split(" ", 1)[1].startswith(prefix):
            continue
        counts = seen.setdefault(op.label, Counter())
        if token:
            _refused_without_token(url, op, problems)
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            try:
                _runner(url, service, op, mode, counts, problems, headers)()
            except Unsatisfiable:  # no invalid request exists (e.g. GET /health: no inputs)
                assert mode is GenerationMode.NEGATIVE, op.label
    assert not problems, "\n".join(problems[:20])
    return seen


def _refused_without_token(url: str, op: Any, problems: list[str]) -> None:
    method, path = op.label.split(" ", 1)
    if path == "/health":
        return
    path = path.replace("{", "").replace("}", "")  # any value: auth comes before routing
    resp = httpx.request(method, url + path, json={} if method == "POST" else None, timeout=30)
    if resp.status_code != 401:
        problems.append(f"{op.label} without the token: {resp.status_code} {resp.text[:200]}")


def _runner(
    url: str,
    service: str,
    op: Any,
    mode: GenerationMode,
    counts: Counter[int],
    problems: list[str],
    headers: dict[str, str],
) -> Any:
    allowed = UPSTREAM.get(service, set())

    @settings(
        max_examples=MAX_EXAMPLES,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=op.as_strategy(generation_mode=mode))
    def run(case: Any) -> None:
        resp = case.call(base_url=url, timeout=60, headers=headers)
        counts[resp.status_code] += 1
        where = f"{op.label} {mode.value}: {resp.status_code} for {case.body!r:.300}"
        if resp.status_code >= 500 and resp.status_code not in allowed:
            problems.append(f"{where}: {resp.text[:300]}")
        if resp.status_code >= 400:
            try:
                error = resp.json()["error"]
                assert set(error) == {"code", "message"}
            except (ValueError, KeyError, TypeError, AssertionError):
                problems.append(f"{where}: not the error envelope: {resp.text[:300]}")

    return run


def _store_still_works(url: str, token: str | None) -> None:
    """After the fuzzing (which may have cleared or reloaded it), the store takes a write and
    gives it back."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    item = {"question": "Is the store intact?", "judgement": "correct", "workflow_summary": "1. s"}
    r = httpx.post(f"{url}/memories", json=item, headers=headers, timeout=60)
    assert r.status_code == 200, r.text
    r = httpx.get(f"{url}/memories", params={"q": "intact"}, headers=headers, timeout=60)
    assert r.status_code == 200 and r.json()["memories"][0]["question"] == item["question"], r.text


@pytest.fixture
def no_unhandled(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    with caplog.at_level(logging.ERROR, logger="mia.http"):
        yield
    assert "unhandled error" not in caplog.text, caplog.text[-3000:]


@pytest.fixture(scope="module")
def search_index(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from local_search import build_index

    root = tmp_path_factory.mktemp("search")
    words = ["apples", "rivers", "castles", "volcanoes", "Eiffel Tower", "Paris"]
    (root / "c.jsonl").write_text(
        "".join(
            json.dumps({"id": i, "contents": f"A passage about {w}."}) + "\n"
            for i, w in enumerate(words)
        )  # fmt: skip
    )
    build_index(root / "c.jsonl", root / "idx", "bm25")
    return root / "idx"


@pytest.fixture(scope="module")
def search_url(search_index: Path) -> Iterator[str]:
    from local_search import open_index
    from local_search.server import create_search_app

    with open_index(search_index) as retriever, ServerThread(create_search_app(retriever)) as url:
        yield url


@pytest.mark.parametrize("token", TOKENS)
def test_fuzz_local_search(search_index: Path, token: str | None, no_unhandled: None) -> None:
    from local_search import open_index
    from local_search.server import create_search_app

    with (
        open_index(search_index) as retriever,
        ServerThread(create_search_app(retriever, token=token)) as url,
    ):
        seen = fuzz(url, "local_search", token=token)
    assert set(seen) == {"GET /health", "POST /retrieve"}
    assert seen["POST /retrieve"][200] and seen["POST /retrieve"][422]


@pytest.mark.parametrize("token", TOKENS)
def test_fuzz_serve(search_url: str, token: str | None, no_unhandled: None) -> None:
    from mia.agent import AgentConfig, build_tools
    from serve import ExecutorService, create_serve_app

    tools = build_tools({"search": {"type": "search", "params": {"url": search_url}}})
    executor = ScriptedChat(lambda _m: "<think>easy</think>\n<answer>Paris</answer>")
    service = ExecutorService(executor, tools, AgentConfig(image_size=16))
    with ServerThread(create_serve_app(service, token=token)) as url:
        seen = fuzz(url, "serve", token=token)
    assert {"POST /execute", "POST /plan", "POST /continue", "POST /replan"} <= set(seen)
    assert seen["POST /execute"][200] and seen["POST /execute"][422]


@pytest.mark.parametrize("token", TOKENS)
def test_fuzz_memory_serve_with_planner(
    tmp_path: Path, token: str | None, no_unhandled: None
) -> None:
    from memory_serve.app import build_app
    from memory_serve.config import load_config
    from memory_serve.service import MemoryService
    from memory_serve.store import MemoryStore
    from mia.embedding import shared_embedder

    sandbox = tmp_path / "sandbox"
    cfg = load_config(
        None,
        [f"persist.allowed_root={sandbox}", f"ttrl.output_dir={sandbox / 'out'}"],
    )
    reply = ScriptedChat(
        lambda m: "2" if "Candidate plans" in str(m) else "yes\n1. Search (q -> a)"
    )
    store = MemoryStore(tmp_path / "m.sqlite", shared_embedder(), cfg.store)
    try:
        app = build_app(MemoryService(cfg, store, reply, reply), token=token)
        with ServerThread(app) as url:
            seen = fuzz(url, "memory_serve", token=token)
            _store_still_works(url, token)
    finally:
        store.close()
    routes = "memory plan best_plan judge_replan replan replan_train memories batch_memory_save "
    routes += "memories/find memory_bank_save consolidate_memories batch_evaluate save_memory "
    routes += "load_memory clear_memory"
    gets = {"GET /stats", "GET /health", "GET /memories", "GET /memories/{memory_id}"}
    gets |= {"GET /runs", "GET /runs/detail"}
    assert {f"POST /{r}" for r in routes.split()} | gets == set(seen)
    # Whatever was written stayed inside the sandbox (relative paths resolve there).
    assert {p.name for p in tmp_path.iterdir()} <= {
        "sandbox",
        "m.sqlite",
        "m.sqlite-wal",
        "m.sqlite-shm",
    }


@pytest.mark.parametrize("token", TOKENS)
def test_fuzz_memory_serve_proxy(tmp_path: Path, token: str | None, no_unhandled: None) -> None:
    """The proxy's routes (``--proxy``) in front of a local fake upstream that always answers."""
    from memory_serve.app import build_app
    from memory_serve.config import load_config
    from memory_serve.service import MemoryService
    from memory_serve.store import MemoryStore
    from mia.embedding import shared_embedder
    from tests.fake_openai import FakeOpenAI

    upstream = FakeOpenAI(lambda body: {"content": "It is in Paris."}, chunk_delay_s=0.0)
    reply = ScriptedChat(lambda m: "1. Search (q -> a)")
    with ServerThread(upstream.app) as up:
        cfg = load_config(None, [f"proxy.upstream={up}/v1", "proxy.timeout_s=30"])
        store = MemoryStore(tmp_path / "m.sqlite", shared_embedder(), cfg.store)
        app = build_app(MemoryService(cfg, store, reply, reply), token=token)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        try:
            with ServerThread(app) as url:
                # One real task first, so feedback/task cases can meet an existing id too.
                r = httpx.post(
                    f"{url}/v1/chat/completions",
                    json={"model": "m", "messages": [{"role": "user", "content": "Where?"}]},
                    headers=headers,
                    timeout=60,
                )
                assert r.status_code == 200, r.text
                seen = fuzz(url, "memory_serve_proxy", prefix="/v1/", token=token)
        finally:
            app.state.proxy.tasks.close()
            store.close()
    proxy_routes = {
        "POST /v1/chat/completions",
        "GET /v1/models",
        "POST /v1/feedback",
        "GET /v1/tasks/{task_id}",
    }
    assert proxy_routes == set(seen)
    # The documented body shape lets the fuzzer reach the upstream, not only the 422 door.
    assert seen["POST /v1/chat/completions"][200] > 0, seen


@pytest.mark.parametrize("token", TOKENS)
def test_fuzz_web_tools(tmp_path: Path, token: str | None, no_unhandled: None) -> None:
    from fake_serper import FakeSerper

    from web_tools.config import WebToolsConfig
    from web_tools.server import build_app

    def ddgs_call(kind: str, query: str, kwargs: dict[str, Any]) -> list[dict[str, Any]]:
        # ddgs' network call, faked (it cannot be pointed at a local server); no images, so
        # /image_search fetches nothing from outside.
        if kind == "images":
            return []
        return [{"title": query, "href": "https://d.example/1", "body": "b"}]

    fake = FakeSerper(expected_key="k")
    with ServerThread(fake.app) as serper:
        config = WebToolsConfig(
            serper_url=f"{serper}/search",
            serper_images_url=f"{serper}/images",
            cache_path=str(tmp_path / "cache.sqlite"),
            rate_limit_qps=0.0,
            timeout_s=5.0,
            max_retries=1,
            backoff_base_s=0.001,
            backoff_max_s=0.01,
        )
        app = build_app(config, serper_key="k", ddgs_call=ddgs_call, token=token)
        with ServerThread(app) as url:
            seen = fuzz(url, "web_tools", token=token)
    routes = {"GET /search", "POST /search", "GET /image_search", "GET /web_scrape", "GET /health"}
    assert set(seen) == routes
    assert all(seen[r][200] > 0 for r in ("GET /search", "POST /search", "GET /image_search"))
    assert sum(seen["GET /web_scrape"].values()) > 0


@pytest.mark.parametrize("token", TOKENS)
def test_fuzz_reward_server(tmp_path: Path, token: str | None, no_unhandled: None) -> None:
    from mia.judge import RuleJudge
    from mia.rewards.hooks import planner_gt_reward
    from ttrl_streaming.reward_server import GTStore, create_reward_app

    store = GTStore(tmp_path / "gts.sqlite")
    try:
        app = create_reward_app(store, RuleJudge(), planner_gt_reward, token=token)
        with ServerThread(app) as url:
            seen = fuzz(url, "reward_server", token=token)
    finally:
        store.close()
    assert any("compute_gt_reward" in r for r in seen) and any("register_gts" in r for r in seen)
