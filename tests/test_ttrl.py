"""TTRL over a small stream with real services and a real tiny Planner (transformers generator):
kill (SIGKILL) mid-batch and resume without duplicate memory writes; the no-ground-truth modes
(majority vote, the review panel on a scripted LLM); and a learning check on the synthetic
world (slow)."""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import signal
import sqlite3
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from role_fixtures import (
    build_tiny_model,
    executor_service,
    memory_service,
    plan_of,
    question_of,
)

from mia.errors import MiaError
from mia.judge import PanelJudge
from mia.judge.vote import majority_vote
from mia.llm.scripted import ScriptedChat
from mia.rewards.planner import PlannerEpisodeRecord, planner_format
from mia.roles.journal import Journal
from ttrl.config import load_config
from ttrl.curve import format_curve
from ttrl.run import PERSIST_POINTS, run_ttrl, run_ttrl_pass

REPO = Path(__file__).resolve().parents[1]
QUESTIONS = {f"Who founded company number {i}?": f"Founder {i}" for i in range(6)}
NO_DEDUP = ("store.write.dedup_threshold=1.000001",)  # every write a row: duplicates would show


def _parity(text: str) -> int:
    return hashlib.md5(text.encode()).digest()[0] % 2


def executor_reply(messages) -> str:
    """Right or wrong depending on the (random) plan text: a deterministic mix."""
    q = question_of(messages)
    return f"<answer>{QUESTIONS[q] if _parity(plan_of(messages)) == 0 else 'Nobody'}</answer>"


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("planner") / "model")


