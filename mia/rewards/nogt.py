"""Rewards without ground truth (docs/reference.md §7.3).

- :func:`nogt_reward`: ``verdict_weight*panel_verdict + format_weight*format``. The verdict comes
  from a judge that needs no golds -- the review panel (:class:`mia.judge.PanelJudge`: three
  critics + an arbiter) -- reading the question, the trace and the final answer. ``format`` is the
  planner format rule for a :class:`PlannerEpisodeRecord`, the Executor's for a
  :class:`~mia.agent.Trajectory`. The panel's feedbacks come back in ``extras["panel"]`` so they
  can be stored with the memory, as the reference does.
- :func:`nogt_vote_rewards`: majority vote across the n rollouts of one question (TTRL-style):
  1.0 for answers that agree with the most common answer, else 0.0.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mia.agent.protocol import check_format
from mia.agent.trajectory import Trajectory
from mia.judge.base import Judge
from mia.judge.vote import majority_vote
from mia.rewards.config import NoGTRewardConfig, load_reward_config
from mia.rewards.grading import grade
from mia.rewards.planner import PlannerEpisodeRecord, planner_format


async def nogt_reward(
    item: PlannerEpisodeRecord | Trajectory,
    judge: Judge,
    cfg: NoGTRewardConfig | Any = None,
    *,
    question: str | None = None,
) -> tuple[float, dict[str, Any]]:
    """``(score, extras)`` for one rollout, graded without ground truth. ``question`` defaults
    to the item's own. An empty answer scores verdict 0 without calling the panel."""
    c = load_reward_config(NoGTRewardConfig, cfg)
    if isinstance(item, Trajectory):
        answer, trace = item.answer, item.trace
        check = check_format(item.assistant_texts())
        format_score, issues = (1.0 if check.ok else 0.0), check.issues
    else:
        answer, trace = item.final_answer, item.final_trace
        format_score, issues = planner_format(item)
    q = item.question if question is None else question
    verdict = await grade(judge, q, answer, None, trajectory=trace, max_words=c.max_answer_words)
    score = c.verdict_weight * verdict.acc + c.format_weight * format_score
    extras: dict[str, Any] = {
        "score": score,
        "verdict": verdict.acc,
        "format": format_score,
        "format_issues": issues,
        "judgement": "correct" if verdict.correct else "incorrect",
        "label": verdict.label,
        "answer": answer,
        "answer_too_long": verdict.too_long,
        "judge": verdict.judge,
        "panel": verdict.detail,
    }
    return score, extras


def nogt_vote_rewards(group_answers: Sequence[str]) -> list[float]:
    """Per answer of one question's group: 1.0 if it matches the majority answer (SQuAD-normalised;
    ties go to the answer seen first; empty answers never win), else 0.0."""
    return majority_vote(list(group_answers)).rewards
