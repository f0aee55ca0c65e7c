"""``mia eval`` end to end: a tiny random Qwen2 (local backend) behind REAL services —
local_search over a tiny world's BM25 index, serve, memory_serve (LLM mode and identity mode)
— on real uvicorn servers; every policy, batched determinism, kill-and-resume without
duplicate memory writes, and bad inputs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from mia.eval import Endpoints, load_eval_config, run_eval
from mia.eval.journal import read_jsonl
from mia.eval.report import format_table, summarize
from mia.http import ServerThread

ROOT = Path(__file__).resolve().parents[1]
N_TEXT = 4  # questions per policy run (kept small: CI time)


def llm_yaml(path: Path, model: Path) -> Path:
    # max_batch_size 1: every request decodes alone, so an LLM reply never depends on what
    # else was in flight (the harness's batched-order guarantee is what the tests check).
    path.write_text(
        "common:\n"
        "  backend: local\n"
        f"  model_path: {model}\n"
        "  max_batch_size: 1\n"
        "  sampling: {temperature: 0.0, top_p: 1.0, max_tokens: 24, presence_penalty: 2.0}\n"
        "roles:\n  manager: {}\n  planner: {}\n  executor: {}\n  judge: {}\n"
    )
    return path


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    from local_search import build_index, open_index
    from local_search.server import create_search_app
    from memory_serve.app import build_app
    from memory_serve.config import load_config
    from memory_serve.llms import build_roles
    from memory_serve.service import MemoryService
    from memory_serve.store import MemoryStore
    from mia.agent import build_tools, load_agent_config
    from mia.data.formats import load_qa
    from mia.data.world import World
    from mia.embedding import shared_embedder
    from mia.llm.config import build_backend, role_configs
    from mia.models.tiny import build_tokenizer, save_tiny, tiny_qwen2
    from serve import ExecutorService, create_serve_app

    root = tmp_path_factory.mktemp("eval")
    World.generate(seed=0, size="small").write(root / "world")
    build_index(root / "world" / "corpus.jsonl", root / "idx", "bm25")
    tok = build_tokenizer()
    save_tiny(tiny_qwen2(tok), tok, root / "model")
    cfg_path = llm_yaml(root / "llm.yaml", root / "model")

    items = load_qa(root / "world" / "test.jsonl")
    text = [it for it in items if it.modality == "text-only"]
    image = [it for it in items if it.modality == "text-image"]
    data = root / "data.jsonl"
    # Four text questions, and an image question the text-only model must fail on (row 4).
    rows = [json.loads(line) for line in (root / "world" / "test.jsonl").read_text().splitlines()]
    by_id = {r["id"]: r for r in rows}
    chosen = [by_id[it.id] for it in text[:N_TEXT]] + [by_id[image[0].id]]
    data.write_text("".join(json.dumps(r) + "\n" for r in chosen))

    from omegaconf import OmegaConf

    retriever = open_index(root / "idx")
    servers = [ServerThread(create_search_app(retriever))]
    search_url = servers[0].start()
    agent = load_agent_config(
        None,
        [
            "max_turns=3",
            f"tools.search.params.url={search_url}",
            f"tools.web_image_to_image_search.params.cache_roots=[{root / 'world' / 'image_cache'}]",
        ],
    )
    roles = role_configs(OmegaConf.load(cfg_path))
    executor = ExecutorService(
        build_backend(roles["executor"], name="executor"), build_tools(agent.tools), agent
    )
    serve_url = _start(servers, create_serve_app(executor))

    mcfg = load_config(None, [f"llm.config={cfg_path}"])
    store = MemoryStore(root / "memory.sqlite", shared_embedder(), mcfg.store)
    manager, planner = build_roles(mcfg.llm)
    memory_url = _start(servers, build_app(MemoryService(mcfg, store, manager, planner)))

    icfg = load_config(None, ["compress.mode=identity", "llm.enabled=false"])
    istore = MemoryStore(root / "identity.sqlite", shared_embedder(), icfg.store)
    identity_url = _start(servers, build_app(MemoryService(icfg, istore, None, None)))
    yield {
        "root": root,
        "data": data,
        "ids": [r["id"] for r in chosen],
        "search": search_url,
        "serve": serve_url,
        "memory": memory_url,
        "identity": identity_url,
        "store": store,
        "istore": istore,
    }
    for s in reversed(servers):
        s.stop()
    store.close()
    istore.close()
    retriever.close()


def _start(servers: list[ServerThread], app: Any) -> str:
    server = ServerThread(app)
    servers.append(server)
    return server.start()


def cfg_for(stack: dict[str, Any], *over: str) -> Any:
    return load_eval_config(None, [f"dataset={stack['data']}", "plot=false", *over])


def endpoints(stack: dict[str, Any]) -> Endpoints:
    return Endpoints(
        serve=stack["serve"],
        memory=stack["memory"],
        memory_by_policy={"rag": stack["identity"]},
    )


def memory_count(url: str) -> int:
    return int(httpx.get(f"{url}/stats", trust_env=False).json()["memories"])


# ----------------------------------------------------------------------------- policies


def test_policy_none_runs_the_executor_alone(stack: dict[str, Any], tmp_path: Path) -> None:
    cfg = cfg_for(stack, "policies=[none]", "workers=2")
    result = run_eval(cfg, endpoints(stack), tmp_path, progress=False)
    rows = result.policies[0].rows
    assert [r["id"] for r in rows] == stack["ids"]
    text, image = rows[:N_TEXT], rows[N_TEXT]
    for r in text:
        assert r["error"] is None
        assert r["policy"] == "none"
        assert r["plan"] is None and r["need_replan"] is None and r["replanned"] is False
        assert r["used_memory_ids"] == [] and r["memory"] == "none"
        assert r["judgement"]["judge"] == "rules:contains"
        assert r["correct"] == (r["judgement"]["label"] == "correct")
        assert 1 <= r["turns"] <= 3
        assert r["tokens"]["total"] == r["tokens"]["prompt"] + r["tokens"]["completion"] > 0
        assert r["messages"][0]["role"] == "system"
        assert r["trace"].startswith(f"### Question: {r['question']}")
        # The guide block is absent without a plan.
        assert "Here is a guide for your reference" not in r["messages"][1]["content"]
    # The text-only model cannot take the image question: a failed row, counted as incorrect.
    assert image["modality"] == "text-image"
    assert image["prediction"] == "[Failed]" and image["correct"] is False
    assert image["error"].startswith("serve /execute: HTTP 502")
    s = result.policies[0].summary
    assert (s["questions"], s["answered"], s["errors"]) == (5, 4, 1)
    assert s["memories_written"] == 0 and s["replan_rate"] is None
    assert result.summary_path.is_file() and result.plot_path is None
    summary = json.loads(result.summary_path.read_text())
    assert summary["policies"][0]["policy"] == "none"
    assert result.table.splitlines()[0].split()[:3] == ["policy", "n", "acc"]


def _check_reflection(r: dict[str, Any]) -> None:
    """The random tiny planner rarely says yes or no: its reflection is then skipped (memory_serve
    answered 502 llm_empty), recorded in planner_errors, and the first answer stands."""
    if r["need_replan"] is None:
        assert r["planner_errors"] and not r["replanned"]
        assert all("HTTP 502 llm_empty" in e for e in r["planner_errors"]), r["planner_errors"]
    else:
        assert r["need_replan"] in (True, False)
    assert r["replanned"] == bool(r["need_replan"] and (r["replan"] or "").strip())


def test_policy_mia_plans_reflects_and_writes_memory(stack: dict[str, Any], tmp_path: Path) -> None:
    cfg = cfg_for(stack, "policies=[mia]", "workers=1", "limit=4")
    result = run_eval(cfg, endpoints(stack), tmp_path, progress=False)
    rows = result.policies[0].rows
    assert len(rows) == 4 and all(r["error"] is None for r in rows)
    receipts = read_jsonl(tmp_path / "mia" / "memory_writes.jsonl")
    assert [r["id"] for r in receipts] == [r["id"] for r in rows]  # one write per question
    assert all(r["via"] == "write" for r in receipts)
    assert memory_count(stack["memory"]) == 4
    # Online order with one worker: question k saw the memories of questions 0..k-1.
    assert rows[0]["used_memory_ids"] == [] and rows[0]["planner"] == "manager"
    for k, r in enumerate(rows):
        assert sorted(q for q in r["used_memory_from"]) == sorted(r["used_memory_from"])
        assert set(r["used_memory_from"]) <= {x["id"] for x in rows[:k]}
        assert isinstance(r["plan"], str)
        _check_reflection(r)
        assert r["messages"][1]["content"].count("Here is a guide for your reference") == (
            1 if r["plan"].strip() else 0
        )
    assert rows[1]["used_memory_from"] == [rows[0]["id"]]
    # The memory holds each question once, with this run's source tag.
    found = httpx.post(
        f"{stack['memory']}/memories/find",
        json={"data_ids": [r["id"] for r in rows], "source": f"eval:{_run_id(tmp_path / 'mia')}"},
        trust_env=False,
    ).json()["memories"]
    assert sorted(m["data_id"] for m in found) == sorted(r["id"] for r in rows)
    assert {m["judgement"] for m in found} <= {"correct", "incorrect"}
    s = result.policies[0].summary
    assert s["memories_written"] == 4
    assert s["reflected"] == sum(r["need_replan"] is not None for r in rows)


def test_parallel_policies_run_their_lanes_at_the_same_time(
    stack: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``parallel_policies``: none, plan_only and mia (three lanes) are in flight together; the
    memory policy still sees only its own writes, and the results keep the configured order."""
    import asyncio

    from mia.eval import harness

    events: list[tuple[str, str]] = []
    real = harness.run_policy

    async def recorded(items: Any, policy: str, *args: Any, **kwargs: Any) -> Any:
        events.append(("start", policy))
        await asyncio.sleep(0.2)  # every lane starts before the fastest can finish
        try:
            return await real(items, policy, *args, **kwargs)
        finally:
            events.append(("end", policy))

    monkeypatch.setattr(harness, "run_policy", recorded)
    cfg = cfg_for(stack, "policies=[none,plan_only,mia]", "workers=1", "limit=3",
                  "parallel_policies=true")  # fmt: skip
    result = run_eval(cfg, endpoints(stack), tmp_path, progress=False)
    assert [kind for kind, _ in events[:3]] == ["start"] * 3
    assert [r.policy for r in result.policies] == ["none", "plan_only", "mia"]
    by = {r.policy: r for r in result.policies}
    assert all(row["error"] is None for r in result.policies for row in r.rows)
    assert by["mia"].summary["memories_written"] == 3 and memory_count(stack["memory"]) == 3
    mia_ids = {row["id"] for row in by["mia"].rows}
    assert all(set(row["used_memory_from"]) <= mia_ids for row in by["mia"].rows)
    assert all(row["used_memory_ids"] == [] for row in by["plan_only"].rows)


