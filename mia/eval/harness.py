"""``run_eval``: every question of a dataset through the services, per memory policy.

Orders (how memory writes interleave with questions):

- ``online`` (the reference): N workers take questions in dataset order; each question's
  memory is written as soon as it is judged, so later questions see it. Which memories a
  question sees depends on worker timing, as in the paper's evaluation.
- ``batched``: questions go in batches of B; within a batch the memory is frozen (nothing is
  written while any of its questions runs), then the batch's trajectories are written in
  dataset order. What every question sees depends only on the dataset order and B, never on
  the number of workers or their timing (bitwise-equal results also need an LLM whose output
  does not depend on what else shares its batch, e.g. the local backend with
  ``max_batch_size: 1``).

Resume and crash safety: see :mod:`mia.eval.journal`.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mia.data.formats import QAItem
from mia.errors import MiaError
from mia.eval.config import EvalConfig, JudgeLLMConfig
from mia.eval.journal import RunJournal, fault_point
from mia.eval.policies import (
    FeedbackMemory,
    FlowContext,
    PolicySpec,
    finished_item,
    memory_item,
    run_question,
    spec,
)
from mia.eval.templates import question_template, wrong_answers
from mia.judge import Judge
from mia.llm.base import LLMError
from mia.services import ExecutorClient, MemoryClient, RequestFailed

log = logging.getLogger("mia.eval")
Log = Callable[[str], None]


@dataclass
class Endpoints:
    """Where the services are. ``memory_by_policy`` overrides ``memory`` for one policy (e.g.
    ``rag`` on its own identity-mode memory_serve)."""

    serve: str
    memory: str | None = None
    memory_by_policy: dict[str, str] = field(default_factory=dict)
    serve_token: str | None = None
    memory_token: str | None = None

    def memory_for(self, policy: str) -> str | None:
        return self.memory_by_policy.get(policy, self.memory)


@dataclass
class PolicyResult:
    policy: str
    run_dir: Path
    rows: list[dict[str, Any]]
    summary: dict[str, Any]


@dataclass
class EvalResult:
    out_dir: Path
    policies: list[PolicyResult]
    summary_path: Path
    table_path: Path
    plot_path: Path | None
    table: str


# ----------------------------------------------------------------------------- inputs


def load_items(cfg: EvalConfig, require_answer: bool = True) -> list[QAItem]:
    """The questions to evaluate: the dataset, filtered by modality, then offset/limit."""
    from mia.data.formats import load_qa

    if not cfg.dataset:
        raise MiaError("no dataset: pass --data FILE (.jsonl, .json or .parquet)")
    path = Path(cfg.dataset).expanduser()
    if not path.is_file():
        raise MiaError(f"dataset not found: {path}")
    items = load_qa(path, require_answer=require_answer)
    if cfg.modality != "all":
        items = [it for it in items if it.modality == cfg.modality]
    items = items[cfg.offset :]
    if cfg.limit is not None:
        items = items[: cfg.limit]
    if not items:
        raise MiaError(
            f"{path.name}: no questions left after modality={cfg.modality}, "
            f"offset={cfg.offset}, limit={cfg.limit}"
        )
    return items


def build_eval_judge(cfg: EvalConfig) -> Judge:
    """The configured judge; LLM judges get their backend from ``cfg.judge_llm``."""
    from mia.judge import build_judge

    if cfg.judge.type == "rules":
        return build_judge(cfg.judge)
    return build_judge(cfg.judge, backend=role_backend(cfg.judge_llm, default_role="judge"))


def role_backend(spec_: JudgeLLMConfig | dict[str, Any], default_role: str) -> Any:
    """A chat backend for one role of an llm config: ``{config, role, overrides}``."""
    from mia.config import from_dict
    from mia.llm.config import build_backend

    spec_ = from_dict(JudgeLLMConfig, spec_, "judge_llm")
    role = spec_.role or default_role
    data = role_llm_dict(spec_.config or "embedded", role)
    data.update(spec_.overrides)
    return build_backend(data, name=role)


def role_llm_dict(config: str, role: str) -> dict[str, Any]:
    """One role of an llm config, with ``common`` merged in, as LLMConfig fields."""
    import dataclasses

    from mia.llm.config import load_llm_config, role_configs

    roles = role_configs(load_llm_config(config))
    if role not in roles:
        raise MiaError(f"llm config {config}: no role {role!r} (has {sorted(roles)})")
    return dataclasses.asdict(roles[role])


def _ids_sha(items: list[QAItem]) -> str:
    return hashlib.sha256("\n".join(it.id for it in items).encode()).hexdigest()[:16]


# ----------------------------------------------------------------------------- one policy


class _Runner:
    """Runs one policy over the items, journaling rows and memory receipts."""

    def __init__(
        self,
        items: list[QAItem],
        ctx: FlowContext,
        journal: RunJournal,
        cfg: EvalConfig,
        bar: Any,
    ) -> None:
        self.items = items
        self.ctx = ctx
        self.journal = journal
        self.cfg = cfg
        self.bar = bar
        self.owner = journal.memory_owner()  # memory id -> question id (this run's memories)
        self.fresh: set[str] = set()  # rows produced by this process (surely not yet written)
        self.rows_done = 0
        self.writes_done = 0
        # memory.expected_answers=wrong: id -> the answers a failed question's memory keeps
        self.expected: dict[str, list[str]] | None = None

    # -------------------------------------------------------------- questions
    async def _answer(self, index: int, item: QAItem, batch: int | None) -> dict[str, Any]:
        row = await run_question(item, index, self.ctx)
        p = self.ctx.policy
        if p.writes and not p.local and not row["error"] and not self.cfg.memory.ground_truth:
            await self._label_without_ground_truth(item, row)
        row["batch"] = batch
        used = row.get("used_memory_ids") or []
        row["used_memory_from"] = [self.owner.get(int(i)) for i in used]
        pending = self.ctx.policy.writes and not row["error"]
        row["memory"] = "pending" if pending else "none"
        self.journal.add_row(row)
        self.fresh.add(item.id)
        self.rows_done += 1
        fault_point("after_row", self.rows_done)
        self._tick()
        return row

    async def _label_without_ground_truth(self, item: QAItem, row: dict[str, Any]) -> None:
        """``memory.ground_truth=false``: the row's memory label from the vote's no-GT rule.
        The Executor answers ``nogt_samples - 1`` more times with the guide it was given,
        sampled (seeds 1, 2, ...); the memory is ``correct`` when every answer, the row's own
        included, is the same non-empty answer (SQuAD-normalised), else ``incorrect``. A
        sample that fails counts as an answer that disagrees."""
        import base64

        from mia.judge import normalize_answer

        m = self.cfg.memory
        answers = [str(row.get("prediction") or "")]
        images = [base64.b64encode(b).decode("ascii") for b in item.images]
        for seed in range(1, m.nogt_samples):
            try:
                res = await self.ctx.serve.execute(
                    item.question,
                    str(row.get("guide") or ""),
                    data_id=item.id,
                    images=images,
                    temperature=m.nogt_temperature,
                    seed=seed,
                )
                answers.append(res.answer)
            except RequestFailed:
                answers.append("[Failed]")
        forms = {normalize_answer(a) for a in answers}
        agree = len(forms) == 1 and "" not in forms and "[Failed]" not in answers
        row["memory_judgement"] = "correct" if agree else "incorrect"
        row["nogt_answers"] = answers

    def _tick(self) -> None:
        if self.bar is None:
            return
        rows = list(self.journal.rows.values())
        ok = sum(1 for r in rows if r.get("correct"))
        errors = sum(1 for r in rows if r.get("error"))
        self.bar.update(1)
        self.bar.set_postfix(acc=f"{ok / max(1, len(rows)):.3f}", err=errors, refresh=False)

    async def _pool(self, todo: list[tuple[int, QAItem]], batch: int | None, write: bool) -> None:
        queue: asyncio.Queue[tuple[int, QAItem]] = asyncio.Queue()
        for job in todo:
            queue.put_nowait(job)

        async def worker() -> None:
            while True:
                try:
                    index, item = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                row = await self._answer(index, item, batch)
                if write and row["memory"] == "pending":
                    await self._flush([row])

        n = min(self.cfg.workers, len(todo))
        try:
            async with asyncio.TaskGroup() as tg:
                for _ in range(n):
                    tg.create_task(worker())
        except BaseExceptionGroup as group:
            raise group.exceptions[0] from None

    # -------------------------------------------------------------- memory writes
    async def _flush(self, rows: list[dict[str, Any]]) -> None:
        """Write the memories of ``rows`` (dataset order) that are not in memory yet.

        Rows from an earlier, interrupted process may already have been written (crash after
        the write, before its receipt): those are looked up by data_id + source first."""
        rows = [r for r in rows if self.journal.needs_write(r["id"])]
        if not rows:
            return
        source = self.journal.source
        old = [r["id"] for r in rows if r["id"] not in self.fresh]
        found: dict[str, dict[str, Any]] = {}
        if self.ctx.feedback is not None:
            pass  # the harness's own memory: rebuilt from the receipts, never written twice
        elif old and self.ctx.baseline is not None:
            found = {k: {"id": v} for k, v in self.ctx.baseline.find(old, source).items()}
        elif old:
            memory = self.ctx.memory
            assert memory is not None
            try:
                answer = await memory.find_memories(old, source)
            except RequestFailed as err:
                raise MiaError(f"cannot check earlier memory writes: {err}") from None
            found = {m.data_id: {"id": m.id} for m in answer.memories}
        missing = []
        for r in rows:
            m = found.get(r["id"])
            if m is None:
                missing.append(r)
                continue
            self._receipt(r["id"], m["id"], "found", {})
        if missing:
            await self._write(missing)

    async def _write(self, rows: list[dict[str, Any]]) -> None:
        """``/memories`` for ``rows`` in order. A write the service refused (an error answer:
        e.g. the summariser LLM failed; memory_serve writes nothing then) is retried item by
        item, and an item still refused gets a ``failed`` receipt: the run goes on without that
        memory. An unknown outcome (timeout, dropped connection) stops the run; rerunning it
        checks with ``/memories/find`` before writing again."""
        if self.ctx.baseline is not None:
            await self._write_baseline(rows)
            return
        if self.ctx.feedback is not None:
            for r in rows:
                self.writes_done += 1
                self._receipt(r["id"], self.ctx.feedback.record(r), "write", {"action": "write"})
            return
        memory = self.ctx.memory
        assert memory is not None
        m = self.cfg.memory
        expected = m.remember_expected and m.ground_truth
        try:
            answer = await memory.save_memories(
                [
                    memory_item(
                        r,
                        self.journal.source,
                        expected,
                        None if self.expected is None else self.expected.get(r["id"], []),
                    )
                    for r in rows
                ]
            )
        except RequestFailed as err:
            if err.status is None:
                raise MiaError(
                    f"memory write interrupted ({err}); rerun the same command to resume"
                ) from None
            if len(rows) > 1:
                for r in rows:
                    await self._write([r])
                return
            self.writes_done += 1
            self._failed(rows[0]["id"], str(err))
            return
        results = answer.results
        if len(results) != len(rows):
            raise MiaError(f"memory_serve answered {len(results)} results for {len(rows)} items")
        for r, res in zip(rows, results, strict=True):
            self.writes_done += 1
            fault_point("after_write", self.writes_done)
            self._receipt(r["id"], res.id, "write", res.model_dump(mode="json"))

    async def _write_baseline(self, rows: list[dict[str, Any]]) -> None:
        """A baseline's writes, one by one in order. An LLM failure (after the client's
        retries) leaves nothing stored for that row (the write is one SQLite transaction) and
        gets a ``failed`` receipt; the run goes on."""
        baseline = self.ctx.baseline
        assert baseline is not None
        for r in rows:
            try:
                res = await baseline.write(finished_item(r, self.journal.source))
            except LLMError as err:
                self.writes_done += 1
                self._failed(r["id"], " ".join(str(err).split()))
                continue
            self.writes_done += 1
            fault_point("after_write", self.writes_done)
            self._receipt(r["id"], res.write_id, "write", {"action": "write", "ops": res.ops})

    def _failed(self, qid: str, error: str) -> None:
        log.warning("memory write for %s failed: %s", qid, error)
        self.journal.add_receipt(
            {"id": qid, "memory_id": None, "action": "failed", "via": "failed", "error": error}
        )

    def _receipt(self, qid: str, memory_id: int, via: str, res: dict[str, Any]) -> None:
        self.journal.add_receipt(
            {
                "id": qid,
                "memory_id": int(memory_id),
                "action": res.get("action", "found"),
                "replaced_id": res.get("replaced_id"),
                "credited_ids": res.get("credited_ids", []),
                "via": via,
                **({"ops": res["ops"]} if "ops" in res else {}),
            }
        )
        self.owner[int(memory_id)] = qid

    # -------------------------------------------------------------- orders
    async def online(self) -> None:
        indexed = list(enumerate(self.items))
        # Finish the writes an interrupted run left pending before anything reads memory.
        await self._flush(
            [self.journal.rows[it.id] for _, it in indexed if it.id in self.journal.rows]
        )
        todo = [(i, it) for i, it in indexed if not self.journal.done(it.id)]
        if todo:
            await self._pool(todo, None, write=True)

    async def batched(self) -> None:
        indexed = list(enumerate(self.items))
        size = self.cfg.batch_size
        for b, start in enumerate(range(0, len(indexed), size)):
            batch = indexed[start : start + size]
            todo = [(i, it) for i, it in batch if not self.journal.done(it.id)]
            if todo:
                await self._pool(todo, b, write=False)
            rows = [self.journal.rows[it.id] for _, it in batch if it.id in self.journal.rows]
            await self._flush(rows)


async def _preflight(serve: ExecutorClient, memory: MemoryClient | None, p: PolicySpec) -> None:
    await serve.check_health()
    if memory is None:
        return
    await memory.check_health()
    mode = (await memory.stats()).compress_mode
    if p.compress_modes is not None and mode not in p.compress_modes:
        raise MiaError(
            f"policy {p.name} needs memory_serve with compress.mode={'|'.join(p.compress_modes)}, but "
            f"{memory.url} runs compress.mode={mode}"
        )
    routes = await memory.routes()
    if routes is not None:
        if p.planner and "/plan" not in routes:
            raise MiaError(
                f"policy {p.name} needs the planner routes, but memory_serve at {memory.url} "
                "has none (started with llm.enabled=false?)"
            )
        if p.writes and "/memories/find" not in routes:
            raise MiaError(f"memory_serve at {memory.url} has no /memories/find (too old)")


async def run_policy(
    items: list[QAItem],
    policy: str,
    cfg: EvalConfig,
    endpoints: Endpoints,
    judge: Judge,
    run_dir: Path,
    *,
    restart: bool = False,
    progress: bool = True,
    log_fn: Log | None = None,
) -> PolicyResult:
    """Evaluate one policy into ``run_dir`` (resuming what is already there)."""
    say = log_fn or (lambda _m: None)
    p = spec(policy)
    memory_url = endpoints.memory_for(policy) if p.needs_memory else None
    if p.needs_memory and not memory_url:
        raise MiaError(f"policy {policy} needs memory_serve: pass --memory-url or --start-services")
    journal = RunJournal(run_dir)
    manifest = {
        "policy": policy,
        "order": cfg.order,
        "batch_size": cfg.batch_size if cfg.order == "batched" else None,
        "dataset": Path(cfg.dataset or "").name,
        "question_ids_sha": _ids_sha(items),
        "questions": len(items),
    }
    serve = ExecutorClient(
        endpoints.serve, token=endpoints.serve_token, timeout_s=cfg.request_timeout_s
    )
    memory = (
        MemoryClient(memory_url, token=endpoints.memory_token, timeout_s=cfg.request_timeout_s)
        if memory_url
        else None
    )
    bar = None
    start = time.perf_counter()
    baseline = None
    baseline_stats = None
    planner_llm = None
    backends: list[Any] = []
    try:
        # Check the services before touching the run folder: a wrong URL leaves nothing behind.
        await _preflight(serve, memory, p)
        if p.baseline:
            baseline, planner_llm, backends = open_baseline(policy, cfg, run_dir)
        resumed = journal.open(manifest, restart=restart)
        done = sum(1 for it in items if journal.done(it.id))
        if resumed:
            say(f"[{policy}] resuming {run_dir}: {done}/{len(items)} questions already answered")
        elif p.writes and cfg.memory.clear_on_start and baseline is not None:
            baseline.clear()
        elif p.writes and cfg.memory.clear_on_start and memory is not None:
            await memory.clear_memory()
        bar = _progress_bar(policy, len(items), done) if progress else None
        ctx = FlowContext(
            policy=p,
            serve=serve,
            memory=memory,
            judge=judge,
            top_k=cfg.memory.top_k,
            replan_top_k=cfg.memory.replan_top_k,
            plan_without_memory=cfg.memory.plan_without_memory,
            plan_without_failure=cfg.memory.plan_without_failure,
            drop_leaked_plans=cfg.memory.drop_leaked_plans,
            reflect=cfg.reflect,
            baseline=baseline,
            planner_llm=planner_llm,
        )
        if p.local:
            ctx.feedback = feedback_memory(journal)
            ctx.templates = {it.id: question_template(it) for it in items}
        runner = _Runner(items, ctx, journal, cfg, bar)
        if memory is not None and cfg.memory.expected_answers == "wrong":
            runner.expected = {
                k: [v] for k, v in wrong_answers(items, answer_pool(cfg, items)).items()
            }
        if cfg.order == "online":
            await runner.online()
        else:
            await runner.batched()
        baseline_stats = baseline.stats() if baseline is not None else None
    finally:
        if bar is not None:
            bar.close()
        journal.close()
        await serve.aclose()
        if memory is not None:
            await memory.aclose()
        if baseline is not None:
            baseline.close()
        for backend in backends:
            await backend.aclose()
    rows = list(journal.ordered_rows([it.id for it in items]))
    summary = _summary(rows, journal, policy, judge, cfg, run_dir)
    summary["wall_s"] = round(time.perf_counter() - start, 1)
    if baseline_stats is not None:
        summary["baseline"] = baseline_stats
    return PolicyResult(policy, run_dir, rows, summary)


def _progress_bar(policy: str, total: int, done: int) -> Any:
    """A tqdm bar on stderr (a line every 10 s when stderr is not a terminal)."""
    from tqdm import tqdm

    return tqdm(
        total=total,
        initial=done,
        desc=f"{policy:>9}",
        unit="q",
        file=sys.stderr,
        dynamic_ncols=True,
        mininterval=1.0 if sys.stderr.isatty() else 10.0,
    )


def _summary(
    rows: list[dict[str, Any]],
    journal: RunJournal,
    policy: str,
    judge: Judge,
    cfg: EvalConfig,
    run_dir: Path,
) -> dict[str, Any]:
    """The policy's summary (:func:`mia.eval.report.summarize`) with its memory writes."""
    from mia.eval.report import summarize

    summary = summarize(rows, policy, judge=getattr(judge, "name", "?"))
    receipts = [journal.receipts[r["id"]] for r in rows if r["id"] in journal.receipts]
    summary["memories_written"] = sum(1 for x in receipts if x.get("memory_id") is not None)
    summary["memory_write_errors"] = sum(1 for x in receipts if x.get("memory_id") is None)
    summary["order"] = cfg.order
    summary["run_dir"] = str(run_dir)
    return summary


