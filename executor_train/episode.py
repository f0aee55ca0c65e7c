"""The Executor GRPO episode (docs/reference.md §6, ``tool_agent_loop``) and its reward (§7.1).

One rollout = one pass of :class:`mia.planner.flow.PlannerFlow`
(:mod:`mia.planner.executor_rollout`, shared with veRL's ``mia_executor`` agent loop): the
Executor loop (token mode: exact ids, mask 1 on sampled tokens, 0 on tool observations and
injected turns) follows the sample's plan; the reflection is the judge's verdict on the first answer, and a wrong one gets
ONE supplementary plan from memory_serve ``/replan_train`` (the Planner's synthetic "the answer
was wrong, replan" conversation); the loop continues with a fresh turn budget.

Plans come from the data (the reference's precomputed ``plan`` column) or, when a row has none,
from memory_serve ``/plan`` -- once per question, shared by its n rollouts, as the column would
be. All per-rollout state (plan, replan, first verdict) lives in the returned trajectory.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from mia.agent import AgentConfig, Tool, ToolSet, Trajectory
from mia.judge.base import Judge
from mia.planner.executor_rollout import (
    LoopExecutor,
    PlanSource,
    TrainingPlanner,
    run_executor_rollout,
)
from mia.rewards import ExecutorRewardConfig, executor_reward, load_reward_config
from mia.rewards.grading import sample_golds
from mia.rl.episode import AgentEpisode, Rollout
from mia.services import MemoryClient

__all__ = ["ExecutorEpisode", "ExecutorReward", "LoopExecutor", "TrainingPlanner"]

log = logging.getLogger("executor_train")


class ExecutorEpisode(AgentEpisode):
    """``await ExecutorEpisode(...).run(sample, rollout) -> mia.agent.Trajectory``.

    ``memory``: the memory_serve client for ``/plan`` (rows without a plan) and
    ``/replan_train``; None trains without replans (and needs plans in the data).
    ``replan``: False disables the replan on failure.
    ``missing_plan``: what a row without a plan gets: ``plan`` (memory_serve ``/plan``) or
    ``none`` (no guide: the Executor alone, as the eval policy ``none``).
    The rollout itself is :func:`mia.planner.executor_rollout.run_executor_rollout`, which
    veRL's ``mia_executor`` agent loop runs too.
    """

    def __init__(
        self,
        tools: ToolSet | Sequence[Tool] | Mapping[str, Any] | None,
        cfg: AgentConfig | Mapping[str, Any] | None,
        *,
        judge: Judge,
        memory: MemoryClient | None = None,
        reward_cfg: ExecutorRewardConfig | Mapping[str, Any] | None = None,
        replan: bool = True,
        chat_template_kwargs: dict[str, Any] | None = None,
        loop_cls: type | None = None,
        missing_plan: str = "plan",
    ) -> None:
        super().__init__(tools, cfg, loop_cls=loop_cls, chat_template_kwargs=chat_template_kwargs)
        self.plans = PlanSource(memory, missing_plan)
        self.missing_plan = missing_plan
        self.judge = judge
        self.memory = memory
        self.reward_cfg = load_reward_config(ExecutorRewardConfig, reward_cfg)
        self.replan = replan

    async def plan_for(self, sample: Mapping[str, Any]) -> tuple[str, str]:
        """``(plan, memory context)`` of a sample: its own columns, else memory_serve /plan."""
        return await self.plans.plan_for(sample)

    async def run(self, sample: Mapping[str, Any], rollout: Rollout) -> Trajectory:
        """One rollout: :func:`~mia.planner.executor_rollout.run_executor_rollout` on the
        trainable loop (the judge reflects, ``/replan_train`` replans)."""
        return await run_executor_rollout(
            self.make_loop(rollout.generator, rollout.sampling),
            sample,
            plans=self.plans,
            judge=self.judge,
            memory=self.memory,
            replan=self.replan,
            max_answer_words=self.reward_cfg.max_answer_words,
        )

    async def aclose(self) -> None:
        await super().aclose()
        if self.memory is not None:
            await self.memory.aclose()


class ExecutorReward:
    """``reward(sample, trajectory) -> (score, extras)``: docs/reference.md §7.1 with ``judge``."""

    def __init__(self, judge: Judge, cfg: ExecutorRewardConfig | Mapping[str, Any] | None = None):
        self.judge = judge
        self.cfg = load_reward_config(ExecutorRewardConfig, cfg)

    async def __call__(
        self, sample: Mapping[str, Any], traj: Trajectory
    ) -> tuple[float, dict[str, Any]]:
        golds = sample_golds(sample)
        return await executor_reward(
            traj, golds, self.judge, self.cfg, first_correct=traj.state.get("first_correct")
        )
