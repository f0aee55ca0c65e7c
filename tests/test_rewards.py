"""mia.rewards: hand-computed Executor, Planner and no-ground-truth rewards (every component,
first-attempt bonus, replan, word-count rule, bad format, tool segments), the panel through
ScriptedChat, majority-vote rewards, and configs that mirror their YAML."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from mia.agent.trajectory import Attempt, ToolCallRecord, Trajectory
from mia.errors import MiaError
from mia.judge import LLMJudge, PanelJudge, RuleJudge
from mia.llm.scripted import ScriptedChat
from mia.rewards import (
    ExecutorRewardConfig,
    NoGTRewardConfig,
    PlannerEpisodeRecord,
    PlannerRewardConfig,
    answer_from_trace,
    executor_reward,
    load_reward_config,
    nogt_reward,
    nogt_vote_rewards,
    planner_format,
    planner_reward,
    tool_segments,
)
from mia.trace import REVISED_PLAN_TEMPLATE

RULES = RuleJudge(mode="contains")
SEARCH = '{"name": "search", "arguments": {"query_list": ["capital of France"]}}'


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def approx(x: float) -> Any:
    return pytest.approx(x, abs=1e-12)


def call_text(body: str = SEARCH, think: str = "I should search.") -> str:
    return f"<think>{think}</think>\n<tool_call>{body}</tool_call>"


def record(attempt: int, body: str = SEARCH, name: str | None = "search") -> ToolCallRecord:
    try:
        value = json.loads(body)
        strict = True
    except ValueError:
        value, strict = None, False
    return ToolCallRecord(
        turn=0,
        attempt=attempt,
        name=name,
        arguments=value.get("arguments") if isinstance(value, dict) else None,
        raw=body,
        ok=name == "search",
        strict_json=strict,
        repaired=not strict,
    )


def make_traj(*attempts: list[tuple[str, ToolCallRecord | None]], answers: list[str]) -> Trajectory:
    """A trajectory from per-attempt assistant turns (text, tool-call record or None); every
    turn with a record gets a tool response; attempts after the first open with a revised plan."""
    traj = Trajectory(question="What is the capital of France?", plan="1. search")
    traj.messages = [
        {"role": "system", "content": "You are an agent."},
        {"role": "user", "content": "Question: What is the capital of France?"},
    ]
    for i, turns in enumerate(attempts):
        if i:
            replan = "Search again, more precisely."
            traj.messages.append(
                {"role": "user", "content": REVISED_PLAN_TEMPLATE.format(replan=replan)}
            )
            traj.replan = replan
        traj.attempts.append(
            Attempt(plan="p", start_message=len(traj.messages) - 1, answer=answers[i])
        )
        for text, rec in turns:
            traj.messages.append({"role": "assistant", "content": text})
            if rec is not None:
                traj.tool_calls.append(rec)
                traj.messages.append({"role": "user", "content": "<tool_response>\n...\n"})
    traj.answer = answers[-1]
    return traj


def one_shot(answer_text: str, answer: str) -> Trajectory:
    return make_traj(
        [(call_text(), record(0)), (f"<think>Found it.</think>\n{answer_text}", None)],
        answers=[answer],
    )


# --------------------------------------------------------------------------------------------
# Executor (docs/reference.md §7.1)
# --------------------------------------------------------------------------------------------
def test_executor_first_attempt_correct_gets_bonus() -> None:
    traj = one_shot("<answer>Paris</answer>", "Paris")
    score, extras = run(executor_reward(traj, ["Paris"], RULES))
    # acc = 1 + 0.2 bonus; tool = 1/1; format = 1  ->  0.7*1.2 + 0.2 + 0.1
    assert score == approx(1.14)
    assert extras == {
        "score": score,
        "acc": approx(1.2),
        "acc_final": 1.0,
        "acc_first": 1.0,
        "first_attempt_bonus": 0.2,
        "tool": 1.0,
        "tool_segments": [1],
        "format": 1.0,
        "format_issues": [],
        "replanned": False,
        "answer": "Paris",
        "first_answer": "Paris",
        "answer_words": 1,
        "answer_too_long": False,
        "judgement": "correct",
        "label": "correct",
        "judge": "rules:contains",
    }


def test_executor_wrong_without_replan() -> None:
    traj = one_shot("<answer>Lyon</answer>", "Lyon")
    score, extras = run(executor_reward(traj, "Paris", RULES))
    assert score == approx(0.2 + 0.1)  # acc 0, tool 1, format 1
    assert (extras["acc"], extras["first_attempt_bonus"], extras["judgement"]) == (
        0.0,
        0.0,
        "incorrect",
    )


def test_executor_replan_recomputes_acc_without_bonus_and_splits_tool_segments() -> None:
    # Attempt 1: searched, answered wrong (the answer was cut off by continue_with_plan).
    # Attempt 2 (revised plan): answered right away, no tool call.
    traj = make_traj(
        [(call_text(), record(0)), ("<think>Probably Lyon.</think>\n", None)],
        [("<think>Now sure.</think>\n<answer>Paris</answer>", None)],
        answers=["Lyon", "Paris"],
    )
    assert traj.replanned
    score, extras = run(executor_reward(traj, ["Paris"], RULES, first_correct=False))
    # acc = 1.0 (max after a replan), tool = segments [1, 0] -> 0.5, format = 1
    assert score == approx(0.7 * 1.0 + 0.2 * 0.5 + 0.1 * 1.0)
    assert extras["acc"] == 1.0
    assert extras["acc_first"] == 0.0
    assert extras["first_attempt_bonus"] == 0.0
    assert extras["tool_segments"] == [1, 0]
    assert extras["first_answer"] == "Lyon"
    assert extras["answer"] == "Paris"
    # Without the episode's verdict on the first answer it is reported as unknown.
    _, extras = run(executor_reward(traj, ["Paris"], RULES))
    assert extras["acc_first"] is None


def test_executor_replan_still_wrong() -> None:
    traj = make_traj(
        [(call_text(), record(0)), ("<think>Lyon?</think>\n", None)],
        [(call_text(think="Search again."), record(1)), ("<answer>Marseille</answer>", None)],
        answers=["Lyon", "Marseille"],
    )
    score, extras = run(executor_reward(traj, ["Paris"], RULES))
    assert score == approx(0.0 + 0.2 * 1.0 + 0.1)
    assert extras["tool_segments"] == [1, 1]


def test_tool_segments_ignore_unrecognised_calls() -> None:
    traj = make_traj(
        [(call_text('{"name": "browse", "arguments": {}}'), record(0, name="browse"))],
        [(call_text("{not json"), record(1, body="{not json", name=None))],
        answers=["", ""],
    )
    assert tool_segments(traj, ["search", "web_image_to_image_search"]) == [0, 0]
    assert tool_segments(traj, ["browse"]) == [1, 0]
    # A repaired (non-strict) call still counts as a recognised tool call.
    repaired = "{'name': 'search', 'arguments': {'query_list': ['x']}}"
    traj.tool_calls.append(record(1, body=repaired, name="search"))
    assert tool_segments(traj, ["search"]) == [0, 1]


def test_executor_long_answer_counts_words_not_characters() -> None:
    no_calls = ScriptedChat([])  # an empty script: any judge call would raise
    long_answer = " ".join(["Paris"] * 31)
    traj = one_shot(f"<answer>{long_answer}</answer>", long_answer)
    score, extras = run(executor_reward(traj, ["Paris"], LLMJudge(no_calls)))
    assert no_calls.calls == []
    assert score == approx(0.2 + 0.1)
    assert (extras["acc"], extras["answer_words"], extras["answer_too_long"]) == (0.0, 31, True)
    # 30 words is fine, even though far longer than the reference's 100 characters.
    ok_answer = "Paris is the capital, " + " ".join(["indeed"] * 26)
    assert len(ok_answer.split()) == 30 and len(ok_answer) > 100
    traj = one_shot(f"<answer>{ok_answer}</answer>", ok_answer)
    score, extras = run(executor_reward(traj, ["Paris"], RULES))
    assert score == approx(1.14) and not extras["answer_too_long"]
    # The rule is configurable, and null disables it.
    traj = one_shot(f"<answer>{long_answer}</answer>", long_answer)
    score, _ = run(executor_reward(traj, ["Paris"], RULES, {"max_answer_words": None}))
    assert score == approx(1.14)
    score, _ = run(executor_reward(traj, ["Paris"], RULES, {"max_answer_words": 40}))
    assert score == approx(1.14)


def test_executor_bad_format_repaired_json_and_unknown_tool() -> None:
    repaired = "{'name': 'search', 'arguments': {'query_list': ['capital of France']}}"
    traj = make_traj(
        [
            (call_text(repaired), record(0, body=repaired, name="search")),
            (call_text('{"name": "browse", "arguments": {}}'), record(0, name="browse")),
            ("<think>ok</think>\n<answer>Paris</answer>", None),
        ],
        answers=["Paris"],
    )
    score, extras = run(executor_reward(traj, ["Paris"], RULES))
    assert score == approx(0.7 * 1.2 + 0.2 * 1.0 + 0.1 * 0.0)
    assert extras["format"] == 0.0
    assert extras["format_issues"] == [
        "turn 1: tool call is not valid JSON",
        "turn 2: unknown tool 'browse'",
    ]


def test_executor_bad_format_think_tags_and_missing_answer() -> None:
    traj = make_traj(
        [("<think>unclosed reasoning, and no answer block: Paris", None)], answers=["Paris"]
    )
    score, extras = run(executor_reward(traj, ["Paris"], RULES))
    # acc 1.2 (the loop's extraction found an answer), tool 0, format 0
    assert score == approx(0.84)
    assert extras["format_issues"] == [
        "turn 1: unbalanced <think> tags",
        "no <answer> block",
    ]


def test_executor_no_answer_is_not_attempted_without_a_judge_call() -> None:
    chat = ScriptedChat([])
    traj = make_traj([(call_text(), record(0))], answers=[""])
    score, extras = run(executor_reward(traj, ["Paris"], LLMJudge(chat)))
    assert chat.calls == []
    assert score == approx(0.2)  # tool only: no answer block -> format 0
    assert extras["label"] == "not_attempted"


def test_executor_with_llm_judge_sees_the_final_answer() -> None:
    chat = ScriptedChat(["A"])
    traj = one_shot("<answer>Paris, France</answer>", "Paris, France")
    score, extras = run(executor_reward(traj, ["Paris"], LLMJudge(chat)))
    assert score == approx(1.14)
    prompt = chat.calls[0]["messages"][1]["content"]
    assert "Predicted answer: Paris, France" in prompt
    assert "Gold target: Paris" in prompt
    assert extras["judge"] == "llm"


def test_executor_custom_weights_and_bad_config() -> None:
    traj = one_shot("<answer>Paris</answer>", "Paris")
    cfg = {"acc_weight": 1, "tool_weight": 0, "format_weight": 0, "first_attempt_bonus": 0}
    score, _ = run(executor_reward(traj, ["Paris"], RULES, cfg))
    assert score == 1.0
    with pytest.raises(MiaError, match=r"unknown key\(s\) \['acc_weigth'\]"):
        run(executor_reward(traj, ["Paris"], RULES, {"acc_weigth": 1}))
    with pytest.raises(MiaError, match="max_answer_words must be a positive integer"):
        run(executor_reward(traj, ["Paris"], RULES, {"max_answer_words": 0}))
    with pytest.raises(MiaError, match="acc_weight"):
        load_reward_config(ExecutorRewardConfig, {"acc_weight": "high"})


@pytest.mark.parametrize(
    ("cls", "name"),
    [
        (ExecutorRewardConfig, "executor"),
        (PlannerRewardConfig, "planner"),
        (NoGTRewardConfig, "nogt"),
    ],
)
def test_dataclass_defaults_mirror_yaml(cls: type, name: str) -> None:
    assert load_reward_config(cls, name) == cls()


# --------------------------------------------------------------------------------------------
# Planner (docs/reference.md §7.2)
# --------------------------------------------------------------------------------------------
PLAN = "<think>Memory 1 worked.</think>\n1. Search the capital of France.\n2. Answer."


def planner_record(
    decision: str, answer_first: str, answer_final: str = "", replan: str | None = None
) -> PlannerEpisodeRecord:
    return PlannerEpisodeRecord(
        plan=PLAN,
        decision=decision,
        replan=replan,
        answer_first=answer_first,
        answer_final=answer_final,
        replanned=replan is not None,
        question="What is the capital of France?",
    )


@pytest.mark.parametrize(
    ("rec", "score", "parts"),
    [
        # correct, kept: 0.7*1 + 0.2*1 + 0.05 + 0.05
        (planner_record("<think>fine</think>\nno", "Paris"), 1.0, (1.0, 1.0, 1.0, 1.0)),
        # wrong, kept: only the format point
        (planner_record("<think>fine</think>\nno", "Lyon"), 0.05, (0.0, 0.0, 1.0, 0.0)),
        # wrong, replanned, fixed: 0.7 + 0 + 0.05 + 0.05
        (
            planner_record("<think>doubt</think>\nyes", "Lyon", "Paris", "<think>x</think>1. ..."),
            0.8,
            (1.0, 0.0, 1.0, 1.0),
        ),
        # correct, replanned anyway, broken: 0 + 0.2 + 0.05 + 0
        (
            planner_record("<think>doubt</think>\nYES", "Paris", "Lyon", "1. Search again."),
            0.25,
            (0.0, 1.0, 1.0, 0.0),
        ),
        # wrong, replanned, still wrong; decision not exactly yes/no -> format 0
        (
            planner_record("<think>doubt</think>\nYes, replan.", "Lyon", "Nice", "1. again"),
            0.05,
            (0.0, 0.0, 0.0, 1.0),
        ),
    ],
)
def test_planner_reward_hand_computed(
    rec: PlannerEpisodeRecord, score: float, parts: tuple[float, ...]
) -> None:
    got, extras = run(planner_reward(rec, ["Paris"], RULES))
    assert got == approx(score)
    assert (extras["acc_final"], extras["acc_first"], extras["format"], extras["decision"]) == parts
    assert extras["is_answer1_correct"] == bool(parts[1])
    assert extras["is_answer2_correct"] == bool(parts[0])
    assert extras["judgement"] == ("correct" if parts[0] else "incorrect")


def test_planner_without_replan_ignores_answer_final_and_judges_once() -> None:
    chat = ScriptedChat(["A"])
    rec = planner_record("no", "Paris", answer_final="garbage")
    score, extras = run(planner_reward(rec, ["Paris"], LLMJudge(chat)))
    assert score == approx(1.0)
    assert len(chat.calls) == 1
    assert extras["answer_final"] == "Paris"
    chat = ScriptedChat(["B", "A"])  # answer 1 wrong, answer 2 right
    rec = planner_record("yes", "Lyon", "Paris", "1. again")
    score, extras = run(planner_reward(rec, ["Paris"], LLMJudge(chat)))
    assert score == approx(0.8)
    assert [c["messages"][1]["content"].count("Predicted answer: Lyon") for c in chat.calls] == [
        1,
        0,
    ]


def test_planner_reward_without_reflection_scores_no_decision() -> None:
    """A rollout that ended at the Executor's answer (``episode.reflect=false``): the format
    rule reads the plan only and the decision term is 0, right or wrong."""
    rec = planner_record("", "Paris")
    rec.reflected = False
    got, extras = run(planner_reward(rec, ["Paris"], RULES))
    assert got == approx(0.7 + 0.2 + 0.05)
    assert (extras["format"], extras["decision"], extras["format_issues"]) == (1.0, 0.0, [])
    rec = planner_record("", "Lyon")
    rec.reflected = False
    rec.plan = "<think>1. plan"
    got, extras = run(planner_reward(rec, ["Paris"], RULES))
    assert got == 0.0 and extras["format_issues"] == ["unbalanced <think> tags in the plan"]
    # The same record as a reflecting one: the empty decision is a format issue.
    rec.reflected = True
    assert (
        planner_format(rec)[1][0]
        == "decision must be exactly 'yes' or 'no' after its reasoning, got ''"
    )


def test_planner_evidence_credit_separates_wrong_plans_that_searched_the_right_place() -> None:
    """``evidence_weight``: two wrong rollouts of one group, one whose searches read the
    passage holding the gold, one whose did not, are no longer tied; off (the reference's
    reward) both score the format point only. A replan's final trace is what counts."""
    from mia.trace import format_trace

    def read(text: str) -> str:
        call = '<tool_call>{"name": "search", "arguments": {"query_list": ["France"]}}</tool_call>'
        return format_trace(
            "What is the capital of France?",
            [
                {"role": "assistant", "content": call},
                {"role": "tool", "content": text},
                {"role": "assistant", "content": "<answer>Lyon</answer>"},
            ],
        )

    found = planner_record("<think>fine</think>\nno", "Lyon")
    found.trace_first = read("Doc 1(Title: France) The capital of France is Paris.")
    missed = planner_record("<think>fine</think>\nno", "Lyon")
    missed.trace_first = read("Doc 1(Title: Lyon) Lyon is a city in France.")
    on = {"evidence_weight": 0.1}
    score, extras = run(planner_reward(found, ["Paris"], RULES, on))
    assert (score, extras["evidence"]) == (approx(0.15), 1.0)
    score, extras = run(planner_reward(missed, "Paris", RULES, on))
    assert (score, extras["evidence"]) == (approx(0.05), 0.0)
    # Off: the reference's reward, both 0.05 (the term is not even computed).
    assert run(planner_reward(found, ["Paris"], RULES))[0] == approx(0.05)
    # "Paris-Lyon" holds Paris as a whole word: found. A gold only in the question is not.
    missed.trace_first = read("Doc 1(Title: Trains) Paris-Lyon trains run hourly.")
    assert run(planner_reward(missed, ["Paris"], RULES, on))[0] == approx(0.15)
    missed.trace_first = read("Doc 1(Title: Lyon) Lyon is a city.")
    missed.question = "Is Paris the capital?"
    assert run(planner_reward(missed, ["Paris"], RULES, on))[0] == approx(0.05)
    # Replanned: the final trace (both runs) is read, not the first one alone.
    fixed = planner_record("<think>doubt</think>\nyes", "Lyon", "Lyon", "<think>x</think>1. ...")
    fixed.trace_first = read("Doc 1(Title: Lyon) Lyon is a city.")
    fixed.trace_final = fixed.trace_first + "\n\n" + read("Doc 2(Title: France) Paris it is.")
    assert run(planner_reward(fixed, ["Paris"], RULES, on))[0] == approx(0.05 + 0.05 + 0.1)


