"""``mia demo`` end to end with a tiny model override: world + index built under $MIA_HOME,
real service subprocesses, the three policies and the TTRL pass, and no process or port left
behind — after a normal run and after Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from mia.models.tiny import build_tokenizer, save_tiny, tiny_qwen2

    out = tmp_path_factory.mktemp("tiny")
    tok = build_tokenizer()
    save_tiny(tiny_qwen2(tok), tok, out)
    return out


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("home")


def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "MIA_EVAL_FAULT"}
    env.update(MIA_HOME=str(home), HF_HUB_OFFLINE="1")
    return env


def _demo(model: Path, out: Path, questions: int, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "mia.cli",
        "demo",
        "--model",
        str(model),
        "--questions",
        str(questions),
        "--world-size",
        "small",
        "--workers",
        "2",
        "--out",
        str(out),
        "--no-progress",
        "agent.max_turns=2",
        # The tiny model answers in milliseconds: no 200 ms batching window per request.
        *(f"local_roles.{role}.batch_wait_ms=5" for role in ("executor", "planner", "manager")),
        "ttrl.batch_size=2",
        *extra,
    ]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purpose (its parent has not reaped it yet)
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def _listening(url: str) -> bool:
    host, port = url.removeprefix("http://").split(":")
    with socket.socket() as s:
        s.settimeout(1.0)
        return s.connect_ex((host, int(port))) == 0


def _assert_stopped(services_json: Path) -> None:
    services = json.loads(services_json.read_text())
    assert set(services) == {"local_search", "serve", "memory_serve_llm", "memory_serve_ttrl"}
    for name, info in services.items():
        assert not _alive(info["pid"]), f"{name} (pid {info['pid']}) is still running"
        assert info["url"].startswith("http://127.0.0.1:")
        assert not _listening(info["url"]), f"{name} still listens on {info['url']}"


@pytest.mark.slow
def test_demo_runs_end_to_end_and_cleans_up(tiny_model: Path, home: Path, tmp_path: Path) -> None:
    out = tmp_path / "demo"
    r = subprocess.run(
        _demo(tiny_model, out, 2), env=_env(home), capture_output=True, text=True, timeout=600
    )
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.splitlines()
    assert lines[0] == f"mia demo: none, plan_only, mia, ttrl on 2 questions -> {out}"
    for step in ("[1/6]", "[2/6]", "[3/6]", "[4/6]", "[5/6]", "[6/6]"):
        assert any(line.startswith(step) for line in lines), step
    header = next(i for i, line in enumerate(lines) if line.startswith("policy "))
    assert lines[header].split()[:3] == ["policy", "n", "acc"]
    table = [line.split()[:2] for line in lines[header + 1 : header + 5]]
    assert table == [["none", "2"], ["plan_only", "2"], ["mia", "2"], ["ttrl", "2"]]
    assert any(line.startswith("done in ") for line in lines)
    # The Manager is a local model: memories are rule summaries (memory_compress=auto), in the
    # policies' store and the TTRL pass's alike.
    assert "  memory compression: rules (memory_compress=auto)" in lines
    assert "  cold-start plans by the Manager: off (cold_start=auto)" in lines
    for store in ("memory_serve_llm", "memory_serve_ttrl"):
        log = (out / "services" / "logs" / f"{store}.log").read_text()
        assert "compress=rules" in log and "compress=llm" not in log, store
        # ... retrieved by question template (memory_retrieval's default)
        assert "embedder all-MiniLM-L6-v2+template" in log, store
    # The tiny model is not the embedded one: no warm start, no SmolLM2 note.
    assert not any("SmolLM2" in line or "warm-started" in line for line in lines)
    summary = json.loads((out / "summary.json").read_text())
    assert [p["policy"] for p in summary["policies"]] == ["none", "plan_only", "mia"]
    assert [p["questions"] for p in summary["policies"]] == [2, 2, 2]
    # The TTRL pass: one batch of the same 2 questions, its curve and its row. It plans where
    # mia does (plan_without_failure: false): its memory starts empty, so the Executor answers
    # both alone, one rollout each (tests/test_ttrl.py follows a gated pass into its plans).
    ttrl_rows = [json.loads(x) for x in (out / "ttrl" / "accuracy.jsonl").read_text().splitlines()]
    assert [
        (r["batch"], r["questions"], r["rollouts"], r["planned_questions"]) for r in ttrl_rows
    ] == [(0, 2, 2, 0)]
    assert (out / "ttrl" / "accuracy.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    demo = json.loads((out / "demo.json").read_text())
    assert [s["policy"] for s in demo["summaries"]] == ["none", "plan_only", "mia", "ttrl"]
    # TTRL's answer per question: the majority of its n answers or, answer=greedy, its greedy
    # rollout's (nothing planned here: each question's one answer)
    assert demo["summaries"][-1]["accuracy"] == ttrl_rows[0]["accuracy_answer"]
    assert demo["summaries"][-1]["accuracy_vote"] == ttrl_rows[0]["accuracy_vote"]
    assert demo["summaries"][-1]["accuracy_rollouts"] == ttrl_rows[0]["accuracy"]
    # ... and says how much the Planner could learn: nothing planned, so no GRPO step.
    assert demo["summaries"][-1]["grpo"] == {
        "batches": 1, "steps": 0, "steps_without_update": 0, "groups": 0, "groups_tied": 0,
        "groups_all_wrong": 0, "groups_all_right": 0,
    }  # fmt: skip
    assert (
        "GRPO: 0 steps over 1 batch (a batch with no planned question takes none), 0 without "
        "an update (every group tied); 0 groups, 0 tied (equal rewards: no signal); 0 all "
        "wrong, 0 all right" in lines
    )
    comp = {r["policy"]: r for r in demo["comparison"]}
    assert list(comp) == ["none", "plan_only", "mia", "ttrl"] and comp["mia"]["n"] == 2
    for r in comp.values():  # intervals bracket the accuracy; paired differences vs none
        assert r["ci"][0] <= r["accuracy"] <= r["ci"][1]
        assert ("delta" in r) == (r["policy"] != "none")
    assert demo["world"] == {"seed": 20999, "size": "small"} and demo["warm_start"] == {}
    # The protocol's stream (conventions + standard, file order): its first 2 questions, both
    # standard, of two templates; per kind, with intervals clustered by template.
    assert demo["templates"] == {
        "w20999_test_00000": "person.birth_city>city.region",
        "w20999_test_00002": "person.death_year",
    }
    assert [(t["scope"], t["questions"], t["clusters"]) for t in demo["by_kind"]] == [
        ("standard", 2, 2)
    ]
    assert [r["row"] for r in demo["by_kind"][0]["rows"]] == ["none", "plan_only", "mia", "ttrl"]
    # Two questions of two templates: no failure can precede a question of its template.
    assert demo["memory_chances"] == {
        "policy": "mia", "templates": [], "needed": 2, "shown": False,
    }  # fmt: skip
    assert (
        "note: 2 questions cannot show memory at work (0 template(s) where a failure precedes "
        "a question of the same template, 2 needed); python bench/efficacy_bench.py "
        "--protocol configs/efficacy/dev.yaml measures it" in lines
    )
    assert sum(line.startswith("note: ") for line in lines) == 1
    assert "standard: 2 questions in 2 templates" in lines
    for policy in ("none", "plan_only", "mia"):
        rows = [json.loads(x) for x in (out / policy / "results.jsonl").read_text().splitlines()]
        assert [r_["modality"] for r_ in rows] == ["text-only", "text-only"]
        assert all(r_["error"] is None for r_ in rows)
    assert (out / "accuracy.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    _assert_stopped(out / "services" / "services.json")
    # World and index are cached under $MIA_HOME/demo and built atomically (no temp folders).
    demo_home = home / "demo"
    assert sorted(p.name for p in demo_home.iterdir()) == [
        "index-world-small-s20999-bm25",
        "world-small-s20999",
    ]


@pytest.mark.slow
def test_demo_ctrl_c_stops_every_service(tiny_model: Path, home: Path, tmp_path: Path) -> None:
    out = tmp_path / "demo"
    cached = (home / "demo" / "world-small-s20999" / "world.json").is_file()
    proc = subprocess.Popen(
        _demo(tiny_model, out, 12),
        env=_env(home),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # A suite started in the background of a non-interactive shell ignores SIGINT, and a
        # child inherits that (Python then installs no KeyboardInterrupt handler): give the
        # demo the default disposition, as a terminal would.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    services_json = out / "services" / "services.json"
    deadline = time.monotonic() + 300
    while not services_json.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert proc.poll() is None, proc.communicate()[1][-3000:]
    time.sleep(0.5)  # the evaluation has started
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr[-3000:]
    assert stderr.strip().splitlines()[-1] == "mia demo: interrupted"
    assert ("reusing" in stdout) == cached  # a cached world and index are reused
    _assert_stopped(services_json)


def test_demo_bad_model_folder_exits_2(tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "mia.cli", "demo", "--model", str(tmp_path / "none")],
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2
    assert r.stderr.strip() == f"mia demo: error: --model: not a folder: {tmp_path / 'none'}"


def test_demo_bad_ttrl_override_exits_2_before_anything_runs(tmp_path: Path) -> None:
    """The TTRL pass runs last; its composed config is checked at load, so a bad override is
    one line and exit 2 before the world, the models or the policies (nothing is written)."""
    out = tmp_path / "out"
    r = subprocess.run(
        [sys.executable, "-m", "mia.cli", "demo", "--out", str(out),
         'ttrl.overrides=["trainer.sampling.temperature=1.5"]'],
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip
    assert r.returncode == 2
    assert r.stderr.strip() == (
        "mia demo: error: demo config: ttrl (supervised): trainer: sampling.temperature=1.5 but "
        "policy.loss.temperature=1; set both to the same value (0 = greedy rollouts, any loss "
        "temperature)"
    )
    assert not out.exists()


def test_demo_config_composes_eval_and_cfg_prints_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The demo's evaluation keys are mia eval's schema under ``eval``, with the demo's values in
    configs/demo/default.yaml; a --config file without a defaults list builds on it; flags win;
    ``--cfg`` prints the composed config and exits."""
    import yaml

    from mia.apps.demo import main
    from mia.apps.demo_config import load_demo_config
    from mia.errors import MiaError
    from mia.eval.config import EvalConfig

    assert EvalConfig().memory.plan_without_failure  # the schema default ...
    shipped = load_demo_config(None, [])
    assert not shipped.eval.memory.plan_without_failure  # ... and the demo's value
    assert shipped.eval.limit == 8 and shipped.eval.modality == "text-only"
    assert (shipped.world.seed, shipped.stream.questions, shipped.stream.standard) == (
        20999, "protocol", 24,
    )  # fmt: skip
    legacy = load_demo_config("efficacy", [])  # the development bench keeps world 1's stream
    assert (legacy.world.seed, legacy.stream.questions, legacy.eval.limit) == (1, "file", 64)
    assert shipped.eval.judge.mode == "em"
    mine = tmp_path / "mine.yaml"
    mine.write_text("eval: {limit: 3}\n")
    main(["--config", str(mine), "--workers", "2", "--cfg", "ttrl.n=3"])
    cfg = yaml.safe_load(capsys.readouterr().out)
    assert (cfg["eval"]["limit"], cfg["eval"]["workers"], cfg["ttrl"]["n"]) == (3, 2, 3)
    assert cfg["eval"]["policies"] == ["none", "plan_only", "mia"]
    assert cfg["eval"]["memory"]["plan_without_failure"] is False
    with pytest.raises(MiaError, match=r"unknown key\(s\) \['questions'\]"):
        load_demo_config(None, ["questions=3"])
    with pytest.raises(MiaError, match="eval.dataset and eval.services.index are the world's"):
        load_demo_config(None, ["eval.dataset=x.jsonl"])


def test_memory_chances_count_templates_where_a_failure_comes_first() -> None:
    """A template gives memory a chance when a question the first memory-writing policy
    answered wrongly comes before another of its template (in the order asked)."""
    from mia.apps.demo_report import memory_chances
    from mia.data.formats import QAItem

    items = [QAItem(id=f"q{i}", question=f"q{i}", answers=["a"]) for i in range(6)]
    templates = {"q0": "a", "q1": "a", "q2": "b", "q3": "c", "q4": "b", "q5": "c"}
    mia = {"q0": 0.0, "q1": 1.0, "q2": 1.0, "q3": 0.0, "q4": 0.0, "q5": 1.0}
    got = memory_chances(items, templates, {"none": {}, "mia": mia}, ["none", "mia"])
    assert got == {"policy": "mia", "templates": ["a", "c"], "needed": 2, "shown": True}
    # b's failure (q4) comes after its other question: no chance there.
    got = memory_chances(items[:5], templates, {"mia": mia}, ["mia"])
    assert got == {"policy": "mia", "templates": ["a"], "needed": 2, "shown": False}
    # No policy writes memory: none.
    assert memory_chances(items, templates, {"none": mia}, ["none"])["policy"] is None
