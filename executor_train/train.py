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
from mia.roles.common import fit_role, grpo_trainer, memory_client, role_config, role_main


def build_trainer(
    cfg: ExecutorTrainConfig | Mapping[str, Any],
    *,
    generator: Any = None,
    judge: Any = None,
    tools: Any = None,
) -> Any:
    """A ready-to-fit Trainer. ``generator`` / ``judge`` / ``tools`` replace what the config
    would build (tests, embedding in other programs)."""
    cfg = role_config(ExecutorTrainConfig, cfg, "executor_train")

    def episode(judge: Any) -> ExecutorEpisode:
        return ExecutorEpisode(
            tools,
            cfg.agent,
            judge=judge,
            memory=memory_client(cfg.services),
            reward_cfg=cfg.reward,
            replan=cfg.replan,
            missing_plan=cfg.missing_plan,
            chat_template_kwargs=cfg.chat_template_kwargs or None,
        )

    return grpo_trainer(
        cfg,
        episode,
        ExecutorReward,
        generator=generator,
        judge=judge,
        text_only=cfg.data.text_only,
    )


def run(cfg: ExecutorTrainConfig | Mapping[str, Any]) -> list[dict[str, Any]]:
    return fit_role("executor_train", build_trainer(cfg))


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
