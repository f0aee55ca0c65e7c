"""The Memory Manager's behaviour behind the HTTP routes (one method per route).

Async throughout: LLM calls are awaited on the event loop, store work (embedding, SQLite) runs
in worker threads. LLM calls never happen while a store lock is held. An LLM failure answers
502 with the error envelope; nothing half-written is left behind (summaries are computed before
any write).
"""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from memory_serve import ttrl
from memory_serve.classify import Classifier
from memory_serve.compress import Compressor
from memory_serve.concurrency import bounded, gather_all
from memory_serve.config import MemoryServeConfig
from memory_serve.llms import sampling
from memory_serve.persist import (
    PersistPolicy,
    check_evaluation_target,
    check_folder,
    check_target,
)
from memory_serve.planning import PlannerRoutes
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
from memory_serve.refjson import (
    export_plan_pairs,
    export_workflows,
    is_plan_layout,
    parse_plan_pairs,
    parse_workflows,
    read_json,
    write_json,
)
from memory_serve.store import MemoryStore
from mia.errors import MiaError
from mia.http import ApiError
from mia.llm.base import ChatBackend, ChatResult, LLMError, Message, SamplingParams
from mia.llm.think import text_after_think
from mia.prompts.manager import choose_plan_prompt, plan_pairs_block
from mia.services import memory as S

log = logging.getLogger("memory_serve")
T = TypeVar("T")

SQLITE_SUFFIXES = (".sqlite", ".sqlite3", ".db")
JSON_SUFFIXES = (".json", ".jsonl")
DIR_SQLITE, DIR_WORKFLOWS, DIR_PLANS = "memory.sqlite", "workflow_memory.jsonl", "plan_memory.jsonl"
FEEDBACK_FIELDS = ("evaluator_1_feedback", "evaluator_2_feedback", "evaluator_3_feedback")


def _non_empty(text: str) -> str | None:
    """The answer part of a reply (after ``</think>``), or None when there is none."""
    return text_after_think(text) or None


def _reason(err: OSError) -> str:
    """An OS error without the server path its ``str`` would show."""
    return err.strerror or type(err).__name__


def _shown(raw: str, name: str) -> str:
    """How a file inside the client's folder ``raw`` is named in messages."""
    return f"{raw.rstrip('/')}/{name}"


def _outcome(result: WriteResult, category: str, modality: str) -> S.WriteOutcome:
    return S.WriteOutcome(
        action=result.action,  # type: ignore[arg-type]
        id=result.id,
        replaced_id=result.replaced_id,
        credited_ids=list(result.credited_ids),
        evicted_ids=list(result.evicted_ids),
        category=category,
        modality=modality,
    )


