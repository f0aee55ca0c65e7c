"""The engine's Trainer with the group reward test-time learning needs.

TTRL acts between the rollouts and the update (writes the rollouts into memory, scores each
group by majority vote) and the streaming server buffers rollouts from several requests before
one update; both use the engine's public halves of a step, :meth:`mia.rl.trainer.Trainer.collect`
and :meth:`mia.rl.trainer.Trainer.learn`. What this subclass adds:

- ``group_reward(results)``: an optional hook (sync or async) rescoring each collection's
  results in place once their rewards are in (majority vote), through the engine's documented
  extension point ``_after_rollouts``;
- every trajectory is stamped with its group id and index (the memory bank keys on them);
- :meth:`RoleTrainer.save_state`: a checkpoint whose data position is the caller's.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from mia.rl.trainer import RolloutResult, Trainer

GroupReward = Callable[[list[RolloutResult]], Any]  # may be async; rescoring in place


class RoleTrainer(Trainer):
    """A :class:`~mia.rl.trainer.Trainer` with an optional ``group_reward`` hook."""

    def __init__(self, *args: Any, group_reward: GroupReward | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.group_reward = group_reward

    async def _after_rollouts(self, results: list[RolloutResult]) -> None:
        for r in results:  # the episode saw the group id through its Rollout already
            if r.trajectory is not None and hasattr(r.trajectory, "group"):
                r.trajectory.group, r.trajectory.index = r.group, r.index
        if self.group_reward is not None:
            out = self.group_reward(results)
            if inspect.isawaitable(out):
                await out

    def save_state(self, data_state: Mapping[str, Any]) -> Path:
        """A checkpoint of the current step whose ``data_state`` is the caller's."""
        state = {"epoch": 0, "cursor": 0, "seed": self.cfg.seed, **dict(data_state)}
        state["trainer_step"] = self.step
        return self.policy.save_checkpoint(
            self.ckpt_dir, step=self.step, data_state=state, keep_last=self.cfg.keep_last
        )


def group_results(results: Sequence[RolloutResult]) -> dict[str, list[RolloutResult]]:
    """Results per group id, groups and rollouts in order."""
    groups: dict[str, list[RolloutResult]] = {}
    for r in results:
        groups.setdefault(r.group, []).append(r)
    return groups
