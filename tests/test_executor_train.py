"""executor_train end to end: one GRPO step of a real tiny Qwen2 policy whose rollouts go
through the real Executor loop, a real local_search (BM25) service and a real memory_serve
(``/plan`` for the row without a plan, ``/replan_train`` after a wrong first answer).

The rollout generator is scripted (exact, known replies over the real tokenizer) so rewards and
payloads can be asserted exactly; the policy, its update, the checkpoint and the services are
real."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest
from role_fixtures import (
    EXECUTOR_GOLD,
    EXECUTOR_PASSAGES,
    PLAN_COLUMN,
    PLAN_FROM_SERVICE,
    ScriptedGenerator,
    build_tiny_model,
    memory_service,
    one_step,
    record_rewards,
    scores_by_question,
    search_service,
)

from executor_train.config import load_config
from executor_train.train import build_trainer
from mia.data.formats import QAItem, write_parquet_qa
from mia.errors import MiaError
from mia.llm.scripted import ScriptedChat
from mia.prompts import planner as planner_text
from mia.prompts.planner import replan_train_messages
from mia.rl.trainer import Trainer
from mia.roles.samples import load_samples

PASSAGES = [
    *EXECUTOR_PASSAGES,
    {"id": "2", "contents": "Velmora\nVelmora is a city on the Vohund River."},
]
REPLAN = "1. Search the birthplace again."


def planner_reply(messages) -> str:
    last = messages[-1]["content"]
    if "You decided to reflect and replan" in last:
        return f"<think>the answer was wrong</think>\n{REPLAN}"
    return f"<think>memories</think>\n{PLAN_FROM_SERVICE}"


class ExecutorScript:
    """First turn: search (variant A or B by call order on the same prompt); A then answers
    right, B wrong; after a revised plan the Executor answers right without a tool."""

    def __init__(self) -> None:
        self.first_calls: Counter[str] = Counter()

    def __call__(self, prompt: str) -> str:
        question = re.search(r"Question: (.*?)\n", prompt).group(1).strip()
        gold = EXECUTOR_GOLD[question]
        # The text of every assistant turn so far (and the turns injected after it).
        turns = prompt.split("<|im_start|>assistant\n")[1:]
        if len(turns) == 1:
            k = self.first_calls[question]
            self.first_calls[question] += 1
            variant = "A" if k % 2 == 0 else "B"
            call = {
                "name": "search",
                "arguments": {"query_list": [f"{question} variant {variant}"]},
            }
            return f"<think>search first</think>\n<tool_call>\n{json.dumps(call)}\n</tool_call>"
        if "I have a revised plan for you to follow" in turns[-2]:
            return f"<think>follow the revised plan</think>\n<answer>{gold}</answer>"
        answer = gold if "variant A" in turns[0] else "Nobody"
        return f"<think>read the passage</think>\n<answer>{answer}</answer>"


@pytest.fixture(scope="module")
def search_url(tmp_path_factory: pytest.TempPathFactory):
    with search_service(tmp_path_factory.mktemp("search"), PASSAGES) as url:
        yield url


def _data(path: Path) -> Path:
    items = [
        QAItem(
            id="e1",
            question="Who founded Vorlanic Institute?",
            answers=["Kaleth Morvaine"],
            extra={"plan": PLAN_COLUMN, "memories_context": "MEMORY CONTEXT OF e1"},
        ),
        QAItem(
            id="e2",
            question="Where was Ilsa Drovan born?",
            answers=["Velmora"],
            extra={"plan": None, "memories_context": None},
        ),
    ]
    write_parquet_qa(items, path)
    return path


def test_load_samples_reads_reference_columns(tmp_path: Path) -> None:
    samples = load_samples(_data(tmp_path / "train.parquet"))
    assert [(s["data_id"], s["plan"], s["memory_context"], s["golds"]) for s in samples] == [
        ("e1", PLAN_COLUMN, "MEMORY CONTEXT OF e1", ["Kaleth Morvaine"]),
        ("e2", None, None, ["Velmora"]),
    ]


def test_one_executor_grpo_step_through_real_services(tmp_path: Path, search_url: str) -> None:
    model = build_tiny_model(tmp_path / "model")
    data = _data(tmp_path / "train.parquet")
    planner = ScriptedChat(planner_reply, name="planner")
    # cold_start=false: the planner (not the manager) plans although the store is empty.
    with memory_service(
        tmp_path / "mem.sqlite", planner=planner, overrides=("planner.cold_start=false",)
    ) as (memory_url, _):
        cfg = load_config(
            "default",
            [
                f"model_path={model}",
                f"data.train={data}",
                f"services.memory_url={memory_url}",
                f"agent.tools.search.params.url={search_url}",
                "agent.context_budget=3000",
                *one_step(tmp_path / "run"),
            ],
        )
        from mia.models.tiny import build_tokenizer

        gen = ScriptedGenerator(build_tokenizer(), ExecutorScript())
        trainer = build_trainer(cfg, generator=gen)
        assert isinstance(trainer, Trainer)
        seen = record_rewards(trainer)
        history = trainer.fit()

    # Rewards: A = right first time with a search (0.7*1.2 + 0.2 + 0.1); B = wrong, one replan,
    # right without a tool in the second attempt (0.7*1.0 + 0.2*0.5 + 0.1).
    assert scores_by_question(seen) == {"e1": [0.9, 1.14], "e2": [0.9, 1.14]}
    for _, traj, score, extras in seen:
        assert score == extras["score"]
        if traj.replanned:
            assert (extras["acc"], extras["tool"], extras["format"]) == (1.0, 0.5, 1.0)
            assert extras["acc_first"] == 0.0 and traj.first_answer == "Nobody"
            assert traj.replan == REPLAN
        else:
            assert (extras["acc"], extras["tool"], extras["format"]) == (1.2, 1.0, 1.0)
        # Token view: sampled turns mask 1, tool results and the revised plan mask 0.
        kinds = [(s.kind, s.mask) for s in traj.segments]
        assert all(mask == (1 if kind == "assistant" else 0) for kind, mask in kinds)
        assert ("observation", 0) in kinds
        assert (("replan", 0) in kinds) == traj.replanned
        # The rollout ran the one Planner flow: the judge reflected, /replan_train replanned.
        want_states = ["plan", "execute", "reflect"] + (["replan", "continue"] * traj.replanned)
        assert traj.state["states"] == want_states
        # The real local_search answered the search.
        passage = "founded by Kaleth Morvaine" if traj.data_id == "e1" else "born in Velmora"
        assert passage in traj.messages[3]["content"]

    # memory_serve: one /plan for the row without a plan column (shared by its 2 rollouts),
    # one /replan_train per B rollout, with the plan and memory context each row used.
    plan_calls = [c for c in planner.calls if len(c["messages"]) == 2]
    replan_calls = [c for c in planner.calls if len(c["messages"]) == 6]
    assert (
        len(plan_calls) == 1
        and "Where was Ilsa Drovan born?" in plan_calls[0]["messages"][1]["content"]
    )
    assert len(replan_calls) == 2
    by_plan = {c["messages"][2]["content"]: c["messages"] for c in replan_calls}
    assert set(by_plan) == {PLAN_COLUMN, PLAN_FROM_SERVICE}
    e1 = by_plan[PLAN_COLUMN]
    want = replan_train_messages(
        "Who founded Vorlanic Institute?", PLAN_COLUMN, "TRACE", "MEMORY CONTEXT OF e1", image=True
    )
    assert [m["role"] for m in e1] == [m["role"] for m in want]
    assert e1[1] == want[1] and e1[4] == {
        "role": "assistant",
        "content": planner_text.REPLAN_TRAIN_DECISION,
    }
    assert e1[5] == want[5]
    assert "<answer>Nobody</answer>" in e1[3]["content"]
    assert "# Retrieved Relevant Memories" in by_plan[PLAN_FROM_SERVICE][1]["content"]

    # One real update: non-zero advantages, a gradient, weights pushed, a checkpoint.
    (m,) = history
    assert m["step"] == 1 and m["rollout/n"] == 4.0 and m["reward/groups_all_equal"] == 0.0
    assert m["actor/grad_norm"] > 0 and gen.weight_version == 1
    assert (tmp_path / "run" / "checkpoints" / "global_step_1" / "COMPLETE").is_file()
    assert json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])["step"] == 1


def test_missing_data_is_one_clear_error(tmp_path: Path) -> None:
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "executor_train", "model_path=/nonexistent"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "python -m executor_train: error: set data.train=FILE (reference parquet, JSON or JSONL)"
    )


def test_rows_without_a_plan_can_train_the_executor_alone() -> None:
    import asyncio

    from executor_train.episode import ExecutorEpisode
    from mia.judge.rules import RuleJudge

    alone = ExecutorEpisode(None, None, judge=RuleJudge(), missing_plan="none")
    assert asyncio.run(alone.plan_for({"question": "q", "plan": None})) == ("", "")
    assert asyncio.run(alone.plan_for({"question": "q", "plan": "1. x"})) == ("1. x", "")
    asks = ExecutorEpisode(None, None, judge=RuleJudge())  # default: memory_serve /plan
    with pytest.raises(MiaError, match="no plan column and no memory_serve URL"):
        asyncio.run(asks.plan_for({"question": "q", "plan": None}))
    with pytest.raises(MiaError, match="missing_plan must be"):
        ExecutorEpisode(None, None, judge=RuleJudge(), missing_plan="sometimes")
    cfg = load_config("default", ["missing_plan=none"])
    assert cfg.missing_plan == "none"


def test_the_agents_sampling_temperature_must_be_the_losss() -> None:
    """The Executor loop samples with agent.sampling over the trainer's, so that is the
    temperature the loss must match (a tempered rollout scored untempered is refused)."""
    with pytest.raises(MiaError, match=r"agent.sampling.temperature=0.7 but policy.loss"):
        load_config("default", ["agent.sampling.temperature=0.7"])
    # Set with the loss's, it is the one value: the trainer's sampling records it, so the
    # Trainer's own check (run on a copy at load, mia.roles.common.check_trainer) agrees.
    hot = load_config(
        "default", ["agent.sampling.temperature=0.7", "trainer.policy.loss.temperature=0.7"]
    )
    assert hot.trainer.sampling["temperature"] == 0.7
    # Greedy rollouts (temperature 0) pass whatever the loss's temperature.
    assert (
        load_config("default", ["agent.sampling.temperature=0"]).agent.sampling["temperature"] == 0
    )
