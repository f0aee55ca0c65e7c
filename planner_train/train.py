"""``python -m planner_train``: Planner GRPO as a configuration of the engine.

The trained Executor is frozen behind the serve service; every rollout plans, lets the Executor
run the plan, reflects (yes/no) and may replan once (:mod:`mia.planner.episode`); the reward
is docs/reference.md §7.2 (:mod:`mia.rewards.planner`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mia.planner.episode import PlannerEpisode
from mia.rewards.planner import PlannerReward
from mia.roles.common import clients, fit_role, grpo_trainer, role_config, role_main
from planner_train.config import PlannerTrainConfig


def make_episode(cfg: PlannerTrainConfig | Mapping[str, Any]) -> PlannerEpisode:
    cfg = role_config(PlannerTrainConfig, cfg, "planner_train")
    executor, memory = clients(cfg.services)
    return PlannerEpisode(
        executor, memory, cfg.episode, chat_template_kwargs=cfg.chat_template_kwargs or None
    )


def build_trainer(
    cfg: PlannerTrainConfig | Mapping[str, Any], *, generator: Any = None, judge: Any = None
) -> Any:
    cfg = role_config(PlannerTrainConfig, cfg, "planner_train")
    return grpo_trainer(
        cfg, lambda _judge: make_episode(cfg), PlannerReward, generator=generator, judge=judge
    )


def run(cfg: PlannerTrainConfig | Mapping[str, Any]) -> list[dict[str, Any]]:
    return fit_role("planner_train", build_trainer(cfg))


def main(argv: list[str] | None = None) -> None:
    role_main(
        "python -m planner_train",
        "Planner GRPO: plan -> Executor (serve) -> reflect -> optional replan "
        "(configs/planner_train/).",
        "planner_train",
        run,
        argv,
        sft_config="planner",
        schema=PlannerTrainConfig,
    )
