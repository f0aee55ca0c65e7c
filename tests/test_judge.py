"""mia.judge: rules (hand-computed), answer extraction, the LLM judge and the panel (ScriptedChat:
exact prompts, verdict parsing, failures reported, fallback only when configured), majority vote,
and build_judge from the Hydra configs."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from mia.judge import (
    JudgeConfig,
    JudgeError,
    LLMJudge,
    PanelJudge,
    RuleJudge,
    build_judge,
    contains,
    exact_match,
    extract_answer,
    majority_vote,
    normalize_answer,
    token_f1,
)
from mia.judge.parse import parse_critic, parse_letter
from mia.llm.base import ChatResult, LLMError, SamplingParams
from mia.llm.scripted import ScriptedChat
from mia.prompts import judge as prompts

REPO = Path(__file__).resolve().parents[1]


def run(coro: Any) -> Any:
    return asyncio.run(coro)


# --------------------------------------------------------------------------------------------
# Rules
# --------------------------------------------------------------------------------------------
def test_normalize_answer() -> None:
    assert normalize_answer("  The  Eiffel-Tower!! ") == "eiffeltower"
    assert normalize_answer("A cat, an owl and THE dog.") == "cat owl and dog"
    assert normalize_answer("“Paris”—France") == "parisfrance"  # Unicode punctuation too
    assert normalize_answer("theatre") == "theatre"  # articles only as whole words
    assert normalize_answer("") == ""


def test_exact_match() -> None:
    assert exact_match("the Paris.", "paris") == 1.0
    assert exact_match("Paris, France", "Paris") == 0.0
    assert exact_match("Lyon", ["Paris", "lyon"]) == 1.0
    assert exact_match("", "Paris") == 0.0


def test_token_f1_hand_computed() -> None:
    # pred tokens [new, york, city], gold [new, york]: P = 2/3, R = 1, F1 = 0.8
    assert token_f1("New York City", "new york") == pytest.approx(0.8)
    # pred [barack, obama], gold [obama]: P = 1/2, R = 1 -> 2/3
    assert token_f1("Barack Obama", "Obama") == pytest.approx(2 / 3)
    # repeated tokens match once: pred [x, x, y], gold [x]: same = 1, P = 1/3, R = 1 -> 0.5
    assert token_f1("x x y", "x") == pytest.approx(0.5)
    assert token_f1("Berlin", "Paris") == 0.0
    assert token_f1("Berlin", ["Paris", "berlin"]) == 1.0  # best gold wins
    assert token_f1("", "Paris") == 0.0


def test_contains_whole_tokens() -> None:
    assert contains("I believe it is Paris, France.", "paris") == 1.0
    assert contains("Comparison", "paris") == 0.0  # not a substring match inside a word
    assert contains("The river Seine", ["Thames", "the Seine"]) == 1.0
    assert contains("anything", "the") == 0.0  # a gold that normalises to "" never matches


def test_rule_judge_modes() -> None:
    em = RuleJudge("em").grade_sync("q", "New York City", ["New York"])
    assert (em.label, em.score, em.judge) == ("incorrect", 0.0, "rules:em")
    assert em.detail == {"em": 0.0, "f1": pytest.approx(0.8), "contains": 1.0, "mode": "em"}
    f1 = RuleJudge("f1", f1_threshold=0.75).grade_sync("q", "New York City", "New York")
    assert (f1.label, f1.score) == ("correct", pytest.approx(0.8))
    f1_strict = RuleJudge("f1", f1_threshold=0.9).grade_sync("q", "New York City", "New York")
    assert f1_strict.label == "incorrect"
    c = run(RuleJudge("contains").grade("q", "It is New York City.", "new york"))
    assert (c.label, c.score, c.correct) == ("correct", 1.0, True)
    empty = RuleJudge().grade_sync("q", " ... ", "Paris")
    assert (empty.label, empty.score) == ("not_attempted", 0.0)


def test_rule_judge_bad_input() -> None:
    with pytest.raises(JudgeError, match="mode must be one of"):
        RuleJudge("regex")
    with pytest.raises(JudgeError, match="needs ground-truth answers"):
        RuleJudge().grade_sync("q", "Paris", None)
    with pytest.raises(JudgeError, match="non-empty list"):
        RuleJudge().grade_sync("q", "Paris", [])


@pytest.mark.parametrize(
    "text, answer",
    [
        ("<think>maybe Lyon</think><answer>Paris</answer>", "Paris"),
        ("<answer>Lyon</answer> wait <answer> Paris </answer><|im_end|>", "Paris"),
        # Answer tags inside the reasoning do not count; the text after </think> does.
        ("<think><answer>Lyon</answer></think>\n<answer>Paris</answer>", "Paris"),
        ("<think>a</think>\nIt is Paris.", "It is Paris."),
        (
            "<think>a</think><tool_call>{}</tool_call>user<tool_response>x</tool_response> Paris",
            "Paris",
        ),
        (
            "<tool_response>doc</tool_response>\nassistant\nParis is the answer",
            "Paris is the answer",
        ),
        ("Just Paris", "Just Paris"),
        ("<answer></answer>", "<answer></answer>"),  # empty answer: fall back to the whole text
    ],
)
def test_extract_answer(text: str, answer: str) -> None:
    assert extract_answer(text) == answer


# --------------------------------------------------------------------------------------------
# Parsing
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "reply, letter",
    [
        ("A", "A"),
        (" b\n", "B"),
        ("(C).", "C"),
        ("**A**", "A"),
        ("A: CORRECT", "A"),
        ("The answer is B.", "B"),
        ("Grade: C", "C"),
        ("INCORRECT", "B"),
        ("NOT_ATTEMPTED", "C"),
        ("correct", "A"),
        ("<think>A or B? It says Malia only.</think>\nB", "B"),
        ("A or B", None),
        ("it is correct, or maybe incorrect", None),
        ("no idea", None),
        ("", None),
    ],
)
def test_parse_letter(reply: str, letter: str | None) -> None:
    assert parse_letter(reply) == letter


def test_parse_letter_restricted() -> None:
    assert parse_letter("C", "AB") is None
    assert parse_letter("B", "AB") == "B"


def test_parse_critic() -> None:
    assert parse_critic("- Score: 7\n- Reason: Sound chain of steps.") == (
        7.0,
        "Sound chain of steps.",
    )
    assert parse_critic("**Score**: 8/10\n**Reason**: fine") == (8.0, "fine")
    assert parse_critic("Score: 0\nReason: nothing") == (1.0, "nothing")  # clamped to 1..10
    score, reason = parse_critic("Score: 5\nReason: " + "word " * 80)
    assert score == 5.0 and len(reason.split()) == 50
    assert parse_critic("I cannot score this") == (None, "I cannot score this")


# --------------------------------------------------------------------------------------------
# LLM judge
# --------------------------------------------------------------------------------------------
class FailingChat:
    """A backend whose every call fails the way OpenAIChat does after its retries."""

    name = "judge-endpoint"

    def __init__(self) -> None:
        self.calls = 0

    async def chat(self, messages: Any, params: SamplingParams | None = None) -> ChatResult:
        self.calls += 1
        raise LLMError("LLM endpoint http://127.0.0.1:8002/v1 failed after 4 attempt(s): HTTP 500")

    async def aclose(self) -> None:
        return None


def test_llm_judge_exact_prompt_and_verdicts() -> None:
    chat = ScriptedChat(["A", "B", "C"])
    judge = LLMJudge(chat)
    a = run(judge.grade("Who wrote Hamlet?", "Shakespeare", "William Shakespeare"))
    b = run(judge.grade("Who wrote Hamlet?", "Marlowe", ["William Shakespeare", "Shakespeare"]))
    c = run(judge.grade("Who wrote Hamlet?", "I don't know", "William Shakespeare"))
    assert [(j.label, j.score, j.judge) for j in (a, b, c)] == [
        ("correct", 1.0, "llm"),
        ("incorrect", 0.0, "llm"),
        ("not_attempted", 0.0, "llm"),
    ]
    assert a.detail == {"letter": "A", "raw": "A", "backend": "scripted"}
    first = chat.calls[0]["messages"]
    assert first[0] == {
        "role": "system",
        "content": "You are a helpful assistant that judges the correctness of answers.",
    }
    user = first[1]["content"]
    assert first[1]["role"] == "user"
    assert user.endswith(
        "```\nQuestion: Who wrote Hamlet?\nGold target: William Shakespeare\n"
        "Predicted answer: Shakespeare\n```\n\nGrade the predicted answer of this new question "
        'as one of:\nA: CORRECT\nB: INCORRECT\nC: NOT_ATTEMPTED\n\nJust return the letters "A", '
        '"B", or "C", with no text around it.'
    )
    # The rubric's three example blocks are in the prompt.
    for grade in ("CORRECT", "INCORRECT", "NOT_ATTEMPTED"):
        assert f"The following are examples of {grade} predicted answers." in user
    assert (
        "Gold target: William Shakespeare (also acceptable: Shakespeare)"
        in (chat.calls[1]["messages"][1]["content"])
    )
    assert chat.calls[0]["params"] == SamplingParams(temperature=0.0, max_tokens=256)


def test_llm_judge_noisy_reply() -> None:
    judge = LLMJudge(ScriptedChat(["<think>The gold is fully present.</think>\n**A**"]))
    assert run(judge.grade("q", "p", "g")).label == "correct"


def test_llm_judge_failure_is_reported() -> None:
    backend = FailingChat()
    with pytest.raises(JudgeError, match=r"llm judge \(judge-endpoint\) failed: .*HTTP 500"):
        run(LLMJudge(backend).grade("q", "Paris", "Paris"))
    assert backend.calls == 1  # retries are the backend's job, not repeated here


def test_llm_judge_unparsable_reply_is_reported() -> None:
    with pytest.raises(JudgeError, match="names no verdict A/B/C: 'I am not sure'"):
        run(LLMJudge(ScriptedChat(["I am not sure"])).grade("q", "Paris", "Paris"))


def test_llm_judge_fallback_only_when_configured(caplog: pytest.LogCaptureFixture) -> None:
    judge = LLMJudge(FailingChat(), fallback="rules", fallback_judge=RuleJudge("contains"))
    with caplog.at_level(logging.WARNING, logger="mia.judge.llm"):
        j = run(judge.grade("Capital of France?", "It is Paris", "Paris"))
    assert (j.label, j.score, j.judge) == ("correct", 1.0, "rules:contains (fallback)")
    assert "HTTP 500" in j.detail["fallback_reason"]
    assert "grading with rules:contains instead" in caplog.text
    wrong = run(judge.grade("Capital of France?", "Lyon", "Paris"))
    assert (wrong.label, wrong.judge) == ("incorrect", "rules:contains (fallback)")
    with pytest.raises(JudgeError, match="fallback must be one of"):
        LLMJudge(FailingChat(), fallback="substring")


# --------------------------------------------------------------------------------------------
# Panel
# --------------------------------------------------------------------------------------------
def panel_script(arbiter: str) -> ScriptedChat:
    """Replies chosen by the prompt (critics run concurrently, so order is not fixed)."""

    def reply(messages: list[dict[str, Any]]) -> str:
        text = messages[-1]["content"]
        if text.startswith("You are a Reasoning"):
            return "- Score: 8\n- Reason: Clear steps from search to answer."
        if text.startswith("You are an Information"):
            return "Score: 6/10\nReason: One date is not in the retrieved passages."
        if text.startswith("You are a Result"):
            return "Score: 9\nReason: A direct, substantive answer."
        if text.startswith("You are the Final Arbiter"):
            return arbiter
        raise AssertionError(text[:80])

    return ScriptedChat(reply)


TRAJ = "### Round 1: search Eiffel Tower height\n### Tool: 330 m\n### Round 2: answer 330 m"


def test_panel_prompts_verdict_and_feedbacks() -> None:
    chat = panel_script("A")
    panel = PanelJudge(chat)
    j = run(panel.grade("How tall is the Eiffel Tower?", "330 m", golds="IGNORED", trajectory=TRAJ))
    assert (j.label, j.score, j.judge) == ("correct", 1.0, "panel")
    d = j.detail
    assert d["is_correct"] == "correct" and d["raw_verdict"] == "A"
    assert d["evaluator_1_feedback"] == "- Score: 8\n- Reason: Clear steps from search to answer."
    assert d["evaluator_2_feedback"].startswith("Score: 6/10")
    assert d["evaluator_3_feedback"] == "Score: 9\nReason: A direct, substantive answer."
    assert [c["score"] for c in d["critics"]] == [8.0, 6.0, 9.0]
    assert [c["name"] for c in d["critics"]] == [
        "reasoning_consistency",
        "information_sourcing",
        "result_validity",
    ]
    assert d["weighted_score"] == pytest.approx((0.5 * 8 + 0.3 * 6 + 0.2 * 9) / 10)

    calls = {c["messages"][0]["content"].split(".")[0]: c for c in chat.calls}
    assert len(chat.calls) == 4
    c1 = calls["You are a Reasoning and Logical Consistency Evaluator"]["messages"][0]["content"]
    c3 = calls["You are a Result Validity Evaluator"]["messages"][0]["content"]
    assert f"- Execution Trajectory (Trajectory): {TRAJ}\n" in c1
    assert "- Agent Final Output (Final Output): 330 m\n" in c1
    assert "Trajectory" not in c3  # critic 3 judges the output alone
    assert "IGNORED" not in str(chat.calls)  # the panel never sees ground truth
    arb = chat.calls[-1]["messages"][0]["content"]
    assert arb.startswith("You are the Final Arbiter")
    assert (
        "- Evaluator 1 Feedback (Reasoning and Logical Consistency, Importance Weight: 0.5):\n"
        "- Score: 8\n- Reason: Clear steps from search to answer.\n"
    ) in arb
    assert "(Information Sourcing and Credibility, Importance Weight: 0.3):\nScore: 6/10" in arb
    assert "(Result Validity, Importance Weight: 0.2):\nScore: 9" in arb
    assert calls["You are a Result Validity Evaluator"]["params"] == SamplingParams(
        temperature=0.1, max_tokens=1000
    )
    assert chat.calls[-1]["params"] == SamplingParams(temperature=0.0, max_tokens=16)


def test_panel_incorrect_and_noisy_verdicts() -> None:
    for reply, label in [("B", "incorrect"), ("**B**.", "incorrect"), ("A.", "correct")]:
        chat = panel_script(reply)
        assert run(PanelJudge(chat).grade("q", "p", trajectory="t")).label == label


def test_panel_critics_run_concurrently() -> None:
    state = {"in_flight": 0, "max": 0}

    class SlowChat:
        name = "slow"

        async def chat(self, messages: Any, params: Any = None) -> ChatResult:
            state["in_flight"] += 1
            state["max"] = max(state["max"], state["in_flight"])
            await asyncio.sleep(0.05)
            state["in_flight"] -= 1
            arbiter = messages[0]["content"].startswith("You are the Final Arbiter")
            return ChatResult(text="A" if arbiter else "Score: 5\nReason: ok")

        async def aclose(self) -> None:
            return None

    j = run(PanelJudge(SlowChat()).grade("q", "p", trajectory="t"))
    assert j.label == "correct"
    assert state["max"] == 3


def test_panel_failures_are_reported() -> None:
    with pytest.raises(JudgeError, match="critic 1 .* call failed: .*HTTP 500"):
        run(PanelJudge(FailingChat()).grade("q", "p", trajectory="t"))
    chat = panel_script("I cannot decide")
    with pytest.raises(JudgeError, match="arbiter reply names no verdict A/B"):
        run(PanelJudge(chat).grade("q", "p", trajectory="t"))
    chat = panel_script("C")
    with pytest.raises(JudgeError, match="names no verdict A/B"):
        run(PanelJudge(chat).grade("q", "p", trajectory="t"))


def test_panel_long_and_empty_trajectory() -> None:
    chat = panel_script("A")
    run(PanelJudge(chat, max_trajectory_chars=100).grade("q", "p", trajectory="x" * 60 + "y" * 60))
    c1 = chat.calls[0]["messages"][0]["content"]
    assert "x" * 50 + "\n...[20 characters omitted]...\n" + "y" * 50 in c1
    chat = panel_script("A")
    run(PanelJudge(chat).grade("q", "p"))
    assert "(no trajectory recorded)" in chat.calls[0]["messages"][0]["content"]


def test_panel_weights_come_from_config() -> None:
    chat = panel_script("A")
    run(PanelJudge(chat, weights=(0.6, 0.2, 0.2)).grade("q", "p", trajectory="t"))
    assert "Importance Weight: 0.6)" in chat.calls[-1]["messages"][0]["content"]


# --------------------------------------------------------------------------------------------
# Majority vote
# --------------------------------------------------------------------------------------------
def test_majority_vote_basic() -> None:
    v = majority_vote(["Paris", "the paris.", "Lyon", "PARIS", "Lyon"])
    assert (v.answer, v.normalized, v.votes) == ("Paris", "paris", 3)
    assert v.counts == {"paris": 3, "lyon": 2}
    assert v.agreement == [0.6, 0.6, 0.4, 0.6, 0.4]
    assert v.rewards == [1.0, 1.0, 0.0, 1.0, 0.0]
    assert v.share == pytest.approx(0.6)


def test_majority_vote_ties_and_empties() -> None:
    tie = majority_vote(["Lyon", "Paris", "paris", "lyon"])
    assert (tie.answer, tie.votes) == ("Lyon", 2)  # first seen wins the tie
    assert tie.rewards == [1.0, 0.0, 0.0, 1.0]
    empties = majority_vote(["", "Paris", " . "])
    assert (empties.answer, empties.votes) == ("Paris", 1)
    assert empties.agreement == [0.0, 1 / 3, 0.0]
    assert empties.rewards == [0.0, 1.0, 0.0]
    none = majority_vote(["", "  "])
    assert (none.answer, none.votes, none.rewards, none.share) == ("", 0, [0.0, 0.0], 0.0)
    assert majority_vote([]).rewards == []


# --------------------------------------------------------------------------------------------
# build_judge
# --------------------------------------------------------------------------------------------
def test_build_judge_from_configs() -> None:
    rules = build_judge(OmegaConf.load(REPO / "configs/judge/rules.yaml"))
    assert isinstance(rules, RuleJudge) and (rules.mode, rules.f1_threshold) == ("contains", 0.5)
    assert isinstance(build_judge(), RuleJudge)
    chat = ScriptedChat(["B"])
    llm = build_judge(OmegaConf.load(REPO / "configs/judge/llm.yaml"), roles={"judge": chat})
    assert isinstance(llm, LLMJudge) and llm.backend is chat and llm.fallback is None
    assert run(llm.grade("q", "p", "g")).label == "incorrect"
    panel = build_judge(OmegaConf.load(REPO / "configs/judge/panel.yaml"), backend=chat)
    assert isinstance(panel, PanelJudge) and panel.weights == (0.5, 0.3, 0.2)
    assert panel.critic_params == SamplingParams(temperature=0.1, max_tokens=1000)


def test_judge_config_defaults_mirror_yaml() -> None:
    default = JudgeConfig()
    for name in ("rules", "llm", "panel"):
        data = OmegaConf.to_container(OmegaConf.load(REPO / f"configs/judge/{name}.yaml"))
        for key, value in data.items():  # type: ignore[union-attr]
            if key != "type":
                assert getattr(default, key) == value, (name, key)


def test_build_judge_fallback_config() -> None:
    judge = build_judge({"type": "llm", "fallback": "rules", "mode": "em"}, backend=FailingChat())
    j = run(judge.grade("q", "Paris", "paris"))
    assert (j.label, j.judge) == ("correct", "rules:em (fallback)")


@pytest.mark.parametrize(
    "cfg, with_backend, message",
    [
        ({"type": "oracle"}, False, "type must be one of"),
        ({"type": "llm"}, False, "needs a chat backend: pass backend= or roles with role 'judge'"),
        ({"type": "rules", "mdoe": "em"}, False, "unknown key"),
        ({"type": "panel", "fallback": "rules"}, True, "panel judge has no fallback"),
        ({"type": "llm", "sampling": {"temp": 1}}, True, "bad sampling"),
    ],
)
def test_build_judge_bad_config(cfg: dict[str, Any], with_backend: bool, message: str) -> None:
    backend = ScriptedChat([]) if with_backend else None
    with pytest.raises(JudgeError, match=message):
        build_judge(cfg, backend=backend)


def test_grader_prompt_has_placeholders() -> None:
    filled = prompts.GRADER_TEMPLATE.format(question="Q?", gold="G", prediction="P")
    assert "Question: Q?\nGold target: G\nPredicted answer: P\n" in filled
