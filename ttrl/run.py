"""Test-time RL: one pass over a test set that updates the memory and the Planner together.

Per batch of questions (docs/reference.md §8, TTRL):

1. memories for every question (memory_serve ``/memory``);
2. n planner rollouts per question: plan -> the Executor (serve) -> reflect -> optional replan
   (:class:`mia.planner.episode.PlannerEpisode`);
3. judging: the ground truth (``mode=supervised``), or without it the review panel / majority
   vote (``mode=nogt``, :mod:`ttrl.rewards`);
4. a GRPO step on the Planner (the engine's, :class:`mia.rl.trainer.Trainer`);
5. memory: ``/memory_bank_save`` -> ``/batch_evaluate`` -> ``/consolidate_memories`` ->
   ``/save_memory`` (:mod:`mia.roles.ttrl_memory`), journaled (:mod:`mia.roles.journal`);
6. the batch's accuracy row (``accuracy.jsonl`` + ``accuracy.png``).

The Planner update (4) is checkpointed before the memory writes (5) of its batch: the two are
independent within a batch, and this order lets a killed run resume without writing anything
twice (a batch whose update was lost is rolled out again, with the same seeds; a batch whose
memory writes began is finished from its journal).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mia.errors import MiaError
from mia.paths import resolve_run_dir
from mia.planner.episode import ExecutorAloneEpisode, PlannerEpisode
from mia.rewards.grading import grade
from mia.rewards.planner import PlannerReward
from mia.rl.trainer import Trainer
from mia.roles.common import (
    build_judge,
    clients,
    resolve_model,
    role_config,
    role_main,
    trainer_section,
)
from mia.roles.journal import Journal
from mia.roles.samples import load_samples
from mia.roles.ttrl_memory import bank_item, check_empty_buffer, commit_batch
from ttrl import curve
from ttrl.config import TTRLConfig, load_config
from ttrl.rewards import PanelReward, VoteGroupReward, pending_vote

__all__ = ["PERSIST_POINTS", "TTRLResult", "TTRLRun", "run_ttrl", "run_ttrl_pass"]

# Where a batch's progress has just been made durable, in order: its GRPO step taken and its row
# and memory bank journaled; the Planner checkpointed (save_freq batches only); the bank in
# memory_serve's buffer; the buffer consolidated. ``TTRLRun(on_persisted=...)`` is called at each with
# (batch, point); a kill at any of them resumes without writing a memory twice.
PERSIST_POINTS = ("after_update", "after_checkpoint", "after_bank_save", "after_consolidate")


@dataclass
class TTRLResult:
    run_dir: Path
    rows: list[dict[str, Any]]
    accuracy_path: Path
    curve_path: Path | None
    memory_dir: Path | None
    checkpoint_dir: Path
    batches: int
    started_at_batch: int = 0  # > 0: this process resumed a killed run
    metrics: list[dict[str, Any]] = field(default_factory=list)


def _mean(values: Sequence[float]) -> float | None:
    return float(sum(values) / len(values)) if values else None


def executor_usage(trajectories: Sequence[Any]) -> dict[str, float | None]:
    """Per rollout, the Executor's work (its first run plus the run after a replan): tool
    calls, assistant turns and tokens, as serve reported them."""
    usages = [t.usage() for t in trajectories]
    return {
        "tool_calls_per_rollout": _mean([float(len(u["tool_calls"])) for u in usages]),
        "turns_per_rollout": _mean([float(u["turns"]) for u in usages]),
        "executor_tokens_per_rollout": _mean(
            [float(u["prompt"] + u["completion"]) for u in usages]
        ),
    }


def question_votes(
    ok: Sequence[Any],
    acc: Sequence[float],
    reported: Mapping[str, tuple[str, float | None]] | None = None,
) -> list[dict[str, Any]]:
    """Per question (GRPO group): its rollouts' final answers, their accuracy when known, their
    rewards, the majority answer (normalised; ties go to the earliest rollout) with its
    accuracy, and the answer reported for the question with its accuracy: ``reported[data_id]``
    (the separate greedy rollout of ``answer=greedy``: answer, accuracy) where given, else the
    majority."""
    from mia.judge.rules import normalize_answer

    known = len(acc) == len(ok)
    groups: dict[str, list[int]] = {}
    for i, r in enumerate(ok):
        groups.setdefault(r.group, []).append(i)
    out = []
    for idx in groups.values():
        answers = [str(ok[i].trajectory.final_answer) for i in idx]
        keys = [normalize_answer(a) for a in answers]
        top = max(keys.count(k) for k in keys)
        pick = next(i for i, k in zip(idx, keys, strict=True) if keys.count(k) == top)
        data_id = str(ok[idx[0]].sample.get("data_id"))
        vote = (str(ok[pick].trajectory.final_answer), acc[pick] if known else None)
        answer = (reported or {}).get(data_id)
        out.append(
            {
                "data_id": data_id,
                "answers": answers,
                "correct": [acc[i] for i in idx] if known else None,
                "rewards": [round(float(ok[i].reward), 6) for i in idx],
                "vote_answer": vote[0],
                "vote_correct": vote[1],
                "answer": (answer or vote)[0],
                "answer_correct": (answer or vote)[1],
                "answer_from": "greedy" if answer else "vote",
            }
        )
    return out


def _doubted_groups(results: Sequence[Any]) -> set[str]:
    """The groups whose finished rollouts' final answers are not all one (SQuAD-normalised)."""
    from mia.judge.rules import normalize_answer

    answers: dict[str, set[str]] = {}
    for r in results:
        if r.error is None and r.trajectory is not None:
            answers.setdefault(r.group, set()).add(normalize_answer(r.trajectory.final_answer))
    return {g for g, forms in answers.items() if len(forms) > 1}


