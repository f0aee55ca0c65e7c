"""Held-out-style compatibility: clients written only from the reference's documented request and
response shapes (docs/reference.md §3.1-3.4, §3.6), as plain dicts over httpx -- never our client
classes -- drive each service's reference routes on real uvicorn servers (scripted LLMs)."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from PIL import Image
from role_fixtures import build_tiny_model, memory_service, reward_service

from mia.agent import ToolSet, load_agent_config
from mia.http import ServerThread
from mia.llm.scripted import ScriptedChat
from mia.prompts import planner as planner_text
from mia.trace import content_text

# ----------------------------------------------------------------------------- memory_serve §3.1

PAST = [
    {"role": "system", "content": planner_text.PLANNER_SYSTEM_PROMPT},
    {"role": "user", "content": "plan please"},
    {"role": "assistant", "content": "1. Search"},
]


def _store(question: str, judgement: str) -> dict[str, Any]:
    # /batch_memory_save as the reference's inference driver sends it (a JSON list).
    return {
        "data_id": question,
        "question": question,
        "image_caption": [],
        "messages": [{"role": "assistant", "content": "<answer>x</answer>"}],
        "plan": "1. search",
        "judgement": judgement,
        "used_memory_indices": [],
    }


def test_memory_serve_reference_driver(tmp_path: Path) -> None:
    def manager(messages) -> str:
        text = content_text(messages[-1]["content"])
        if text.startswith("Several candidate research plans"):
            return "<think>pick</think>3"
        if text == planner_text.judge_prompt("T"):
            return "no"
        if "Please summarize" in text or "summar" in text.lower():
            return "1. Search the thing (q -> a)"
        return "<think>cold</think>\n1. Cold plan (q -> a)"

    sampled = iter(f"<think>s</think>\n{i}. Sampled plan" for i in range(1, 100))
    mode = {"sample": False}

    def planner_reply(messages) -> str:
        return next(sampled) if mode["sample"] else "<think>x</think>\n1. Planner plan (q -> b)"

    planner = ScriptedChat(planner_reply)
    with memory_service(tmp_path / "m.sqlite", ScriptedChat(manager), planner) as (url, _):
        post = lambda path, body: httpx.post(url + path, json=body, timeout=60)  # noqa: E731
        assert post("/clear_memory", None).json()["status"] == "success"
        r = post("/batch_memory_save", [_store(f"Which river is in city {i}?", j)
                                        for i, j in enumerate(["correct", "correct",
                                                               "incorrect", "incorrect"])])  # fmt: skip
        assert r.status_code == 200 and r.json()["status"] == "success", r.text

        # /memory: a JSON list in, a list out; pos_indices/neg_indices are ints; the TTRL
        # driver's {data_id, question, image_caption} gets prompt + indices (union).
        out = post("/memory", [{"question": "Which river is in city 9?", "mem_top_k": 2,
                                "pass_num": 0, "data_id": "d9", "image_caption": ""}]).json()  # fmt: skip
        assert isinstance(out, list) and len(out) == 1
        m = out[0]
        assert set(m) >= {"context", "pos_indices", "neg_indices", "prompt", "indices"}
        assert (sorted(m["pos_indices"]), sorted(m["neg_indices"])) == ([1, 2], [3, 4])
        assert m["prompt"] == m["context"] and m["context"].startswith("# Retrieved Relevant")
        assert m["indices"] == m["pos_indices"] + m["neg_indices"]
        ttrl = post("/memory", {"data_id": "d9", "question": "Which river is in city 9?",
                                "image_caption": ["a river", "a bridge"]}).json()  # fmt: skip
        assert ttrl["indices"] == ttrl["pos_indices"] + ttrl["neg_indices"]

        # /judge_replan: need_replan is the "yes"/"no" TEXT (the driver tests == "yes").
        j = post("/judge_replan", [{"workflow": "T", "past_messages": PAST,
                                    "memory_indices": [1]}]).json()[0]  # fmt: skip
        assert j["need_replan"] == "no" and isinstance(j["need_replan"], str)
        assert j["messages"][-2:] == [
            {"role": "user", "content": planner_text.judge_prompt("T")},
            {"role": "assistant", "content": "no"},
        ]

        # /replan as the inference driver calls it: mem_top_k=0, pass_num=2; 2+2 memories
        # found, so the Planner (not a cold start) writes it; indices are always [].
        history = [*j["messages"][:-1], {"role": "assistant", "content": "yes"}]
        rp = post("/replan", [{"question": "Which river is in city 9?", "past_messages": history,
                               "image_caption": "", "mem_top_k": 0, "pass_num": 2}]).json()[0]  # fmt: skip
        assert rp["replan"] == "1. Planner plan (q -> b)"
        assert (rp["pos_indices"], rp["neg_indices"]) == ([], [])
        assert rp["messages"][-2] == {
            "role": "user", "content": planner_text.replan_prompt("Which river is in city 9?")
        }  # fmt: skip

        # /best_plan: 4 plans sampled at T=1, the memory LLM picks "3".
        mode["sample"] = True
        b = post("/best_plan", [{"question": "Which river is in city 9?"}]).json()[0]
        assert b["all_plans"] == [f"{i}. Sampled plan" for i in range(1, 5)]
        assert (b["selected_plan_number"], b["plan"]) == ("3", "3. Sampled plan")
        assert set(b) >= {"plan", "messages", "pos_indices", "neg_indices"}
        assert [c["params"].temperature for c in planner.calls[-4:]] == [1.0] * 4


# ----------------------------------------------------------------------------- serve §3.2-3.3


def _png() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (12, 10), (255, 0, 0)).save(buf, format="PNG")
    return buf.getvalue()


def test_serve_reference_plan_and_replan() -> None:
    from serve.app import ExecutorService, create_serve_app

    def reply(messages) -> str:
        last = content_text(messages[-1]["content"])
        return "<answer>Lyon</answer>" if "revised plan" in last else "<answer>Paris</answer>"

    backend = ScriptedChat(reply, name="executor")
    cfg = load_agent_config({"tools": {}, "max_turns": 4, "image_size": 16})
    service = ExecutorService(backend, ToolSet([]), cfg, images_by_id={"q7": [_png()]})
    with ServerThread(create_serve_app(service)) as url:
        # The Planner loop's PLAN_URL body: no images, found by data_id.
        r = httpx.post(f"{url}/plan", json={"data_id": "q7", "question": "Which city?",
                                            "plan": "1. look"}, timeout=30)  # fmt: skip
        assert r.status_code == 200, r.text
        plan = r.json()
        first_user = backend.calls[0]["messages"][1]["content"]
        assert isinstance(first_user, list) and any("image" in str(p) for p in first_user)
        assert plan["history_messages"] == [
            {"role": "assistant", "content": "<answer>Paris</answer>"}
        ]
        assert plan["trace"].startswith("### Question: Which city?")
        assert plan["prompt"] == planner_text.judge_prompt(plan["trace"])

        # REPLAN_URL body: the history back, with plan and the supplementary plan.
        body = {"data_id": "q7", "question": "Which city?", "plan": "1. look",
                "messages": plan["history_messages"], "replan": "1. check again"}  # fmt: skip
        r = httpx.post(f"{url}/replan", json=body, timeout=30)
        assert r.status_code == 200, r.text
        out = r.json()
        assert out["history_messages"] == [
            {"role": "assistant", "content": ""},
            {"role": "user", "content": "\nI have a revised plan for you to follow:\n"
             "1. check again\nPlease continue with this updated guidance:\n"},
            {"role": "assistant", "content": "<answer>Lyon</answer>"},
        ]  # fmt: skip
        assert "Lyon" in out["trace"] and "Paris" not in out["trace"]
        assert out["prompt"] == planner_text.judge_prompt(out["trace"])
        # The rebuilt first prompt is the one /plan used (same images, same plan).
        assert backend.calls[-1]["messages"][:2] == backend.calls[0]["messages"][:2]


# ----------------------------------------------------------------------------- ttrl_streaming §3.6


@pytest.fixture(scope="module")
def stream(tmp_path_factory: pytest.TempPathFactory):
    from role_fixtures import executor_service

    from ttrl_streaming.config import load_config
    from ttrl_streaming.server import StreamingServer, create_streaming_app

    root = tmp_path_factory.mktemp("stream")
    seen: list[list[dict[str, Any]]] = []

    def reply(messages) -> str:
        seen.append(messages)
        return "<answer>Paris</answer>"

    with (
        reward_service(root / "gts.sqlite") as reward_url,
        memory_service(root / "mem.sqlite") as (memory_url, _),
        executor_service(reply) as (serve_url, _),
    ):
        cfg = load_config("server", [
            f"model_path={build_tiny_model(root / 'model')}", f"run_dir={root / 'run'}",
            f"services.executor_url={serve_url}", f"services.memory_url={memory_url}",
            f"services.reward_url={reward_url}", "trainer.batch_size=2", "trainer.n=2",
            "trainer.logging.console=false", "episode.plan_max_tokens=8",
            "episode.decision_max_tokens=4", "episode.replan_max_tokens=6",
            "memory.evaluate=false",
        ])  # fmt: skip
        server = StreamingServer(cfg).start()
        try:
            with ServerThread(create_streaming_app(server)) as url:
                yield SimpleNamespace(url=url, reward_url=reward_url, server=server, seen=seen)
        finally:
            server.close()


def _collated(ids: list[str]) -> dict[str, Any]:
    """A veRL-style collated batch in the reference codec (tensors ignored by the server)."""
    k = len(ids)
    return {
        "batch": {"input_ids": {"__tensor__": True, "dtype": "int64", "data": [[1, 2]] * k}},
        "non_tensor_batch": {
            "data_id": {"__ndarray_object__": True, "data": ids},
            "raw_prompt": {
                "__ndarray_object__": True,
                "data": [[{"role": "user", "content": f"<image>Where is {i}?"}] for i in ids],
            },  # fmt: skip
            "reward_model": {
                "__ndarray_object__": True,
                "data": [{"ground_truth": ""} for _ in ids],
            },  # fmt: skip
            "image_caption": {"__ndarray_object__": True, "data": [["a tower"]] * k},
        },
        "meta_info": {},
    }


def test_streaming_reference_client(stream) -> None:
    img = "data:image/png;base64," + base64.b64encode(_png()).decode()
    reg = httpx.post(f"{stream.url}/streaming/register_images",
                     json={"entries": [{"data_id": "r1", "images": [img, "second"]}]}).json()  # fmt: skip
    assert reg == {"status": "success", "registered": 1, "total": 1}
    one = httpx.post(f"{stream.url}/streaming/register_images",
                     json={"data_id": "r2", "images": [img]}).json()  # fmt: skip
    assert (one["registered"], one["total"]) == (1, 2)
    assert httpx.get(f"{stream.url}/streaming/health").json()["registered_images"] == 2
    gts = httpx.post(f"{stream.reward_url}/register_gts", json={"entries": [
        {"data_id": "r1", "ground_truth": ["Paris"]}, {"data_id": "r2", "ground_truth": "Paris"}]})  # fmt: skip
    assert gts.status_code == 200, gts.text

    # /submit_sample with {"rollout": <JSON-encoded batch>}: a string, as json.dumps'd.
    body = {"rollout": json.dumps(_collated(["r1"])), "epoch": 0, "finish": False,
            "flush_partial": False}  # fmt: skip
    r = httpx.post(f"{stream.url}/submit_sample", json=body, timeout=600)
    assert r.status_code == 200, r.text
    out = r.json()
    assert (out["status"], out["global_steps"], out["rollout_buffer_len"], out["epoch"]) == (
        "rollout", 0, 2, 0
    )  # fmt: skip
    assert [x["data_id"] for x in out["rollouts"]] == ["r1", "r1"]
    # The registered image reached the Executor (its first user turn carries an image part).
    assert any(
        isinstance(m[1]["content"], list) and any("image" in str(p) for p in m[1]["content"])
        for m in stream.seen
    )
    # /submit_batch: one full rollout + update step on what is buffered.
    r = httpx.post(f"{stream.url}/submit_batch",
                   json={"batch": _collated(["r2"]), "epoch": 1, "finish": True}, timeout=600)  # fmt: skip
    assert r.status_code == 200, r.text
    out = r.json()
    assert (out["status"], out["global_steps"], out["done"], out["epoch"]) == ("step", 1, True, 1)
    health = httpx.get(f"{stream.url}/health").json()
    assert {"global_steps", "total_training_steps", "train_batch_size", "rollout_n"} <= set(health)
    # A batch without data_id is a 4xx, nothing buffered.
    bad = httpx.post(f"{stream.url}/submit_sample", json={"rollout": {"batch": {}}})
    assert bad.status_code == 422 and "data_id" in bad.json()["error"]["message"]


# ----------------------------------------------------------------------------- web_tools §3.4


def test_web_tools_reference_client(tmp_path: Path) -> None:
    """The gateway's three tool routes as the reference's clients call them: GET with query
    parameters, an envelope {request_id, tool: {name, version}, result, stat: {cache}} back."""
    from fake_serper import FakeSerper
    from fake_web import FakeWeb

    from web_tools.config import WebToolsConfig
    from web_tools.server import build_app

    def ddgs_call(kind: str, query: str, kwargs: dict[str, Any]) -> list[dict[str, Any]]:
        # Stands in for ddgs' network call (ddgs cannot be pointed at a local server).
        return [{"title": f"{query} {i}", "href": f"https://d.example/{i}", "body": f"b{i}"}
                for i in range(1, kwargs["max_results"] + 1)]  # fmt: skip

    serper, web = FakeSerper(), FakeWeb()
    with ServerThread(serper.app) as serper_url, ServerThread(web.app) as web_url:
        serper.images["tower"] = {"images": [
            {"title": "Red tower", "imageUrl": f"{web_url}/img/red.png", "link": "https://p/1"}]}  # fmt: skip
        config = WebToolsConfig(
            serper_url=f"{serper_url}/search", serper_images_url=f"{serper_url}/images",
            cache_path=str(tmp_path / "c.sqlite"), rate_limit_qps=0.0, default_engine="ddgs",
            fetch_allow_hosts=[web_url.removeprefix("http://")],  # the fake web is on loopback
        )  # fmt: skip
        app = build_app(config, serper_key="k", ddgs_call=ddgs_call)
        with ServerThread(app) as url:
            get = lambda path, **params: httpx.get(url + path, params=params, timeout=60)  # noqa: E731

            def envelope(resp: httpx.Response, tool: str, cache: str) -> dict[str, Any]:
                assert resp.status_code == 200, resp.text
                body = resp.json()
                assert isinstance(body["request_id"], str) and body["request_id"]
                assert body["tool"]["name"] == tool and isinstance(body["tool"]["version"], str)
                assert body["stat"] == {"cache": cache}
                return body["result"]

            # tool_serper.py: GET /search?q=...&engine=serper&max_results=5, one query.
            r = envelope(get("/search", q="eiffel tower", engine="serper", max_results=5),
                         "search", "MISS")  # fmt: skip
            assert (r["success"], r["engine"]) == (True, "serper")
            assert [x["url"] for x in r["results"]] == [
                f"https://example.com/eiffel-tower/{i}" for i in range(1, 6)
            ]
            first = r["results"][0]
            assert {k: first[k] for k in ("title", "snippet", "date")} == {
                "title": "eiffel tower - result 1", "snippet": "Snippet 1 about eiffel tower.",
                "date": "Jan 2, 2024"}  # fmt: skip
            assert first["formatted"] in r["formatted"] and isinstance(r["latency_ms"], float)
            assert serper.calls[-1].body == {"q": "eiffel tower", "num": 5, "gl": "us", "hl": "en"}
            again = get("/search", q="eiffel tower", engine="serper", max_results=5)
            assert envelope(again, "search", "HIT")["results"] == r["results"]

            # A list of queries, no engine (the default, ddgs), max_results defaults to 3:
            # results is ONE string, the formatted blocks joined by "\n=======\n".
            r = envelope(httpx.get(f"{url}/search?q=a&q=b", timeout=60), "search", "MISS")
            assert r["engine"] == "ddgs" and isinstance(r["results"], str)
            blocks = r["results"].split("\n=======\n")
            assert len(blocks) == 2 and all(b.count("https://d.example/") == 3 for b in blocks)

            # /image_search: text (titles) and images (base64, 256x256).
            r = envelope(get("/image_search", q="tower", engine="serper"), "image_search", "MISS")
            assert r["text"] == "Red tower" and len(r["images"]) == 1
            img = Image.open(io.BytesIO(base64.b64decode(r["images"][0])))
            assert img.size == (256, 256)
            assert serper.calls[-1].body["num"] == 5  # the reference's default max_results

            # /web_scrape: success, url, markdown_content, latency_ms.
            page = f"{web_url}/article.html"
            r = envelope(get("/web_scrape", url=page, goal="bridges"), "web_scrape", "MISS")
            assert (r["success"], r["url"]) == (True, page)
            assert r["markdown_content"].startswith("# The River Seine\n\n")
            assert isinstance(r["latency_ms"], float) and "extracted_info" not in r
            hit = envelope(get("/web_scrape", url=page), "web_scrape", "HIT")
            drop = ("latency_ms", "goal")
            assert {k: v for k, v in hit.items() if k not in drop} == {
                k: v for k, v in r.items() if k not in drop}  # fmt: skip

            # deterministic=true: a cache miss is a 404 (an error body with "error").
            miss = get("/search", q="never asked", deterministic="true")
            assert miss.status_code == 404 and "error" in miss.json()