def test_planner_format_issues() -> None:
    rec = planner_record("<think>hmm\nyes", "Lyon", "Paris", "<think>replan")
    rec.plan = "</think>1. plan"
    fmt, issues = planner_format(rec)
    assert fmt == 0.0
    assert issues == [
        "decision must be exactly 'yes' or 'no' after its reasoning, got ''",
        "unbalanced <think> tags in the plan",
        "unbalanced <think> tags in the decision",
        "unbalanced <think> tags in the replan",
    ]
    assert planner_format(planner_record(" No <|im_end|>", "x")) == (1.0, [])


def test_record_from_reference_messages() -> None:
    trace1 = (
        "### Question: Q\n\n### Round 1:\n#### Agent Reasoning and Tool Call:\n"
        "<think>guess</think>\n<answer>Lyon</answer>"
    )
    trace2 = (
        "### Round 2:\n#### Agent Reasoning and Tool Call:\n"
        "<think>a</think><answer>wrong</answer><think>b</think>\n<answer>Paris</answer>"
    )
    msgs = [
        {"role": "assistant", "content": PLAN},
        {"role": "user", "content": trace1},
        {"role": "assistant", "content": "<think>x</think>yes"},
        {"role": "user", "content": "replan prompt"},
        {"role": "assistant", "content": [{"type": "text", "text": "1. Search again."}]},
        {"role": "user", "content": trace2},
    ]
    rec = PlannerEpisodeRecord.from_reference_messages(msgs, "Q")
    assert rec == PlannerEpisodeRecord(
        plan=PLAN,
        decision="<think>x</think>yes",
        replan="1. Search again.",
        answer_first="Lyon",
        answer_final="Paris",
        replanned=True,
        question="Q",
        trace_first=trace1,
        trace_final=trace2,
    )
    rec = PlannerEpisodeRecord.from_reference_messages([PLAN, "no answer block here", "no"])
    assert (rec.replanned, rec.answer_first, rec.replan) == (False, "", None)
    with pytest.raises(MiaError, match="must hold 3 .* or 6 .* got 4"):
        PlannerEpisodeRecord.from_reference_messages(["a", "b", "c", "d"])
    assert PlannerEpisodeRecord.from_dict(rec.to_dict()) == rec
    with pytest.raises(MiaError, match=r"unknown field\(s\) \['score'\]"):
        PlannerEpisodeRecord.from_dict({**rec.to_dict(), "score": 1})