def _fingerprint(
    samples: Sequence[Mapping[str, Any]], batch_size: int, n: int, cfg: TTRLConfig
) -> str:
    """What a resumed run must share with the journal it continues: the questions, the batches
    and every setting that changes what a batch answers and remembers (a run resumed with
    another ``memory.alone_samples`` would gate its later batches by another rule)."""
    ids = json.dumps([str(s.get("data_id")) for s in samples])
    m = cfg.memory
    rule = [cfg.mode, cfg.nogt.method, cfg.answer, m.plan_without_failure, m.alone_samples,
            m.alone_temperature, m.remember_expected]  # fmt: skip
    return hashlib.sha256(f"{ids}|{batch_size}|{n}|{json.dumps(rule)}".encode()).hexdigest()[:16]


class TTRLRun:
    """``TTRLRun(cfg).run() -> TTRLResult`` for a :class:`~ttrl.config.TTRLConfig` (or a
    composed ``configs/ttrl`` mapping, validated into one).

    ``generator`` / ``judge`` / ``panel`` replace what the config would build (tests, demos).
    ``on_persisted(batch, point)``, when given, is called at each of :data:`PERSIST_POINTS`
    (none in production; tests kill the process there to check the resume).
    """

    def __init__(
        self,
        cfg: TTRLConfig | Mapping[str, Any],
        *,
        generator: Any = None,
        judge: Any = None,
        panel: Any = None,
        on_persisted: Callable[[int, str], None] | None = None,
    ) -> None:
        self.cfg = cfg = role_config(TTRLConfig, cfg, "ttrl")
        self.mode = cfg.mode
        self.method = cfg.nogt.method
        if not cfg.data.test:
            raise MiaError("set data.test=FILE (reference parquet, JSON or JSONL test set)")
        self.samples = load_samples(
            cfg.data.test, require_answer=self.mode == "supervised", limit=cfg.data.limit
        )
        if not cfg.services.memory_url:
            raise MiaError("set services.memory_url (memory_serve): TTRL writes its memories there")
        self.executor, self.memory = clients(cfg.services)
        assert self.memory is not None
        self.run_dir = resolve_run_dir(cfg.run_dir, "ttrl")
        self.journal = Journal(self.run_dir / "ttrl_state")
        self.eval_dir = str(self.run_dir / "eval") if cfg.memory.evaluate else None
        self.memory_dir = self.run_dir / "memory" if cfg.memory.save else None
        self.accuracy_path = self.run_dir / "accuracy.jsonl"
        self.curve_path = self.run_dir / "accuracy.png" if cfg.plot else None
        self.on_persisted = on_persisted
        self.judge = judge
        self.panel = panel
        self.generator = generator
        self.alone_episode = ExecutorAloneEpisode(
            self.executor, temperature=cfg.memory.alone_temperature
        )

    # ------------------------------------------------------------------ pieces
    def _persisted(self, batch: int, point: str) -> None:
        if self.on_persisted is not None:
            self.on_persisted(batch, point)

    def _rewards(self) -> tuple[Any, Any]:
        cfg = self.cfg
        if self.judge is None:
            self.judge = build_judge(cfg.judge, cfg.llm)
        if self.mode == "supervised":
            return PlannerReward(self.judge, cfg.reward), None
        if self.method == "vote":
            return pending_vote, VoteGroupReward(cfg.nogt_reward)
        if self.panel is None:
            if cfg.panel.type != "panel":
                raise MiaError("nogt.method=panel needs a panel judge config (panel.type=panel)")
            self.panel = build_judge(cfg.panel, cfg.llm)
        return PanelReward(self.panel, cfg.nogt_reward), None

    def _trainer(self) -> Trainer:
        cfg = self.cfg
        section = trainer_section(cfg, resolve_model(cfg.model_path))
        section.run_dir = str(self.run_dir)
        bs = max(1, min(section.batch_size, len(self.samples)))
        section.batch_size = bs
        self.batch_size = bs
        self.n_batches = -(-len(self.samples) // bs)
        section.total_steps = self.n_batches
        section.shuffle = False
        section.resume = cfg.resume
        self.save_every = int(section.save_freq or 1)
        episode = PlannerEpisode(
            self.executor,
            self.memory,
            cfg.episode,
            chat_template_kwargs=cfg.chat_template_kwargs or None,
        )
        reward_fn, group_reward = self._rewards()
        return Trainer(
            section,
            episode,
            reward_fn,
            self.samples,
            generator=self.generator,
            group_reward=group_reward,
        )

    def _with_memories(self, batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        assert self.memory is not None
        top_k = self.cfg.episode.memory_top_k
        queries = [
            self.memory.query(
                s["question"],
                image_caption=s.get("image_caption") or None,
                data_id=s.get("data_id"),
                top_k=top_k,
            )
            for s in batch
        ]
        found = self.memory.sync.memories(queries)
        out = []
        for s, m in zip(batch, found, strict=True):
            out.append(
                {
                    **s,
                    "memory_context": m.context,
                    "memory_ids": [*m.positive_ids, *m.negative_ids],
                    "memory_failed": bool(m.negative_ids),
                }
            )
        return out

    def _gate(
        self, batch: list[dict[str, Any]]
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """(planned, answered alone): with ``memory.plan_without_failure=false`` the Planner
        plans only the questions whose memories show a similar question failing; the Executor
        answers the others alone."""
        if self.cfg.memory.plan_without_failure:
            return batch, []
        planned = [s for s in batch if s["memory_failed"]]
        return planned, [s for s in batch if not s["memory_failed"]]

    def _report_accuracy(self, trainer: Trainer, ok: list[Any]) -> list[float]:
        """Per rollout: the ground-truth verdict on its final answer (reporting only)."""
        if self.mode == "supervised":
            return [float(r.extras.get("acc_final", 0.0)) for r in ok]
        labelled = [r for r in ok if r.sample.get("golds")]
        if len(labelled) < len(ok) or not ok:
            return []

        async def grade_all() -> list[float]:
            import asyncio

            graded = await asyncio.gather(
                *(
                    grade(
                        self.judge,
                        r.trajectory.question,
                        r.trajectory.final_answer,
                        list(r.sample["golds"]),
                    )  # fmt: skip
                    for r in labelled
                )
            )
            return [g.acc for g in graded]

        return trainer.run_async(grade_all())

    def _row(
        self,
        trainer: Trainer,
        batch: int,
        samples: list[dict[str, Any]],
        results: list[Any],
        seconds: float,
        planned: int,
        updated: bool | None = None,
        answered: Sequence[Any] = (),
        doubted: set[str] | frozenset[str] = frozenset(),
    ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        ok = [r for r in results if r.error is None and r.trajectory is not None]
        acc = self._report_accuracy(trainer, ok)
        judged = [1.0 if r.extras.get("judgement") == "correct" else 0.0 for r in ok]
        # answer=greedy: each planned question's reported answer is its greedy rollout (a
        # failed one falls back to the majority).
        greedy = [r for r in answered if r.error is None and r.trajectory is not None]
        greedy_acc = self._report_accuracy(trainer, greedy)
        reported = {
            str(r.sample.get("data_id")): (
                str(r.trajectory.final_answer),
                greedy_acc[i] if len(greedy_acc) == len(greedy) else None,
            )
            for i, r in enumerate(greedy)
        }
        per_question = question_votes(ok, acc, reported)
        row: dict[str, Any] = {
            "batch": batch,
            "step": trainer.step,
            "questions": len(samples),
            "planned_questions": planned,  # the others: the Executor alone (plan_without_failure)
            "updated": updated,  # the GRPO step: None = none tried, False = skipped (all tied)
            "rollouts": len(ok),
            "failed_rollouts": len(results) - len(ok),
            "accuracy": _mean(acc),
            # The majority of each question's n final answers (no ground truth needed) and the
            # answer TTRL gives (that majority, or with answer=greedy the greedy rollout's),
            # next to the mean over single rollouts.
            "accuracy_vote": _mean(
                [q["vote_correct"] for q in per_question if q["vote_correct"] is not None]
            ),
            "accuracy_answer": _mean(
                [q["answer_correct"] for q in per_question if q["answer_correct"] is not None]
            ),
            "answer_rollouts": len(greedy),
            "failed_answer_rollouts": len(answered) - len(greedy),
            "per_question": per_question,
            "accuracy_first": _mean(
                [float(r.extras["acc_first"]) for r in ok if "acc_first" in r.extras]
            )
            if self.mode == "supervised"
            else None,
            "self_accuracy": _mean(judged) if self.mode == "nogt" else None,
            "reward_mean": _mean([r.reward for r in ok]),
            "replan_rate": _mean([float(r.trajectory.asked_replan) for r in ok]),
            **executor_usage([r.trajectory for r in ok]),
            "seconds": round(seconds, 3),
        }
        expected = self.cfg.memory.remember_expected
        # doubted: the no-GT vote's alone groups whose answers disagree, remembered as failures
        bank = [
            bank_item(
                r.sample,
                r.trajectory,
                {**r.extras, "judgement": "incorrect"} if r.group in doubted else r.extras,
                self.mode,
                batch,
                r.reward,
                expected,
            )
            for r in ok
        ]
        return row, bank

    def _commit(self, trainer: Trainer, batch: int, payload: dict[str, Any]) -> dict[str, Any]:
        assert self.memory is not None
        info = commit_batch(
            self.memory,
            self.journal,
            batch,
            payload,
            eval_dir=self.eval_dir,
            save_path=str(self.memory_dir) if self.memory_dir is not None else None,
            crash=lambda point: self._persisted(batch, point),
        )
        row = {**payload["row"], **info}
        row["memories"] = self.memory.sync.stats().memories
        rows = curve.write_row(self.accuracy_path, row)
        if self.curve_path is not None:
            curve.plot(rows, self.curve_path, title=f"TTRL ({self.mode})")
        self.journal.finish(batch)
        acc = row.get("accuracy")
        trainer.note(
            f"batch {batch + 1}/{self.n_batches}: accuracy "
            f"{'n/a' if acc is None else f'{acc:.3f}'} | reward {row['reward_mean'] or 0:.3f} "
            f"| memories {row['memories']}"
        )
        return row

    def _checkpoint_batch(self, trainer: Trainer, path: Path) -> int:
        state = json.loads((path / "trainer_state.json").read_text())
        return int((state.get("data_state") or {}).get("ttrl_batch", 0))

    # ------------------------------------------------------------------ the pass
    def run(self) -> TTRLResult:
        """Start the pass in run_dir, or resume the one its journal holds, and run every batch
        left."""
        trainer = self._trainer()
        try:
            # Whether this run_dir may be (re)entered at all is the journal's to say: asked
            # before the trainer loads the Planner and its generator.
            fp, state = self._admit(trainer)
            with trainer:
                started, first = self._resume(trainer, fp, state)
                metrics = [self._run_batch(trainer, b) for b in range(first, self.n_batches)]
        finally:
            # The sync pools of the orchestration calls (the async ones close with the trainer).
            self.memory.close()  # type: ignore[union-attr]
            self.executor.close()
        return TTRLResult(
            run_dir=self.run_dir,
            rows=curve.read_rows(self.accuracy_path),
            accuracy_path=self.accuracy_path,
            curve_path=self.curve_path,
            memory_dir=self.memory_dir,
            checkpoint_dir=trainer.ckpt_dir,
            batches=self.n_batches,
            started_at_batch=started,
            metrics=metrics,
        )

    def _admit(self, trainer: Trainer) -> tuple[str, dict[str, Any]]:
        """(this run's fingerprint, the journal's state: empty for a new run). Refuses a run_dir
        holding a run over other data, batches or memory settings, and any run without
        ``resume=true``."""
        fp = _fingerprint(self.samples, self.batch_size, trainer.cfg.n, self.cfg)
        state = self.journal.load()
        if state and state.get("fingerprint") != fp:
            raise MiaError(
                f"{self.run_dir} holds a TTRL run over other data, batch or memory "
                "settings; use another run_dir"
            )
        if state and not trainer.cfg.resume:
            raise MiaError(
                f"{self.run_dir} holds a TTRL run; resume=true continues it, or use another run_dir"
            )
        return fp, state

    def _resume(self, trainer: Trainer, fp: str, state: dict[str, Any]) -> tuple[int, int]:
        """(the batch the journal resumes at, the first batch to roll out). A new run starts
        its journal (memory_serve's buffer must be empty); a resumed one finishes the memory
        writes of a batch whose update survived (it began them, or a checkpoint holds it) and
        drops one whose update was lost, to roll it out again with the same seeds."""
        from mia.rl.checkpoint import latest_checkpoint

        ckpt = latest_checkpoint(trainer.ckpt_dir) if trainer.cfg.resume else None
        ckpt_batch = self._checkpoint_batch(trainer, ckpt) if ckpt is not None else 0
        nb = started = self.journal.next_batch
        if not state:
            check_empty_buffer(self.memory)  # type: ignore[arg-type]
            self.journal.save(fingerprint=fp, next_batch=0, batches=self.n_batches)
        pending = self.journal.pending(nb)
        if pending is not None:
            if self.journal.phases(nb) or ckpt_batch > nb:
                trainer.note(f"resuming: finishing the memory writes of batch {nb + 1}")
                self._commit(trainer, nb, pending)
                nb += 1
            else:  # its update was lost: roll it out again (same seeds)
                self.journal.drop(nb)
        if ckpt_batch > nb:
            raise MiaError(
                f"checkpoint of batch {ckpt_batch} is ahead of the journal (batch {nb}): "
                f"{self.journal.root} was removed or belongs to another run"
            )
        if ckpt_batch < nb:
            trainer.note(
                f"resuming at batch {nb + 1}: Planner weights from batch {ckpt_batch} (the "
                f"updates of batches {ckpt_batch + 1}..{nb} were not checkpointed; their "
                "memories are kept)"
            )
        elif nb:
            trainer.note(f"resuming at batch {nb + 1}/{self.n_batches}")
        return started, nb

    def _run_batch(self, trainer: Trainer, b: int) -> dict[str, Any]:
        """Batch ``b``: its rollouts and GRPO step, journaled, then the Planner checkpoint
        (every save_freq batches and after the last) and the memory writes; returns the
        metrics it logged."""
        step_metrics, payload = self._learn_batch(trainer, b)
        self.journal.write_pending(b, payload)
        self._persisted(b, "after_update")
        last = b == self.n_batches - 1
        if self.save_every > 0 and ((b + 1) % self.save_every == 0 or last):
            trainer.save_checkpoint({"ttrl_batch": b + 1})
            self._persisted(b, "after_checkpoint")
        full = self._commit(trainer, b, self.journal.pending(b) or {})
        ttrl_metrics = {
            f"ttrl/{k}": v
            for k, v in full.items()
            if isinstance(v, int | float) and not isinstance(v, bool)
        }
        merged = {**step_metrics, **ttrl_metrics}
        trainer.log_metrics(merged)
        return {"step": trainer.step, **merged}

    def _learn_batch(self, trainer: Trainer, b: int) -> tuple[dict[str, Any], dict[str, Any]]:
        """Batch ``b`` up to its memory writes: memories, the rollouts (planned and alone),
        their judging and the GRPO step. Returns (the step's metrics, the journal payload: the
        batch's accuracy row and its memory bank)."""
        t0 = time.perf_counter()
        lo = b * self.batch_size
        batch = self._with_memories(self.samples[lo : lo + self.batch_size])
        planned, alone = self._gate(batch)
        results = trainer.collect(planned, tag=f"b{b}") if planned else []
        # answer=greedy: the answer reported for a planned question comes from one more
        # rollout with a greedy plan, collected before the update (it must not have learnt
        # from this batch's verdicts); the sampled ones train the Planner and go to memory,
        # this one only answers.
        answered = (
            trainer.collect(planned, n=1, sampling={"temperature": 0.0}, tag=f"answer-b{b}")
            if planned and self.cfg.answer == "greedy"
            else []
        )
        # Unlogged: its row is logged by _run_batch with the ttrl/* keys of the batch.
        step_metrics = trainer.learn(results, log=False) if results else {}
        alone_results = (
            trainer.collect(
                alone,
                n=self.cfg.memory.alone_samples,
                tag=f"alone-b{b}",
                episode=self.alone_episode,
            )
            if alone
            else []
        )
        results += alone_results
        # Without ground truth (the vote) an unplanned question whose Executor answers disagree
        # is remembered as a failure, its majority still answering it: their doubt is the only
        # sign of one, and memory keeps one memory per question, so a losing answer stored
        # beside the winner would be dropped and the gate would never plan.
        doubted = (
            _doubted_groups(alone_results)
            if self.mode == "nogt" and self.method == "vote"
            else set()
        )
        # Whether the Planner moved: None without a step (no question planned), False when the
        # trainer skipped it (every group tied: no signal).
        updated = bool(step_metrics.get("actor/updates")) if planned else None
        seconds = time.perf_counter() - t0
        row, bank = self._row(
            trainer, b, batch, results, seconds, len(planned), updated, answered, doubted
        )
        return step_metrics, {"row": row, "bank": bank}


def run_ttrl(cfg: TTRLConfig | Mapping[str, Any], **kwargs: Any) -> TTRLResult:
    return TTRLRun(cfg, **kwargs).run()


def run_ttrl_pass(
    data: str | Path,
    *,
    executor_url: str,
    memory_url: str,
    run_dir: str | Path,
    model_path: str = "embedded",
    mode: str = "supervised",
    nogt_method: str = "panel",
    batch_size: int = 2,
    n: int = 2,
    max_batches: int | None = None,
    overrides: Sequence[str] = (),
    generator: Any = None,
    judge: Any = None,
    panel: Any = None,
) -> TTRLResult:
    """One TTRL pass for ``mia demo --ttrl`` (and scripts): ``configs/ttrl/default.yaml`` with
    these settings, the Planner trained in this process (no Ray). ``overrides`` are further
    ``key=value`` config overrides; ``generator`` / ``judge`` / ``panel`` replace what the config
    would build. Print the curve with ``ttrl.curve.format_curve(result.rows)``."""
    limit = None if max_batches is None else int(max_batches) * int(batch_size)
    cfg = load_config(
        "default",
        [
            f"mode={mode}",
            f"nogt.method={nogt_method}",
            f"model_path={model_path}",
            f"data.test={data}",
            f"data.limit={'null' if limit is None else limit}",
            f"run_dir={run_dir}",
            f"services.executor_url={executor_url}",
            f"services.memory_url={memory_url}",
            f"trainer.batch_size={batch_size}",
            f"trainer.n={n}",
            "trainer.workers.mode=single_process",
            *overrides,
        ],
    )
    return run_ttrl(cfg, generator=generator, judge=judge, panel=panel)


def _run_cli(cfg: TTRLConfig) -> None:
    result = run_ttrl(cfg)
    print(curve.format_curve(result.rows), flush=True)
    print(
        f"ttrl: {result.batches} batches; accuracy {result.accuracy_path}"
        + (f", curve {result.curve_path}" if result.curve_path else "")
        + (f", memory {result.memory_dir}" if result.memory_dir else "")
        + f", checkpoints {result.checkpoint_dir}",
        flush=True,
    )


def main(argv: list[str] | None = None) -> None:
    role_main(
        "python -m ttrl",
        "Test-time RL: one pass over a test set updating memory and Planner "
        "(mode=supervised|nogt; configs/ttrl/).",
        "ttrl",
        _run_cli,
        argv,
        schema=TTRLConfig,
    )
