"""The TTRL config schema (``python -m ttrl --help-config`` lists every key).

Every default lives here, sized for a laptop CPU with the embedded model;
``configs/ttrl/default.yaml`` composes the shared groups (the rewards, the judge, the review
panel) and ``experiment=paper`` / ``experiment=paper_nogt`` give the reference's settings
(docs/reference.md §9).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from mia.config import option, section
from mia.errors import MiaError
from mia.judge import JudgeConfig
from mia.planner.episode import PlannerEpisodeConfig
from mia.rewards.config import NoGTRewardConfig, PlannerRewardConfig
from mia.rl.trainer import TrainerConfig
from mia.roles.common import load_role
from mia.roles.config import PlannerServices, cpu_episode, cpu_planner_trainer
from ttrl.rewards import MODES, NOGT_METHODS

ANSWERS = ("vote", "greedy")


@dataclass
class TTRLData:
    """The test stream."""

    test: str | None = option(
        None, "reference parquet / JSON / JSONL (TTRL parquet: docs/reference.md §10)"
    )
    limit: int | None = option(None, "the first N questions; null = all")


@dataclass
class NoGTOptions:
    """``mode=nogt``: how rollouts are judged without ground truth."""

    method: str = option(
        "panel", "panel (3 critics + an arbiter, an LLM) | vote (majority over the n answers)"
    )


@dataclass
class TTRLMemory:
    """The memory writes after every batch."""

    evaluate: bool = option(
        True, "/batch_evaluate into run_dir/eval (paths on memory_serve's host)"
    )
    save: bool = option(True, "/save_memory into run_dir/memory after every batch")
    remember_expected: bool = option(
        False,
        "mode=supervised: a failed rollout's memory also keeps the expected answer and the "
        "search-result sentence that held it (as mia eval's memory.remember_expected); false = "
        "the reference's memory, without ground truth",
    )
    plan_without_failure: bool = option(
        True,
        "plan every question (the reference); false = plan only the questions whose /memory "
        "shows a failed similar question, the others answered by the Executor alone "
        "(alone_samples rollouts, judged and remembered, no Planner update), as mia eval's "
        "option of the same name; mode=nogt with nogt.method=vote needs alone_samples >= 2 (a "
        "lone answer always wins its own vote)",
    )
    alone_samples: int = option(
        1,
        "Executor rollouts per question answered alone (plan_without_failure=false): 1 = one "
        "greedy answer; k > 1 = the greedy answer and k-1 sampled at alone_temperature, the "
        "question answered by their majority (ties: the greedy one). Under nogt.method=vote a "
        "question whose answers disagree is remembered as a failure, so the next question of "
        "its kind is planned: the gate without ground truth (docs/ttrl.md)",
    )
    alone_temperature: float = option(
        0.8, "serve's sampling temperature for the alone rollouts after the first"
    )


@dataclass
class TTRLConfig:
    """Test-time RL (``python -m ttrl mode=supervised|nogt data.test=FILE``): per batch,
    memories -> n plans per question -> the Executor (serve) -> judge -> a GRPO step on the
    Planner -> memory writes (memory_serve). A killed run resumes from run_dir."""

    mode: str = option("supervised", "supervised (ground truth) | nogt (no ground truth)")
    nogt: NoGTOptions = section(NoGTOptions, "mode=nogt only")
    model_path: str = option("embedded", 'the Planner to adapt; "embedded" = SmolLM2-135M-Instruct')
    llm: str = option(
        "embedded", "LLM roles for llm/panel judges: configs/llm/<name>.yaml or a file"
    )
    chat_template_kwargs: dict[str, Any] = option(
        {}, "passed to the chat template, e.g. {enable_thinking: true} for Qwen3 planners"
    )
    run_dir: str = option("", '"" = $MIA_HOME/runs/ttrl-<time>; reuse it to resume a killed run')
    resume: bool = option(True, "continue the run found in run_dir (checkpoint + journal)")
    plot: bool = option(True, "write accuracy.png")
    answer: str = option(
        "vote",
        "the answer reported for a planned question: vote (the majority of its n sampled "
        "answers; the reference) | greedy (one more rollout whose plan is greedy, before the "
        "batch's update; reported only: neither trained on nor remembered; one more Executor "
        "rollout per planned question)",
    )
    data: TTRLData = section(TTRLData, "the test stream")
    services: PlannerServices = section(
        PlannerServices, "serve and memory_serve (required: TTRL writes its memories there)"
    )
    memory: TTRLMemory = section(TTRLMemory, "the memory writes")
    episode: PlannerEpisodeConfig = section(
        cpu_episode,
        "the Planner episode (mia.planner.episode.PlannerEpisodeConfig), CPU-sized",
    )
    reward: PlannerRewardConfig = section(
        PlannerRewardConfig, "mode=supervised: 0.7 acc2 + 0.2 acc1 + 0.05 format + 0.05 decision"
    )
    nogt_reward: NoGTRewardConfig = section(NoGTRewardConfig, "mode=nogt: 0.9 verdict + 0.1 format")
    judge: JudgeConfig = section(
        JudgeConfig, "ground-truth judge (supervised; nogt: accuracy reporting only)"
    )
    panel: JudgeConfig = section(
        lambda: JudgeConfig(type="panel"), "the no-GT review panel (nogt.method=panel)"
    )
    trainer: TrainerConfig = section(
        lambda: cpu_planner_trainer(save_freq=1, keep_last=1),
        "the GRPO trainer: batch_size questions per batch (the reference: 32), n plans per "
        "question (4); checkpoint every save_freq batches (> 1: a resume may lose up to "
        "save_freq - 1 updates, never a memory write) and after the last; keep_last 1 (resume "
        "needs only the newest)",
    )

    def validate(self) -> TTRLConfig:
        if self.mode not in MODES:
            raise MiaError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.answer not in ANSWERS:
            raise MiaError(f"answer must be one of {ANSWERS}, got {self.answer!r}")
        if self.mode == "nogt" and self.nogt.method not in NOGT_METHODS:
            raise MiaError(f"nogt.method must be one of {NOGT_METHODS}, got {self.nogt.method!r}")
        if self.memory.alone_samples < 1 or not 0.0 <= self.memory.alone_temperature <= 2.0:
            raise MiaError(
                "memory.alone_samples must be >= 1 and memory.alone_temperature in [0, 2]"
            )
        if (
            not self.memory.plan_without_failure
            and self.mode == "nogt"
            and self.nogt.method == "vote"
            and self.memory.alone_samples < 2
        ):
            raise MiaError(
                "memory.plan_without_failure=false with mode=nogt and nogt.method=vote needs "
                "memory.alone_samples >= 2: an unplanned question's lone answer always wins its "
                "own vote, so no failure would ever be remembered"
            )
        if self.memory.remember_expected and self.mode == "nogt":
            raise MiaError("memory.remember_expected needs mode=supervised (the ground truth)")
        PlannerEpisodeConfig.from_dict(asdict(self.episode))  # its limits are consistent
        self.nogt_reward.validate()
        return self


def load_config(name: str = "default", overrides: Sequence[str] = ()) -> TTRLConfig:
    """``configs/ttrl/<name>.yaml`` (or a file) composed over the schema's defaults, with
    Hydra overrides (``mode=nogt``, ``experiment=paper``, ``trainer.n=8``)."""
    return load_role(TTRLConfig, "ttrl", name, overrides)
