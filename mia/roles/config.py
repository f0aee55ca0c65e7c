"""Config sections the role schemas share (``executor_train/config.py``, ``planner_train/config.py``,
``ttrl/config.py``, ``ttrl_streaming/config.py`` put them together): the services a role talks
to, and the CPU-sized defaults of the Planner episode and the trainer that the role schemas
start from. Every field has its default and help text here, once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mia.config import option, section
from mia.judge import JudgeConfig
from mia.planner.episode import PlannerEpisodeConfig
from mia.rl.generators.base import GeneratorConfig
from mia.rl.policy import PolicyConfig
from mia.rl.trainer import TrainerConfig
from mia.rl.workers import WorkersConfig

MEMORY_URL = "http://127.0.0.1:5000"
EXECUTOR_URL = "http://127.0.0.1:5001"


def _token() -> Any:
    return option(None, "bearer token for the services (or token_env)")


def _token_env() -> Any:
    return option(None, "name of an env var holding the bearer token")


def _timeout() -> Any:
    return option(600.0, "seconds per service call")


def val_data() -> Any:
    return option(None, "validation questions (same formats); null = none")


def row_limit(rows: str) -> Any:
    return option(None, f"keep the first N {rows} rows; null = all")


def judge_llm() -> Any:
    return option("embedded", "LLM roles for LLM judges: configs/llm/<name>.yaml or a file")


def truth_judge() -> Any:
    return section(JudgeConfig, "the ground-truth judge (judge=llm: the SimpleQA-style LLM judge)")


def grpo_section(trainer: Any) -> Any:
    """The ``trainer`` section of executor_train and planner_train: ``trainer(save_freq=10)``
    (:func:`cpu_trainer` or :func:`cpu_planner_trainer`)."""
    return section(lambda: trainer(save_freq=10), "the GRPO trainer (python -m mia.rl's keys)")


@dataclass
class MemoryServices:
    """The services of the Executor trainer: memory_serve only."""

    memory_url: str | None = option(
        MEMORY_URL,
        "memory_serve: /plan for rows without a plan, /replan_train; null = no replans, plans "
        "must be in the data",
    )
    token: str | None = _token()
    token_env: str | None = _token_env()
    memory_token: str | None = option(None, "memory_serve's own token; null = token")
    timeout_s: float = _timeout()


@dataclass
class PlannerServices:
    """The services of a Planner role: the frozen Executor (serve) and memory_serve."""

    executor_url: str | None = option(
        EXECUTOR_URL, "serve (the frozen Executor, python -m serve): /execute, /continue"
    )
    memory_url: str | None = option(
        MEMORY_URL,
        "memory_serve: /memory for rows without memories_context (and the TTRL memory routes); "
        "null = plan without memories",
    )
    token: str | None = _token()
    token_env: str | None = _token_env()
    executor_token: str | None = option(None, "serve's own token; null = token")
    memory_token: str | None = option(None, "memory_serve's own token; null = token")
    timeout_s: float = _timeout()


def cpu_episode() -> PlannerEpisodeConfig:
    """The Planner episode sized for a laptop CPU and the embedded model (the reference: 24576 +
    8192 tokens of context, 8192 for all planner turns; experiment=paper)."""
    return PlannerEpisodeConfig(
        max_context=8192, plan_max_tokens=256, decision_max_tokens=64, replan_max_tokens=192
    )


def cpu_trainer(**fields: Any) -> TrainerConfig:
    """The trainer sized for a laptop CPU: 4 questions x 4 rollouts per step, one process
    (``workers.mode=ray`` for FSDP2 workers), 16 rows decoded together, a failed rollout drops
    its group; ``fields`` are the role's own settings."""
    return TrainerConfig(
        batch_size=4,
        n=4,
        rollout_errors="drop",
        workers=WorkersConfig(mode="single_process"),
        generator=GeneratorConfig(max_batch_size=16),
        **fields,
    )


def cpu_planner_trainer(**fields: Any) -> TrainerConfig:
    """:func:`cpu_trainer` for the Planner roles: one sample per backward. Plan prompts with
    retrieved memories run to ~1,500 tokens, and on a CPU the attention of several such samples
    at once needs more memory than a 24 GB machine has; the step covers the same samples
    (gradient accumulation)."""
    return cpu_trainer(policy=PolicyConfig(micro_batch_size=1), **fields)
