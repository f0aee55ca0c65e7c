"""planner_train end to end: one GRPO step of a real tiny Qwen2 Planner whose rollouts go
through the real serve service (the frozen Executor, a scripted LLM) and memory_serve.

Episode: plan -> serve /execute -> reflect yes/no -> (yes) replan -> serve /continue. The
planner's replies are scripted over the real tokenizer so rewards, masks and payloads are exact;
the conversation's tokens must be exactly the chat template's rendering of its messages."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path

import httpx
import pytest
from role_fixtures import (
    ScriptedGenerator,
    build_tiny_model,
    executor_service,
    memory_service,
    one_step,
    plan_of,
    question_of,
    record_rewards,
    replan_of,
    scores_by_question,
)

from mia.errors import MiaError
from mia.llm.base import SamplingParams
from mia.models.tiny import build_tokenizer
from mia.planner.episode import PlannerEpisode, planner_segments
from mia.prompts import planner as planner_text
from mia.rl.episode import Rollout
from mia.services import ExecutorClient
from mia.trace import REVISED_PLAN_MARKER, content_text
from planner_train.config import load_config
from planner_train.train import build_trainer

GOLD = {
    "Who founded Vorlanic Institute?": "Kaleth Morvaine",
    "Where was Ilsa Drovan born?": "Velmora",
}
BAD_PLAN = "1. Guess the answer."
GOOD_REPLAN = "1. Search the person."


def executor_reply(messages) -> str:
    """The frozen Executor: right only when told to search (a revised plan always does)."""
    gold = GOLD[question_of(messages)]
    guide = replan_of(messages) or plan_of(messages)
    return f"<answer>{gold if 'Search' in guide else 'Nobody'}</answer>"


class PlannerScript:
    """Plan (bad) -> decision yes / no alternating per question -> replan (good)."""

    def __init__(self) -> None:
        self.decisions: Counter[str] = Counter()

    def __call__(self, prompt: str) -> str:
        turns = prompt.split("<|im_start|>assistant\n")[1:]
        if len(turns) == 1:
            return f"<think>plan</think>\n{BAD_PLAN}"
        if len(turns) == 2:
            question = next(q for q in GOLD if q in prompt)
            k = self.decisions[question]
            self.decisions[question] += 1
            return "<think>unsure</think>\nyes" if k % 2 == 0 else "<think>fine</think>\nno"
        return f"<think>fix it</think>\n{GOOD_REPLAN}"


def test_one_planner_grpo_step_through_real_services(tmp_path: Path) -> None:
    model = build_tiny_model(tmp_path / "model")
    data = tmp_path / "train.jsonl"
    rows = [
        {"id": "p1", "question": "Who founded Vorlanic Institute?", "answer": "Kaleth Morvaine",
         "memories_context": "MEMORIES OF p1"},
        {"id": "p2", "question": "Where was Ilsa Drovan born?", "answer": "Velmora"},
    ]  # fmt: skip
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tok = build_tokenizer()
    gen = ScriptedGenerator(tok, PlannerScript())
    with (
        memory_service(tmp_path / "mem.sqlite") as (memory_url, _),
        executor_service(executor_reply) as (serve_url, executor),
    ):
        stored = {"question": "Where was Ilsa Drovan's sister born?", "judgement": "correct",
                  "workflow_summary": "1. Search the sister (name -> city)"}  # fmt: skip
        assert httpx.post(f"{memory_url}/memories", json=stored).status_code == 200
        cfg = load_config(
            "default",
            [
                f"model_path={model}",
                f"data.train={data}",
                f"services.executor_url={serve_url}",
                f"services.memory_url={memory_url}",
                *one_step(tmp_path / "run"),
            ],
        )
        trainer = build_trainer(cfg, generator=gen)
        seen = record_rewards(trainer)
        history = trainer.fit()

    # yes: first answer wrong, replanned, right (0.7 + 0.05 format + 0.05 decision);
    # no: wrong and kept (0.05 format, decision wrong).
    assert scores_by_question(seen) == {"p1": [0.05, 0.8], "p2": [0.05, 0.8]}
    for sample, r, score, extras in seen:
        assert score == extras["score"]
        gold = GOLD[sample["question"]]
        assert r.plan == BAD_PLAN and r.answer_first == "Nobody"
        if r.asked_replan:
            assert r.replan == GOOD_REPLAN and r.final_answer == gold
            assert (extras["acc_first"], extras["acc_final"], extras["decision"]) == (0.0, 1.0, 1.0)
            want = [("assistant", 1), ("judge_prompt", 0), ("assistant", 1),
                    ("replan_prompt", 0), ("assistant", 1)]  # fmt: skip
        else:
            assert r.replan_raw is None and not r.replanned and r.final_answer == "Nobody"
            assert (extras["acc_first"], extras["acc_final"], extras["decision"]) == (0.0, 0.0, 0.0)
            want = [("assistant", 1), ("judge_prompt", 0), ("assistant", 1)]
        assert [(k, m) for k, m, _ in planner_segments(r)] == want
        # Token-exact: prompt + response decode to the template's rendering of the messages.
        text = tok.decode(r.prompt_ids + r.response_ids, skip_special_tokens=False)
        rendered = tok.apply_chat_template(r.messages, tokenize=False)
        assert rendered == text + "\n"
        assert len(r.response_mask) == len(r.response_ids) == len(r.rollout_logprobs)
        # The plan prompt holds the memories: the data column, or memory_serve's retrieval.
        prompt = r.messages[1]["content"]
        if sample["data_id"] == "p1":
            assert "MEMORIES OF p1" in prompt and r.memory_ids == []
        else:
            assert "Where was Ilsa Drovan's sister born?" in prompt and r.memory_ids == [1]
        assert r.messages[3]["content"] == planner_text.judge_prompt(r.first["trace"])
        assert "<answer>Nobody</answer>" in r.messages[3]["content"]

    # serve saw one /execute per rollout with the plan, one /continue per "yes" with the replan.
    firsts = [c for c in executor.calls if len(c["messages"]) == 2]
    continues = [c for c in executor.calls if len(c["messages"]) > 2]
    assert len(firsts) == 4 and len(continues) == 2
    assert all(plan_of(c["messages"]) == BAD_PLAN for c in firsts)
    for c in continues:
        last = content_text(c["messages"][-1]["content"])
        assert REVISED_PLAN_MARKER in last and GOOD_REPLAN in last
        assert c["messages"][2] == {"role": "assistant", "content": ""}  # answer dropped

    (m,) = history
    assert m["step"] == 1 and m["reward/groups_all_equal"] == 0.0 and m["actor/grad_norm"] > 0
    assert m["reward/asked_replan"] == 0.5 and m["reward/replanned"] == 0.5
    assert gen.weight_version == 1
    assert (tmp_path / "run" / "checkpoints" / "global_step_1" / "COMPLETE").is_file()


def test_planner_rollout_without_reflection_trains_on_the_plan_only(tmp_path: Path) -> None:
    """``episode.reflect=false`` (the demo's TTRL): plan -> serve /execute -> done. The response
    is the plan alone, and the reward reads no decision: a wrong answer with a well-formed plan
    scores the format point only (0.05), never the decision's."""
    model = build_tiny_model(tmp_path / "model")
    data = tmp_path / "train.jsonl"
    rows = [{"id": f"p{i}", "question": q, "answer": a, "memories_context": "none"}
            for i, (q, a) in enumerate(GOLD.items())]  # fmt: skip
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tok = build_tokenizer()
    gen = ScriptedGenerator(tok, PlannerScript())
    with executor_service(executor_reply) as (serve_url, executor):
        cfg = load_config(
            "default",
            [
                f"model_path={model}",
                f"data.train={data}",
                f"services.executor_url={serve_url}",
                "services.memory_url=null",
                "episode.reflect=false",
                "trainer.batch_size=2",
                "trainer.n=2",
                "trainer.total_steps=1",
                "trainer.rollout_errors=raise",
                f"trainer.run_dir={tmp_path / 'run'}",
                "trainer.logging.console=false",
            ],
        )
        trainer = build_trainer(cfg, generator=gen)
        seen = record_rewards(trainer)
        (m,) = trainer.fit()
    assert [score for _, _, score, _ in seen] == [0.05] * 4
    for _, r, _, extras in seen:
        assert r.states == ["plan", "execute"] and r.decision_raw == "" and not r.record.reflected
        assert (extras["format"], extras["decision"], extras["format_issues"]) == (1.0, 0.0, [])
        assert [(k, mask) for k, mask, _ in planner_segments(r)] == [("assistant", 1)]
        assert [msg["role"] for msg in r.messages] == ["system", "user", "assistant"]
        assert sum(r.response_mask) == len(r.response_ids)  # every response token is the plan
    assert len(executor.calls) == 4 and all(len(c["messages"]) == 2 for c in executor.calls)
    assert m["reward/groups_all_equal"] == 1.0


def test_plan_prompt_over_the_budget_is_a_clear_error() -> None:
    gen = ScriptedGenerator(build_tokenizer(), lambda _p: "never called")
    episode = PlannerEpisode(ExecutorClient("http://127.0.0.1:9"), None, {"max_context": 64})
    with pytest.raises(MiaError, match="leaves no room to generate"):
        asyncio.run(
            episode.run({"question": "Why?"}, Rollout(generator=gen, sampling=SamplingParams()))
        )
    assert gen.prompts == []
