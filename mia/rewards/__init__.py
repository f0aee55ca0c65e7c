"""Rewards as pure functions with weights in config (``configs/reward/*.yaml``).

Every reward returns ``(score, extras)``; ``extras`` holds the components for logging.

    from mia.judge import build_judge
    from mia.rewards import executor_reward, planner_reward, nogt_reward, nogt_vote_rewards

    judge = build_judge()                                  # rules, containment
    score, extras = await executor_reward(traj, ["Paris"], judge)          # docs/reference.md §7.1
    score, extras = await planner_reward(record, ["Paris"], judge)         # §7.2
    score, extras = await nogt_reward(record, panel_judge)                 # §7.3
    rewards = nogt_vote_rewards(["Paris", "paris", "Lyon"])               # [1.0, 1.0, 0.0]

Reward functions for the reward server (user feedback) live in :mod:`mia.rewards.hooks`.
"""

from __future__ import annotations

from mia.rewards.config import (
    ExecutorRewardConfig,
    NoGTRewardConfig,
    PlannerRewardConfig,
    load_reward_config,
)
from mia.rewards.executor import executor_reward, tool_score, tool_segments
from mia.rewards.grading import Graded, answer_from_trace, grade, word_count
from mia.rewards.nogt import nogt_reward, nogt_vote_rewards
from mia.rewards.planner import PlannerEpisodeRecord, planner_format, planner_reward

__all__ = [
    "ExecutorRewardConfig",
    "Graded",
    "NoGTRewardConfig",
    "PlannerEpisodeRecord",
    "PlannerRewardConfig",
    "answer_from_trace",
    "executor_reward",
    "grade",
    "load_reward_config",
    "nogt_reward",
    "nogt_vote_rewards",
    "planner_format",
    "planner_reward",
    "tool_score",
    "tool_segments",
    "word_count",
]