def feedback_memory(journal: RunJournal) -> FeedbackMemory:
    """The ``feedback`` policy's memory, with what an interrupted run of it had written (its
    receipts, in the order they were written)."""
    memory = FeedbackMemory()
    for qid in journal.receipts:
        if qid in journal.rows:
            memory.record(journal.rows[qid])
    return memory


def answer_pool(cfg: EvalConfig, items: list[QAItem]) -> list[QAItem]:
    """The questions whose answers ``memory.expected_answers=wrong`` draws from: the whole
    dataset file when there is one (every modality), else the evaluated questions."""
    if not cfg.dataset:
        return items
    from mia.data.formats import load_qa

    return load_qa(Path(cfg.dataset).expanduser(), require_answer=False)


def open_baseline(policy: str, cfg: EvalConfig, run_dir: Path) -> tuple[Any, Any, list[Any]]:
    """Memory baseline ``policy`` on ``run_dir/baseline.sqlite``: the memory, the Planner's
    backend (expel, memento; else None) and the backends to close afterwards."""
    from mia.baselines import build_memory
    from mia.embedding import shared_embedder

    b = cfg.baselines
    config = b.llm.config or cfg.services.llm_config

    def backend(role: str) -> Any:
        return role_backend(
            {"config": config, "role": role, "overrides": dict(b.llm.overrides)},
            default_role=role,
        )

    memory_llm = backend(b.llm.memory_role)
    backends = [memory_llm]
    planner_llm = None
    if spec(policy).planner:
        planner_llm = backend(b.llm.planner_role)
        backends.append(planner_llm)
    run_dir.mkdir(parents=True, exist_ok=True)
    memory = build_memory(
        policy, b, run_dir / "baseline.sqlite", memory_llm, shared_embedder(b.embedder)
    )
    return memory, planner_llm, backends