def test_policy_plan_only_uses_no_memory(stack: dict[str, Any], tmp_path: Path) -> None:
    before = memory_count(stack["memory"])
    cfg = cfg_for(stack, "policies=[plan_only]", "workers=2", "limit=2")
    rows = run_eval(cfg, endpoints(stack), tmp_path, progress=False).policies[0].rows
    assert len(rows) == 2
    for r in rows:
        assert r["error"] is None and r["used_memory_ids"] == [] and r["memory"] == "none"
        assert isinstance(r["plan"], str)
        _check_reflection(r)
    assert memory_count(stack["memory"]) == before  # nothing written, nothing cleared
    assert not (tmp_path / "plan_only" / "memory_writes.jsonl").read_text()


def test_policy_rag_gives_raw_traces_as_the_guide(stack: dict[str, Any], tmp_path: Path) -> None:
    cfg = cfg_for(stack, "policies=[rag]", "workers=1", "limit=3")
    rows = run_eval(cfg, endpoints(stack), tmp_path, progress=False).policies[0].rows
    assert [r["error"] for r in rows] == [None] * 3
    first, second = rows[0], rows[1]
    assert first["context"] == "" and first["used_memory_ids"] == []
    assert "Here is a guide for your reference" not in first["messages"][1]["content"]
    assert second["used_memory_from"] == [first["id"]]
    assert second["context"].startswith("# Retrieved Relevant Memories")
    # The stored memory is the raw trace (identity compression), shown to the Executor.
    assert first["trace"] in second["context"]
    assert second["context"] in second["messages"][1]["content"]
    assert second["plan"] is None and second["need_replan"] is None
    assert memory_count(stack["identity"]) == 3


