"""The engine's Trainer with the two seams test-time learning needs.

:meth:`mia.rl.trainer.Trainer.train_on` runs rollouts, rewards and the update in one call.
TTRL must act between them (write the rollouts into memory, score a group by majority vote) and
the streaming server must buffer rollouts from several requests before one update. So:

- :meth:`RoleTrainer.collect` -- n rollouts per sample and their rewards, no update; then an
  optional ``group_reward(results)`` hook rescoring whole groups (majority vote);
- :meth:`RoleTrainer.learn` -- one GRPO step (advantages, old log-probs, update, weight sync,
  metrics) on given results, through ``train_on`` itself, so the step is the engine's.

Both reuse the engine's private rollout/run helpers; the seam is small and lives here until the
engine grows a public ``collect``/``learn`` split.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from mia.llm.base import SamplingParams
from mia.rl.trainer import RolloutResult, Trainer

GroupReward = Callable[[list[RolloutResult]], Any]  # may be async; rescoring in place


class RoleTrainer(Trainer):
    def __init__(self, *args: Any, group_reward: GroupReward | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.group_reward = group_reward
        self._injected: list[RolloutResult] | None = None
        self._collects = itertools.count()

    # ------------------------------------------------------------------ collect / learn
    def collect(
        self, samples: Sequence[Mapping[str, Any]], phase: str | None = None
    ) -> list[RolloutResult]:
        """``cfg.n`` rollouts per sample with rewards (failed rollouts carry ``error``).

        ``phase`` names the collection: group ids and sampling seeds derive from it and the
        next step number, so results of different collections never share a group."""
        self.setup()
        tag = phase or f"c{next(self._collects)}"
        sampling = SamplingParams(**self.cfg.sampling)
        return self._run(self._rollouts(list(samples), self.cfg.n, sampling, self.step + 1, tag))

    def learn(self, results: Sequence[RolloutResult]) -> dict[str, Any]:
        """One GRPO step on ``results`` (groups whose rollouts failed are dropped)."""
        self._injected = list(results)
        try:
            return self.train_on([r.sample for r in results])
        finally:
            self._injected = None

    async def _rollouts(
        self,
        samples: Sequence[Mapping[str, Any]],
        n: int,
        sampling: SamplingParams,
        step: int,
        phase: str,
    ) -> list[RolloutResult]:
        if self._injected is not None and phase == "train":
            return self._injected
        results = await super()._rollouts(samples, n, sampling, step, phase)
        for r in results:  # the episode saw the group id through its Rollout already
            if r.trajectory is not None and hasattr(r.trajectory, "group"):
                r.trajectory.group, r.trajectory.index = r.group, r.index
        if self.group_reward is not None:
            out = self.group_reward(results)
            if inspect.isawaitable(out):
                await out
        return results

    # ------------------------------------------------------------------ logging / checkpoints
    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        if self._logger is not None:
            self._logger.log(self.step if step is None else step, dict(metrics))

    def note(self, text: str) -> None:
        if self._logger is not None:
            self._logger.note(text)
        else:
            print(text, flush=True)

    def save_state(self, data_state: Mapping[str, Any]) -> Path:
        """A checkpoint of the current step whose ``data_state`` is the caller's."""
        state = {"epoch": 0, "cursor": 0, "seed": self.cfg.seed, **dict(data_state)}
        state["trainer_step"] = self.step
        return self.policy.save_checkpoint(
            self.ckpt_dir, step=self.step, data_state=state, keep_last=self.cfg.keep_last
        )

    def run_async(self, coro: Any) -> Any:
        """Run a coroutine on the trainer's event loop (where its episode's clients live)."""
        self.setup()
        if not asyncio.iscoroutine(coro):
            raise TypeError("run_async needs a coroutine")
        return self._run(coro)


def group_results(results: Sequence[RolloutResult]) -> dict[str, list[RolloutResult]]:
    """Results per group id, groups and rollouts in order."""
    groups: dict[str, list[RolloutResult]] = {}
    for r in results:
        groups.setdefault(r.group, []).append(r)
    return groups
