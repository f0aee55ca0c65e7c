"""The ``mia`` section of a veRL config (recipes/verl/config/*.yaml): MIA's side of a veRL run.

veRL's own keys (``actor_rollout_ref``, ``data``, ``trainer``, ``reward``, ...) configure the
engine; this section configures what runs inside its agent loops: the Executor loop (``agent``),
the services (``services``: memory_serve for ``/plan``, ``/replan_train``, ``/memory``; serve for
the frozen Executor of Planner training), the judge of the Executor's first answer (``judge``,
``llm``), the Planner episode (``episode``) and TTRL's memory hooks (``ttrl``). Every key has
its default and help here; a recipe holds only what differs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from mia.agent.config import AgentConfig
from mia.config import from_dict, option, plain, section
from mia.errors import MiaError
from mia.judge import JudgeConfig
from mia.planner.episode import PlannerEpisodeConfig
from mia.planner.executor_rollout import MISSING_PLAN
from mia.roles.config import PlannerServices


def gpu_agent() -> AgentConfig:
    """The reference's Executor RL loop (docs/reference.md §9): 10 turns and tool calls, a
    4096-character tool output cap, one replan. The response budget is veRL's
    ``rollout.response_length``; temperature and top-p are veRL's rollout settings."""
    return AgentConfig(max_turns=10, max_tool_calls=10, context_budget=10**9)


@dataclass
class TTRLHooks:
    """TTRL's memory writes (``trainer.v1.trainer_mode=mia_ttrl``): every rollout is buffered by
    the reward (``/memory_bank_save``); after each step ``/batch_evaluate`` ->
    ``/consolidate_memories`` -> ``/save_memory``."""

    bank: bool = option(False, "the reward buffers each rollout in memory_serve (TTRL)")
    mode: str = option("supervised", "supervised (judgement from the ground truth) | nogt")
    eval_dir: str | None = option(None, "/batch_evaluate's output folder; null = skip it")
    save_path: str | None = option(None, "/save_memory's file after each step; null = skip it")


@dataclass
class VerlMiaConfig:
    """MIA inside veRL's agent loops (the ``mia`` section of a recipes/verl config)."""

    agent: AgentConfig = section(
        gpu_agent,
        "mia_executor: the Executor loop (mia.agent.AgentConfig: turns, tool calls, tools, "
        "image size, stop strings, sampling.max_tokens per turn); temperature and top_p come "
        "from actor_rollout_ref.rollout and must not be set here",
    )
    services: PlannerServices = section(
        PlannerServices,
        "memory_serve (/plan, /replan_train, /memory, TTRL) and serve (the frozen Executor of "
        "mia_planner)",
    )
    replan: bool = option(True, "mia_executor: one /replan_train plan after a wrong first answer")
    missing_plan: str = option(
        "plan", "mia_executor, a row without a plan: plan (memory_serve /plan) | none"
    )
    max_answer_words: int | None = option(
        30, "mia_executor's reflection: a first answer longer than this is wrong (as the reward)"
    )
    judge: JudgeConfig = section(
        JudgeConfig, "mia_executor: the judge of the first answer (decides the replan)"
    )
    llm: str = option("embedded", "LLM roles for an LLM judge: configs/llm/<name>.yaml or a file")
    chat_template_kwargs: dict[str, Any] = option(
        {}, "extra chat template arguments over data.apply_chat_template_kwargs"
    )
    episode: PlannerEpisodeConfig = section(
        PlannerEpisodeConfig,
        "mia_planner: the Planner episode (turn limits; max_context is also capped by veRL's "
        "prompt + response lengths)",
    )
    ttrl: TTRLHooks = section(TTRLHooks, "TTRL's memory hooks")

    def validate(self) -> VerlMiaConfig:
        self.agent.validate()
        if self.missing_plan not in MISSING_PLAN:
            raise MiaError(f"mia.missing_plan must be plan | none, got {self.missing_plan!r}")
        fixed = sorted({"temperature", "top_p"} & set(self.agent.sampling))
        if fixed:
            raise MiaError(
                f"mia.agent.sampling sets {fixed}: veRL samples and scores the rollouts at "
                "actor_rollout_ref.rollout.temperature / top_p; set them there"
            )
        if self.ttrl.mode not in ("supervised", "nogt"):
            raise MiaError("mia.ttrl.mode must be supervised | nogt")
        PlannerEpisodeConfig.from_dict(plain(self.episode))
        return self

    def key(self) -> str:
        """A stable identity (what the per-process caches key on)."""
        return json.dumps(plain(self), sort_keys=True, default=str)


def load_mia_config(section_: Any) -> VerlMiaConfig:
    """The ``mia`` section (an OmegaConf node, a mapping or None) validated."""
    return from_dict(
        VerlMiaConfig, plain(section_) if section_ is not None else {}, "mia"
    ).validate()
