"""The Memory Manager's behaviour behind the HTTP routes (one method per route): retrieval,
writes, inspection and TTRL here; the planner routes in :mod:`memory_serve.planning`, saving and
loading in :mod:`memory_serve.backups`.

Async throughout: LLM calls are awaited on the event loop, store work (embedding, SQLite) runs
in worker threads. LLM calls never happen while a store lock is held. An LLM failure answers
502 with the error envelope; nothing half-written is left behind (summaries are computed before
any write).
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

from memory_serve import ttrl
from memory_serve.backups import Backups
from memory_serve.classify import Classifier
from memory_serve.compress import Compressor
from memory_serve.concurrency import bounded, gather_all
from memory_serve.config import MemoryServeConfig
from memory_serve.llms import sampling
from memory_serve.persist import (
    PersistPolicy,
    check_evaluation_target,
    check_folder,
    os_reason,
    shown_in,
)
from memory_serve.planning import PlannerRoutes, mem_top_k
from memory_serve.records import (
    CORRECT,
    MemoryRecord,
    NewMemory,
    Retrieval,
    Rollout,
    ScoredMemory,
    WriteResult,
    modality_of,
    normalise_caption,
    normalise_judgement,
)
from memory_serve.store import MemoryStore
from mia.errors import MiaError
from mia.http import ApiError
from mia.llm.base import ChatBackend, LLMError, Message
from mia.prompts.manager import choose_plan_prompt, plan_pairs_block
from mia.services import memory as memory_api

log = logging.getLogger("memory_serve")

FEEDBACK_FIELDS = ("evaluator_1_feedback", "evaluator_2_feedback", "evaluator_3_feedback")


def _outcome(result: WriteResult, category: str, modality: str) -> memory_api.WriteOutcome:
    return memory_api.WriteOutcome(
        action=result.action,  # type: ignore[arg-type]
        id=result.id,
        replaced_id=result.replaced_id,
        credited_ids=list(result.credited_ids),
        evicted_ids=list(result.evicted_ids),
        category=category,
        modality=modality,
    )


def _scored(rank: int, m: ScoredMemory) -> memory_api.ScoredMemory:
    rec = m.record
    return memory_api.ScoredMemory(
        rank=rank,
        id=rec.id,
        question=rec.question,
        workflow_summary=rec.workflow_summary,
        judgement=rec.judgement,
        usage_count=rec.usage_count,
        success_count=rec.success_count,
        similarity=m.similarity,
        normalised=m.normalised,
        win_rate=rec.win_rate,
        score=m.score,
    )


def _row(rec: MemoryRecord) -> memory_api.MemoryRow:
    return memory_api.MemoryRow.model_validate(rec, from_attributes=True)


class MemoryService:
    def __init__(
        self,
        cfg: MemoryServeConfig,
        store: MemoryStore,
        manager: ChatBackend | None,
        planner: ChatBackend | None = None,
    ) -> None:
        if manager is None and (cfg.compress.mode == "llm" or cfg.classifier.enabled):
            raise MiaError("memory_serve: a manager LLM is needed (compress.mode=llm/classifier)")
        self.cfg = cfg
        self.store = store
        self.manager = manager
        self.planner = planner or manager
        self.compressor = Compressor(cfg.compress, manager)
        self.classifier = Classifier(cfg.classifier, manager)
        self.persist = PersistPolicy.from_config(cfg.persist.allowed_root, cfg.ttrl.output_dir)
        # /plan, /best_plan, /judge_replan, /replan, /replan_train
        self.planning = PlannerRoutes(cfg, manager, self.planner, self._retrieve)
        self.backups = Backups(store, self.persist, cfg.ttrl.output_dir)  # /save_memory, ...

    # ------------------------------------------------------------------ helpers

    async def _category(self, question: str, given: str | None = None) -> str:
        return given or await self.classifier.classify(question)

    async def _where(self, q: memory_api.MemoryQuery) -> tuple[str, str, str]:
        """``(caption, modality, category)`` of a query."""
        caption = normalise_caption(q.image_caption)
        modality = q.modality or modality_of(caption)
        category = q.category or await self.classifier.classify(q.question)
        return caption, modality, category

    async def _retrieve(self, q: memory_api.MemoryQuery, k: int) -> tuple[Retrieval, str]:
        """The query's memories and its modality."""
        found, _, modality, _ = await self._retrieve_where(q, k)
        return found, modality

    async def _retrieve_where(
        self, q: memory_api.MemoryQuery, k: int
    ) -> tuple[Retrieval, str, str, str]:
        """The query's memories, caption, modality and category."""
        caption, modality, category = await self._where(q)
        found = await asyncio.to_thread(
            self.store.retrieve,
            q.question,
            caption,
            category=category,
            modality=modality,
            top_k=k,
            pass_num=q.pass_num,
            min_similarity=q.min_similarity,
        )
        return found, caption, modality, category

    # ------------------------------------------------------------------ retrieval / planning

    async def memory(self, q: memory_api.MemoryQuery) -> memory_api.MemoryResponse:
        k = mem_top_k(q, self.cfg.store.retrieval.top_k)
        r, caption, modality, category = await self._retrieve_where(q, k)
        explain = None
        if q.explain:
            rc = self.cfg.store.retrieval
            explain = memory_api.RetrievalExplain(
                modality=modality,
                category=category,
                bucket_size=r.bucket_size,
                similarity_min=r.similarity_min,
                similarity_max=r.similarity_max,
                caption_used=bool(caption),
                question_weight=rc.question_weight,
                caption_weight=rc.caption_weight,
                similarity_weight=rc.similarity_weight,
                win_rate_weight=rc.win_rate_weight,
                min_similarity=rc.min_similarity if q.min_similarity is None else q.min_similarity,
                top_k=k,
                pass_num=q.pass_num,
                positives=[_scored(i, m) for i, m in enumerate(r.positives, 1)],
                negatives=[_scored(i, m) for i, m in enumerate(r.negatives, 1)],
            )
        context = r.context()
        return memory_api.MemoryResponse(
            context=context,
            positive_ids=r.positive_ids,
            negative_ids=r.negative_ids,
            pos_indices=r.positive_ids,
            neg_indices=r.negative_ids,
            prompt=context,
            indices=r.positive_ids + r.negative_ids,
            # Set only when asked: the route leaves unset fields out (the reference's payload).
            **({"explain": explain} if explain is not None else {}),
        )

    # ------------------------------------------------------------------ writes

    def _verdict(self, item: memory_api._TrajectoryFields) -> str:
        value = item.judgement if item.judgement is not None else item.judgement_nogt
        if value is None:
            raise ApiError(422, "judgement is required ('correct' or 'incorrect')")
        return normalise_judgement(value)

    @staticmethod
    def _extra(item: memory_api._TrajectoryFields) -> dict[str, Any]:
        extra = dict(item.extra)
        if item.judgement_data is not None:
            extra["judgement_data"] = item.judgement_data
            for key in FEEDBACK_FIELDS:
                if item.judgement_data.get(key):
                    extra[key] = str(item.judgement_data[key])
        for key in FEEDBACK_FIELDS:
            value = getattr(item, key)
            if value:
                extra[key] = value
        return extra

    async def _summaries(
        self, jobs: list[tuple[str, list[Message], str | None, str | None]]
    ) -> list[str]:
        """Workflow summaries for ``(question, messages, trace, summary)``; given ones are kept."""

        def job(question: str, msgs: list[Message], trace: str | None, summary: str | None):
            async def run() -> str:
                if summary is not None:
                    return summary
                try:
                    return await self.compressor.summary(question, msgs, trace)
                except LLMError as err:
                    raise ApiError(502, f"workflow summary failed: {err}", "llm_error") from None

            return run

        return await bounded(self.cfg.compress.concurrency, [job(*j) for j in jobs])

    async def _write(self, mems: list[NewMemory]) -> list[WriteResult]:
        try:
            return await asyncio.to_thread(self.store.add_many, mems)
        except MiaError as err:
            raise ApiError(400, str(err)) from None

    async def save_memories(
        self, items: list[memory_api.TrajectoryItem]
    ) -> memory_api.SaveMemoriesResponse:
        verdicts = [self._verdict(it) for it in items]  # validate everything before any LLM call
        summaries = await self._summaries(
            [
                (it.question, memory_api.dump_messages(it.messages), it.trace, it.workflow_summary)
                for it in items
            ]
        )
        categories = await gather_all([self._category(it.question, it.category) for it in items])
        mems = []
        for it, verdict, summary, category in zip(
            items, verdicts, summaries, categories, strict=True
        ):
            caption = normalise_caption(it.image_caption)
            mems.append(
                NewMemory(
                    question=it.question,
                    workflow_summary=summary,
                    judgement=verdict,
                    data_id=it.data_id,
                    image_caption=caption,
                    plan=it.plan,
                    category=category,
                    modality=it.modality or modality_of(caption),
                    source=it.source or "trajectory",
                    extra=self._extra(it),
                    used_memory_ids=list(it.used_memory_ids),
                )
            )
        results = await self._write(mems)
        return memory_api.SaveMemoriesResponse(
            results=[
                _outcome(r, m.category, str(m.modality)) for r, m in zip(results, mems, strict=True)
            ]
        )

    async def find_memories(
        self, req: memory_api.FindMemoriesRequest
    ) -> memory_api.FindMemoriesResponse:
        wanted = set(req.data_ids)
        records = await asyncio.to_thread(self.store.records)
        return memory_api.FindMemoriesResponse(
            memories=[
                memory_api.FoundMemory.model_validate(r, from_attributes=True)
                for r in records
                if r.data_id in wanted and (req.source is None or r.source == req.source)
            ]
        )

    # ------------------------------------------------------------------ inspection

    async def list_memories(
        self,
        *,
        offset: int,
        limit: int,
        query: str,
        judgement: str | None,
        bucket: str | None,
        source: str | None,
        sort: str,
    ) -> memory_api.MemoryPage:
        modality = category = None
        if bucket:
            modality, _, category = bucket.partition("/")
            if modality not in memory_api.MODALITIES or category not in memory_api.CATEGORIES:
                raise ApiError(422, f"bucket must be <modality>/<category>, got {bucket[:100]!r}")
        try:
            total, recs = await asyncio.to_thread(
                self.store.page,
                offset=offset,
                limit=limit,
                query=query,
                judgement=judgement,
                modality=modality,
                category=category,
                source=source,
                sort=sort,
            )
        except MiaError as err:
            raise ApiError(422, str(err)) from None
        return memory_api.MemoryPage(
            total=total, offset=offset, limit=limit, memories=[_row(r) for r in recs]
        )

    async def memory_detail(self, memory_id: int, history: int) -> memory_api.MemoryDetail:
        rec = self.store.get(memory_id)
        if rec is None:
            raise ApiError(404, f"no memory {memory_id}", "no_such_memory")
        uses, rows = await asyncio.to_thread(self.store.history, memory_id, limit=history)
        return memory_api.MemoryDetail(
            memory=_row(rec),
            plan=rec.plan,
            extra=rec.extra,
            uses=uses,
            history=[memory_api.MemoryUse(**u) for u in rows],
        )

    # ------------------------------------------------------------------ TTRL

    async def bank_save(self, items: list[memory_api.RolloutItem]) -> memory_api.BankSaveResponse:
        rows = [
            {
                "data_id": it.data_id,
                "question": it.question,
                "image_caption": normalise_caption(it.image_caption),
                "plan": it.plan,
                "slow_plan": it.slow_plan,
                "judgement": self._verdict(it),
                "messages": memory_api.dump_messages(it.messages),
                "used_memory_ids": list(it.used_memory_ids),
                "extra": self._extra(it),
            }
            for it in items
        ]
        ids = await asyncio.to_thread(self.store.buffer_rollouts, rows)
        return memory_api.BankSaveResponse(buffered=len(ids), ids=ids)

    def _rollout_memory(self, r: Rollout, summary: str, category: str, credit: bool) -> NewMemory:
        return NewMemory(
            question=r.question,
            workflow_summary=summary,
            judgement=r.judgement,
            data_id=r.data_id,
            image_caption=r.image_caption,
            plan=r.plan,
            category=category,
            source="ttrl",
            extra=dict(r.extra),
            used_memory_ids=list(r.used_memory_ids) if credit else [],
        )

    async def consolidate(
        self, req: memory_api.ConsolidateRequest
    ) -> memory_api.ConsolidateResponse:
        seed = self.cfg.ttrl.seed if req.seed is None else req.seed
        snapshot = await asyncio.to_thread(self.store.rollouts)
        groups = ttrl.group_rollouts(snapshot)
        picks = [ttrl.consolidate_group(g, seed) for g in groups.values()]
        chosen: list[tuple[Rollout, bool]] = []
        for pick in picks:
            if pick.positive is not None:
                chosen.append((pick.positive, pick.credit_positive))
            if pick.negative is not None:
                chosen.append((pick.negative, pick.credit_negative))
        summaries = await self._summaries([(r.question, r.messages, None, None) for r, _ in chosen])
        categories = await gather_all([self._category(r.question) for r, _ in chosen])
        mems = [
            self._rollout_memory(r, s, category, credit)
            for (r, credit), s, category in zip(chosen, summaries, categories, strict=True)
        ]
        results = await self._write(mems)
        pairs = 0
        for pick in picks:
            if pick.positive is not None and pick.negative is not None:
                p = pick.positive
                await asyncio.to_thread(
                    self.store.add_plan_pair,
                    p.question,
                    p.plan,
                    pick.negative.plan,
                    data_id=p.data_id,
                    image_caption=p.image_caption,
                    category=await self.classifier.classify(p.question),
                )
                pairs += 1
        await asyncio.to_thread(self.store.delete_rollouts, [r.id for r in snapshot])
        stored = [(m, res) for m, res in zip(mems, results, strict=True)]
        return memory_api.ConsolidateResponse(
            questions=len(groups),
            saved_positives=sum(
                1 for m, res in stored if m.judgement == CORRECT and res.action != "kept_existing"
            ),
            saved_negatives=sum(
                1 for m, res in stored if m.judgement != CORRECT and res.action != "kept_existing"
            ),
            saved_plan_pairs=pairs,
            results=[_outcome(res, m.category, modality_of(m.image_caption)) for m, res in stored],
        )

    async def _choose(self, group: list[Rollout]) -> int | None:
        """The LLM's pick among a question's rollouts (None: unusable reply or failed call)."""
        first = group[0]
        if len(group) == 1:
            return 0
        category = await self.classifier.classify(first.question)
        pairs = await asyncio.to_thread(
            self.store.retrieve_plan_pairs, first.question, first.image_caption, category=category
        )
        prompt = choose_plan_prompt(
            first.question, plan_pairs_block([p for p, _ in pairs]), [r.plan for r in group]
        )
        assert self.manager is not None
        params = sampling(self.manager, temperature=0.0, max_tokens=self.cfg.ttrl.choice_max_tokens)
        try:
            result = await self.manager.chat([{"role": "user", "content": prompt}], params)
        except LLMError as err:
            log.warning("plan choice failed for %s: %s", first.key, err)
            return None
        return ttrl.parse_choice(result.text, len(group))

    async def batch_evaluate(
        self, req: memory_api.BatchEvaluateRequest
    ) -> memory_api.BatchEvaluateResponse:
        out = req.output_dir or self.cfg.ttrl.output_dir
        if not out:
            raise ApiError(400, "no output_dir in the request and ttrl.output_dir is not set")
        out_dir = self.persist.resolve(out)
        check_folder(out_dir, out)
        rules = list(req.rules or self.cfg.ttrl.rules)
        for rule in rules:  # append only to files this route wrote
            name = f"evaluated-{rule}.jsonl"
            check_evaluation_target(out_dir / name, rule, shown_in(out, name))
        if "choice" in rules and self.manager is None:
            raise ApiError(400, "the 'choice' rule needs a manager LLM")
        seed = self.cfg.ttrl.seed if req.seed is None else req.seed
        groups = list(ttrl.group_rollouts(await asyncio.to_thread(self.store.rollouts)).values())
        picks, fallbacks = await self._picks(rules, groups, seed)
        try:
            files = await asyncio.to_thread(
                self._write_evaluations, out_dir, rules, groups, picks, req.step
            )
        except OSError as err:
            raise ApiError(400, f"cannot write to {out}: {os_reason(err)}") from None
        accuracy: dict[str, float | None] = {}
        for rule in rules:
            hits = [groups[j][i].judgement == CORRECT for j, i in enumerate(picks[rule])]
            accuracy[rule] = sum(hits) / len(hits) if hits else None
        return memory_api.BatchEvaluateResponse(
            processed_count=len(groups),
            accuracy=accuracy,
            files=files,
            choice_fallbacks=fallbacks,
            message=f"evaluated {len(groups)} questions under {len(rules)} rules",
        )

    async def _picks(
        self, rules: list[str], groups: list[list[Rollout]], seed: int
    ) -> tuple[dict[str, list[int]], int]:
        """Each rule's pick per question group, and how many LLM choices fell back to the
        first rollout (an unusable reply or a failed call)."""
        fallbacks = 0
        picks: dict[str, list[int]] = {}
        for rule in rules:
            if rule == "choice":
                choices = await bounded(
                    self.cfg.ttrl.concurrency, [lambda g=g: self._choose(g) for g in groups]
                )
                fallbacks = sum(1 for c in choices if c is None)
                picks[rule] = [0 if c is None else c for c in choices]
            else:
                picks[rule] = [ttrl.select_index(rule, g, seed) for g in groups]
        return picks, fallbacks

    def _write_evaluations(
        self,
        out_dir: Path,
        rules: list[str],
        groups: list[list[Rollout]],
        picks: dict[str, list[int]],
        step: int | None,
    ) -> dict[str, str]:
        """Append each rule's picks to its ``evaluated-<rule>.jsonl``; the files by rule."""
        out_dir.mkdir(parents=True, exist_ok=True)
        files = {}
        for rule in rules:
            path = out_dir / f"evaluated-{rule}.jsonl"
            with path.open("a", encoding="utf-8") as f:
                for g, i in zip(groups, picks[rule], strict=True):
                    f.write(json.dumps(self._eval_row(rule, g, i, step), ensure_ascii=False))
                    f.write("\n")
            files[rule] = str(path)
        return files

    @staticmethod
    def _eval_row(rule: str, group: list[Rollout], i: int, step: int | None) -> dict[str, Any]:
        r = group[i]
        return {
            "rule": rule,
            "step": step,
            "data_id": r.data_id,
            "question": r.question,
            "image_caption": r.image_caption,
            "plan": r.plan,
            "judgement": r.judgement,
            "selected_index": i,
            "num_rollouts": len(group),
            "used_memory_ids": r.used_memory_ids,
            "messages": r.messages,
            "extra": r.extra,
        }

    # ------------------------------------------------------------------ persistence

    async def clear(self, req: memory_api.ClearRequest) -> memory_api.ClearResponse:
        await asyncio.to_thread(self.store.clear, rollouts=req.rollouts)
        what = (
            "memories, plan pairs and rollout buffer" if req.rollouts else "memories and plan pairs"
        )
        return memory_api.ClearResponse(message=f"cleared {what}")

    async def stats(self) -> memory_api.StatsResponse:
        data = await asyncio.to_thread(self.store.stats)
        return memory_api.StatsResponse(
            **data, compress_mode=self.cfg.compress.mode, classifier=self.classifier.enabled
        )
