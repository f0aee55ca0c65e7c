"""The MIA protocol for one question, once: a small state machine.

    PLAN -> EXECUTE -> REFLECT -> REPLAN -> CONTINUE -> DONE

- PLAN: the Planner reads the question (and, depending on the Planner, retrieved memories) and
  writes a plan;
- EXECUTE: the Executor follows it with its tools and answers;
- REFLECT: the Planner reads the Executor's trace and decides whether to replan (yes/no);
- REPLAN: if yes, it writes a supplementary plan (at most ``max_replans``, i.e. once);
- CONTINUE: the Executor continues its conversation with the supplementary plan.

Every consumer runs this one flow; they differ only in the Planner and the Executor they plug in
(the Planners are in :mod:`mia.planner.planners`):

| consumer | Planner | Executor |
|---|---|---|
| ``mia eval`` (``plan_only``, ``mia``) | memory_serve ``/plan``, ``/judge_replan``, ``/replan`` | serve |
| ``mia eval`` (``none``, ``rag``) | none / the retrieved context as the guide | serve |
| Planner GRPO, TTRL, streaming | token-exact turns of the trainable policy | serve |
| Executor GRPO (``executor_train``) | the sample's plan; the judge reflects; ``/replan_train`` | the trainable loop |
| memory_serve's routes | each route is one step of the chat Planner | - |

A Planner step returns False when the Planner's context has no room left for it; the flow then
ends with ``stop_reason = "context_budget"``. The state visited at each step is recorded in
``PlannerRun.states`` (tests compare flows by it).
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from mia.config import check_known
from mia.errors import MiaError
from mia.judge.panel import truncate_middle
from mia.llm.think import text_after_think
from mia.rewards.planner import PlannerEpisodeRecord
from mia.services.serve import ExecuteResponse
from mia.trace import format_trace

STOP_DONE = "done"
STOP_CONTEXT = "context_budget"


class State(enum.Enum):
    PLAN = "plan"
    EXECUTE = "execute"
    REFLECT = "reflect"
    REPLAN = "replan"
    CONTINUE = "continue"
    DONE = "done"


@dataclass
class FlowConfig:
    """How far the flow goes; the same for evaluation and training."""

    reflect: bool = field(
        default=True, metadata={"help": "ask the Planner to reflect on the Executor's trace"}
    )
    max_replans: int = field(
        default=1, metadata={"help": "supplementary plans per question (0: decide, never act)"}
    )
    judge_trace_max_chars: int | None = field(
        default=20000,
        metadata={"help": "the trace in the reflection turn is cut in the middle to this size"},
    )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | FlowConfig | None) -> FlowConfig:
        if isinstance(data, cls):
            return data
        data = dict(data or {})
        check_known(cls, data, "flow")
        cfg = cls(**data)
        if cfg.max_replans < 0:
            raise MiaError("flow.max_replans must be >= 0")
        return cfg


@dataclass
class Task:
    """One question. ``memory_context`` / ``memory_ids``: memories retrieved beforehand (TTRL
    retrieves a whole batch at once); None lets the Planner retrieve them itself."""

    question: str
    data_id: str | None = None
    images: Sequence[str] = ()  # base64, forwarded to the Executor
    image_caption: str | list[str] | None = None
    modality: str | None = None
    memory_context: str | None = None
    memory_ids: list[int] | None = None

    @classmethod
    def from_sample(cls, sample: Mapping[str, Any]) -> Task:
        """From a training/test sample (:func:`mia.roles.samples.load_samples`)."""
        data_id = sample.get("data_id")
        ids = sample.get("memory_ids")
        return cls(
            question=str(sample["question"]),
            data_id=None if data_id is None else str(data_id),
            images=list(sample.get("images") or []),
            image_caption=sample.get("image_caption") or None,
            modality=sample.get("modality"),
            memory_context=sample.get("memory_context") or None,
            memory_ids=[int(i) for i in ids] if ids is not None else None,
        )


@dataclass
class PlannerRun:
    """Everything one pass of the flow produced. ``first`` / ``final`` are the Executor's
    answers (serve's ``/execute`` and ``/continue`` JSON). ``conversation`` is the token view
    of the Planner's conversation when the Planner is the trainable policy."""

    task: Task
    memory_context: str = ""
    memory_ids: list[int] = field(default_factory=list)
    planner: str = ""  # which model wrote the plan (memory_serve: planner | manager)
    messages: list[dict[str, Any]] = field(default_factory=list)  # the Planner's chat
    plan_raw: str = ""
    plan: str = ""  # what the Executor receives (reasoning stripped)
    first: dict[str, Any] | None = None
    decision_raw: str = ""
    need_replan: bool | None = None  # None: no reflection happened
    replan_raw: str | None = None
    replan: str = ""
    final: dict[str, Any] | None = None
    stop_reason: str = ""
    states: list[str] = field(default_factory=list)
    planner_errors: list[str] = field(default_factory=list)  # planner steps that gave nothing
    conversation: Any = None  # mia.agent.Trajectory in token mode
    group: str = ""  # GRPO group id and index (training)
    index: int = 0

    # ---- the Executor's side
    @property
    def question(self) -> str:
        return self.task.question

    @property
    def data_id(self) -> str | None:
        return self.task.data_id

    @property
    def replanned(self) -> bool:
        return self.final is not None

    @property
    def asked_replan(self) -> bool:
        return bool(self.need_replan)

    @property
    def executor(self) -> dict[str, Any]:
        """The Executor's last answer (after the replan when there was one)."""
        return self.final or self.first or {}

    @property
    def executor_messages(self) -> list[dict[str, Any]]:
        return list(self.executor.get("messages") or [])

    @property
    def answer_first(self) -> str:
        return str((self.first or {}).get("answer", ""))

    @property
    def final_answer(self) -> str:
        return str(self.executor.get("answer", ""))

    def executor_history(self) -> list[dict[str, Any]]:
        """The Executor chat after its first user prompt (what memories are made of)."""
        msgs = self.executor_messages
        first_user = next((i for i, m in enumerate(msgs) if m.get("role") == "user"), len(msgs))
        return msgs[first_user + 1 :]

    def executor_runs(self) -> list[dict[str, Any]]:
        return [r for r in (self.first, self.final) if r]

    def usage(self) -> dict[str, Any]:
        """The Executor's work over both runs: tool calls, turns, tokens."""
        calls: list[Any] = []
        turns = prompt = completion = 0
        for r in self.executor_runs():
            calls += list(r.get("tool_calls") or [])
            turns += int(r.get("turns") or 0)
            u = r.get("usage") or {}
            prompt += int(u.get("prompt_tokens") or 0)
            completion += int(u.get("completion_tokens") or 0)
        return {"tool_calls": calls, "turns": turns, "prompt": prompt, "completion": completion}

    # ---- rewards and dumps
    @property
    def record(self) -> PlannerEpisodeRecord:
        """What the Planner rewards read."""
        first = self.first or {}
        return PlannerEpisodeRecord(
            plan=self.plan_raw,
            decision=self.decision_raw,
            replan=self.replan_raw,
            answer_first=str(first.get("answer", "")),
            answer_final=str((self.final or {}).get("answer", "")),
            replanned=self.replanned,
            question=self.question,
            trace_first=str(first.get("trace", "")),
            reflected=State.REFLECT.value in self.states,
            trace_final=format_trace(self.question, self.executor_history())
            if self.replanned
            else "",
        )

    # ---- token view (mia.rl.episode.token_view), token mode only
    @property
    def prompt_ids(self) -> list[int] | None:
        return None if self.conversation is None else self.conversation.prompt_ids

    @property
    def response_ids(self) -> list[int] | None:
        return None if self.conversation is None else self.conversation.response_ids

    @property
    def response_mask(self) -> list[int] | None:
        return None if self.conversation is None else self.conversation.response_mask

    @property
    def rollout_logprobs(self) -> list[float] | None:
        return None if self.conversation is None else self.conversation.rollout_logprobs

    def to_dict(self, tokens: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {
            "question": self.question,
            "data_id": self.data_id,
            "group": self.group,
            "index": self.index,
            "plan": self.plan,
            "decision": text_after_think(self.decision_raw),
            "asked_replan": self.asked_replan,
            "replan": self.replan if self.replan_raw is not None else None,
            "replanned": self.replanned,
            "answer_first": self.answer_first,
            "answer_final": self.final_answer,
            "memory_ids": list(self.memory_ids),
            "stop_reason": self.stop_reason,
            "states": list(self.states),
            "planner_messages": self.messages,
        }
        if tokens:
            out.update(
                prompt_ids=self.prompt_ids,
                response_ids=self.response_ids,
                response_mask=self.response_mask,
                rollout_logprobs=self.rollout_logprobs,
            )
        return out


class Planner(Protocol):
    """One Planner behind the flow. Each step fills its fields of ``run`` and returns False
    when the Planner's context has no room left for it."""

    name: str
    reflects: bool  # False: the flow ends after EXECUTE (no Planner to reflect)

    async def plan(self, run: PlannerRun) -> bool: ...

    async def reflect(self, run: PlannerRun, trace: str) -> bool: ...

    async def replan(self, run: PlannerRun) -> bool: ...


class Executor(Protocol):
    """The Executor behind the flow: serve's :class:`ExecuteResponse`
    (:class:`mia.services.ExecutorClient`) or an in-process Executor's view of one (a dict with
    its ``answer``, ``trace``, ``messages``); the run keeps it as JSON (:func:`executor_json`)."""

    async def execute(
        self,
        question: str,
        plan: str,
        *,
        data_id: str | None = None,
        images: Sequence[str] = (),
        temperature: float | None = None,
        seed: int | None = None,
    ) -> ExecuteResponse | dict[str, Any]:
        """``temperature`` / ``seed``: sample this run (None: the Executor's own sampling)."""
        ...

    async def continue_(
        self,
        question: str,
        messages: Sequence[Mapping[str, Any]],
        replan: str,
        *,
        data_id: str | None = None,
        images: Sequence[str] = (),
    ) -> ExecuteResponse | dict[str, Any]: ...


def executor_json(answer: ExecuteResponse | dict[str, Any]) -> dict[str, Any]:
    """An Executor's answer as serve's JSON (what :class:`PlannerRun` keeps and dumps)."""
    return answer.model_dump(mode="json") if isinstance(answer, ExecuteResponse) else answer


Handler = Callable[[PlannerRun], Awaitable[State]]


class PlannerFlow:
    """``await PlannerFlow(planner, executor, cfg).run(task) -> PlannerRun``: one handler per
    state, each returning the next state."""

    def __init__(
        self,
        planner: Planner,
        executor: Executor,
        cfg: FlowConfig | Mapping[str, Any] | None = None,
    ) -> None:
        self.planner = planner
        self.executor = executor
        self.cfg = FlowConfig.from_dict(cfg)
        self._handlers: dict[State, Handler] = {
            State.PLAN: self._plan,
            State.EXECUTE: self._execute,
            State.REFLECT: self._reflect,
            State.REPLAN: self._replan,
            State.CONTINUE: self._continue,
        }

    async def run(self, task: Task, run: PlannerRun | None = None) -> PlannerRun:
        run = run or PlannerRun(task=task)
        state = State.PLAN
        while state is not State.DONE:
            run.states.append(state.value)
            state = await self._handlers[state](run)
        run.stop_reason = run.stop_reason or STOP_DONE
        return run

    # ------------------------------------------------------------------ handlers
    async def _plan(self, run: PlannerRun) -> State:
        if not await self.planner.plan(run):
            raise MiaError(
                f"the plan prompt of {run.data_id or run.question[:40]!r} leaves no room to "
                "generate (the Planner's context is full)"
            )
        return State.EXECUTE

    async def _execute(self, run: PlannerRun) -> State:
        t = run.task
        run.first = executor_json(
            await self.executor.execute(t.question, run.plan, data_id=t.data_id, images=t.images)
        )
        return State.REFLECT if self.cfg.reflect and self.planner.reflects else State.DONE

    async def _reflect(self, run: PlannerRun) -> State:
        # Every Planner reads the same (cut) trace: evaluation and training cannot drift.
        trace = truncate_middle(
            str((run.first or {}).get("trace", "")), self.cfg.judge_trace_max_chars
        )
        if not await self.planner.reflect(run, trace):
            run.stop_reason = STOP_CONTEXT
            return State.DONE
        if run.need_replan and self.cfg.max_replans >= 1:
            return State.REPLAN
        return State.DONE

    async def _replan(self, run: PlannerRun) -> State:
        if not await self.planner.replan(run):
            run.stop_reason = STOP_CONTEXT
            return State.DONE
        return State.CONTINUE if run.replan.strip() else State.DONE

    async def _continue(self, run: PlannerRun) -> State:
        t = run.task
        answer = await self.executor.continue_(
            t.question,
            list((run.first or {}).get("messages") or []),
            run.replan,
            data_id=t.data_id,
            images=t.images,
        )
        run.final = executor_json(answer)
        return State.DONE