def test_answer_from_trace_never_returns_the_trace() -> None:
    assert answer_from_trace("search results: Paris is the capital") == ""
    assert answer_from_trace("Give your answer in <answer> </answer>.\nok") == ""
    assert answer_from_trace("<answer> </answer> prompt\n<answer>Paris</answer>") == "Paris"


# --------------------------------------------------------------------------------------------
# No ground truth (docs/reference.md §7.3)
# --------------------------------------------------------------------------------------------
def panel_chat(verdict: str) -> ScriptedChat:
    def reply(messages: list[dict[str, Any]]) -> str:
        text = messages[-1]["content"]
        if "Score: 8" in text:  # only the arbiter's prompt holds the critics' feedback
            return verdict
        return "Score: 8\nReason: consistent and sourced."

    return ScriptedChat(reply)


def test_nogt_panel_reward_on_a_planner_record() -> None:
    chat = panel_chat("A")
    rec = planner_record("<think>ok</think>no", "Paris")
    rec.trace_first = "### Question: Q\n\n### Round 1:\n<answer>Paris</answer>"
    score, extras = run(nogt_reward(rec, PanelJudge(chat)))
    assert score == approx(0.9 * 1.0 + 0.1 * 1.0)
    assert len(chat.calls) == 4  # three critics + the arbiter
    critic_prompts = [c["messages"][-1]["content"] for c in chat.calls[:3]]
    assert all("Paris" in p for p in critic_prompts)
    assert sum(rec.trace_first in p for p in critic_prompts) == 2  # critic 3 has no trajectory
    assert extras["verdict"] == 1.0
    assert extras["judgement"] == "correct"
    assert extras["panel"]["evaluator_1_feedback"] == "Score: 8\nReason: consistent and sourced."
    assert extras["panel"]["weighted_score"] == approx(0.8)

    score, extras = run(nogt_reward(rec, PanelJudge(panel_chat("B"))))
    assert score == approx(0.1)
    assert extras["judgement"] == "incorrect"


