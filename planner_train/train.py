"""``python -m planner_train``: Planner GRPO as a configuration of the engine.

The trained Executor is frozen behind the serve service; every rollout plans, lets the Executor
run the plan, reflects (yes/no) and may replan once (:mod:`mia.planner.episode`); the reward
is docs/reference.md §7.2 (:mod:`mia.rewards.planner`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mia.errors import MiaError
from mia.planner.episode import PlannerEpisode
from mia.rewards.planner import PlannerReward
from mia.roles.common import (
    build_judge,
    clients,
    resolve_model,
    role_config,
    role_main,
    trainer_section,
)
from mia.roles.samples import load_samples
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
    from mia.rl.trainer import Trainer

    cfg = role_config(PlannerTrainConfig, cfg, "planner_train")
    data = cfg.data
    if not data.train:
        raise MiaError("set data.train=FILE (reference parquet, JSON or JSONL)")
    train = load_samples(data.train, limit=data.limit)
    val = load_samples(data.val, limit=data.val_limit) if data.val else None
    judge = judge if judge is not None else build_judge(cfg.judge, cfg.llm)
    episode = make_episode(cfg)
    reward = PlannerReward(judge, cfg.reward)
    section = trainer_section(cfg, resolve_model(cfg.model_path))
    return Trainer(section, episode, reward, train, val_dataset=val, generator=generator)


def run(cfg: PlannerTrainConfig | Mapping[str, Any]) -> list[dict[str, Any]]:
    trainer = build_trainer(cfg)
    history = trainer.fit()
    print(
        f"planner_train: {trainer.step} steps; metrics {trainer.run_dir / 'metrics.jsonl'}; "
        f"checkpoints {trainer.ckpt_dir}",
        flush=True,
    )
    return history


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
