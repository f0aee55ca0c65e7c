"""The GRPO trainer, generic over an episode and a reward function.

    Trainer(cfg, episode, reward_fn, dataset).fit()

One step (``configs/rl/trainer.yaml``):

1. take ``batch_size`` samples (shuffled per epoch from ``seed``; the position is checkpointed);
2. run ``n`` rollouts per sample CONCURRENTLY (one asyncio task each; the generator batches
   their calls), each followed by its reward ``reward_fn(sample, trajectory)`` -> ``score`` or
   ``(score, extras)``, sync or async;
3. group-normalised advantages (:func:`mia.rl.grpo.group_advantages`);
4. old log-probs (``old_logprobs``): ``auto`` (default) takes the update's own log-probs,
   detached, when the batch gets one optimizer step (exact: the weights have not moved since
   they sampled it), and recomputes them otherwise; ``recompute`` always runs the policy once
   more; ``rollout`` uses the generator's. Either trainer-side way also gives the entropy and
   the rollout/trainer log-prob gap;
5. ``ppo_epochs`` passes of ``PolicyGroup.train_step`` over mini-batches of ``mini_batch_size``
   sequences;
6. weight sync to the generator: ``update_weights(state_dict=...)`` in process, or an exported
   Hugging Face folder + ``update_weights(path=...)`` (``weight_sync: folder``);
7. metrics to the console, ``<run_dir>/metrics.jsonl`` and wandb (offline) when enabled;
   a checkpoint every ``save_freq`` steps (and at the end) with the data position.

``resume: true`` continues from the latest complete checkpoint under ``checkpoint_dir``.
Role trainers (Executor, Planner, TTRL) are configurations of this class with their own episode
and reward. Step 2, and steps 3-6 with the metrics, are public on their own
(:meth:`Trainer.collect`, :meth:`Trainer.learn`) for loops that act between rollouts and the
update (TTRL writes the rollouts into memory; the streaming server buffers rollouts of several
requests); ``fit`` runs through the same two methods.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import shutil
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

import torch

from mia.errors import MiaError
from mia.heap import trim_heap
from mia.llm.base import SamplingParams
from mia.paths import resolve_run_dir
from mia.rl.batches import Batch, slice_batch
from mia.rl.data_cursor import DataCursor
from mia.rl.episode import Episode, collate
from mia.rl.generators.base import GeneratorConfig
from mia.rl.grpo import group_advantages
from mia.rl.metrics import MetricsLogger
from mia.rl.rollouts import (
    GroupReward,
    RewardFn,
    RolloutResult,
    drop_failed_groups,
    dump_rollouts,
    maybe_await,
    pad_id,
    pad_rows,
    run_rollouts,
)
from mia.rl.rollouts import group_results as group_results
from mia.rl.step_metrics import masked_mean, mean, numeric_extras, step_metrics
from mia.rl.trainer_config import OLD_LOGPROB_MODES as OLD_LOGPROB_MODES
from mia.rl.trainer_config import ROLLOUT_ERROR_MODES as ROLLOUT_ERROR_MODES
from mia.rl.trainer_config import SYNC_MODES as SYNC_MODES
from mia.rl.trainer_config import TrainerConfig
from mia.rl.trainer_config import check_loss_temperature as check_loss_temperature

# The config (mia.rl.trainer_config), the data position (mia.rl.data_cursor), the rollouts and
# update batches (mia.rl.rollouts) and the step metrics (mia.rl.step_metrics) live in their own
# modules; their names stay importable from here.

log = logging.getLogger("mia.rl.trainer")


def _log_failed(results: Sequence[RolloutResult]) -> None:
    """One warning per failed rollout, with its cause: a dropped rollout is never silent."""
    for r in results:
        if r.error is not None:
            log.warning("rollout %s/%d failed: %s", r.group, r.index, r.error)


class Trainer:
    """``Trainer(cfg, episode, reward_fn, dataset).fit()``; also a context manager.

    ``dataset``: any sequence of mappings (a list of dicts, a ``datasets.Dataset``).
    ``generator``: a ready generator to use instead of building one from ``cfg.generator``
    (the caller keeps ownership). The policy runs in Ray actors (``workers.mode=ray``; a local
    cluster is started under the run folder unless Ray is already up) or in this process.

    Public API: :meth:`fit` (the loop), :meth:`train_on` (one step on given samples, unlogged),
    and its two halves :meth:`collect` (rollouts + rewards) and :meth:`learn` (advantages ->
    update -> weight sync -> step counter -> metrics); :meth:`evaluate`, :meth:`log_metrics`,
    :meth:`note`, :meth:`run_async`, :meth:`sync_weights`, :meth:`save_checkpoint`,
    :meth:`setup` / :meth:`close`. ``step`` is the number of learning steps taken.

    ``group_reward(results)`` (optional, sync or async): called on the results of every
    collection (training and validation) once all their per-rollout rewards are in and before
    anything reads them; it may rescore them in place (e.g. a majority vote over each group of
    ``n`` rollouts when there is no ground truth, :mod:`ttrl.rewards`).
    """

    def __init__(
        self,
        cfg: TrainerConfig | Mapping[str, Any],
        episode: Episode,
        reward_fn: RewardFn,
        dataset: Sequence[Mapping[str, Any]],
        *,
        val_dataset: Sequence[Mapping[str, Any]] | None = None,
        generator: Any = None,
        group_reward: GroupReward | None = None,
    ) -> None:
        self.cfg = TrainerConfig.from_dict(cfg)
        if not callable(getattr(episode, "run", None)):
            raise MiaError("episode must have an async run(sample, rollout) method")
        if not callable(reward_fn):
            raise MiaError("reward_fn must be callable: reward_fn(sample, trajectory)")
        self.episode = episode
        self.reward_fn = reward_fn
        self.group_reward = group_reward
        self.dataset = dataset
        self.val_dataset = val_dataset
        self.run_dir = resolve_run_dir(self.cfg.run_dir, "grpo")
        self.ckpt_dir = Path(self.cfg.checkpoint_dir or self.run_dir / "checkpoints")
        self.step = 0
        self.data = DataCursor(len(dataset), self.cfg.batch_size, self.cfg.shuffle, self.cfg.seed)
        self.total_steps = (
            self.cfg.total_steps
            if self.cfg.total_steps is not None
            else self.cfg.epochs * self.data.steps_per_epoch
        )
        self.history: list[dict[str, Any]] = []
        self.policy: Any = None
        self.generator: Any = generator
        self._own_generator = generator is None
        self._ray_ctx: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._logger: MetricsLogger | None = None
        self._weights_dir: Path | None = None
        self._ready = False
        self._auto_tags = itertools.count()
        # Wall time of the collections since the last learn(): that step's time/rollout.
        self._rollout_seconds = 0.0

    # ------------------------------------------------------------------ lifecycle
    def setup(self) -> Trainer:
        """Start Ray (if needed), the policy workers and the generator; resume if asked."""
        if self._ready:
            return self
        from mia.rl.workers import PolicyGroup

        torch.manual_seed(self.cfg.seed)
        self._loop = asyncio.new_event_loop()
        try:
            if self.cfg.workers.mode == "ray":
                self._start_ray()
                self._check_cluster_placement()
            t0 = time.perf_counter()
            self.policy = PolicyGroup.from_config(self.cfg.policy, self.cfg.workers)
            log.info("policy ready in %.1f s", time.perf_counter() - t0)
            if self.generator is None:
                self.generator = self._build_generator()
            self._ready = True
            resumed = self._maybe_resume()
            self._logger = MetricsLogger(
                self.run_dir,
                self.cfg.logging,
                total_steps=self.total_steps,
                start_step=self.step,
                run_config=self.cfg.to_dict(),
            )
            if resumed:
                self._logger.note(f"resumed from {resumed} at step {self.step}")
        except BaseException:
            self.close()
            raise
        return self

    def _start_ray(self) -> None:
        from mia.rl.ray_utils import start_private_ray

        self._ray_ctx = start_private_ray(
            self.run_dir, self.cfg.workers.ray_num_cpus, self.cfg.workers.ray_address
        )

    def _check_cluster_placement(self) -> None:
        """A joined cluster (``workers.ray_address``) that has one node: the same check as at
        load, with that node's GPUs (:mod:`mia.rl.placement`)."""
        if self.cfg.workers.ray_address is None:
            return  # checked at load with this machine's GPUs
        import ray

        from mia.rl.placement import check_placement

        nodes = [n for n in ray.nodes() if n.get("Alive")]
        if len(nodes) == 1:
            check_placement(self.cfg, int(nodes[0].get("Resources", {}).get("GPU", 0)))

    def _build_generator(self) -> Any:
        from mia.rl.generators import make_generator

        gcfg = GeneratorConfig.from_dict(self.cfg.generator.to_dict())
        if not gcfg.model_path:
            gcfg.model_path = self.cfg.policy.model_path
        if not gcfg.run_dir:
            gcfg.run_dir = str(self.run_dir / "generator")
        t0 = time.perf_counter()
        gen = make_generator(gcfg)
        log.info("generator %s ready in %.1f s", gen.name, time.perf_counter() - t0)
        return gen

    def close(self) -> None:
        """Release what this trainer started: the policy workers, Ray (if it started it), the
        generator (if it built it), and the episode's resources (``episode.aclose()``)."""
        if self._logger is not None:
            self._logger.close()
            self._logger = None
        if self._loop is not None:
            aclose = getattr(self.episode, "aclose", None)
            if callable(aclose):
                try:
                    self._loop.run_until_complete(aclose())
                except Exception:  # closing must not hide the error that got us here
                    log.exception("episode.aclose failed")
            self._loop.close()
            self._loop = None
        if self.generator is not None and self._own_generator:
            self.generator.close()
            self.generator = None
        if self.policy is not None:
            self.policy.shutdown()
            self.policy = None
        if self._ray_ctx is not None:
            self._ray_ctx.__exit__(None, None, None)
            self._ray_ctx = None
        self._ready = False

    def __enter__(self) -> Trainer:
        return self.setup()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ checkpoints
    def _maybe_resume(self) -> str | None:
        from mia.rl.checkpoint import resume_path

        path = resume_path(self.cfg.resume, self.ckpt_dir)
        if path is None:
            if self.cfg.resume not in (False, "", "false", "never", None):
                log.info("resume: no checkpoint under %s, starting fresh", self.ckpt_dir)
            return None
        info = self.policy.load_checkpoint(path)
        state = info.get("data_state") or {}
        self.step = int(state.get("trainer_step", info["step"]))
        self.data = DataCursor(
            len(self.dataset),
            self.cfg.batch_size,
            self.cfg.shuffle,
            int(state.get("seed", self.cfg.seed)),
            epoch=int(state.get("epoch", 0)),
            cursor=int(state.get("cursor", 0)),
        )
        self.sync_weights()  # the generator still holds the starting weights
        return str(info["path"])

    def save_checkpoint(self, data_state: Mapping[str, Any] | None = None) -> Path:
        """A checkpoint of the current step. ``data_state``: the caller's data position (a
        loop that feeds its own samples, e.g. TTRL's batch or the streaming server's count);
        default: this trainer's own cursor."""
        if data_state is None:
            data_state = {**self.data.state(), "seed": self.data.seed}
        else:
            data_state = {"epoch": 0, "cursor": 0, "seed": self.cfg.seed, **dict(data_state)}
        data_state = {**data_state, "trainer_step": self.step}
        return self.policy.save_checkpoint(
            self.ckpt_dir, step=self.step, data_state=data_state, keep_last=self.cfg.keep_last
        )

    # ------------------------------------------------------------------ the loop
    def fit(self, stop: Callable[[dict[str, Any]], bool] | None = None) -> list[dict[str, Any]]:
        """Train for ``total_steps`` (from the resumed step), or until ``stop(metrics)`` is
        true after a step (e.g. a target reward); returns every step's metrics."""
        own = not self._ready
        self.setup()
        try:
            if self.cfg.val_at_start and self.val_dataset is not None and self.step == 0:
                self._log_validation(self.evaluate())
            while self.step < self.total_steps:
                samples = [self.dataset[i] for i in self.data.next()]
                metrics = self.train_on(samples)
                if self._due(self.cfg.val_every) and self.val_dataset is not None:
                    val = self.evaluate()
                    metrics.update(val)
                    self.history[-1].update(val)
                self.log_metrics(metrics)
                if self.cfg.save_freq > 0 and self.step % self.cfg.save_freq == 0:
                    self.save_checkpoint()
                if stop is not None and stop(metrics):
                    self.note(f"stopping at step {self.step}: stop condition met")
                    break
            if self.cfg.save_freq >= 0 and self.step > 0:
                from mia.rl.checkpoint import step_dir

                if not (step_dir(self.ckpt_dir, self.step) / "COMPLETE").is_file():
                    self.save_checkpoint()
        finally:
            if own:
                self.close()
        return self.history

    def _due(self, every: int) -> bool:
        return every > 0 and self.step % every == 0

    def _log_validation(self, metrics: dict[str, Any]) -> None:
        if self._logger is not None:
            text = " | ".join(f"{k} {v:.4g}" for k, v in metrics.items() if isinstance(v, float))
            self._logger.note(f"validation at step {self.step}: {text}")

    def _run(self, coro: Awaitable[Any]) -> Any:
        assert self._loop is not None, "call setup() first"
        return self._loop.run_until_complete(coro)

    def run_async(self, coro: Awaitable[Any]) -> Any:
        """Run a coroutine on the trainer's event loop (where its episode's clients live)."""
        self.setup()
        if not asyncio.iscoroutine(coro):
            raise TypeError("run_async needs a coroutine")
        return self._run(coro)

    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        """One row of metrics (console, metrics.jsonl, wandb) at ``step`` (default: the current
        step); a no-op outside ``setup()``..``close()``."""
        if self._logger is not None:
            self._logger.log(self.step if step is None else step, dict(metrics))

    def note(self, text: str) -> None:
        """A line in the run's log (printed when the trainer is not set up)."""
        if self._logger is not None:
            self._logger.note(text)
        else:
            print(text, flush=True)

    def train_on(self, samples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """One GRPO step on ``samples`` (n rollouts each): ``learn(collect(samples))``; returns
        its metrics (recorded in ``history``; :meth:`fit` logs them with the validation
        metrics, other callers log their own)."""
        return self.learn(self.collect(samples, tag="train"), log=False)

    def collect(
        self,
        samples: Sequence[Mapping[str, Any]],
        *,
        n: int | None = None,
        sampling: SamplingParams | Mapping[str, Any] | None = None,
        tag: str | None = None,
        episode: Episode | None = None,
    ) -> list[RolloutResult]:
        """``n`` (default ``cfg.n``) concurrent rollouts per sample with their rewards, no
        update; a failed rollout raises or (``rollout_errors: drop``) carries ``error``.
        ``episode``: run them with another episode than the trainer's (TTRL answers the
        questions its Planner does not plan with the Executor alone), scored by the same reward.

        ``sampling``: a SamplingParams, or overrides of ``cfg.sampling``. ``tag`` names the
        collection: group ids (``<tag>-<next step>-<sample>``) and sampling seeds derive from
        it and the next step number, so a rerun repeats the rollouts; the default is a fresh
        tag per call, so collections before one :meth:`learn` never share a group."""
        if isinstance(sampling, SamplingParams):
            params = sampling
        else:
            over = dict(sampling or {})
            bad = sorted(set(over) - {f.name for f in fields(SamplingParams)})
            if bad:
                raise MiaError(f"collect: unknown sampling key(s) {bad}")
            params = SamplingParams(**{**self.cfg.sampling, **over})
        count = self.cfg.n if n is None else int(n)
        if count < 1:
            raise MiaError(f"collect: n must be >= 1, got {count}")
        self.setup()
        name = f"c{next(self._auto_tags)}" if tag is None else str(tag)
        t0 = time.perf_counter()
        results = self._run(
            self._collect(list(samples), count, params, self.step + 1, name, episode)
        )
        self._rollout_seconds += time.perf_counter() - t0
        trim_heap()  # the rollouts' KV caches, before the update allocates: mia/heap.py
        _log_failed(results)  # every collection, trained on or not (TTRL's Executor-alone ones)
        return results

    def learn(self, results: Sequence[RolloutResult], *, log: bool = True) -> dict[str, Any]:
        """One GRPO step on collected ``results``: drops groups with a failed rollout, then
        group advantages, old log-probs, ``ppo_epochs`` of updates, weight sync, ``step += 1``;
        returns the step's metrics (in ``history``; also logged unless ``log=False``, for a
        caller that adds its own keys to the row)."""
        if not results:
            raise MiaError("learn: no rollout results")
        self.setup()
        cfg = self.cfg
        t_learn = time.perf_counter()
        timing: dict[str, float] = {"rollout": self._rollout_seconds}
        self._rollout_seconds = 0.0
        step = self.step + 1
        results, n_dropped = drop_failed_groups(list(results), step)

        rewards = torch.tensor([r.reward for r in results], dtype=torch.float32)
        groups = [r.group for r in results]
        adv = group_advantages(rewards, group_ids=groups, norm_by_std=cfg.norm_adv_by_std)
        batch = collate([r.trajectory for r in results], pad_id(self.generator))
        batch["advantages"] = adv
        rollout_lps = batch.pop("rollout_logprobs", None)
        mask = batch["response_mask"].float()

        metrics: dict[str, Any] = {}
        t0 = time.perf_counter()
        mode = self._old_logprob_mode(int(batch["input_ids"].shape[0]))
        if mode == "update":
            # train_step detaches its own log-probs and measures the entropy and the gap to
            # the generator's log-probs on the way (the metrics below for recompute).
            batch["old_logprobs"] = None
            if rollout_lps is not None:
                batch["rollout_logprobs"] = rollout_lps
        elif mode == "recompute":
            old, ent = self.policy.compute_logprobs(batch, return_entropy=True)
            batch["old_logprobs"] = old * mask
            metrics["actor/entropy"] = masked_mean(ent, mask)
            if rollout_lps is not None and cfg.policy.loss.temperature == 1.0:
                # The gap between generator and trainer log-probs of the same tokens: ~0 when
                # weight sync works (numerics aside), large when the generator is stale. Only
                # untempered: generators return the raw distribution's log-probs.
                gap = (rollout_lps - batch["old_logprobs"]).abs()
                metrics["rollout/logprob_diff_mean"] = masked_mean(gap, mask)
                metrics["rollout/logprob_diff_max"] = float((gap * mask).max())
        else:
            if rollout_lps is None:
                raise MiaError(
                    "old_logprobs=rollout but some trajectories have no rollout log-probs"
                )
            batch["old_logprobs"] = rollout_lps
        timing["old_logprobs"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        slept = self._engine_sleep() if self._has_signal(adv) else False
        update = self._update(batch) if self._has_signal(adv) else []
        timing["update"] = time.perf_counter() - t0

        self.step = step
        t0 = time.perf_counter()
        if slept:  # weights back on the GPU first: the sync writes into them
            self.generator.wake_up(["weights"])
        if update:  # unchanged weights need no sync
            self.sync_weights()
        if slept:
            self.generator.wake_up(["kv_cache"])
        timing["sync"] = time.perf_counter() - t0

        timing["step"] = timing["rollout"] + time.perf_counter() - t_learn
        metrics.update(step_metrics(results, batch, update, timing, n_dropped))
        dump_rollouts(self.run_dir / "rollouts.jsonl", self.step, results, self.cfg.log_rollouts)
        self.history.append({"step": self.step, **metrics})
        if log:
            self.log_metrics(metrics)
        return metrics

    def _old_logprob_mode(self, rows: int) -> str:
        """``update`` (the update's own detached log-probs), ``recompute`` or ``rollout``."""
        cfg = self.cfg
        if cfg.old_logprobs != "auto":
            return cfg.old_logprobs
        one_update = cfg.ppo_epochs == 1 and (
            cfg.mini_batch_size is None or cfg.mini_batch_size >= rows
        )
        return "update" if one_update else "recompute"

    def _engine_sleep(self) -> bool:
        """Free the rollout engine's GPU memory for the update (vLLM sleep mode, GPU only);
        True when it slept, so the caller wakes it."""
        if not getattr(self.generator, "sleep_enabled", False):
            return False
        return bool(self.generator.sleep(level=1))

    def _has_signal(self, adv: torch.Tensor) -> bool:
        """False when the step would only replay optimizer momentum: every advantage is zero
        (all groups tied) and no KL or entropy term gives a gradient of its own."""
        loss = self.cfg.policy.loss
        if not self.cfg.skip_tied_steps or loss.kl_coef > 0 or loss.entropy_coef != 0:
            return True
        return bool(adv.abs().max() > 0)

    def _update(self, batch: Batch) -> list[dict[str, float]]:
        n = int(batch["input_ids"].shape[0])
        mbs = self.cfg.mini_batch_size or n
        ws = self.policy.world_size
        out = []
        for _ in range(self.cfg.ppo_epochs):
            for start in range(0, n, mbs):
                mb = pad_rows(slice_batch(batch, start, min(start + mbs, n)), ws)
                out.append(self.policy.train_step(mb))
        return out

    def sync_weights(self) -> None:
        """Push the policy's current weights into the generator."""
        if self.cfg.weight_sync == "state_dict":
            self.generator.update_weights(state_dict=self.policy.state_dict_for_export())
            return
        target = self.run_dir / "weights" / f"step_{self.step:06d}"
        if target.exists():
            shutil.rmtree(target)
        folder = self.policy.export_hf(target)
        self.generator.update_weights(path=str(folder))
        if self._weights_dir is not None and self._weights_dir != folder:
            shutil.rmtree(self._weights_dir, ignore_errors=True)
        self._weights_dir = folder

    async def _collect(
        self,
        samples: Sequence[Mapping[str, Any]],
        n: int,
        sampling: SamplingParams,
        step: int,
        phase: str,
        episode: Episode | None = None,
    ) -> list[RolloutResult]:
        results = await run_rollouts(
            samples,
            n,
            sampling,
            step,
            phase,
            episode or self.episode,
            generator=self.generator,
            reward_fn=self.reward_fn,
            seed=self.cfg.seed,
            max_concurrent=self.cfg.max_concurrent_rollouts,
            rollout_errors=self.cfg.rollout_errors,
        )
        if self.group_reward is not None:
            await maybe_await(self.group_reward(results))
        return results

    # ------------------------------------------------------------------ evaluation
    def evaluate(
        self,
        dataset: Sequence[Mapping[str, Any]] | None = None,
        n: int | None = None,
        sampling: Mapping[str, Any] | None = None,
    ) -> dict[str, float]:
        """Mean reward (and numeric extras) of ``n`` rollouts per sample, without training."""
        self.setup()
        data = dataset if dataset is not None else self.val_dataset
        if not data:
            raise MiaError("evaluate: no dataset (pass one or give the trainer val_dataset)")
        params = {**self.cfg.sampling, **self.cfg.val_sampling, **dict(sampling or {})}
        samples = [data[i] for i in range(len(data))]
        results = self._run(
            self._collect(samples, n or self.cfg.val_n, SamplingParams(**params), self.step, "val")
        )
        _log_failed(results)
        ok = [r for r in results if r.error is None]
        if not ok:
            raise MiaError("evaluate: every rollout failed")
        out = {
            "val/reward_mean": mean([r.reward for r in ok]),
            "val/n": float(len(ok)),
            "val/failed": float(len(results) - len(ok)),
        }
        for key, values in numeric_extras(ok).items():
            out[f"val/{key}"] = mean(values)
        return out