def _data(path: Path, labelled: bool = True) -> Path:
    rows = [
        {"id": f"t{i}", "question": q, **({"answer": a} if labelled else {})}
        for i, (q, a) in enumerate(QUESTIONS.items())
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _overrides(model: Path, data: Path, run_dir: Path, serve: str, memory: str) -> list[str]:
    return [
        f"model_path={model}",
        f"data.test={data}",
        f"run_dir={run_dir}",
        f"services.executor_url={serve}",
        f"services.memory_url={memory}",
        "trainer.batch_size=2",
        "trainer.n=2",
        "trainer.logging.console=false",
        "trainer.log_rollouts=100",
        "trainer.policy.optim.lr=1e-3",
        "episode.plan_max_tokens=12",
        "episode.decision_max_tokens=6",
        "episode.replan_max_tokens=8",
    ]


# Crash injection: ``python -m ttrl ARGS`` with an ``on_persisted`` hook that SIGKILLs the process
# at BATCH:POINT (argv[1]; POINT one of ttrl.run.PERSIST_POINTS). ttrl has no crash switch of its
# own: the hook goes in through the CLI's ``run_ttrl``.
KILLED_TTRL = """
import functools, os, signal, sys

import ttrl.run

at, argv = sys.argv[1], sys.argv[2:]


def kill_at(batch, point):
    if f"{batch}:{point}" == at:
        print(f"crash injection: SIGKILL at {at}", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)


ttrl.run.run_ttrl = functools.partial(ttrl.run.run_ttrl, on_persisted=kill_at)
ttrl.run.main(argv)
"""


def run_killed_at(batch: int, point: str, args: list[str]) -> subprocess.CompletedProcess:
    """``python -m ttrl ARGS`` killed (SIGKILL) at ``point`` of ``batch``."""
    assert point in PERSIST_POINTS
    return subprocess.run(
        [sys.executable, "-c", KILLED_TTRL, f"{batch}:{point}", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


@contextmanager
def _stream(model: Path, tmp_path: Path, reply: Any) -> Iterator[tuple[list[str], Any, Any]]:
    """A labelled stream on a real memory_serve (no dedup) and a scripted Executor behind
    serve: yields (the ttrl overrides, the memory service, the Executor backend)."""
    data = _data(tmp_path / "test.jsonl")
    with (
        memory_service(tmp_path / "mem.sqlite", overrides=NO_DEDUP) as (memory_url, service),
        executor_service(reply) as (serve_url, backend),
    ):
        yield _overrides(model, data, tmp_path / "run", serve_url, memory_url), service, backend


def test_kill_and_resume_without_duplicate_memory_writes(model: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    with _stream(model, tmp_path, executor_reply) as (args, service, _):
        # A real SIGKILL right after batch 2's rollouts reached memory_serve's buffer.
        proc = run_killed_at(1, "after_bank_save", args)
        assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
        assert "crash injection: SIGKILL at 1:after_bank_save" in proc.stderr
        journal = Journal(run_dir / "ttrl_state")
        assert journal.next_batch == 1
        assert journal.phases(1) == {"bank_saving", "bank_saved"}
        assert service.store.stats()["buffered_rollouts"] == 4
        # batch 1 consolidated: per question its best correct and/or one incorrect rollout
        assert 2 <= len(service.store) <= 4
        assert [r["batch"] for r in map(json.loads, (run_dir / "accuracy.jsonl").open())] == [0]
        # Resuming under another memory rule is refused before anything is written.
        kept = (len(service.store), service.store.stats()["buffered_rollouts"])
        files = {f: f.stat().st_size for f in run_dir.rglob("*")}
        with pytest.raises(MiaError, match="other data, batch or memory settings"):
            run_ttrl(load_config("default", [*args, "memory.alone_samples=2"]))
        assert (len(service.store), service.store.stats()["buffered_rollouts"]) == kept
        assert {f: f.stat().st_size for f in run_dir.rglob("*")} == files
        assert Journal(run_dir / "ttrl_state").next_batch == 1

        persisted: list[tuple[int, str]] = []
        result = run_ttrl(
            load_config("default", args), on_persisted=lambda b, p: persisted.append((b, p))
        )

        stats = service.store.stats()
        records = service.store.records()
    assert result.started_at_batch == 1 and result.batches == 3
    # The resume finished batch 1's memory writes (its bank had landed), then ran batch 2 whole.
    assert persisted == [(1, "after_consolidate"), *((2, p) for p in PERSIST_POINTS)]
    assert [r["batch"] for r in result.rows] == [0, 1, 2]
    assert stats["buffered_rollouts"] == 0
    assert Journal(run_dir / "ttrl_state").next_batch == 3
    assert not list((run_dir / "ttrl_state" / "pending").iterdir())
    # Each question's rollouts went into memory exactly once: at most one correct and one
    # incorrect memory per question (dedup is off, so a repeated consolidation would add rows).
    per_question = Counter((r.question, r.judgement) for r in records)
    assert set(per_question.values()) == {1}
    assert {r.question for r in records} == set(QUESTIONS)
    # memory_serve evaluated every question once per rule, each over exactly n=2 rollouts.
    rows = [json.loads(x) for x in (run_dir / "eval" / "evaluated-random.jsonl").open()]
    assert sorted(r["question"] for r in rows) == sorted(QUESTIONS)
    assert {r["num_rollouts"] for r in rows} == {2} and {r["step"] for r in rows} == {0, 1, 2}
    # Accuracy rows agree with the judgements of the rollouts behind them.
    rollouts = [json.loads(x) for x in (run_dir / "rollouts.jsonl").open()]
    for row in result.rows:
        assert row["rollouts"] == 4 and row["questions"] == 2
        assert 0.0 <= row["accuracy"] <= 1.0
    assert [r["memories"] for r in result.rows] == sorted(r["memories"] for r in result.rows)
    assert result.rows[-1]["memories"] == len(records)
    # Each row times the memory hooks it ran: batch 1's row was written after the resume,
    # which ran only the hooks the kill had left (its bank save had landed).
    hooks = ["bank_save", "evaluate", "consolidate", "save"]
    assert [list(r["memory_seconds"]) for r in result.rows] == [hooks, hooks[1:], hooks]
    assert all(v >= 0 for r in result.rows for v in r["memory_seconds"].values())
    last = [r for r in rollouts if r["step"] == 3]
    assert result.rows[2]["accuracy"] == sum(r["extras"]["acc_final"] for r in last) / 4
    # Outputs: the curve, the memory DB copy, a checkpoint per batch.
    assert result.curve_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with sqlite3.connect(run_dir / "memory" / "memory.sqlite") as db:
        assert db.execute("SELECT COUNT(*) FROM memories").fetchone()[0] == len(records)
    # A checkpoint after every batch; the default keeps only the newest (all resume needs).
    steps = sorted(p.name for p in (run_dir / "checkpoints").glob("global_step_*"))
    assert steps == ["global_step_3"]
    assert format_curve(result.rows).count("\n") == 2


def _vote_or_panel(model: Path, tmp_path: Path, method: str, **kwargs) -> tuple:
    """One batch of 2 questions x n=2 through ``run_ttrl_pass`` (the demo's entry point)."""
    run_dir = tmp_path / "run"
    data = _data(tmp_path / "test.jsonl", labelled=True)
    with (
        memory_service(tmp_path / "mem.sqlite") as (memory_url, service),
        executor_service(executor_reply) as (serve_url, _),
    ):
        extra = _overrides(model, data, run_dir, serve_url, memory_url)[
            7:
        ]  # run_ttrl_pass sets the rest
        result = run_ttrl_pass(
            data,
            executor_url=serve_url,
            memory_url=memory_url,
            run_dir=run_dir,
            model_path=str(model),
            mode="nogt",
            nogt_method=method,
            batch_size=2,
            n=2,
            max_batches=1,
            overrides=[*extra, "memory.evaluate=false"],
            **kwargs,
        )
        records = service.store.records()
    rollouts = [json.loads(x) for x in (run_dir / "rollouts.jsonl").open()]
    return result, records, rollouts


def test_nogt_majority_vote(model: Path, tmp_path: Path) -> None:
    result, records, rollouts = _vote_or_panel(model, tmp_path, "vote")
    assert len(rollouts) == 4
    for group in {r["group"] for r in rollouts}:
        members = [r for r in rollouts if r["group"] == group]
        vote = majority_vote([r["trajectory"]["answer_final"] for r in members])
        for r, agree in zip(members, vote.rewards, strict=True):
            traj = r["trajectory"]
            raw = [m["content"] for m in traj["planner_messages"]]  # system, user, plan, ...
            record = PlannerEpisodeRecord(
                plan=raw[2], decision=raw[4], replan=raw[6] if len(raw) > 6 else None
            )
            fmt, _ = planner_format(record)
            assert r["reward"] == pytest.approx(0.9 * agree + 0.1 * fmt)
            assert r["extras"]["judgement"] == ("correct" if agree else "incorrect")
            assert r["extras"]["vote_answer"] == vote.answer
    (row,) = result.rows
    # self-judged (vote) vs ground-truth accuracy, reported separately
    assert row["self_accuracy"] == sum(r["extras"]["verdict"] for r in rollouts) / 4
    gold = [
        r["trajectory"]["answer_final"] == QUESTIONS[r["trajectory"]["question"]] for r in rollouts
    ]
    assert row["accuracy"] == sum(gold) / 4
    assert {r.judgement for r in records} <= {"correct", "incorrect"} and records


def panel_reply(messages) -> str:
    """Critics score 7; the arbiter says A (correct) unless the final output is "Nobody"."""
    text = messages[-1]["content"]
    final = re.search(r"Agent Final Output \(Final Output\): (.*)", text).group(1)
    if text.startswith("You are the Final Arbiter"):
        return "B" if "Nobody" in final else "A"
    return "Score: 7\nReason: the answer follows from the trajectory."


def test_nogt_review_panel(model: Path, tmp_path: Path) -> None:
    backend = ScriptedChat(panel_reply, name="panel")
    panel = PanelJudge(backend)
    result, records, rollouts = _vote_or_panel(model, tmp_path, "panel", panel=panel)
    assert len(backend.calls) == 4 * 4  # 3 critics + 1 arbiter per rollout
    for r in rollouts:
        answer = r["trajectory"]["answer_final"]
        verdict = 0.0 if answer == "Nobody" else 1.0
        assert r["extras"]["verdict"] == verdict
        assert r["reward"] == pytest.approx(0.9 * verdict + 0.1 * r["extras"]["format"])
        assert r["extras"]["panel"]["evaluator_1_feedback"].startswith("Score: 7")
    # Memories carry the panel's verdict and feedback (shown to the Planner later).
    assert records and all(rec.extra.get("evaluator_2_feedback") for rec in records)
    assert result.rows[0]["self_accuracy"] == sum(r["extras"]["verdict"] for r in rollouts) / 4


def gated_reply(messages) -> str:
    """Alone (no plan) the Executor answers the even-numbered questions only; with a plan as
    :func:`executor_reply`."""
    q = question_of(messages)
    if plan_of(messages):
        return executor_reply(messages)
    return f"<answer>{QUESTIONS[q] if int(q.split()[-1][:-1]) % 2 == 0 else 'Nobody'}</answer>"


def test_plans_only_where_memory_shows_a_failure(model: Path, tmp_path: Path) -> None:
    """memory.plan_without_failure=false: the first batch (empty memory) is answered by the
    Executor alone, one rollout per question and no GRPO step; its failure (question 1)
    becomes a memory (with its expected answer: memory.remember_expected), so every later
    (similar) question is planned n=2 times and learnt from."""
    with _stream(model, tmp_path, gated_reply) as (args, service, backend):
        gate = ["memory.plan_without_failure=false", "memory.remember_expected=true"]
        cfg = load_config("default", [*args, *gate])
        result = run_ttrl(cfg)
        records = service.store.records()
    plans = [plan_of(call["messages"]) for call in backend.calls]
    assert plans[:2] == ["", ""] and all(plans[2:])  # batch 1 alone, then only plans
    assert [r["planned_questions"] for r in result.rows] == [0, 2, 2]
    assert [r["rollouts"] for r in result.rows] == [2, 4, 4]
    assert [r["step"] for r in result.rows] == [0, 1, 2]  # no update from the lone answers
    # Each row says whether its GRPO step moved the Planner, as the trainer's own log does:
    # a step is skipped exactly when every group of the batch is tied.
    from ttrl.curve import step_report

    logged = [
        json.loads(line)
        for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()
        if "reward/groups_all_equal" in line
    ]
    assert [r["updated"] for r in result.rows][0] is None  # no planned question: no step
    assert [r["updated"] for r in result.rows[1:]] == [
        m["reward/groups_all_equal"] < 1.0 for m in logged
    ]
    report = step_report(result.rows)
    tied = sum(round(2 * m["reward/groups_all_equal"]) for m in logged)
    assert (report["steps"], report["groups"], report["groups_tied"]) == (2, 4, tied)
    assert report["steps_without_update"] == sum(r["updated"] is False for r in result.rows)
    first = {q["data_id"]: q for q in result.rows[0]["per_question"]}
    assert first["t0"]["answers"] == ["Founder 0"] and first["t0"]["vote_correct"] == 1.0
    assert first["t1"]["answers"] == ["Nobody"] and first["t1"]["vote_correct"] == 0.0
    alone = {
        (r.question, r.judgement, r.plan, r.extra.get("expected"))
        for r in records
        if r.extra.get("batch") == 0
    }
    assert alone == {  # remember_expected: the failure keeps its expected answer
        ("Who founded company number 0?", "correct", "", None),
        ("Who founded company number 1?", "incorrect", "", "Founder 1"),
    }
    with pytest.raises(MiaError, match="remember_expected needs mode=supervised"):
        load_config("default", [*args, "mode=nogt", "memory.remember_expected=true"])
    with pytest.raises(MiaError, match="needs memory.alone_samples >= 2"):
        load_config("default", [*args, "mode=nogt", "nogt.method=vote",
                                "memory.plan_without_failure=false"])  # fmt: skip


def test_nogt_gate_remembers_a_doubted_question_as_a_failure(model: Path, tmp_path: Path) -> None:
    """mode=nogt, nogt.method=vote, memory.plan_without_failure=false, memory.alone_samples=3:
    an unplanned question is answered by the Executor three times (the first greedy, two
    sampled at alone_temperature with their rollout's seed) and by their majority; a question
    whose answers disagree is a failure in memory, so the next question of its kind is planned."""
    sent: list[tuple[float, int | None]] = []
    backend: dict[str, Any] = {}

    def reply(messages) -> str:
        q = question_of(messages)
        if plan_of(messages):
            return executor_reply(messages)
        params = backend["chat"].calls[-1]["params"]  # the request being answered
        sent.append((params.temperature, params.seed))
        if params.temperature == 0.0 or q.endswith("0?"):
            return f"<answer>{QUESTIONS[q]}</answer>"  # question 0: the samples agree
        return f"<answer>Guess {params.seed}</answer>"  # question 1: they all differ

    with _stream(model, tmp_path, reply) as (args, service, chat):
        backend["chat"] = chat
        gate = [
            "mode=nogt",
            "nogt.method=vote",
            "memory.plan_without_failure=false",
            "memory.alone_samples=3",
            "memory.alone_temperature=0.8",
        ]
        result = run_ttrl(load_config("default", [*args, *gate]))
        records = service.store.records()
    # batch 1: 2 questions x 3 alone runs, one greedy and two sampled (distinct seeds) each
    assert sorted(t for t, _ in sent) == [0.0, 0.0, 0.8, 0.8, 0.8, 0.8]
    seeds = [s for t, s in sent if t == 0.8]
    assert None not in seeds and len(set(seeds)) == 4
    assert all(s is None for t, s in sent if t == 0.0)
    assert [r["planned_questions"] for r in result.rows] == [0, 2, 2]
    assert [r["step"] for r in result.rows] == [0, 1, 2]  # the alone votes train nothing
    first = {q["data_id"]: q for q in result.rows[0]["per_question"]}
    assert first["t0"]["answers"] == ["Founder 0"] * 3 and first["t0"]["answer_correct"] == 1.0
    # A three-way tie goes to the earliest rollout: the greedy answer.
    assert first["t1"]["answers"][0] == "Founder 1" and len(set(first["t1"]["answers"])) == 3
    assert (first["t1"]["answer"], first["t1"]["answer_correct"]) == ("Founder 1", 1.0)
    # Memory: question 0's agreeing answer; question 1, whose answers disagreed, is a failure
    # (memory_serve keeps one memory per question: a losing answer beside a winning one would
    # be dropped, and the gate would never plan).
    alone = sorted((r.question, r.judgement) for r in records if r.extra.get("batch") == 0)
    assert alone == [
        ("Who founded company number 0?", "correct"),
        ("Who founded company number 1?", "incorrect"),
    ]


def test_greedy_answer_is_reported_not_trained_on_or_remembered(
    model: Path, tmp_path: Path
) -> None:
    """answer=greedy: per planned question one more rollout, its plan greedy, collected after
    the n sampled ones and before the update; its answer is the one reported (answer_correct,
    the row's accuracy_answer), the sampled ones alone are the GRPO group and the memories."""
    with _stream(model, tmp_path, executor_reply) as (args, service, backend):
        result = run_ttrl(load_config("default", [*args, "answer=greedy"]))
        records = service.store.records()
    calls = [(question_of(c["messages"]), plan_of(c["messages"]), c) for c in backend.calls]
    assert len(calls) == 18  # 3 batches x 2 questions x (2 sampled + 1 greedy)
    reply = {  # question -> its greedy rollout's answer: the last 2 calls of each batch of 6
        q: executor_reply(c["messages"])[len("<answer>") : -len("</answer>")]
        for b in range(3)
        for q, _, c in calls[6 * b + 4 : 6 * b + 6]
    }
    sampled_plans = {p for b in range(3) for _, p, _ in calls[6 * b : 6 * b + 4]}
    assert [r["rollouts"] for r in result.rows] == [4, 4, 4]  # the GRPO groups: sampled only
    assert [r["answer_rollouts"] for r in result.rows] == [2, 2, 2]
    assert [r["step"] for r in result.rows] == [1, 2, 3]
    questions = [q for r in result.rows for q in r["per_question"]]
    gold = {f"t{i}": a for i, a in enumerate(QUESTIONS.values())}
    by_id = {f"t{i}": q for i, q in enumerate(QUESTIONS)}
    for q in questions:
        assert q["answer_from"] == "greedy" and len(q["answers"]) == 2
        assert q["answer"] == reply[by_id[q["data_id"]]]
        assert q["answer_correct"] == float(q["answer"] == gold[q["data_id"]])
        assert q["vote_correct"] == float(q["vote_answer"] == gold[q["data_id"]])
    for r in result.rows:
        got = [q["answer_correct"] for q in r["per_question"]]
        assert r["accuracy_answer"] == sum(got) / len(got)
    assert {r.plan for r in records} <= sampled_plans  # memory holds the sampled rollouts
    with pytest.raises(MiaError, match="answer must be one of"):
        load_config("default", [*args, "answer=best"])


# ----------------------------------------------------------------------------- learning check

GOOD_PLAN = "1. Search for the entity.\n2. Answer."
BAD_PLAN = "1. Guess the answer."


def _warm_start(out: Path, questions: list[str]) -> Path:
    """A tiny Planner fine-tuned to write one of two plans, 50/50: a good one (the Executor
    searches and answers right) and a bad one (it guesses wrong). TTRL has to find out which."""
    from role_fixtures import ScriptedGenerator

    from mia.agent import TokenPolicy
    from mia.models.tiny import build_tokenizer, save_tiny, tiny_qwen2
    from mia.prompts.planner import EMPTY_MEMORY, plan_messages
    from mia.rl.episode import collate
    from mia.rl.policy import PolicyModel

    tok = build_tokenizer()
    base = save_tiny(tiny_qwen2(tok, seed=0), tok, out / "base")
    render = TokenPolicy(ScriptedGenerator(tok, lambda _p: ""))
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    rows = []
    for i, q in enumerate(questions[:8]):
        prompt = render.encode(render.render(plan_messages(EMPTY_MEMORY, q, image=False), True))
        resp = render.encode(GOOD_PLAN if i % 2 == 0 else BAD_PLAN) + [eos]
        rows.append(SimpleRow(prompt, resp))
    policy = PolicyModel({"model_path": str(base), "optim": {"lr": 1e-2}, "micro_batch_size": 8})
    batch = collate(rows, tok.pad_token_id)
    for _ in range(8):
        policy.sft_step(batch)
    return policy.export_hf(out / "warm")


class SimpleRow:
    def __init__(self, prompt: list[int], resp: list[int]) -> None:
        self.prompt_ids, self.response_ids = prompt, resp
        self.response_mask, self.rollout_logprobs = [1] * len(resp), None


@pytest.mark.slow
def test_ttrl_raises_planner_reward_on_the_synthetic_world(tmp_path: Path) -> None:
    """The Executor (scripted, behind serve) answers a synthetic-world question right iff the
    plan tells it to search. GRPO steps on the Planner during the pass must shift it to the
    searching plan: the mean reward of the last two batches beats the first two by a margin."""
    from mia.data.world import World

    world = World.generate(seed=0, size="small")
    qs = world.questions[:24]
    gold = {q.question: q.answer for q in qs}
    data = tmp_path / "world_test.jsonl"
    data.write_text(
        "".join(
            json.dumps(
                {"id": q.id, "question": q.question, "answer": q.answer, "aliases": q.aliases}
            )
            + "\n"  # fmt: skip
            for q in qs
        )
    )
    rng = random.Random(0)
    warm = _warm_start(tmp_path, [q.question for q in rng.sample(world.questions, 8)])

    def reply(messages) -> str:
        right = "Search" in plan_of(messages)
        return f"<answer>{gold[question_of(messages)] if right else 'unknown'}</answer>"

    with (
        memory_service(tmp_path / "mem.sqlite") as (memory_url, _),
        executor_service(reply) as (serve_url, _),
    ):
        args = [
            f"model_path={warm}",
            f"data.test={data}",
            f"run_dir={tmp_path / 'run'}",
            f"services.executor_url={serve_url}",
            f"services.memory_url={memory_url}",
            "trainer.batch_size=4",
            "trainer.n=4",
            "trainer.save_freq=100",
            "trainer.logging.console=false",
            "trainer.policy.optim.lr=2e-3",
            "episode.plan_max_tokens=24",
            "episode.decision_max_tokens=8",
            "episode.replan_max_tokens=8",
            "episode.memory_top_k=1",
            "memory.evaluate=false",
            "plot=false",
        ]
        result = run_ttrl(load_config("default", args))
    print(format_curve(result.rows))
    rewards = [r["reward_mean"] for r in result.rows]
    assert len(rewards) == 6
    first, last = sum(rewards[:2]) / 2, sum(rewards[-2:]) / 2
    assert last > first + 0.15, format_curve(result.rows)
    acc = [r["accuracy"] for r in result.rows]
    assert sum(acc[-2:]) / 2 > sum(acc[:2]) / 2 + 0.15, format_curve(result.rows)


def test_question_votes_take_the_majority_answer() -> None:
    from types import SimpleNamespace as NS

    from ttrl.run import question_votes

    def r(group: str, answer: str, qid: str) -> NS:
        return NS(
            group=group, trajectory=NS(final_answer=answer), sample={"data_id": qid}, reward=0.5
        )

    ok = [r("g0", "Paris", "a"), r("g0", "paris.", "a"), r("g0", "Rome", "a"),
          r("g1", "X", "b"), r("g1", "Y", "b")]  # fmt: skip
    votes = question_votes(ok, [1.0, 1.0, 0.0, 0.0, 1.0])
    assert [(v["data_id"], v["vote_answer"], v["vote_correct"]) for v in votes] == [
        ("a", "Paris", 1.0),  # two of three say Paris (normalised)
        ("b", "X", 0.0),  # a tie goes to the earliest rollout
    ]
    assert question_votes(ok, [])[0]["vote_correct"] is None  # no ground truth: not judged
    assert [v["rewards"] for v in votes] == [[0.5, 0.5, 0.5], [0.5, 0.5]]
    # Without a separate answer the reported one is the majority; with one, that one.
    assert [(v["answer"], v["answer_correct"], v["answer_from"]) for v in votes] == [
        ("Paris", 1.0, "vote"),
        ("X", 0.0, "vote"),
    ]
    given = question_votes(ok, [1.0, 1.0, 0.0, 0.0, 1.0], {"b": ("Y", 1.0)})
    assert [(v["answer"], v["answer_correct"], v["answer_from"]) for v in given] == [
        ("Paris", 1.0, "vote"),
        ("Y", 1.0, "greedy"),
    ]
    assert given[1]["vote_answer"] == "X"


# ----------------------------------------------------------------------------- lr = 0


class SeededPlans:
    """A scripted Planner (token generator) whose plan depends on the rollout's sampling seed:
    the n plans of a question differ (so GRPO groups are not all tied), and a pass rolls out
    the same plans whatever the weights. Records every state dict pushed to it."""

    def __init__(self, tokenizer: Any) -> None:
        from role_fixtures import ScriptedGenerator

        self.inner = ScriptedGenerator(tokenizer, lambda _p: "")
        self.synced: list[dict[str, Any]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def generate(self, prompt_ids: list[int], params: Any = None, multimodal: Any = None):
        seed = 0 if params is None or params.seed is None else int(params.seed)
        turns = len(self.inner.tokenizer.decode(prompt_ids).split("<|im_start|>assistant\n")) - 1
        # "step 7" leads the Executor to the right answer, "step 0" does not (executor_reply)
        text = (
            f"<think>p</think>\n1. Search step {7 if seed % 2 else 0}."
            if turns == 1
            else "<think>ok</think>\nno"
        )
        self.inner.reply = lambda _p: text
        return await self.inner.generate(prompt_ids, params, multimodal)

    generate_ids = generate

    def update_weights(self, state_dict: Any = None, path: Any = None) -> int:
        if state_dict is not None:
            self.synced.append({k: v.detach().clone() for k, v in state_dict.items()})
        return self.inner.update_weights(state_dict, path)


def test_learning_rate_zero_is_the_same_pass_without_weight_change(
    model: Path, tmp_path: Path
) -> None:
    """The protocol's ttrl_lr0 (mia demo's ttrl.lr=0 -> trainer.policy.optim.lr): the same
    rollouts, GRPO steps and memory writes as the pass with a learning rate, and the Planner's
    weights exactly the base model's after every step; with a learning rate they move."""
    from safetensors.torch import load_file

    from mia.apps.demo_config import load_demo_config, ttrl_overrides
    from mia.models.tiny import build_tokenizer

    demo = load_demo_config(None, ["ttrl.lr=0"])
    assert "trainer.policy.optim.lr=0.0" in ttrl_overrides(demo, "supervised")
    assert "trainer.policy.optim.lr=1e-05" in ttrl_overrides(load_demo_config(None, []), "nogt")
    base = load_file(str(model / "model.safetensors"))
    runs = {}
    for lr in ("0", "1e-3"):
        gen = SeededPlans(build_tokenizer())
        (tmp_path / lr).mkdir()
        with _stream(model, tmp_path / lr, executor_reply) as (args, service, _):
            args = [a for a in args if not a.startswith("trainer.policy.optim.lr=")]
            cfg = load_config("default", [*args, f"trainer.policy.optim.lr={lr}"])
            result = run_ttrl(cfg, generator=gen)
            memories = sorted((r.question, r.judgement, r.plan) for r in service.store.records())
        runs[lr] = (result, memories, gen.synced)
    (r0, mem0, synced0), (r1, mem1, synced1) = runs["0"], runs["1e-3"]
    assert [r["updated"] for r in r0.rows] == [r["updated"] for r in r1.rows]
    assert any(r["updated"] for r in r0.rows)  # steps were taken: groups were not all tied
    assert [r["per_question"] for r in r0.rows] == [r["per_question"] for r in r1.rows]
    assert mem0 == mem1 and mem0
    assert len(synced0) == len(synced1) >= 1
    for state in synced0:
        shared = sorted(set(state) & set(base))
        assert shared and len(shared) == len(base)
        assert all(torch_equal(state[k], base[k]) for k in shared)
    assert not all(torch_equal(synced1[-1][k], base[k]) for k in base)


def torch_equal(a: Any, b: Any) -> bool:
    import torch

    return bool(torch.equal(a.to(torch.float32), b.to(torch.float32)))