# ----------------------------------------------------------------------------- all policies


def policy_lanes(policies: list[str], endpoints: Endpoints) -> list[list[str]]:
    """Policies that may run at the same time, each lane running its policies one after
    another: the policies that read or write one memory_serve store share a lane (in their
    order: each clears and fills the store); the others (no memory, a Planner without memories,
    a baseline's memory of its own) get a lane each.

    >>> policy_lanes(["none", "plan_only", "rag", "mia", "mem0"], Endpoints("s", "m"))
    [['none'], ['plan_only'], ['rag', 'mia'], ['mem0']]
    >>> policy_lanes(["rag", "mia"], Endpoints("s", "m", memory_by_policy={"rag": "r"}))
    [['rag'], ['mia']]
    """
    lanes: dict[str, list[str]] = {}
    for policy in policies:
        p = spec(policy)
        shared = (p.retrieve or p.writes) and p.needs_memory
        key = f"store:{endpoints.memory_for(policy)}" if shared else policy
        lanes.setdefault(key, []).append(policy)
    return list(lanes.values())


def run_eval(
    cfg: EvalConfig,
    endpoints: Endpoints,
    out_dir: str | Path,
    *,
    restart: bool = False,
    progress: bool = True,
    log_fn: Log | None = None,
    items: list[QAItem] | None = None,
) -> EvalResult:
    """Evaluate every configured policy into ``out_dir/<policy>/`` and write the combined
    ``summary.json``, ``summary.txt`` and ``accuracy.png``."""
    from mia.eval.report import write_report

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    needs_golds = cfg.judge.type != "panel"
    if items is None:
        items = load_items(cfg, require_answer=needs_golds)
    judge = build_eval_judge(cfg)

    async def lane(policies: list[str]) -> list[PolicyResult]:
        return [
            await run_policy(
                items,
                policy,
                cfg,
                endpoints,
                judge,
                out / policy,
                restart=restart,
                progress=progress,
                log_fn=log_fn,
            )
            for policy in policies
        ]

    async def all_policies() -> list[PolicyResult]:
        # One event loop for every policy: LLM judge clients stay on the loop they started on.
        if not cfg.parallel_policies:
            return await lane(list(cfg.policies))
        lanes = policy_lanes(cfg.policies, endpoints)
        done = await asyncio.gather(*(lane(ps) for ps in lanes))
        by_name = {r.policy: r for results in done for r in results}
        return [by_name[p] for p in cfg.policies]

    results = asyncio.run(all_policies())
    summary_path, table_path, plot_path, table = write_report(
        out, [r.summary for r in results], [r.rows for r in results], plot=cfg.plot
    )
    return EvalResult(out, results, summary_path, table_path, plot_path, table)
