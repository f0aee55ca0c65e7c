"""Rewards of a :class:`~mia.planner.episode.PlannerRollout`, as ``reward(sample, rollout)``.

- :class:`PlannerReward`: docs/reference.md §7.2 against the sample's ground truth with a local judge.
- :class:`RemoteReward`: the pluggable reward server (``/compute_gt_reward`` with the native
  episode record), where ground truths and user feedback live (TTRL-streaming).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mia.errors import MiaError
from mia.judge.base import Judge
from mia.rewards import PlannerRewardConfig, load_reward_config, planner_reward
from mia.services import RewardClient


class PlannerReward:
    def __init__(self, judge: Judge, cfg: PlannerRewardConfig | Mapping[str, Any] | None = None):
        self.judge = judge
        self.cfg = load_reward_config(PlannerRewardConfig, cfg)

    async def __call__(
        self, sample: Mapping[str, Any], rollout: Any
    ) -> tuple[float, dict[str, Any]]:
        golds = list(sample.get("golds") or [])
        if not golds:
            raise MiaError(f"sample {sample.get('data_id')!r} has no ground-truth answer")
        return await planner_reward(rollout.record, golds, self.judge, self.cfg)


class RemoteReward:
    """Scores come from the reward server; ``extras`` are the server's (judgement, format, ...)."""

    def __init__(self, client: RewardClient) -> None:
        self.client = client

    async def __call__(
        self, sample: Mapping[str, Any], rollout: Any
    ) -> tuple[float, dict[str, Any]]:
        data_id = sample.get("data_id")
        if data_id is None:
            raise MiaError("the reward server needs a data_id per sample")
        out = await self.client.compute(
            str(data_id),
            rollout.record.to_dict(),
            question=str(sample.get("question", "")),
            data_source=sample.get("data_source") or None,
        )
        extras = dict(out.get("extras") or {})
        for key in ("judgement", "format_score", "decision_score"):
            if out.get(key) is not None:
                extras.setdefault(key, out[key])
        return float(out["score"]), extras
