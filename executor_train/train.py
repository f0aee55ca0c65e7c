"""``python -m executor_train``: Executor GRPO as a configuration of the engine.

``build_trainer(cfg)`` turns an :class:`~executor_train.config.ExecutorTrainConfig` (or a
composed ``configs/executor_train`` mapping, validated into one) into a
:class:`mia.rl.trainer.Trainer` over :class:`~executor_train.episode.ExecutorEpisode` and
:class:`~executor_train.episode.ExecutorReward`; ``run(cfg)`` trains it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from executor_train.config import ExecutorTrainConfig
from executor_train.episode import ExecutorEpisode, ExecutorReward
from mia.errors import MiaError
from mia.roles.common import (
    build_judge,
    memory_client,
    resolve_model,
    role_config,
    role_main,
    trainer_section,
)
from mia.roles.samples import load_samples


def build_trainer(
    cfg: ExecutorTrainConfig | Mapping[str, Any],
    *,
    generator: Any = None,
    judge: Any = None,
    tools: Any = None,
) -> Any:
    """A ready-to-fit Trainer. ``generator`` / ``judge`` / ``tools`` replace what the config
    would build (tests, embedding in other programs)."""
    from mia.rl.trainer import Trainer

    cfg = role_config(ExecutorTrainConfig, cfg, "executor_train")
    data = cfg.data
    if not data.train:
        raise MiaError("set data.train=FILE (reference parquet, JSON or JSONL)")
    train = load_samples(data.train, text_only=data.text_only, limit=data.limit)
    val = (
        load_samples(data.val, text_only=data.text_only, limit=data.val_limit) if data.val else None
    )
    judge = judge if judge is not None else build_judge(cfg.judge, cfg.llm)
    episode = ExecutorEpisode(
        tools,
        cfg.agent,
        judge=judge,
        memory=memory_client(cfg.services),
        reward_cfg=cfg.reward,
        replan=cfg.replan,
        missing_plan=cfg.missing_plan,
        chat_template_kwargs=cfg.chat_template_kwargs or None,
    )
    reward = ExecutorReward(judge, cfg.reward)
    section = trainer_section(cfg, resolve_model(cfg.model_path))
    return Trainer(section, episode, reward, train, val_dataset=val, generator=generator)


def run(cfg: ExecutorTrainConfig | Mapping[str, Any]) -> list[dict[str, Any]]:
    trainer = build_trainer(cfg)
    history = trainer.fit()
    print(
        f"executor_train: {trainer.step} steps; metrics {trainer.run_dir / 'metrics.jsonl'}; "
        f"checkpoints {trainer.ckpt_dir}",
        flush=True,
    )
    return history


def main(argv: list[str] | None = None) -> None:
    role_main(
        "python -m executor_train",
        "Executor GRPO: the Executor loop with tools and one replan on failure "
        "(configs/executor_train/).",
        "executor_train",
        run,
        argv,
        sft_config="executor",
        schema=ExecutorTrainConfig,
    )
