"""The Executor GRPO episode (docs/reference.md §6, ``tool_agent_loop``) and its reward (§7.1).

One rollout = one pass of :class:`mia.planner.flow.PlannerFlow`: the Executor loop (token mode:
exact ids, mask 1 on sampled tokens, 0 on tool observations and injected turns) follows the
sample's plan; the reflection is the judge's verdict on the first answer, and a wrong one gets
ONE supplementary plan from memory_serve ``/replan_train`` (the Planner's synthetic "the answer
was wrong, replan" conversation); the loop continues with a fresh turn budget.

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
from mia.planner.flow import FlowConfig, PlannerFlow, PlannerRun, Task
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
        result = (out.plan, out.context)
        self._plans[key] = result
        return result

    async def run(self, sample: Mapping[str, Any], rollout: Rollout) -> Trajectory:
        """One rollout: :class:`~mia.planner.flow.PlannerFlow` with the trainable loop as the
        Executor and :class:`TrainingPlanner` (the judge reflects, ``/replan_train`` replans)."""
        plan, context = await self.plan_for(sample)
        plan = strip_image_tokens(plan)  # as the reference: only the prompt places images
        loop = self.make_loop(rollout.generator, rollout.sampling)
        can_replan = self.replan and self.memory is not None and loop.cfg.max_replans >= 1
        executor = LoopExecutor(loop)
        planner = TrainingPlanner(self, sample, plan, context)
        flow = PlannerFlow(
            planner,
            executor,
            FlowConfig(max_replans=1 if can_replan else 0, judge_trace_max_chars=None),
        )
        run = await flow.run(Task.from_sample({**sample, "plan": plan}))
        traj = executor.traj
        traj.state["first_correct"] = planner.first_correct
        traj.state["memory_context"] = context
        traj.state["states"] = list(run.states)
        if run.replan_raw is not None:
            traj.state["replan_text"] = run.replan
        return traj

    async def aclose(self) -> None:
        await super().aclose()
        if self.memory is not None:
            await self.memory.aclose()


class LoopExecutor:
    """The trainable Executor loop behind the flow: it keeps the token trajectory (``traj``)
    and answers the flow with serve's JSON view of it."""

    def __init__(self, loop: Any) -> None:
        self.loop = loop
        self.traj: Trajectory | None = None

    @staticmethod
    def _view(traj: Trajectory) -> dict[str, Any]:
        return {"answer": traj.answer, "trace": traj.trace, "messages": traj.messages}

    async def execute(
        self,
        question: str,
        plan: str,
        *,
        data_id: str | None = None,
        images: Sequence[str] = (),
        temperature: float | None = None,
        seed: int | None = None,
    ) -> dict[str, Any]:
        task = {"question": question, "plan": plan, "data_id": data_id, "images": list(images)}
        self.traj = await self.loop.run(task)
        return self._view(self.traj)

    async def continue_(
        self,
        question: str,
        messages: Sequence[Mapping[str, Any]],
        replan: str,
        *,
        data_id: str | None = None,
        images: Sequence[str] = (),
    ) -> dict[str, Any]:
        assert self.traj is not None, "continue_ before execute"
        await self.loop.continue_with_plan(self.traj, replan)
        return self._view(self.traj)


class TrainingPlanner:
    """The Planner of Executor training: the sample's plan; the reflection is the judge's
    verdict (a wrong first answer asks for a replan); the replan is memory_serve
    ``/replan_train`` (the Planner's synthetic "the answer was wrong" conversation)."""

    name = "replan_train"
    reflects = True

    def __init__(
        self, episode: ExecutorEpisode, sample: Mapping[str, Any], plan: str, context: str
    ) -> None:
        self.episode = episode
        self.sample = sample
        self.plan_text = plan
        self.context = context
        self.first_correct = False

    async def plan(self, run: PlannerRun) -> bool:
        run.plan = run.plan_raw = self.plan_text
        run.memory_context = self.context
        return True

    async def reflect(self, run: PlannerRun, trace: str) -> bool:
        first = run.first or {}
        graded = await grade(
            self.episode.judge,
            run.question,
            str(first.get("answer", "")),
            list(self.sample.get("golds") or []),
            trajectory=str(first.get("trace", "")),
            max_words=self.episode.reward_cfg.max_answer_words,
        )
        self.first_correct = graded.correct
        run.need_replan = not graded.correct
        run.decision_raw = "no" if graded.correct else "yes"
        return True

    async def replan(self, run: PlannerRun) -> bool:
        assert self.episode.memory is not None  # the flow replans only when it can
        out = await self.episode.memory.replan_train(
            run.question,
            self.plan_text,
            str((run.first or {}).get("trace", "")),
            self.context,
            data_id=self.sample.get("data_id"),
            image_caption=self.sample.get("image_caption") or None,
        )
        run.replan = run.replan_raw = out.content
        return True


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