def test_rag_refuses_a_compressing_memory_service(stack: dict[str, Any], tmp_path: Path) -> None:
    from mia.errors import MiaError

    cfg = cfg_for(stack, "policies=[rag]", "limit=1")
    wrong = Endpoints(serve=stack["serve"], memory=stack["memory"])
    with pytest.raises(MiaError, match="needs memory_serve with compress.mode=identity"):
        run_eval(cfg, wrong, tmp_path, progress=False)
    assert not (tmp_path / "rag" / "results.jsonl").exists()


ALL_POLICIES = [
    "none",
    "rag",
    "plan_only",
    "mem0",
    "amem",
    "expel",
    "memento",
    "reasoningbank",
    "mia",
]
BASELINES = ["mem0", "amem", "expel", "memento", "reasoningbank"]


def test_every_policy_including_the_memory_baselines(stack: dict[str, Any], tmp_path: Path) -> None:
    """All nine policies on one tiny world, the baselines on the same local LLM as the services
    (its random replies are junk JSON: counted, never fatal); one comparison table."""
    cfg = cfg_for(
        stack,
        f"policies=[{','.join(ALL_POLICIES)}]",
        "workers=1",
        "limit=2",
        f"baselines.llm.config={stack['root'] / 'llm.yaml'}",
        "baselines.llm.max_tokens=24",
    )
    result = run_eval(cfg, endpoints(stack), tmp_path, progress=False)
    assert [r.policy for r in result.policies] == ALL_POLICIES
    table_rows = [line.split()[0] for line in result.table.splitlines()[1:] if line.strip()]
    assert [p for p in table_rows if p in ALL_POLICIES] == ALL_POLICIES
    by = {r.policy: r for r in result.policies}
    for name in BASELINES:
        r = by[name]
        assert [row["error"] for row in r.rows] == [None, None], name
        assert r.summary["memories_written"] == 2 and r.summary["memory_write_errors"] == 0
        stats = r.summary["baseline"]
        assert stats["baseline"] == name and stats["writes"] == 2
        receipts = read_jsonl(tmp_path / name / "memory_writes.jsonl")
        assert [x["via"] for x in receipts] == ["write", "write"] and "ops" in receipts[0]
        assert (tmp_path / name / "baseline.sqlite").is_file()
        first, second = r.rows
        assert first["used_memory_ids"] == []  # empty memory: nothing retrieved
        if name in ("expel", "memento"):  # a Planner over the planner role wrote the plan
            assert first["planner"] == name and isinstance(first["plan"], str)
            assert first["need_replan"] in (True, False)
        else:  # the context is the guide; the first question had none
            assert first["plan"] is None and first["context"] == ""
    # amem and memento store something whatever the LLM says: the second question saw it.
    for name in ("amem", "memento"):
        rows = by[name].rows
        assert rows[1]["used_memory_from"] == [rows[0]["id"]], name
    # memento's write needs no LLM: the second question saw the first one's case, as a plan.
    second = by["memento"].rows[1]
    assert "## Correct plans from similar past questions" in second["context"]
    # The random LLM's replies are junk JSON for the LLM-written baselines: counted as no-ops.
    assert by["mem0"].summary["baseline"]["llm_junk"] >= 1
    summary = json.loads(result.summary_path.read_text())
    assert [p["policy"] for p in summary["policies"]] == ALL_POLICIES

    # Rerunning resumes: nothing is asked or written twice.
    again = run_eval(
        cfg_for(
            stack,
            "policies=[memento]",
            "limit=2",
            f"baselines.llm.config={stack['root'] / 'llm.yaml'}",
        ),
        endpoints(stack),
        tmp_path,
        progress=False,
    )
    assert again.policies[0].summary["baseline"]["writes"] == 2


