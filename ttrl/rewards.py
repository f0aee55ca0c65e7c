"""How a TTRL rollout is judged, by mode:

- ``supervised``: the Planner reward (docs/reference.md §7.2) against the ground truth with the
  configured judge (:class:`mia.rewards.planner.PlannerReward`);
- ``nogt`` + ``panel``: ``0.9*panel_verdict + 0.1*format`` (§7.3), the review panel reads the
  question, the Executor's trace and its final answer (:class:`PanelReward`);
- ``nogt`` + ``vote``: ``0.9*agrees_with_majority + 0.1*format`` -- majority vote over the final
  answers of a question's n rollouts, applied to the whole group after the rollouts
  (:class:`VoteGroupReward`).

Every reward's extras carry ``judgement`` (``correct``/``incorrect``): what the memory stores.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mia.judge.base import Judge
from mia.judge.vote import majority_vote
from mia.rewards import NoGTRewardConfig, load_reward_config, nogt_reward
from mia.rewards.planner import planner_format
from mia.rl.trainer import RolloutResult, group_results

MODES = ("supervised", "nogt")
NOGT_METHODS = ("panel", "vote")


class PanelReward:
    def __init__(self, judge: Judge, cfg: NoGTRewardConfig | Mapping[str, Any] | None = None):
        self.judge = judge
        self.cfg = load_reward_config(NoGTRewardConfig, cfg)

    async def __call__(
        self, sample: Mapping[str, Any], rollout: Any
    ) -> tuple[float, dict[str, Any]]:
        return await nogt_reward(rollout.record, self.judge, self.cfg, question=rollout.question)


def pending_vote(sample: Mapping[str, Any], rollout: Any) -> tuple[float, dict[str, Any]]:
    """The per-rollout placeholder of vote mode: the group hook sets the real reward."""
    return 0.0, {}


class VoteGroupReward:
    """Rescores each group in place: 1 for an answer agreeing with the group's majority (SQuAD
    normalised; empty answers never win), plus the planner format score."""

    def __init__(self, cfg: NoGTRewardConfig | Mapping[str, Any] | None = None) -> None:
        self.cfg = load_reward_config(NoGTRewardConfig, cfg)

    def __call__(self, results: list[RolloutResult]) -> None:
        for group in group_results(results).values():
            ok = [r for r in group if r.error is None and r.trajectory is not None]
            vote = majority_vote([r.trajectory.final_answer for r in ok])
            for r, agree, share in zip(ok, vote.rewards, vote.agreement, strict=True):
                fmt, issues = planner_format(r.trajectory.record)
                score = self.cfg.verdict_weight * agree + self.cfg.format_weight * fmt
                r.reward = score
                r.extras = {
                    "score": score,
                    "verdict": agree,
                    "format": fmt,
                    "format_issues": issues,
                    "judgement": "correct" if agree else "incorrect",
                    "vote_share": vote.share,
                    "agreement": share,
                    "vote_answer": vote.answer,
                    "answer": r.trajectory.final_answer,
                }
