"""The Executor GRPO reward (docs/reference.md §7.1), over one :class:`~mia.agent.Trajectory`.

``score = acc_weight*acc + tool_weight*tool + format_weight*format`` where

- ``acc``: the judge's verdict on the final answer (1/0). Correct on the first attempt without a
  replan adds ``first_attempt_bonus`` (acc 1.2 with the defaults); after the one replan acc is
  the verdict on the final answer, at most 1.0. Answers longer than ``max_answer_words`` WORDS
  score 0 without a judge call (the reference counted characters).
- ``tool``: the share of attempts (the first plan, then each revised plan) that contain at least
  one recognised tool call -- parsed, with a name in ``tool_names``, whatever its arguments (bad
  arguments cost format points instead).
- ``format``: 1 if :func:`mia.agent.protocol.check_format` finds nothing wrong, else 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mia.agent.protocol import check_format
from mia.agent.trajectory import Trajectory
from mia.judge.base import Judge
from mia.rewards.config import ExecutorRewardConfig, load_reward_config
from mia.rewards.grading import grade


def tool_segments(traj: Trajectory, tool_names: Sequence[str]) -> list[int]:
    """Per attempt: 1 if it made at least one recognised tool call, else 0."""
    n = max(1, len(traj.attempts))
    used = [0] * n
    names = set(tool_names)
    for call in traj.tool_calls:
        if call.name in names and 0 <= call.attempt < n:
            used[call.attempt] = 1
    return used


def tool_score(traj: Trajectory, tool_names: Sequence[str]) -> float:
    used = tool_segments(traj, tool_names)
    return sum(used) / len(used)


async def executor_reward(
    traj: Trajectory,
    golds: str | Sequence[str],
    judge: Judge,
    cfg: ExecutorRewardConfig | Any = None,
    *,
    first_correct: bool | None = None,
) -> tuple[float, dict[str, Any]]:
    """``(score, extras)`` for one Executor rollout.

    ``first_correct``: the verdict on the first answer when the episode already judged it (to
    decide on the replan); only reported in ``extras`` -- it is not re-judged here, because after
    a replan only the final answer counts.
    """
    c = load_reward_config(ExecutorRewardConfig, cfg)
    final = await grade(
        judge,
        traj.question,
        traj.answer,
        golds,
        trajectory=traj.trace,
        max_words=c.max_answer_words,
    )
    bonus = c.first_attempt_bonus if final.correct and not traj.replanned else 0.0
    acc = final.acc + bonus
    if traj.replanned:
        acc_first = None if first_correct is None else float(first_correct)
    else:
        acc_first = final.acc
    segments = tool_segments(traj, c.tool_names)
    tool = sum(segments) / len(segments)
    fmt = check_format(traj.assistant_texts(), c.tool_names)
    format_score = 1.0 if fmt.ok else 0.0
    score = c.acc_weight * acc + c.tool_weight * tool + c.format_weight * format_score
    extras: dict[str, Any] = {
        "score": score,
        "acc": acc,
        "acc_final": final.acc,
        "acc_first": acc_first,
        "first_attempt_bonus": bonus,
        "tool": tool,
        "tool_segments": segments,
        "format": format_score,
        "format_issues": fmt.issues,
        "replanned": traj.replanned,
        "answer": traj.answer,
        "first_answer": traj.first_answer,
        "answer_words": final.words,
        "answer_too_long": final.too_long,
        "judgement": "correct" if final.correct else "incorrect",
        "label": final.label,
        "judge": final.judge,
    }
    return score, extras