# ----------------------------------------------------------------------------- batched order


def _comparable(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [
        (
            r["id"],
            r["plan"],
            r["prediction"],
            r["judgement"]["label"],
            r["need_replan"],
            r["replan"],
            r["used_memory_from"],
            r["batch"],
        )
        for r in rows
    ]


def test_batched_order_does_not_depend_on_workers(stack: dict[str, Any], tmp_path: Path) -> None:
    runs = []
    for workers in (1, 3):
        cfg = cfg_for(
            stack,
            "policies=[mia]",
            "order=batched",
            "batch_size=2",
            f"workers={workers}",
            "limit=4",
        )
        out = tmp_path / f"w{workers}"
        runs.append(run_eval(cfg, endpoints(stack), out, progress=False).policies[0].rows)
    one, three = runs
    assert _comparable(one) == _comparable(three)
    # Frozen memory: batch 0 saw nothing, batch 1 saw exactly batch 0's memories.
    assert [r["batch"] for r in one] == [0, 0, 1, 1]
    assert one[0]["used_memory_ids"] == [] and one[1]["used_memory_ids"] == []
    for r in one[2:]:
        assert set(r["used_memory_from"]) <= {one[0]["id"], one[1]["id"]}
        assert r["used_memory_from"]  # retrieval found batch 0's memories


# ----------------------------------------------------------------------------- resume


def _run_id(run_dir: Path) -> str:
    return json.loads((run_dir / "run.json").read_text())["run_id"]


def _eval_cmd(stack: dict[str, Any], out: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "mia.cli",
        "eval",
        "--data",
        str(stack["data"]),
        "--policy",
        "mia",
        "--limit",
        "4",
        "--memory-url",
        stack["memory"],
        "--serve-url",
        stack["serve"],
        "--out",
        str(out),
        "--no-progress",
        "plot=false",
        *extra,
    ]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "MIA_EVAL_FAULT"}
    env.update(extra)
    return env


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["after_row:2", "after_write:2"])
def test_crash_windows_resume_without_duplicate_writes(
    stack: dict[str, Any], tmp_path: Path, fault: str
) -> None:
    """Kill the real process right after a row is journaled (memory not written yet) or right
    after a memory write (receipt not journaled yet): the resumed run writes each memory once."""
    cmd = _eval_cmd(stack, tmp_path, "workers=1")
    killed = subprocess.run(cmd, env=_env(MIA_EVAL_FAULT=fault), capture_output=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr.decode()[-2000:]
    rows = read_jsonl(tmp_path / "mia" / "results.jsonl")
    receipts = read_jsonl(tmp_path / "mia" / "memory_writes.jsonl")
    assert len(rows) == 2 and len(receipts) == 1  # the second question is in the crash window
    in_memory = memory_count(stack["memory"])
    assert in_memory == (1 if fault.startswith("after_row") else 2)

    resumed = subprocess.run(cmd, env=_env(), capture_output=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr.decode()[-2000:]
    assert b"resuming" in resumed.stderr and b"2/4 questions already answered" in resumed.stderr
    rows = read_jsonl(tmp_path / "mia" / "results.jsonl")
    receipts = read_jsonl(tmp_path / "mia" / "memory_writes.jsonl")
    assert [r["id"] for r in rows] == stack["ids"][:4]  # no question ran twice
    assert [r["id"] for r in receipts] == stack["ids"][:4]
    assert receipts[1]["via"] == ("write" if fault.startswith("after_row") else "found")
    assert memory_count(stack["memory"]) == 4 == len(rows)


@pytest.mark.slow
def test_killed_mid_run_resumes(stack: dict[str, Any], tmp_path: Path) -> None:
    """SIGKILL at an arbitrary moment (the first row is on disk), then resume."""
    cmd = _eval_cmd(stack, tmp_path, "workers=2")
    proc = subprocess.Popen(cmd, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    results = tmp_path / "mia" / "results.jsonl"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        if results.exists() and results.read_text().count("\n") >= 1:
            break
        time.sleep(0.02)
    assert proc.poll() is None, "the run ended before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert len(read_jsonl(results)) < 4  # killed mid-run
    resumed = subprocess.run(cmd, env=_env(), capture_output=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr.decode()[-2000:]
    rows = read_jsonl(results)
    assert sorted(r["id"] for r in rows) == sorted(stack["ids"][:4])
    assert len({r["id"] for r in rows}) == len(rows)
    assert memory_count(stack["memory"]) == len(rows) == 4
    assert "policy" in resumed.stdout.decode()  # the summary table was printed


def test_torn_last_line_is_dropped(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text('{"id": "a"}\n{"id": "b"}\n{"id": "c", "pred')
    assert read_jsonl(path, repair=True) == [{"id": "a"}, {"id": "b"}]
    assert path.read_text() == '{"id": "a"}\n{"id": "b"}\n'
    path.write_text('{"id": "a"}\nnot json\n{"id": "b"}\n')
    from mia.errors import MiaError

    with pytest.raises(MiaError, match="line 2 is not valid JSON"):
        read_jsonl(path)


def test_summary_numbers() -> None:
    rows = [
        {"id": "a", "correct": True, "error": None, "tool_call_count": 2, "turns": 3,
         "tokens": {"total": 100}, "need_replan": True, "replanned": True, "messages": [],
         "judgement": {"label": "correct", "detail": {"em": 1.0, "f1": 1.0}}},
        {"id": "b", "correct": False, "error": None, "tool_call_count": 0, "turns": 1,
         "tokens": {"total": 50}, "need_replan": False, "replanned": False,
         "messages": [{"role": "assistant", "content": "<answer>x</answer>"}],
         "judgement": {"label": "incorrect", "detail": {"em": 0.0, "f1": 0.5}}},
        {"id": "c", "correct": False, "error": "boom", "judgement": {"label": "incorrect"}},
    ]  # fmt: skip
    s = summarize(rows, "mia", judge="rules:contains")
    assert s["accuracy"] == pytest.approx(1 / 3) and s["accuracy_answered"] == 0.5
    assert (s["em"], s["f1"]) == (0.5, 0.75)
    assert (s["tool_calls_per_question"], s["turns_per_question"]) == (1.0, 2.0)
    assert s["tokens_per_question"] == 75.0 and s["replan_rate"] == 0.5
    assert s["answer_tag_rate"] == 0.5 and s["errors"] == 1
    assert s["labels"] == {"correct": 1, "incorrect": 2}
    s.update(memories_written=2, wall_s=3.0)
    table = format_table([s]).splitlines()
    assert table[0].split() == [
        "policy", "n", "acc", "EM", "F1", "tools/q", "turns/q", "tokens/q", "replan",
        "memories", "errors", "time", "s",
    ]  # fmt: skip
    assert table[2].split() == [
        "mia", "3", "0.333", "0.500", "0.750", "1.00", "2.00", "75", "0.50", "2", "1", "3",
    ]  # fmt: skip


# ----------------------------------------------------------------------------- bad inputs


def _mia_eval(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mia.cli", "eval", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(),
    )


def test_missing_dataset_exits_2_with_one_line(tmp_path: Path) -> None:
    r = _mia_eval("--data", str(tmp_path / "nope.jsonl"), "--serve-url", "http://127.0.0.1:9")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        f"mia eval: error: dataset not found: {tmp_path / 'nope.jsonl'}"
    ]


def test_unreachable_service_exits_2_with_one_line(stack: dict[str, Any], tmp_path: Path) -> None:
    out = tmp_path / "out"
    r = _mia_eval("--data", str(stack["data"]), "--policy", "none", "--serve-url",
                  "http://127.0.0.1:9", "--out", str(out), "--no-progress")  # fmt: skip
    assert r.returncode == 2
    lines = [ln for ln in r.stderr.strip().splitlines() if not ln.startswith("mia eval: 5 ")]
    assert len(lines) == 1
    assert lines[0].startswith("mia eval: error: serve at http://127.0.0.1:9 is unreachable")
    assert not (out / "none").exists()  # nothing written for a run that could not start


def test_no_service_given_exits_2(stack: dict[str, Any]) -> None:
    r = _mia_eval("--data", str(stack["data"]))
    assert r.returncode == 2
    assert r.stderr.strip() == (
        "mia eval: error: pass --serve-url (and --memory-url) of running services, "
        "or --start-services"
    )


def test_unknown_policy_exits_2(stack: dict[str, Any]) -> None:
    r = _mia_eval("--data", str(stack["data"]), "--policy", "mia,magic", "--serve-url", "http://x")
    assert r.returncode == 2
    assert r.stderr.strip() == (
        "mia eval: error: eval config: unknown policy 'magic' "
        "(known: ('none', 'plan_only', 'mia', 'rag', 'feedback', 'mem0', 'amem', 'expel', "
        "'memento', 'reasoningbank'))"
    )


# ----------------------------------------------------------------------------- --start-services


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purpose
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


GROUP_SCRIPT = """
import sys, time
from pathlib import Path
from mia.eval.supervisor import ServiceGroup, ServiceSpec
work = Path(sys.argv[1])
with ServiceGroup(work, startup_timeout_s=120) as group:
    group.start([ServiceSpec("local_search", "local_search", ["serve", "--index", sys.argv[2]])])
    group.write_manifest(work / "services.json")
    time.sleep(300)
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_service_group_stops_its_services(tmp_path: Path, sig: int) -> None:
    """SIGTERM to the parent: the group stops its services and exits 'interrupted'. SIGKILL
    (no cleanup possible): the kernel terminates them (PR_SET_PDEATHSIG)."""
    from local_search import build_index

    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"id": "0", "contents": "Tokyo\\nTokyo is the capital of Japan."}\n')
    build_index(corpus, tmp_path / "idx", "bm25")
    parent = subprocess.Popen(
        [sys.executable, "-c", GROUP_SCRIPT, str(tmp_path / "w"), str(tmp_path / "idx")],
        env=_env(),
        stderr=subprocess.PIPE,
    )
    manifest = tmp_path / "w" / "services.json"
    deadline = time.monotonic() + 120
    while not manifest.exists() and parent.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert parent.poll() is None, parent.communicate()[1].decode()[-2000:]
    info = json.loads(manifest.read_text())["local_search"]
    assert httpx.get(f"{info['url']}/health", trust_env=False).json()["status"] == "ok"
    parent.send_signal(sig)
    _, stderr = parent.communicate(timeout=60)
    if sig == signal.SIGTERM:
        assert b"KeyboardInterrupt: signal 15" in stderr
    else:
        assert parent.returncode == -signal.SIGKILL
    deadline = time.monotonic() + 30
    while _alive(info["pid"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(info["pid"])
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{info['url']}/health", trust_env=False, timeout=2)
