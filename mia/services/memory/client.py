"""The memory_serve client (docs/memory_serve.md): one coroutine per route, sending the route's
request model and returning its response model (:mod:`mia.services.memory.models`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote, urlencode

from mia.services.base import RequestFailed, ServiceClient
from mia.services.memory.models import (
    BankSaveResponse,
    BatchEvaluateRequest,
    BatchEvaluateResponse,
    ClearRequest,
    ClearResponse,
    ConsolidateRequest,
    ConsolidateResponse,
    FeedbackRequest,
    FeedbackResponse,
    FindMemoriesRequest,
    FindMemoriesResponse,
    JudgeReplanRequest,
    JudgeReplanResponse,
    MemoryDetail,
    MemoryPage,
    MemoryQuery,
    MemoryResponse,
    PlanResponse,
    ReplanRequest,
    ReplanResponse,
    ReplanTrainRequest,
    ReplanTrainResponse,
    RolloutItem,
    RunDetail,
    RunsResponse,
    SaveMemoriesResponse,
    SaveRequest,
    SaveResponse,
    StatsResponse,
    TaskInfo,
    TrajectoryItem,
)


def _caption(value: str | Sequence[str] | None) -> str | list[str] | None:
    return list(value) if isinstance(value, list | tuple) else value


class MemoryClient(ServiceClient):
    """memory_serve (docs/memory_serve.md): retrieval, plans, the TTRL buffer, persistence.

    Each method is a coroutine that sends the route's request model and returns its response
    model (``await memory.plan(q) -> PlanResponse``); blocking code calls the same methods
    through :attr:`sync` (``memory.sync.stats() -> StatsResponse``)."""

    service = "memory_serve"

    @staticmethod
    def _query_fields(
        question: str,
        *,
        image_caption: str | Sequence[str] | None = None,
        data_id: str | None = None,
        top_k: int | None = None,
        plan_if: str | None = None,
        explain: bool = False,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"question": question, "data_id": data_id or ""}
        if image_caption:
            body["image_caption"] = _caption(image_caption)
        if top_k is not None:
            body["mem_top_k"] = top_k
        if plan_if is not None:
            body["plan_if"] = plan_if
        if explain:
            body["explain"] = True
        return body

    def query(self, question: str, **kw: Any) -> MemoryQuery:
        """One question's :class:`MemoryQuery` (``image_caption``, ``data_id``, ``top_k``,
        ``plan_if``, ``explain``), e.g. for :meth:`memories`."""
        return self.build(MemoryQuery, self._query_fields(question, **kw), "/memory")

    async def memory(self, question: str, **kw: Any) -> MemoryResponse:
        """``/memory``: the memory context and the positive / negative ids of one question."""
        return await self.send("POST", "/memory", self.query(question, **kw), MemoryResponse)

    async def memories(
        self, queries: Sequence[MemoryQuery | Mapping[str, Any]]
    ) -> list[MemoryResponse]:
        """``/memory`` for many questions in one request (answers in order)."""
        if not queries:
            return []
        body = [self.build(MemoryQuery, q, "/memory") for q in queries]
        return await self.send("POST", "/memory", body, list[MemoryResponse])

    async def explain(self, question: str, **kw: Any) -> MemoryResponse:
        """``/memory`` with ``explain``: the retrieved memories and the numbers that ranked
        them (``explain.positives``, ``explain.negatives``, ...)."""
        body = self.query(question, explain=True, **kw)
        return await self.send("POST", "/memory", body, MemoryResponse)

    async def plan(self, question: str, **kw: Any) -> PlanResponse:
        """``/plan``: a plan written with memories (``plan``, ``messages``, ``memory_ids``,
        ``context``, ``planner``)."""
        body = self.build(MemoryQuery, self._query_fields(question, **kw), "/plan")
        return await self.send("POST", "/plan", body, PlanResponse)

    async def judge_replan(
        self, workflow: str, past_messages: Sequence[Mapping[str, Any]], memory_ids: Sequence[int]
    ) -> JudgeReplanResponse:
        """The Planner's reflection on a trace (``replan_needed``, ``decision``, ``messages``)."""
        fields = {
            "workflow": workflow,
            "past_messages": [dict(m) for m in past_messages],
            "memory_ids": [int(i) for i in memory_ids],
        }
        body = self.build(JudgeReplanRequest, fields, "/judge_replan")
        return await self.send("POST", "/judge_replan", body, JudgeReplanResponse)

    async def replan(
        self, question: str, past_messages: Sequence[Mapping[str, Any]], **kw: Any
    ) -> ReplanResponse:
        """A supplementary plan continuing ``past_messages`` (``replan``, ``messages``)."""
        fields = self._query_fields(question, **kw)
        fields["past_messages"] = [dict(m) for m in past_messages]
        body = self.build(ReplanRequest, fields, "/replan")
        return await self.send("POST", "/replan", body, ReplanResponse)

    async def replan_train(
        self,
        question: str,
        plan: str,
        trace: str,
        mem_context: str = "",
        *,
        data_id: str | None = None,
        image_caption: str | Sequence[str] | None = None,
    ) -> ReplanTrainResponse:
        """The supplementary plan of Executor training (the answer was judged wrong); its
        ``content`` is "" when the Planner wrote none (the route's 502 ``llm_empty``): the
        episode goes on without."""
        fields: dict[str, Any] = {
            "question": question,
            "plan": plan,
            "trace": trace,
            "mem_context1": mem_context,
            "data_id": data_id or "",
        }
        if image_caption:
            fields["image_caption"] = _caption(image_caption)
        body = self.build(ReplanTrainRequest, fields, "/replan_train")
        try:
            return await self.send("POST", "/replan_train", body, ReplanTrainResponse)
        except RequestFailed as err:
            if err.code == "llm_empty":
                return ReplanTrainResponse(content="")
            raise

    # ---- writes
    async def save_memories(
        self, items: Sequence[TrajectoryItem | Mapping[str, Any]]
    ) -> SaveMemoriesResponse:
        """``/memories``: finished trajectories to remember (``results``: one per item)."""
        body = [self.build(TrajectoryItem, i, "/memories") for i in items]
        return await self.send("POST", "/memories", body, SaveMemoriesResponse)

    async def find_memories(
        self, data_ids: Sequence[str], source: str | None = None
    ) -> FindMemoriesResponse:
        """``/memories/find``: the stored memories written for these trajectories."""
        fields = {"data_ids": list(data_ids), "source": source}
        body = self.build(FindMemoriesRequest, fields, "/memories/find")
        return await self.send("POST", "/memories/find", body, FindMemoriesResponse)

    async def feedback(
        self,
        task_id: str | None = None,
        *,
        completion_id: str | None = None,
        correct: bool | None = None,
        judgement: str | None = None,
        feedback: str | None = None,
    ) -> FeedbackResponse:
        """``POST /v1/feedback`` (proxy): the outcome of a proxied task (``status``,
        ``task_id``, ``result``); the task's conversation is written to memory."""
        given = {
            "task_id": task_id,
            "completion_id": completion_id,
            "correct": correct,
            "judgement": judgement,
            "feedback": feedback,
        }
        fields = {k: v for k, v in given.items() if v is not None}
        body = self.build(FeedbackRequest, fields, "/v1/feedback")
        return await self.send("POST", "/v1/feedback", body, FeedbackResponse)

    async def task(self, task_id: str) -> TaskInfo:
        """``GET /v1/tasks/{id}`` (proxy): a task's plan, memories, turns and status."""
        path = f"/v1/tasks/{quote(task_id, safe='')}"
        return await self.send("GET", path, None, TaskInfo)

    # ---- inspection
    async def list_memories(self, **params: Any) -> MemoryPage:
        """``GET /memories``: one page (``offset``, ``limit``, ``q``, ``judgement``, ``bucket``,
        ``source``, ``sort``)."""
        query = urlencode({k: v for k, v in params.items() if v is not None})
        return await self.send(
            "GET", f"/memories?{query}" if query else "/memories", None, MemoryPage
        )

    async def memory_detail(self, memory_id: int, history: int = 200) -> MemoryDetail:
        """``GET /memories/{id}``: the memory and the trajectories that used it."""
        path = f"/memories/{int(memory_id)}?history={int(history)}"
        return await self.send("GET", path, None, MemoryDetail)

    async def runs(self) -> RunsResponse:
        """``GET /runs``: TTRL and eval runs under the service's runs folder."""
        return await self.send("GET", "/runs", None, RunsResponse)

    async def run(self, run_id: str) -> RunDetail:
        """``GET /runs/detail``: one run's rows (per batch or per policy)."""
        return await self.send("GET", f"/runs/detail?{urlencode({'id': run_id})}", None, RunDetail)

    async def stats(self) -> StatsResponse:
        return await self.send("GET", "/stats", None, StatsResponse)

    # ---- TTRL and persistence
    async def bank_save(self, items: Sequence[RolloutItem | Mapping[str, Any]]) -> BankSaveResponse:
        """``/memory_bank_save``: buffer TTRL rollouts until the next consolidation."""
        body = [self.build(RolloutItem, i, "/memory_bank_save") for i in items]
        return await self.send("POST", "/memory_bank_save", body, BankSaveResponse)

    async def batch_evaluate(
        self, output_dir: str | None = None, step: int | None = None
    ) -> BatchEvaluateResponse:
        fields: dict[str, Any] = {}
        if output_dir is not None:
            fields["output_dir"] = output_dir
        if step is not None:
            fields["step"] = step
        body = self.build(BatchEvaluateRequest, fields, "/batch_evaluate")
        return await self.send("POST", "/batch_evaluate", body, BatchEvaluateResponse)

    async def consolidate(self) -> ConsolidateResponse:
        body = self.build(ConsolidateRequest, {}, "/consolidate_memories")
        return await self.send("POST", "/consolidate_memories", body, ConsolidateResponse)

    async def save_memory(self, path: str | None = None) -> SaveResponse:
        body = self.build(SaveRequest, {"path": path} if path else {}, "/save_memory")
        return await self.send("POST", "/save_memory", body, SaveResponse)

    async def clear_memory(self) -> ClearResponse:
        """``/clear_memory``: forget every memory (and the rollout buffer)."""
        body = self.build(ClearRequest, {}, "/clear_memory")
        return await self.send("POST", "/clear_memory", body, ClearResponse)
