"""The Planner GRPO config schema (``python -m planner_train --help-config`` lists every key).

Every default lives here, sized for a laptop CPU with the embedded model;
``configs/planner_train/default.yaml`` composes the shared groups (``judge=llm``, the reward)
and ``experiment=paper`` gives the reference's settings (docs/reference.md §9).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from mia.config import option, section
from mia.judge import JudgeConfig
from mia.planner.episode import PlannerEpisodeConfig
from mia.rewards.config import PlannerRewardConfig
from mia.rl.trainer import TrainerConfig
from mia.roles import config as shared
from mia.roles.common import load_role
from mia.roles.config import PlannerServices, cpu_episode, cpu_planner_trainer


@dataclass
class PlannerTrainData:
    """The training questions."""

    train: str | None = option(
        None,
        "reference planner parquet / JSON / JSONL; a memories_context column is used as is, "
        "else memories come from services.memory_url",
    )
    val: str | None = shared.val_data()
    limit: int | None = shared.row_limit("training")
    val_limit: int | None = shared.row_limit("validation")


@dataclass
class PlannerTrainConfig:
    """Planner GRPO (``python -m planner_train``): plan -> the frozen Executor (serve /execute)
    -> reflect yes/no -> optional replan -> serve /continue, with the Planner reward."""

    model_path: str = option(
        "embedded", 'the Planner\'s Hugging Face folder; "embedded" = SmolLM2-135M-Instruct'
    )
    llm: str = shared.judge_llm()
    chat_template_kwargs: dict[str, Any] = option(
        {}, "passed to the chat template, e.g. {enable_thinking: true} for Qwen3 planners"
    )
    data: PlannerTrainData = section(PlannerTrainData, "the training questions")
    services: PlannerServices = section(PlannerServices, "serve and memory_serve")
    episode: PlannerEpisodeConfig = section(
        cpu_episode,
        "the Planner episode (mia.planner.episode.PlannerEpisodeConfig), CPU-sized: the "
        "reference has 24576 + 8192 tokens of context, 8192 for all planner turns",
    )
    reward: PlannerRewardConfig = section(
        PlannerRewardConfig, "0.7 acc_after_replan + 0.2 acc_first + 0.05 format + 0.05 decision"
    )
    judge: JudgeConfig = shared.truth_judge()
    trainer: TrainerConfig = shared.grpo_section(cpu_planner_trainer)

    def validate(self) -> PlannerTrainConfig:
        PlannerEpisodeConfig.from_dict(asdict(self.episode))  # its limits are consistent
        return self


def load_config(name: str = "default", overrides: Sequence[str] = ()) -> PlannerTrainConfig:
    """``configs/planner_train/<name>.yaml`` (or a file) composed over the schema's defaults,
    with Hydra overrides (``experiment=paper``, ``trainer.n=8``)."""
    return load_role(PlannerTrainConfig, "planner_train", name, overrides)
