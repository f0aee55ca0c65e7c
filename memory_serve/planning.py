"""The planner routes (``/plan``, ``/best_plan``, ``/judge_replan``, ``/replan``,
``/replan_train``): each is one step of :class:`mia.planner.ConversationPlanner` over the
service's chat LLM, with memories retrieved from this store. The Planner's steps and text live
in :mod:`mia.planner` and :mod:`mia.prompts.planner`; what stays here is the reference's wire
shape and rules: which LLM writes (the manager on a cold start), how many memories, and the
errors (502 ``llm_empty`` / ``llm_error``).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from memory_serve import ttrl
from memory_serve.concurrency import gather_all
from memory_serve.config import MemoryServeConfig
from memory_serve.llms import sampling
from memory_serve.records import TEXT_IMAGE, Retrieval
from mia.agent import ChatPolicy
from mia.http import ApiError
from mia.llm.base import ChatBackend, ChatResult, LLMError, Message, SamplingParams
from mia.planner.flow import PlannerRun, Task
from mia.planner.planners import ConversationPlanner, EmptyReply, TurnLimits
from mia.prompts.manager import choose_plan_prompt
from mia.prompts.planner import replan_train_prefix
from mia.services import memory as memory_api

log = logging.getLogger("memory_serve")
T = TypeVar("T")
# A query's memories (at most k of each side) and its modality: the service's retrieval.
Retrieve = Callable[[memory_api.MemoryQuery, int], Awaitable[tuple[Retrieval, str]]]

# The service's Planner conversation is as long as the LLM allows (its own context, when it
# reports one, still bounds it).
UNBOUNDED_CONTEXT = 10**9


def mem_top_k(q: memory_api.MemoryQuery, default: int) -> int:
    """How many memories of each side a query asks for: its ``mem_top_k``, else ``default``."""
    return q.mem_top_k if q.mem_top_k is not None else default


class PlannerRoutes:
    """The planner routes of one :class:`~memory_serve.service.MemoryService`: its manager and
    planner LLMs, over its retrieval."""

    def __init__(
        self,
        cfg: MemoryServeConfig,
        manager: ChatBackend | None,
        planner: ChatBackend | None,
        retrieve: Retrieve,
    ) -> None:
        self.cfg = cfg
        self.manager = manager
        self.planner = planner
        self._retrieve = retrieve

    # ------------------------------------------------------------------ the LLMs
    def _pick(self, cold: bool) -> tuple[ChatBackend | None, str]:
        """The manager LLM on a cold start (few memories yet), else the planner."""
        if cold and self.cfg.planner.cold_start:
            return self.manager, "manager"
        return self.planner, "planner"

    async def _chat(
        self, backend: ChatBackend | None, messages: list[Message], params: SamplingParams | None
    ) -> ChatResult:
        if backend is None:
            raise ApiError(503, "no LLM configured for this route", "llm_unavailable")
        try:
            return await backend.chat(messages, params)
        except LLMError as err:
            raise ApiError(502, f"LLM call failed: {err}", "llm_error") from None

    async def _ask(
        self,
        backend: ChatBackend | None,
        who: str,
        messages: list[Message],
        what: str,
        parse: Callable[[str], T | None],
    ) -> tuple[str, T]:
        """The LLM's reply and its parsed value. A reply with nothing usable (empty, only
        ``<think>``, no decision) is an upstream fault like a 5xx: asked again
        (``planner.empty_retries``), then 502 ``llm_empty``; never a silent ``""`` or "no"."""
        params = self._planner_params(backend)
        attempts = 1 + self.cfg.planner.empty_retries
        text = ""
        for attempt in range(attempts):
            text = (await self._chat(backend, messages, params)).text
            value = parse(text)
            if value is not None:
                return text, value
            log.warning("%s LLM: no %s in reply (attempt %d/%d)", who, what, attempt + 1, attempts)
        raise ApiError(
            502,
            f"the {who} LLM gave no {what} in {attempts} attempt(s) (reply {text[:200]!r})",
            "llm_empty",
        )

    def _planner_params(self, backend: ChatBackend | None) -> SamplingParams | None:
        if backend is None:
            return None
        p = self.cfg.planner
        return sampling(backend, temperature=p.temperature, max_tokens=p.max_tokens)

    # ------------------------------------------------------------------ the runtime
    def _planner(
        self, backend: ChatBackend | None, who: str, temperature: float | None = None
    ) -> ConversationPlanner:
        if backend is None:
            raise ApiError(503, "no LLM configured for this route", "llm_unavailable")
        p = self.cfg.planner
        policy = ChatPolicy(backend)
        params = sampling(
            backend, temperature=p.temperature if temperature is None else temperature
        )
        params = params or policy.default_params()
        cap = p.max_tokens or params.max_tokens
        limits = TurnLimits(
            max_context=UNBOUNDED_CONTEXT,
            plan_max_tokens=cap,
            decision_max_tokens=cap,
            replan_max_tokens=cap,
        )
        return ConversationPlanner(
            policy, params, limits=limits, name=who, empty_retries=p.empty_retries
        )

    @staticmethod
    async def _step(step: Awaitable[bool], who: str) -> None:
        """Run one Planner step; its failures as the routes' errors."""
        try:
            ok = await step
        except LLMError as err:
            raise ApiError(502, f"LLM call failed: {err}", "llm_error") from None
        except EmptyReply as err:
            raise ApiError(502, f"the {who} LLM gave {err}", "llm_empty") from None
        if not ok:
            raise ApiError(
                422, "the conversation leaves the Planner no room to reply", "context_budget"
            )

    @staticmethod
    def _run(
        q: memory_api.MemoryQuery | None, r: Retrieval | None, modality: str = ""
    ) -> PlannerRun:
        """A run of the flow for this request; its memories are the ones retrieved here."""
        task = Task(
            question=q.question if q is not None else "",
            data_id=(q.data_id or None) if q is not None else None,
            modality=modality or None,
            memory_context=r.context() if r is not None else None,
            memory_ids=(r.positive_ids + r.negative_ids) if r is not None else None,
        )
        return PlannerRun(task=task)

    def _variant(self, modality: str) -> str:
        return "image" if modality == TEXT_IMAGE else "text"

    # ------------------------------------------------------------------ routes
    async def plan(self, q: memory_api.MemoryQuery) -> memory_api.PlanResponse:
        k = mem_top_k(q, self.cfg.store.retrieval.top_k)
        r, modality = await self._retrieve(q, k)
        if _skip(q.plan_if, r):
            return _plan_response(q, r, "", [], "none")
        backend, who = self._pick(len(r.positives) < k or len(r.negatives) < k)
        planner = self._planner(backend, who)
        planner.image_variant = self._variant(modality)
        run = self._run(q, r, modality)
        await self._step(planner.plan(run), who)
        return _plan_response(q, r, run.plan, run.messages, who)

    async def best_plan(self, q: memory_api.MemoryQuery) -> memory_api.BestPlanResponse:
        """Sample several plans (T=1 by default), let the manager LLM pick one (§3.1)."""
        p = self.cfg.planner
        k = mem_top_k(q, self.cfg.store.retrieval.top_k)
        r, modality = await self._retrieve(q, k)
        backend, who = self._pick(len(r.positives) < k or len(r.negatives) < k)

        async def one() -> PlannerRun:
            planner = self._planner(backend, who, p.best_plan_temperature)
            planner.sampling = dataclasses.replace(planner.sampling, seed=None)
            planner.image_variant = self._variant(modality)
            run = self._run(q, r, modality)
            await self._step(planner.plan(run), who)
            return run

        runs = await gather_all([one() for _ in range(p.best_plan_samples)])
        plans = [run.plan for run in runs]
        _, pick = await self._ask(
            self.manager,
            "manager",
            [{"role": "user", "content": choose_plan_prompt(q.question, r.context(), plans)}],
            f"plan number (1 to {len(plans)})",
            lambda text: ttrl.parse_choice(text, len(plans)),
        )
        base = _plan_response(q, r, plans[pick], runs[pick].messages, who)
        return memory_api.BestPlanResponse(
            **base.model_dump(), selected_plan_number=str(pick + 1), all_plans=plans
        )

    async def judge_replan(
        self, req: memory_api.JudgeReplanRequest
    ) -> memory_api.JudgeReplanResponse:
        # As /plan: a question planned on a cold start is also judged by the manager.
        cold = len(req.memory_ids) < 2 * self.cfg.store.retrieval.top_k
        backend, who = self._pick(cold)
        planner, run = self._planner(backend, who), self._run(None, None)
        await planner.start(run, memory_api.dump_messages(req.past_messages))
        await self._step(planner.reflect(run, req.workflow), who)
        need = bool(run.need_replan)
        return memory_api.JudgeReplanResponse(
            need_replan="yes" if need else "no",
            replan_needed=need,
            decision="yes" if need else "no",
            messages=run.messages,
            planner=who,  # type: ignore[arg-type]
        )

    async def replan(self, req: memory_api.ReplanRequest) -> memory_api.ReplanResponse:
        # The reference's rule (docs/reference.md §3.1): retrieve ``top_k + pass_num`` of each
        # side from the top, and plan with the manager LLM when either side has fewer. Its
        # driver sends mem_top_k=0, pass_num=2: two of each, so a young store is a cold start.
        k = mem_top_k(req, self.cfg.planner.replan_top_k)
        n = k + req.pass_num
        r, _ = await self._retrieve(req.model_copy(update={"pass_num": 0}), n)
        memory = None
        if self.cfg.planner.replan_include_memory:  # positions [pass_num, pass_num + k)
            skip = req.pass_num
            memory = Retrieval(r.positives[skip : skip + k], r.negatives[skip : skip + k])
        backend, who = self._pick(len(r.positives) < n or len(r.negatives) < n)
        planner, run = self._planner(backend, who), self._run(req, None)
        await planner.start(run, memory_api.dump_messages(req.past_messages))
        await self._step(planner.replan(run, memory.context() if memory else None), who)
        return memory_api.ReplanResponse(
            replan=run.replan,
            messages=run.messages,
            planner=who,  # type: ignore[arg-type]
            pos_indices=[],
            neg_indices=[],
            memory_ids=r.positive_ids + r.negative_ids,
        )

    async def replan_train(
        self, req: memory_api.ReplanTrainRequest
    ) -> memory_api.ReplanTrainResponse:
        """The replan of Executor training: the synthetic conversation in which the plan was
        followed and the answer judged wrong (the decision is a canned "yes")."""
        variant = self.cfg.planner.replan_train_variant
        caption = req.image_caption
        image = variant == "image" or (variant == "auto" and bool(caption))
        planner, run = self._planner(self.planner, "planner"), self._run(None, None)
        run.task.question = req.question
        prefix = replan_train_prefix(
            req.question, req.plan, req.trace, req.mem_context1, image=image
        )
        await planner.start(run, prefix)
        await self._step(planner.replan(run), "planner")
        return memory_api.ReplanTrainResponse(content=run.replan)


def _skip(plan_if: str, r: Retrieval) -> bool:
    """``plan_if``: no plan unless memory holds something (``memory``) or a failure
    (``failure``) for the question: the client then goes without one."""
    if plan_if == "memory":
        return not (r.positives or r.negatives)
    if plan_if == "failure":
        return not r.negatives
    return False


def _plan_response(
    q: memory_api.MemoryQuery, r: Retrieval, plan: str, messages: list[dict[str, Any]], who: str
) -> memory_api.PlanResponse:
    return memory_api.PlanResponse(
        plan=plan,
        messages=messages,
        memory_ids=r.positive_ids + r.negative_ids,
        positive_ids=r.positive_ids,
        negative_ids=r.negative_ids,
        pos_indices=r.positive_ids,
        neg_indices=r.negative_ids,
        context=r.context(),
        planner=who,  # type: ignore[arg-type]
    )
