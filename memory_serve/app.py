"""HTTP routes of the Memory Manager (docs/memory_serve.md): one router per OpenAPI tag, composed
by :func:`build_app`; the reference's route names are added by :mod:`memory_serve.compat`."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path as PathLib
from typing import Any, Literal, TypeVar

from fastapi import APIRouter, Body, FastAPI, Path, Query

from memory_serve.compat import reference_aliases
from memory_serve.concurrency import gather_all
from memory_serve.inspector import PAGES, add_inspector
from memory_serve.proxy import add_proxy
from memory_serve.runs import find_runs, load_run
from memory_serve.service import MemoryService
from memory_serve.store import SORTS
from mia.http import DEFAULT_MAX_BODY_BYTES, ApiError, create_app
from mia.paths import mia_home
from mia.services import memory as memory_api

MAX_PAGE = 500

Q = TypeVar("Q")
R = TypeVar("R")


async def _each(body: Q | list[Q], fn: Callable[[Q], Awaitable[R]], cap: int) -> R | list[R]:
    """One object -> one answer; a list of at most ``cap`` -> a list of answers (computed
    concurrently)."""
    if isinstance(body, list):
        return await gather_all([fn(x) for x in _as_list(body, cap)])
    return await fn(body)


def _as_list(body: Q | list[Q], cap: int) -> list[Q]:
    """The body as a list; 413 when it lists more than ``cap`` items."""
    items = body if isinstance(body, list) else [body]
    if len(items) > cap:
        raise ApiError(413, f"{len(items)} items in one request; at most {cap}", "too_many_items")
    return items


def build_app(
    service: MemoryService,
    *,
    token: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> FastAPI:
    app = create_app(
        "memory_serve",
        token=token,
        max_body_bytes=max_body_bytes,
        health=lambda: {"memories": len(service.store)},
        pages=PAGES if service.cfg.ui.enabled else (),
    )
    app.state.service = service
    routers = [retrieval_routes(service)]
    if service.planner is not None:
        # Without an LLM (llm.enabled=false) the planner routes do not exist (404).
        routers.append(planner_routes(service))
    routers += [
        memory_routes(service),
        ttrl_routes(service),
        persistence_routes(service),
        inspect_routes(service),
    ]
    for router in [*routers, reference_aliases(routers)]:
        app.include_router(router)
    if service.cfg.ui.enabled:
        add_inspector(app)
    if service.cfg.proxy.upstream:
        add_proxy(app, service)
    return app


def retrieval_routes(service: MemoryService) -> APIRouter:
    router = APIRouter(tags=["retrieval"])
    cap = service.cfg.limits.max_items

    @router.post(
        "/memory",
        response_model=list[memory_api.MemoryResponse] | memory_api.MemoryResponse,
        response_model_exclude_unset=True,
    )
    async def memory(body: list[memory_api.MemoryQuery] | memory_api.MemoryQuery) -> Any:
        """Retrieve positive and negative workflows.

        ``{"question": "Who?", "image_caption": ["a face"], "mem_top_k": 2}`` ->
        ``{context, positive_ids, negative_ids, pos_indices, neg_indices, prompt, indices}``
        (``prompt`` = ``context`` and ``indices`` = both sides' ids, for the TTRL driver); with
        ``explain: true`` also every retrieved memory's similarity, normalised similarity,
        win-rate and score (the numbers that ranked it)."""
        return await _each(body, service.memory, cap)

    return router


def planner_routes(service: MemoryService) -> APIRouter:
    router = APIRouter(tags=["planner"])
    planning, cap = service.planning, service.cfg.limits.max_llm_items

    @router.post("/plan", response_model=list[memory_api.PlanResponse] | memory_api.PlanResponse)
    async def plan(body: list[memory_api.MemoryQuery] | memory_api.MemoryQuery) -> Any:
        """Retrieve memories and write a plan (the manager LLM plans on a cold start)."""
        return await _each(body, planning.plan, cap)

    @router.post(
        "/best_plan", response_model=list[memory_api.BestPlanResponse] | memory_api.BestPlanResponse
    )
    async def best_plan(body: list[memory_api.MemoryQuery] | memory_api.MemoryQuery) -> Any:
        """Sample several plans; the manager LLM picks one (``selected_plan_number``)."""
        return await _each(body, planning.best_plan, cap)

    @router.post(
        "/judge_replan",
        response_model=list[memory_api.JudgeReplanResponse] | memory_api.JudgeReplanResponse,
    )
    async def judge_replan(
        body: list[memory_api.JudgeReplanRequest] | memory_api.JudgeReplanRequest,
    ) -> Any:
        """Reflect on the Executor's trace -> ``{need_replan: "yes"|"no", replan_needed: bool,
        decision, messages, planner}``."""
        return await _each(body, planning.judge_replan, cap)

    @router.post(
        "/replan", response_model=list[memory_api.ReplanResponse] | memory_api.ReplanResponse
    )
    async def replan(body: list[memory_api.ReplanRequest] | memory_api.ReplanRequest) -> Any:
        """A supplementary plan (<= 200 words) continuing the planner conversation ->
        ``{replan, messages, planner, pos_indices: [], neg_indices: [], memory_ids}``."""
        return await _each(body, planning.replan, cap)

    @router.post("/replan_train", response_model=memory_api.ReplanTrainResponse)
    async def replan_train(body: memory_api.ReplanTrainRequest) -> Any:
        """Supplementary plan for Executor training (synthetic 6-message conversation)."""
        return await planning.replan_train(body)

    return router


def memory_routes(service: MemoryService) -> APIRouter:
    router = APIRouter(tags=["memory"])
    cap = service.cfg.limits.max_items

    # The name keeps the operation id this route had next to its reference alias.
    @router.post(
        "/memories", response_model=memory_api.SaveMemoriesResponse, name="save_memories_memories"
    )
    async def save_memories(
        body: list[memory_api.TrajectoryItem] | memory_api.TrajectoryItem,
    ) -> Any:
        """Compress and store finished trajectories (win-rate credit to the used memories)."""
        return await service.save_memories(_as_list(body, cap))

    @router.post("/memories/find", response_model=memory_api.FindMemoriesResponse)
    async def find_memories(body: memory_api.FindMemoriesRequest) -> Any:
        """Stored memories written for these ``data_ids`` (optionally from one ``source``)."""
        return await service.find_memories(body)

    return router


def ttrl_routes(service: MemoryService) -> APIRouter:
    router = APIRouter(tags=["ttrl"])
    cap = service.cfg.limits.max_items

    @router.post("/memory_bank_save", response_model=memory_api.BankSaveResponse)
    async def bank_save(body: list[memory_api.RolloutItem] | memory_api.RolloutItem) -> Any:
        """Buffer TTRL rollouts per question until the next consolidation."""
        return await service.bank_save(_as_list(body, cap))

    @router.post("/consolidate_memories", response_model=memory_api.ConsolidateResponse)
    async def consolidate(
        body: memory_api.ConsolidateRequest | list[Any] | None = Body(default=None),
    ) -> Any:
        """Per question: best correct + one incorrect rollout into memory, plus a plan pair."""
        req = (
            body
            if isinstance(body, memory_api.ConsolidateRequest)
            else memory_api.ConsolidateRequest()
        )
        return await service.consolidate(req)

    @router.post("/batch_evaluate", response_model=memory_api.BatchEvaluateResponse)
    async def batch_evaluate(
        body: memory_api.BatchEvaluateRequest | list[Any] | None = Body(default=None),
    ) -> Any:
        """Pick one rollout per question under each selection rule; JSONL per rule."""
        req = (
            body
            if isinstance(body, memory_api.BatchEvaluateRequest)
            else memory_api.BatchEvaluateRequest()
        )
        return await service.batch_evaluate(req)

    return router


def persistence_routes(service: MemoryService) -> APIRouter:
    router = APIRouter(tags=["persistence"])

    @router.post("/save_memory", response_model=memory_api.SaveResponse)
    async def save_memory(body: memory_api.SaveRequest | None = Body(default=None)) -> Any:
        """Copy the store to a SQLite file, a reference JSON file or a folder with both."""
        return await service.backups.save(body or memory_api.SaveRequest())

    @router.post("/load_memory", response_model=memory_api.LoadResponse)
    async def load_memory(body: memory_api.LoadRequest) -> Any:
        """Replace (or merge into) the store from a saved copy."""
        return await service.backups.load(body)

    @router.post("/clear_memory", response_model=memory_api.ClearResponse)
    async def clear_memory(
        body: memory_api.ClearRequest | list[Any] | None = Body(default=None),
    ) -> Any:
        """Forget every memory (and by default the rollout buffer)."""
        req = body if isinstance(body, memory_api.ClearRequest) else memory_api.ClearRequest()
        return await service.clear(req)

    @router.get("/stats", response_model=memory_api.StatsResponse)
    async def stats() -> Any:
        return await service.stats()

    return router


def inspect_routes(service: MemoryService) -> APIRouter:
    router = APIRouter(tags=["inspect"])
    runs_root = PathLib(cfg_runs_dir(service))

    @router.get("/memories", response_model=memory_api.MemoryPage)
    async def list_memories(
        offset: int = Query(0, ge=0, le=10**9),
        limit: int = Query(50, ge=1, le=MAX_PAGE),
        q: str = Query("", max_length=1000),
        judgement: Literal["correct", "incorrect"] | None = None,
        bucket: str | None = Query(None, max_length=100),
        source: str | None = Query(None, max_length=200),
        sort: Literal[tuple(SORTS)] = "newest",  # type: ignore[valid-type]
    ) -> Any:
        """One page of stored memories, filtered (judgement, ``modality/category`` bucket,
        source), searched (substring of question or summary, or an id) and sorted in SQL."""
        return await service.list_memories(
            offset=offset,
            limit=limit,
            query=q,
            judgement=judgement,
            bucket=bucket,
            source=source,
            sort=sort,
        )

    @router.get("/memories/{memory_id}", response_model=memory_api.MemoryDetail)
    async def memory_detail(
        memory_id: int = Path(ge=1, le=2**62), history: int = Query(200, ge=0, le=10_000)
    ) -> Any:
        """One memory and its history: the trajectories that used it and whether they succeeded."""
        return await service.memory_detail(memory_id, history)

    @router.get("/runs", response_model=memory_api.RunsResponse)
    async def runs() -> Any:
        """TTRL runs (``accuracy.jsonl``) and evaluations (``summary.json``) under the runs folder."""
        found, truncated = await asyncio.to_thread(find_runs, runs_root)
        return {"root": str(runs_root), "runs": found, "truncated": truncated}

    @router.get("/runs/detail", response_model=memory_api.RunDetail)
    async def run_detail(id: str = Query(min_length=1, max_length=1000)) -> Any:  # noqa: A002
        """One run's rows: per batch (TTRL) or per policy (evaluation), numbers only."""
        return await asyncio.to_thread(load_run, runs_root, id)

    return router


def cfg_runs_dir(service: MemoryService) -> str:
    return service.cfg.ui.runs_dir or str(mia_home() / "runs")
