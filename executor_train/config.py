"""The Executor GRPO config schema (``python -m executor_train --help-config`` lists every key).

Every default lives here, sized for a laptop CPU with the embedded model;
``configs/executor_train/default.yaml`` composes the shared groups (``judge=llm``, the reward)
and ``experiment=paper`` gives the reference's settings (docs/reference.md §9).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mia.agent.config import AgentConfig
from mia.config import option, section
from mia.errors import MiaError
from mia.judge import JudgeConfig
from mia.rewards.config import ExecutorRewardConfig
from mia.rl.trainer import TrainerConfig, check_loss_temperature
from mia.roles import config as shared
from mia.roles.common import load_role
from mia.roles.config import MemoryServices, cpu_trainer


@dataclass
class ExecutorTrainData:
    """The training questions."""

    train: str | None = option(
        None,
        "reference parquet / JSON / JSONL (docs/reference.md §10); plan and memories_context "
        "columns optional (absent: memory_serve /plan)",
    )
    val: str | None = shared.val_data()
    text_only: bool = option(
        True,
        "skip image questions: true for text-only policies (the CPU default SmolLM2); "
        "false needs a Qwen2.5-VL policy (experiment=paper sets it)",
    )
    limit: int | None = shared.row_limit("training")
    val_limit: int | None = shared.row_limit("validation")


def cpu_agent() -> AgentConfig:
    """The Executor loop sized for a CPU (the reference: 10 turns, a 16k response budget;
    experiment=paper): sampled rollouts with log-probs."""
    return AgentConfig(
        max_turns=4,
        max_tool_calls=4,
        context_budget=4096,
        answer_reserve_tokens=256,
        sampling={"temperature": 1.0, "top_p": 1.0, "max_tokens": 256, "logprobs": True},
    )


@dataclass
class ExecutorTrainConfig:
    """Executor GRPO (``python -m executor_train``): the engine's trainer with the Executor
    episode (the Executor loop with tools and ONE replan on failure, memory_serve
    /replan_train) and the Executor reward."""

    model_path: str = option(
        "embedded", 'the policy\'s Hugging Face folder; "embedded" = SmolLM2-135M-Instruct'
    )
    llm: str = shared.judge_llm()
    replan: bool = option(
        True, "one supplementary plan from /replan_train when the first answer is wrong"
    )
    missing_plan: str = option(
        "plan",
        "a row without a plan column: plan (memory_serve /plan) | none (no guide: the "
        "Executor alone, as the eval policy `none`)",
    )
    chat_template_kwargs: dict[str, Any] = option(
        {}, "passed to the chat template when rendering prompts"
    )
    data: ExecutorTrainData = section(ExecutorTrainData, "the training questions")
    services: MemoryServices = section(MemoryServices, "memory_serve")
    agent: AgentConfig = section(
        cpu_agent, "the Executor loop: limits, sampling, tools (a CPU-sized loop)"
    )
    reward: ExecutorRewardConfig = section(
        ExecutorRewardConfig, "0.7 acc + 0.2 tool + 0.1 format, +0.2 first attempt (§7.1)"
    )
    judge: JudgeConfig = shared.truth_judge()
    trainer: TrainerConfig = shared.grpo_section(cpu_trainer)

    def validate(self) -> ExecutorTrainConfig:
        if self.missing_plan not in ("plan", "none"):
            raise MiaError(f"missing_plan must be plan | none, got {self.missing_plan!r}")
        self.agent.validate()
        self.reward.validate()
        # The Executor loop samples with the agent's settings over the trainer's: the agent's
        # temperature is the rollouts', so the trainer's sampling records it (one value to set).
        sampled = self.agent.sampling.get("temperature")
        if sampled is not None:
            check_loss_temperature(float(sampled), self.trainer, "agent.sampling")
            self.trainer.sampling = {**self.trainer.sampling, "temperature": float(sampled)}
        return self


def load_config(name: str = "default", overrides: Sequence[str] = ()) -> ExecutorTrainConfig:
    """``configs/executor_train/<name>.yaml`` (or a file) composed over the schema's defaults,
    with Hydra overrides (``experiment=paper``, ``trainer.n=8``)."""
    return load_role(ExecutorTrainConfig, "executor_train", name, overrides)