def test_nogt_reward_reads_the_final_answer_and_trace_after_a_replan() -> None:
    chat = panel_chat("A")
    rec = planner_record("yes", "Lyon", "Paris", "1. again")
    rec.trace_first, rec.trace_final = "trace one", "trace two"
    score, extras = run(nogt_reward(rec, PanelJudge(chat), question="Capital?"))
    assert score == approx(1.0)
    first_critic = chat.calls[0]["messages"][-1]["content"]
    assert "trace two" in first_critic and "trace one" not in first_critic
    assert "Capital?" in first_critic
    assert extras["answer"] == "Paris"


def test_nogt_reward_on_a_trajectory_and_empty_answer() -> None:
    traj = one_shot("<answer>Paris</answer>", "Paris")
    score, _ = run(nogt_reward(traj, PanelJudge(panel_chat("A"))))
    assert score == approx(1.0)
    chat = ScriptedChat([])
    rec = planner_record("no", "")
    score, extras = run(nogt_reward(rec, PanelJudge(chat), {"verdict_weight": 0.5}))
    assert chat.calls == []
    assert score == approx(0.1)
    assert extras["label"] == "not_attempted"


def test_nogt_vote_rewards() -> None:
    assert nogt_vote_rewards(["Paris", "the paris.", "Lyon", ""]) == [1.0, 1.0, 0.0, 0.0]
    assert nogt_vote_rewards(["Lyon", "Paris"]) == [1.0, 0.0]  # tie: first seen wins
    assert nogt_vote_rewards(["", " "]) == [0.0, 0.0]
    assert nogt_vote_rewards([]) == []


def test_the_wire_record_has_every_field_of_the_record() -> None:
    """/compute_gt_reward's ``record`` and the dataclass the rewards read cannot drift apart."""
    from dataclasses import fields

    from mia.services.rewards import EpisodeRecord

    assert set(EpisodeRecord.model_fields) == {f.name for f in fields(PlannerEpisodeRecord)}