def _scored(rank: int, m: ScoredMemory) -> S.ScoredMemory:
    rec = m.record
    return S.ScoredMemory(
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


def _row(rec: MemoryRecord) -> S.MemoryRow:
    return S.MemoryRow(
        id=rec.id,
        data_id=rec.data_id,
        question=rec.question,
        image_caption=rec.image_caption,
        workflow_summary=rec.workflow_summary,
        judgement=rec.judgement,
        usage_count=rec.usage_count,
        success_count=rec.success_count,
        win_rate=rec.win_rate,
        modality=rec.modality,
        category=rec.category,
        created_at=rec.created_at,
        source=rec.source,
    )


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
        self.planning = PlannerRoutes(self)  # /plan, /best_plan, /judge_replan, /replan, ...

    # ------------------------------------------------------------------ helpers

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

    def _pick(self, cold: bool) -> tuple[ChatBackend | None, str]:
        """The manager LLM on a cold start (few memories yet), else the planner."""
        if cold and self.cfg.planner.cold_start:
            return self.manager, "manager"
        return self.planner, "planner"

    async def _category(self, question: str, given: str | None = None) -> str:
        return given or await self.classifier.classify(question)

    async def _where(self, q: S.MemoryQuery) -> tuple[str, str, str]:
        """``(caption, modality, category)`` of a query."""
        caption = normalise_caption(q.image_caption)
        modality = q.modality or modality_of(caption)
        category = q.category or await self.classifier.classify(q.question)
        return caption, modality, category

    async def _retrieve(self, q: S.MemoryQuery, k: int) -> tuple[Retrieval, str]:
        """The query's memories and its modality."""
        found, _, modality, _ = await self._retrieve_where(q, k)
        return found, modality

    async def _retrieve_where(self, q: S.MemoryQuery, k: int) -> tuple[Retrieval, str, str, str]:
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

    def _k(self, q: S.MemoryQuery, default: int | None = None) -> int:
        if q.mem_top_k is not None:
            return q.mem_top_k
        return self.cfg.store.retrieval.top_k if default is None else default

    def _check_path(self, raw: str) -> Path:
        """A client's path resolved under the persistence policy (400/403 otherwise)."""
        return self.persist.resolve(raw)

    # ------------------------------------------------------------------ retrieval / planning

    async def memory(self, q: S.MemoryQuery) -> S.MemoryResponse:
        k = self._k(q)
        r, caption, modality, category = await self._retrieve_where(q, k)
        explain = None
        if q.explain:
            rc = self.cfg.store.retrieval
            explain = S.RetrievalExplain(
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
        return S.MemoryResponse(
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

    def _verdict(self, item: S._TrajectoryFields) -> str:
        value = item.judgement if item.judgement is not None else item.judgement_nogt
        if value is None:
            raise ApiError(422, "judgement is required ('correct' or 'incorrect')")
        return normalise_judgement(value)

    @staticmethod
    def _extra(item: S._TrajectoryFields) -> dict[str, Any]:
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
        def work() -> list[WriteResult]:
            q, c = self.store.embed([m.question for m in mems], [m.image_caption for m in mems])
            return [self.store.write(m, q[i], c[i]) for i, m in enumerate(mems)]

        try:
            return await asyncio.to_thread(work)
        except MiaError as err:
            raise ApiError(400, str(err)) from None

    async def save_memories(self, items: list[S.TrajectoryItem]) -> S.SaveMemoriesResponse:
        verdicts = [self._verdict(it) for it in items]  # validate everything before any LLM call
        summaries = await self._summaries(
            [
                (it.question, S.dump_messages(it.messages), it.trace, it.workflow_summary)
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
        return S.SaveMemoriesResponse(
            results=[
                _outcome(r, m.category, str(m.modality)) for r, m in zip(results, mems, strict=True)
            ]
        )

    async def find_memories(self, req: S.FindMemoriesRequest) -> S.FindMemoriesResponse:
        wanted = set(req.data_ids)
        records = await asyncio.to_thread(self.store.records)
        return S.FindMemoriesResponse(
            memories=[
                S.FoundMemory(
                    id=r.id,
                    data_id=r.data_id,
                    question=r.question,
                    judgement=r.judgement,
                    source=r.source,
                    created_at=r.created_at,
                )
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
    ) -> S.MemoryPage:
        modality = category = None
        if bucket:
            modality, _, category = bucket.partition("/")
            if modality not in S.MODALITIES or category not in S.CATEGORIES:
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
        return S.MemoryPage(
            total=total, offset=offset, limit=limit, memories=[_row(r) for r in recs]
        )

    async def memory_detail(self, memory_id: int, history: int) -> S.MemoryDetail:
        rec = self.store.get(memory_id)
        if rec is None:
            raise ApiError(404, f"no memory {memory_id}", "no_such_memory")
        uses, rows = await asyncio.to_thread(self.store.history, memory_id, limit=history)
        return S.MemoryDetail(
            memory=_row(rec),
            plan=rec.plan,
            extra=rec.extra,
            uses=uses,
            history=[S.MemoryUse(**u) for u in rows],
        )

    # ------------------------------------------------------------------ TTRL

    async def bank_save(self, items: list[S.RolloutItem]) -> S.BankSaveResponse:
        rows = [
            {
                "data_id": it.data_id,
                "question": it.question,
                "image_caption": normalise_caption(it.image_caption),
                "plan": it.plan,
                "slow_plan": it.slow_plan,
                "judgement": self._verdict(it),
                "messages": S.dump_messages(it.messages),
                "used_memory_ids": list(it.used_memory_ids),
                "extra": self._extra(it),
            }
            for it in items
        ]
        ids = await asyncio.to_thread(self.store.buffer_rollouts, rows)
        return S.BankSaveResponse(buffered=len(ids), ids=ids)

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

    async def consolidate(self, req: S.ConsolidateRequest) -> S.ConsolidateResponse:
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
        return S.ConsolidateResponse(
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

    async def batch_evaluate(self, req: S.BatchEvaluateRequest) -> S.BatchEvaluateResponse:
        out = req.output_dir or self.cfg.ttrl.output_dir
        if not out:
            raise ApiError(400, "no output_dir in the request and ttrl.output_dir is not set")
        out_dir = self._check_path(out)
        check_folder(out_dir, out)
        rules = list(req.rules or self.cfg.ttrl.rules)
        for rule in rules:  # append only to files this route wrote
            name = f"evaluated-{rule}.jsonl"
            check_evaluation_target(out_dir / name, rule, _shown(out, name))
        if "choice" in rules and self.manager is None:
            raise ApiError(400, "the 'choice' rule needs a manager LLM")
        seed = self.cfg.ttrl.seed if req.seed is None else req.seed
        groups = list(ttrl.group_rollouts(await asyncio.to_thread(self.store.rollouts)).values())
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

        def write_files() -> dict[str, str]:
            out_dir.mkdir(parents=True, exist_ok=True)
            files = {}
            for rule in rules:
                path = out_dir / f"evaluated-{rule}.jsonl"
                with path.open("a", encoding="utf-8") as f:
                    for g, i in zip(groups, picks[rule], strict=True):
                        f.write(
                            json.dumps(self._eval_row(rule, g, i, req.step), ensure_ascii=False)
                        )
                        f.write("\n")
                files[rule] = str(path)
            return files

        try:
            files = await asyncio.to_thread(write_files)
        except OSError as err:
            raise ApiError(400, f"cannot write to {out}: {_reason(err)}") from None
        accuracy: dict[str, float | None] = {}
        for rule in rules:
            hits = [groups[j][i].judgement == CORRECT for j, i in enumerate(picks[rule])]
            accuracy[rule] = sum(hits) / len(hits) if hits else None
        return S.BatchEvaluateResponse(
            processed_count=len(groups),
            accuracy=accuracy,
            files=files,
            choice_fallbacks=fallbacks,
            message=f"evaluated {len(groups)} questions under {len(rules)} rules",
        )

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

    @staticmethod
    def _format_of(path: Path, fmt: str) -> str:
        if fmt != "auto":
            return fmt
        if path.suffix.lower() in SQLITE_SUFFIXES:
            return "sqlite"
        if path.suffix.lower() in JSON_SUFFIXES:
            return "json"
        return "dir"

    async def save(self, req: S.SaveRequest) -> S.SaveResponse:
        raw = req.path or self.cfg.ttrl.output_dir
        if not raw:
            raise ApiError(400, "no path in the request and ttrl.output_dir is not set")
        path = self._check_path(raw)
        fmt = (
            "dir"
            if req.path is None and req.format == "auto"
            else self._format_of(path, req.format)
        )
        store = self.store
        # Nothing but a memory backup is ever replaced (and never the live database).
        if fmt == "dir":
            check_folder(path, raw)
            for name, kind in (
                (DIR_SQLITE, "sqlite"),
                (DIR_WORKFLOWS, "json"),
                (DIR_PLANS, "json"),
            ):
                check_target(path / name, kind, _shown(raw, name), store.db_path)
        else:
            check_target(path, fmt, raw, store.db_path)

        def work() -> list[str]:
            if fmt == "sqlite":
                return [str(store.backup(path))]
            if fmt == "json":
                write_json(path, export_workflows(store.records()))
                return [str(path)]
            path.mkdir(parents=True, exist_ok=True)
            store.backup(path / DIR_SQLITE)
            write_json(path / DIR_WORKFLOWS, export_workflows(store.records()))
            write_json(path / DIR_PLANS, export_plan_pairs(store.plan_pairs()))
            return [str(path / n) for n in (DIR_SQLITE, DIR_WORKFLOWS, DIR_PLANS)]

        try:
            files = await asyncio.to_thread(work)
        except OSError as err:
            raise ApiError(400, f"cannot save to {raw}: {_reason(err)}") from None
        except sqlite3.Error as err:
            raise ApiError(400, f"cannot save to {raw}: {err}") from None
        return S.SaveResponse(
            format=fmt,  # type: ignore[arg-type]
            files=files,
            memories=len(store),
            plan_pairs=len(store.plan_pairs()),
        )

    async def load(self, req: S.LoadRequest) -> S.LoadResponse:
        raw = req.path
        path = self._check_path(raw)
        try:
            exists = path.exists()
        except OSError as err:  # e.g. a file name over the OS limit
            raise ApiError(400, f"cannot load {raw[:200]!r}: {_reason(err)}") from None
        if not exists:
            raise ApiError(404, f"nothing to load at {raw}")
        fmt = self._format_of(path, req.format)
        if fmt == "dir" and not path.is_dir():
            raise ApiError(400, f"{raw} is not a folder (use format sqlite or json)")
        store = self.store

        def import_json(files: list[tuple[Path, str]]) -> int:
            # Everything is parsed before the store is touched, then written into a copy of
            # the store that replaces it only when the whole import succeeded.
            parsed = []
            for f, shown in files:
                data = read_json(f, shown)
                if is_plan_layout(data):
                    parsed.append((parse_plan_pairs(data, shown), True))
                else:
                    parsed.append((parse_workflows(data, shown), False))

            def fill(staging: MemoryStore) -> int:
                if req.mode == "replace":  # replace the kinds being loaded, keep the others
                    staging.clear(
                        memories=any(not plans for _, plans in parsed),
                        plan_pairs=any(plans for _, plans in parsed),
                        rollouts=False,
                    )
                n = 0
                for entries, plans in parsed:
                    if plans:
                        n += staging.import_plan_pairs(entries)
                    else:
                        n += len(staging.import_memories(entries, progress=True))
                return n

            return store.rebuild(fill, copy_live=True)

        def work() -> int:
            if fmt == "sqlite" or (fmt == "dir" and (path / DIR_SQLITE).is_file()):
                if req.mode != "replace":
                    raise MiaError("a SQLite copy can only be loaded with mode=replace")
                src, shown = (
                    (path / DIR_SQLITE, _shown(raw, DIR_SQLITE)) if fmt == "dir" else (path, raw)
                )
                store.restore(src, reembed_on_mismatch=req.reembed, shown=shown)
                return len(store) + len(store.plan_pairs())
            if fmt == "json":
                return import_json([(path, raw)])
            files = [
                (path / n, _shown(raw, n))
                for n in (DIR_WORKFLOWS, DIR_PLANS)
                if (path / n).is_file()
            ]
            if not files:
                raise MiaError(f"{raw} holds no {DIR_SQLITE}, {DIR_WORKFLOWS} or {DIR_PLANS}")
            return import_json(files)

        try:
            imported = await asyncio.to_thread(work)
        except OSError as err:
            raise ApiError(400, f"cannot load {raw}: {_reason(err)}") from None
        except (MiaError, ValueError, TypeError, sqlite3.Error) as err:
            # ValueError covers text a JSON file holds that SQLite cannot store (UnicodeError).
            raise ApiError(400, str(err) or type(err).__name__) from None
        return S.LoadResponse(
            format=fmt,  # type: ignore[arg-type]
            memories=len(store),
            plan_pairs=len(store.plan_pairs()),
            imported=imported,
        )

    async def clear(self, req: S.ClearRequest) -> S.ClearResponse:
        await asyncio.to_thread(self.store.clear, rollouts=req.rollouts)
        what = (
            "memories, plan pairs and rollout buffer" if req.rollouts else "memories and plan pairs"
        )
        return S.ClearResponse(message=f"cleared {what}")

    async def stats(self) -> S.StatsResponse:
        data = await asyncio.to_thread(self.store.stats)
        return S.StatsResponse(
            **data, compress_mode=self.cfg.compress.mode, classifier=self.classifier.enabled
        )
