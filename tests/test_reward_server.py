"""The reward server end to end on real uvicorn servers: exact payloads for the reference request
shape and the native record, ground-truth aliases, custom reward functions from an import path,
persistence across a restart of the real CLI process, concurrency, and every 4xx."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers import sole_error_line

from mia.errors import MiaError
from mia.http import ServerThread, wait_for_port_file
from mia.judge import LLMJudge, RuleJudge
from mia.llm.scripted import ScriptedChat
from mia.rewards.hooks import (
    DEFAULT_REWARD_FN,
    RewardContext,
    load_reward_fn,
    planner_gt_reward,
)
from ttrl_streaming import reward_server
from ttrl_streaming.reward_server import GTStore, create_reward_app

REPO = Path(__file__).resolve().parents[1]

PLAN = "<think>Memories suggest a direct search.</think>\n1. Search the capital of France."
TRACE1 = (
    "### Question: What is the capital of France?\n\n### Round 1:\n"
    "#### Agent Reasoning and Tool Call:\n<think>I guess.</think>\n<answer>Lyon</answer>"
)
TRACE2 = (
    "### Round 2:\n#### Agent Reasoning and Tool Call:\n"
    "<think>Checked.</think>\n<answer>Paris</answer>"
)
REFERENCE_REQUEST = {
    "data_source": "2wiki",
    "solution_str": "<think>not sure</think>yes",
    "extra_info": {
        "question": "What is the capital of France?",
        "messages": [
            {"role": "assistant", "content": PLAN},
            {"role": "user", "content": TRACE1},
            {"role": "assistant", "content": "<think>not sure</think>yes"},
            {"role": "user", "content": "You decided to reflect and replan ..."},
            {"role": "assistant", "content": "<think>retry</think>1. Search again."},
            {"role": "user", "content": TRACE2},
        ],
    },
    "data_id": "q1",
    "image_caption": "",
}

FEEDBACK_MODULE = '''
"""A user-feedback reward for the tests: thumbs up/down sent along with the request."""


def reward(ctx):
    up = ctx.request.get("feedback") == "up"
    extras = {
        "judgement": "correct" if up else "incorrect",
        "golds": ctx.ground_truths,
        "answer": ctx.record.final_answer,
        "question": ctx.question,
        "config": dict(ctx.config or {}),
    }
    return (1.0 if up else -1.0), extras


async def bare(ctx):
    return 0.25


def bad(ctx):
    return "high", {}
'''


@pytest.fixture
def feedback_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    pkg = tmp_path / "plugins"
    pkg.mkdir()
    (pkg / "feedback_mod.py").write_text(FEEDBACK_MODULE)
    monkeypatch.syspath_prepend(str(pkg))
    return pkg


def start(tmp_path: Path, judge: Any = None, reward_fn: Any = planner_gt_reward, **kw: Any):
    store = GTStore(tmp_path / "gts.sqlite")
    app = create_reward_app(store, judge or RuleJudge(), reward_fn, **kw)
    return store, ServerThread(app)


@pytest.fixture(scope="module")
def shared_client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    store, server = start(tmp_path_factory.mktemp("shared"))
    with server as url, httpx.Client(base_url=url, timeout=10) as c:
        register(c, [{"data_id": "q1", "ground_truth": "Paris"}])
        yield c
    store.close()


@pytest.fixture
def client(tmp_path: Path) -> Iterator[httpx.Client]:
    store, server = start(tmp_path)
    with server as url, httpx.Client(base_url=url, timeout=10) as c:
        yield c
    store.close()


def register(c: httpx.Client, entries: list[dict[str, Any]]) -> dict[str, Any]:
    r = c.post("/register_gts", json={"entries": entries})
    assert r.status_code == 200, r.text
    return r.json()


def error(r: httpx.Response) -> tuple[int, str, str]:
    body = r.json()["error"]
    return r.status_code, body["code"], body["message"]


# --------------------------------------------------------------------------------------------
def test_register_and_health(client: httpx.Client) -> None:
    entries = [
        {"data_id": "q1", "ground_truth": ["Paris", "Paris, France"]},
        {"data_id": 7, "ground_truth": 1984},
    ]
    got = register(client, entries)
    assert got == {"status": "ok", "registered": 2, "total": 2}
    # One entry at the top level; re-registering an id replaces it.
    r = client.post("/register_gts", json={"data_id": "q1", "ground_truth": "Paris"})
    assert r.json() == {"status": "ok", "registered": 1, "total": 2}
    assert client.get("/health").json() == {
        "status": "ok",
        "service": "reward_server",
        "registered_gts": 2,
        "reward_fn": DEFAULT_REWARD_FN,
        "judge": "rules:contains",
    }


def test_reference_request_shape(client: httpx.Client) -> None:
    register(client, [{"data_id": "q1", "ground_truth": "Paris"}])
    r = client.post("/compute_gt_reward", json=REFERENCE_REQUEST)
    assert r.status_code == 200, r.text
    body = r.json()
    extras = body.pop("extras")
    assert body.pop("score") == pytest.approx(0.7 * 1 + 0.2 * 0 + 0.05 * 1 + 0.05 * 1)
    assert body == {
        "judgement": "correct",
        "format_score": 1.0,
        "decision_score": 1.0,
        "is_answer1_correct": False,
        "is_answer2_correct": True,
        "data_source": "2wiki",
        "data_id": "q1",
    }
    assert extras["answer_first"] == "Lyon"
    assert extras["answer_final"] == "Paris"
    assert extras["format_issues"] == []
    assert extras["asked_replan"] is True

    # No replan, data_id inside extra_info, answer right the first time.
    req = {
        "solution_str": "no",
        "extra_info": {
            "data_id": "q1",
            "question": "Capital?",
            "messages": [PLAN, TRACE1.replace("Lyon", "Paris"), "<think>fine</think>no"],
        },
    }
    r = client.post("/compute_gt_reward", json=req)
    body = r.json()
    assert body["score"] == pytest.approx(1.0)
    assert (body["data_id"], body["data_source"], body["is_answer2_correct"]) == ("q1", None, True)


def test_native_record_and_gt_aliases(client: httpx.Client) -> None:
    register(client, [{"data_id": "q2", "ground_truth": ["George Orwell", "Eric Blair"]}])
    req = {
        "data_id": "q2",
        "data_source": "app",
        "record": {
            "plan": PLAN,
            "decision": "no",
            "answer_first": "Eric Arthur Blair",  # no alias contained ...
            "question": "Who wrote 1984?",
        },
    }
    r = client.post("/compute_gt_reward", json=req)
    assert r.json()["score"] == pytest.approx(0.05)  # wrong, kept: format only
    req["record"]["answer_first"] = "It was Eric Blair."  # ... the second alias is
    body = client.post("/compute_gt_reward", json=req).json()
    body.pop("extras")
    assert body == {
        "score": 1.0,
        "judgement": "correct",
        "format_score": 1.0,
        "decision_score": 1.0,
        "is_answer1_correct": True,
        "is_answer2_correct": True,
        "data_source": "app",
        "data_id": "q2",
    }


def test_unknown_id_is_a_404(client: httpx.Client) -> None:
    r = client.post("/compute_gt_reward", json={**REFERENCE_REQUEST, "data_id": "nope"})
    assert r.status_code == 404
    assert r.json() == {
        "error": {
            "code": "not_found",
            "message": "no ground truth registered for data_id 'nope' (POST /register_gts)",
        }
    }


@pytest.mark.parametrize(
    ("path", "payload", "status", "fragment"),
    [
        ("/register_gts", {}, 422, 'expected {"entries": [{"data_id", "ground_truth"}, ...]}'),
        ("/register_gts", {"entries": []}, 422, "entries must not be empty"),
        ("/register_gts", {"entries": [{"data_id": "a", "ground_truth": []}]}, 422, "non-empty"),
        ("/register_gts", {"entries": [{"data_id": "a", "ground_truth": " "}]}, 422, "non-empty"),
        ("/register_gts", {"entries": [{"data_id": " ", "ground_truth": "x"}]}, 422, "data_id"),
        ("/register_gts", {"entries": [{"data_id": "a"}]}, 422, "ground_truth"),
        ("/compute_gt_reward", {"extra_info": {"messages": []}}, 422, "data_id is required"),
        ("/compute_gt_reward", {"data_id": "q1"}, 422, "send either record"),
        (
            "/compute_gt_reward",
            {"data_id": "q1", "extra_info": {"messages": ["a", "b", "c", "d"]}},
            422,
            "got 4",
        ),
        (
            "/compute_gt_reward",
            {"data_id": "q1", "record": {"plan": "p", "decision": "no", "score": 1}},
            422,
            "record.score",
        ),
        (
            "/compute_gt_reward",
            {"data_id": "q1", "extra_info": {"question": 3, "messages": ["a", "b", "c"]}},
            422,
            "question must be a string",
        ),
    ],
)
def test_bad_input_is_4xx(
    shared_client: httpx.Client, path: str, payload: dict[str, Any], status: int, fragment: str
) -> None:
    code, _, message = error(shared_client.post(path, json=payload))
    assert code == status
    assert fragment in message
    headers = {"content-type": "application/json"}
    r = shared_client.post(path, content=b"{not json", headers=headers)
    assert error(r)[:2] == (400, "bad_json")


def test_token_and_judge_failure(tmp_path: Path) -> None:
    store, server = start(tmp_path, judge=LLMJudge(ScriptedChat([])), token="s3cret")
    with server as url, httpx.Client(base_url=url, timeout=10) as c:
        assert c.get("/health").status_code == 200  # health stays open
        r = c.post("/register_gts", json={"data_id": "q1", "ground_truth": "Paris"})
        assert error(r) == (401, "unauthorized", "missing or wrong bearer token")
        c.headers["Authorization"] = "Bearer s3cret"
        register(c, [{"data_id": "q1", "ground_truth": "Paris"}])
        code, kind, message = error(c.post("/compute_gt_reward", json=REFERENCE_REQUEST))
        assert (code, kind) == (502, "judge_failed")
        assert "script exhausted" in message
    store.close()


def test_custom_reward_fn_from_an_import_path(tmp_path: Path, feedback_module: Path) -> None:
    fn = load_reward_fn("feedback_mod:reward")
    store, server = start(
        tmp_path, reward_fn=fn, reward_config={"bonus": 2}, reward_fn_name="feedback_mod:reward"
    )
    with server as url, httpx.Client(base_url=url, timeout=10) as c:
        register(c, [{"data_id": "q1", "ground_truth": ["Paris", "paris"]}])
        body = c.post("/compute_gt_reward", json={**REFERENCE_REQUEST, "feedback": "up"}).json()
        assert body == {
            "score": 1.0,
            "judgement": "correct",
            "format_score": None,
            "decision_score": None,
            "is_answer1_correct": None,
            "is_answer2_correct": None,
            "data_source": "2wiki",
            "data_id": "q1",
            "extras": {
                "judgement": "correct",
                "golds": ["Paris", "paris"],
                "answer": "Paris",
                "question": "What is the capital of France?",
                "config": {"bonus": 2},
            },
        }
        body = c.post("/compute_gt_reward", json=REFERENCE_REQUEST).json()
        assert (body["score"], body["judgement"]) == (-1.0, "incorrect")
        assert c.get("/health").json()["reward_fn"] == "feedback_mod:reward"
    store.close()

    store, server = start(tmp_path, reward_fn=load_reward_fn("feedback_mod:bare"))
    with server as url, httpx.Client(base_url=url, timeout=10) as c:
        body = c.post("/compute_gt_reward", json=REFERENCE_REQUEST).json()
        assert (body["score"], body["extras"], body["judgement"]) == (0.25, {}, None)
    store.close()

    bad = load_reward_fn("feedback_mod:bad")
    store, server = start(tmp_path, reward_fn=bad, reward_fn_name="feedback_mod:bad")
    with server as url, httpx.Client(base_url=url, timeout=10) as c:
        code, kind, message = error(c.post("/compute_gt_reward", json=REFERENCE_REQUEST))
        assert (code, kind) == (500, "reward_fn_error")
        assert message == (
            "feedback_mod:bad: reward function returned a non-numeric or non-finite score: 'high'"
        )
    store.close()


def test_load_reward_fn_errors(feedback_module: Path) -> None:
    with pytest.raises(MiaError, match="must be 'package.module:function'"):
        load_reward_fn("feedback_mod.reward")
    with pytest.raises(MiaError, match="cannot import no_such_mod"):
        load_reward_fn("no_such_mod:fn")
    with pytest.raises(MiaError, match="has no attribute 'missing'"):
        load_reward_fn("feedback_mod:missing")
    assert load_reward_fn(DEFAULT_REWARD_FN) is planner_gt_reward
    assert RewardContext.__dataclass_fields__.keys() >= {"record", "ground_truths", "request"}


def test_concurrent_registration(client: httpx.Client) -> None:
    url = str(client.base_url)

    def worker(k: int) -> None:
        with httpx.Client(base_url=url, timeout=10) as c:
            for i in range(5):
                entries = [{"data_id": f"w{k}-{i}-{j}", "ground_truth": str(j)} for j in range(4)]
                assert c.post("/register_gts", json={"entries": entries}).status_code == 200

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert client.get("/health").json()["registered_gts"] == 6 * 5 * 4


# --------------------------------------------------------------------------------------------
# The real CLI process
# --------------------------------------------------------------------------------------------
def cli_env(tmp_path: Path, plugins: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(plugins), str(REPO), env.get("PYTHONPATH", "")])
    env["MIA_HOME"] = str(tmp_path / "home")
    return env


def launch(tmp_path: Path, env: dict[str, str], *args: str) -> tuple[subprocess.Popen, str]:
    port_file = tmp_path / "port"
    port_file.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "ttrl_streaming.reward_server", "--port", "0"]
    proc = subprocess.Popen(
        [*cmd, "--port-file", str(port_file), *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    port = wait_for_port_file(port_file, timeout=60, proc=proc)
    return proc, f"http://127.0.0.1:{port}"


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    proc.wait(timeout=20)


def test_cli_persists_ground_truths_across_restart(tmp_path: Path, feedback_module: Path) -> None:
    env = cli_env(tmp_path, feedback_module)
    db = str(tmp_path / "gts.sqlite")
    args = ["--db", db, "--reward-fn", "feedback_mod:reward", "--reward-config", "planner"]
    proc, url = launch(tmp_path, env, *args, "--token", "t0k")
    try:
        auth = {"Authorization": "Bearer t0k"}
        with httpx.Client(base_url=url, timeout=10, headers=auth) as c:
            register(c, [{"data_id": "q1", "ground_truth": ["Paris", "City of Light"]}])
            register(c, [{"data_id": "q2", "ground_truth": "Orwell"}])
            body = c.post("/compute_gt_reward", json={**REFERENCE_REQUEST, "feedback": "up"})
            assert body.json()["score"] == 1.0
            assert body.json()["extras"]["config"] == {
                "acc_final_weight": 0.7,
                "acc_first_weight": 0.2,
                "format_weight": 0.05,
                "decision_weight": 0.05,
                "evidence_weight": 0.0,
            }
    finally:
        stop(proc)

    proc, url = launch(tmp_path, env, "--db", db)  # default reward: the Planner reward
    try:
        with httpx.Client(base_url=url, timeout=10) as c:
            health = c.get("/health").json()
            assert (health["registered_gts"], health["reward_fn"]) == (2, DEFAULT_REWARD_FN)
            body = c.post("/compute_gt_reward", json=REFERENCE_REQUEST).json()
            assert body["score"] == pytest.approx(0.8)
            assert body["extras"]["label_final"] == "correct"
    finally:
        stop(proc)


def test_cli_bad_reward_fn_exits_2_with_one_line(tmp_path: Path, feedback_module: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "ttrl_streaming.reward_server", "--reward-fn", "no_such_mod:fn"],
        cwd=REPO,
        env=cli_env(tmp_path, feedback_module),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert sole_error_line(proc).startswith(
        "reward_server: error: reward function no_such_mod:fn: cannot import no_such_mod"
    )


def test_cli_config_errors(tmp_path: Path) -> None:
    bad_cfg = tmp_path / "bad.yaml"
    bad_cfg.write_text(json.dumps({"acc_weigth": 1}))
    with pytest.raises(MiaError, match=r"^judge config not found: nope"):
        reward_server.main(["--judge", "nope"])
    with pytest.raises(
        MiaError,
        match=r"^reward config \(PlannerRewardConfig\): unknown key\(s\) \['acc_weigth'\]",
    ):
        reward_server.main(["--reward-config", str(bad_cfg)])
    with pytest.raises(MiaError, match=r"^reward config not found: nogtx"):
        reward_server.main(["--reward-config", "nogtx"])
