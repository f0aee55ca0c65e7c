"""One Executor GRPO rollout (docs/reference.md §6, ``tool_agent_loop``), written once.

A rollout is one pass of :class:`mia.planner.flow.PlannerFlow` with the trainable Executor loop
(:class:`LoopExecutor`) and :class:`TrainingPlanner`: the sample's plan; the reflection is the
judge's verdict on the first answer; a wrong one gets ONE supplementary plan from memory_serve
``/replan_train`` (the Planner's synthetic "the answer was wrong, replan" conversation) and the
loop continues with a fresh turn budget. Both engines run it: ``mia.rl``'s
:class:`executor_train.episode.ExecutorEpisode` and veRL's ``mia_executor`` agent loop
(:mod:`mia.verl.agent_loops`); they differ only in where the loop's tokens come from.

Plans come from the data (the reference's precomputed ``plan`` column) or, when a row has none,
from memory_serve ``/plan`` -- once per question, shared by its concurrent rollouts
(:class:`PlanSource`). All per-rollout state (plan, replan, first verdict) lives in the returned
trajectory.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from mia.agent import Trajectory
from mia.errors import MiaError
from mia.judge.base import Judge
from mia.planner.flow import FlowConfig, PlannerFlow, PlannerRun, Task
from mia.prompts.executor import strip_image_tokens
from mia.rewards import grade
from mia.services import MemoryClient

MISSING_PLAN = ("plan", "none")


class PlanSource:
    """``(plan, memory context)`` of a sample: its own columns, else memory_serve ``/plan``
    (``missing_plan="plan"``; one request per question, shared by the rollouts that ask at the
    same time and remembered after), else no guide (``"none"``: the Executor alone)."""

    def __init__(self, memory: MemoryClient | None, missing_plan: str = "plan") -> None:
        if missing_plan not in MISSING_PLAN:
            raise MiaError(f"missing_plan must be plan | none, got {missing_plan!r}")
        self.memory = memory
        self.missing_plan = missing_plan
        self._plans: dict[str, tuple[str, str]] = {}
        self._pending: dict[str, asyncio.Task] = {}

    async def plan_for(self, sample: Mapping[str, Any]) -> tuple[str, str]:
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
        images: Sequence[Any] = (),
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
        images: Sequence[Any] = (),
    ) -> dict[str, Any]:
        assert self.traj is not None, "continue_ before execute"
        await self.loop.continue_with_plan(self.traj, replan)
        return self._view(self.traj)


class TrainingPlanner:
    """The Planner of Executor training: the sample's plan; the reflection is ``judge``'s
    verdict on the first answer (a wrong one asks for a replan; answers over
    ``max_answer_words`` are wrong, as in the reward); the replan is memory_serve
    ``/replan_train``."""

    name = "replan_train"
    reflects = True

    def __init__(
        self,
        sample: Mapping[str, Any],
        plan: str,
        context: str,
        *,
        judge: Judge,
        memory: MemoryClient | None,
        max_answer_words: int | None = None,
    ) -> None:
        self.sample = sample
        self.plan_text = plan
        self.context = context
        self.judge = judge
        self.memory = memory
        self.max_answer_words = max_answer_words
        self.first_correct = False

    async def plan(self, run: PlannerRun) -> bool:
        run.plan = run.plan_raw = self.plan_text
        run.memory_context = self.context
        return True

    async def reflect(self, run: PlannerRun, trace: str) -> bool:
        first = run.first or {}
        graded = await grade(
            self.judge,
            run.question,
            str(first.get("answer", "")),
            list(self.sample.get("golds") or []),
            trajectory=str(first.get("trace", "")),
            max_words=self.max_answer_words,
        )
        self.first_correct = graded.correct
        run.need_replan = not graded.correct
        run.decision_raw = "no" if graded.correct else "yes"
        return True

    async def replan(self, run: PlannerRun) -> bool:
        assert self.memory is not None  # the flow replans only when it can
        out = await self.memory.replan_train(
            run.question,
            self.plan_text,
            str((run.first or {}).get("trace", "")),
            self.context,
            data_id=self.sample.get("data_id"),
            image_caption=self.sample.get("image_caption") or None,
        )
        run.replan = run.replan_raw = out.content
        return True


async def run_executor_rollout(
    loop: Any,
    sample: Mapping[str, Any],
    *,
    plans: PlanSource,
    judge: Judge,
    memory: MemoryClient | None,
    replan: bool = True,
    max_answer_words: int | None = None,
) -> Trajectory:
    """One rollout of ``sample`` (``question``, ``golds``, optional ``plan``,
    ``memory_context``, ``images``, ``data_id``, ``image_caption``) on ``loop`` (an
    :class:`mia.agent.ExecutorLoop` in token mode): the flow above. Returns the loop's
    trajectory, with ``state["first_correct"]``, ``state["memory_context"]``,
    ``state["states"]`` and, after a replan, ``state["replan_text"]``."""
    plan, context = await plans.plan_for(sample)
    plan = strip_image_tokens(plan)  # as the reference: only the prompt places images
    can_replan = replan and memory is not None and loop.cfg.max_replans >= 1
    executor = LoopExecutor(loop)
    planner = TrainingPlanner(
        sample, plan, context, judge=judge, memory=memory, max_answer_words=max_answer_words
    )
    flow = PlannerFlow(
        planner,
        executor,
        FlowConfig(max_replans=1 if can_replan else 0, judge_trace_max_chars=None),
    )
    run = await flow.run(Task.from_sample({**sample, "plan": plan}))
    traj = executor.traj
    assert traj is not None
    traj.state["first_correct"] = planner.first_correct
    traj.state["memory_context"] = context
    traj.state["states"] = list(run.states)
    if run.replan_raw is not None:
        traj.state["replan_text"] = run.replan
    return traj
