"""The Executor GRPO episode (docs/reference.md §6, ``tool_agent_loop``) and its reward (§7.1).

One rollout = the Executor loop (token mode: exact ids, mask 1 on sampled tokens, 0 on tool
observations and injected turns) with the sample's plan; the first answer is judged, and a wrong
one gets ONE supplementary plan from memory_serve ``/replan_train`` (the Planner's synthetic
"the answer was wrong, replan" conversation) and the loop continues with a fresh turn budget.

Plans come from the data (the reference's precomputed ``plan`` column) or, when a row has none,
from memory_serve ``/plan`` -- once per question, shared by its n rollouts, as the column would
be. All per-rollout state (plan, replan, first verdict) lives in the returned trajectory.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from mia.agent import AgentConfig, Tool, ToolSet, Trajectory
from mia.errors import MiaError
from mia.judge.base import Judge
from mia.prompts.executor import strip_image_tokens
from mia.rewards import ExecutorRewardConfig, executor_reward, grade, load_reward_config
from mia.rl.episode import AgentEpisode, Rollout
from mia.services import MemoryClient

log = logging.getLogger("executor_train")


class ExecutorEpisode(AgentEpisode):
    """``await ExecutorEpisode(...).run(sample, rollout) -> mia.agent.Trajectory``.

    ``memory``: the memory_serve client for ``/plan`` (rows without a plan) and
    ``/replan_train``; None trains without replans (and needs plans in the data).
    ``replan``: False disables the replan on failure.
    ``missing_plan``: what a row without a plan gets: ``plan`` (memory_serve ``/plan``) or
    ``none`` (no guide: the Executor alone, as the eval policy ``none``).
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
        if missing_plan not in ("plan", "none"):
            raise MiaError(f"missing_plan must be plan | none, got {missing_plan!r}")
        self.missing_plan = missing_plan
        self.judge = judge
        self.memory = memory
        self.reward_cfg = load_reward_config(ExecutorRewardConfig, reward_cfg)
        self.replan = replan
        self._plans: dict[str, tuple[str, str]] = {}
        self._pending: dict[str, asyncio.Task] = {}

    async def plan_for(self, sample: Mapping[str, Any]) -> tuple[str, str]:
        """``(plan, memory context)`` of a sample: its own columns, else memory_serve /plan."""
        if sample.get("plan"):
            return str(sample["plan"]), str(sample.get("memory_context") or "")
        if self.missing_plan == "none":
            return "", str(sample.get("memory_context") or "")
        if self.memory is None:
            raise MiaError(
                f"sample {sample.get('data_id')!r} has no plan column and no memory_serve URL "
                "is configured (services.memory_url) to plan it"
            )
        key = str(sample.get("data_id") or sample["question"])
        if key in self._plans:
            return self._plans[key]
        task = self._pending.get(key)
        if task is None or task.get_loop() is not asyncio.get_running_loop():
            task = asyncio.ensure_future(
                self.memory.plan(
                    str(sample["question"]),
                    image_caption=sample.get("image_caption") or None,
                    data_id=sample.get("data_id"),
                )
            )
            self._pending[key] = task
        try:
            out = await asyncio.shield(task)
        finally:
            if task.done():
                self._pending.pop(key, None)
        result = (str(out.get("plan", "")), str(out.get("context", "")))
        self._plans[key] = result
        return result

    async def run(self, sample: Mapping[str, Any], rollout: Rollout) -> Trajectory:
        plan, context = await self.plan_for(sample)
        plan = strip_image_tokens(plan)  # as the reference: only the prompt places images
        loop = self.make_loop(rollout.generator, rollout.sampling)
        task = {
            "question": sample["question"],
            "plan": plan,
            "data_id": sample.get("data_id"),
            "images": list(sample.get("images") or []),
        }
        traj = await loop.run(task)
        first = await grade(
            self.judge,
            traj.question,
            traj.answer,
            list(sample.get("golds") or []),
            trajectory=traj.trace,
            max_words=self.reward_cfg.max_answer_words,
        )
        traj.state["first_correct"] = first.correct
        traj.state["memory_context"] = context
        if first.correct or not self.replan or self.memory is None or loop.cfg.max_replans < 1:
            return traj
        replan = await self.memory.replan_train(
            traj.question,
            plan,
            traj.trace,
            context,
            data_id=sample.get("data_id"),
            image_caption=sample.get("image_caption") or None,
        )
        traj.state["replan_text"] = replan
        if replan.strip():
            await loop.continue_with_plan(traj, replan)
        return traj

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
        golds = list(sample.get("golds") or [])
        if not golds:
            raise MiaError(f"sample {sample.get('data_id')!r} has no ground-truth answer")
        return await executor_reward(
            traj, golds, self.judge, self.cfg, first_correct=traj.state.get("first_correct")
        )
