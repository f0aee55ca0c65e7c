"""Reward weights and switches: one schema per reward (``configs/reward/{executor,planner,nogt}.yaml``
hold only what differs from these defaults).

:func:`load_reward_config` accepts what callers have at hand: nothing (the defaults), a mapping
or an OmegaConf node (a Hydra ``reward`` group), a YAML file, or a name in ``configs/reward/``.
Unknown keys are an error, so a typo never silently leaves a weight at its default.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from mia.config import from_dict, load_dict, option, resolve_path
from mia.errors import MiaError
from mia.paths import config_dir

CONFIG_DIR = config_dir("reward")

DEFAULT_TOOL_NAMES = ("search", "web_image_to_image_search")


def _check_words(value: int | None, where: str) -> None:
    if value is not None and value < 1:
        raise MiaError(f"{where}: max_answer_words must be a positive integer or null")


@dataclass
class ExecutorRewardConfig:
    """``acc_weight*acc + tool_weight*tool + format_weight*format`` (docs/reference.md §7.1)."""

    acc_weight: float = option(0.7, "weight of answer accuracy (the judge's verdict)")
    tool_weight: float = option(0.2, "weight of the tool score (a valid tool call was made)")
    format_weight: float = option(0.1, "weight of the format score (protocol followed)")
    first_attempt_bonus: float = option(
        0.2, "added to acc when correct on the first attempt, without a replan (acc 1.2)"
    )
    max_answer_words: int | None = option(
        30,
        "answers with more WORDS than this get acc 0 without asking the judge (the reference "
        "counted 100 characters by mistake); null = no length rule",
    )
    tool_names: list[str] = option(
        list(DEFAULT_TOOL_NAMES), "tool calls that count for the tool score and pass the format"
    )

    def validate(self, where: str = "reward config") -> ExecutorRewardConfig:
        _check_words(self.max_answer_words, where)
        return self


@dataclass
class PlannerRewardConfig:
    """``acc_final_weight*acc2 + acc_first_weight*acc1 + format_weight*format +
    decision_weight*decision [+ evidence_weight*evidence]`` (docs/reference.md §7.2; also the
    reward server's default)."""

    acc_final_weight: float = option(
        0.7, "answer after the (optional) replan; = acc1 when there was no replan"
    )
    acc_first_weight: float = option(0.2, "answer of the first plan")
    format_weight: float = option(
        0.05, "decision is exactly yes/no; <think> tags balanced in plan/decision/replan"
    )
    decision_weight: float = option(0.05, "replanned iff the first answer was wrong")
    evidence_weight: float = option(
        0.0,
        "partial credit: 1 iff a search result the Executor read (final trace) holds a gold "
        "answer (mia.trace.evidence_in_trace), right or wrong answer; separates the wrong "
        "plans that searched the right place from the rest, so an all-wrong group ties only "
        "when all or none reached it. 0 = the reference's reward (docs/ttrl.md)",
    )


@dataclass
class NoGTRewardConfig:
    """``verdict_weight*panel_verdict + format_weight*format`` (docs/reference.md §7.3; the
    verdict comes from the review panel, configs/judge/panel.yaml)."""

    verdict_weight: float = option(0.9, "weight of the panel's (or the vote's) verdict")
    format_weight: float = option(
        0.1, "weight of the planner format rule (or the Executor's, for a Trajectory)"
    )
    max_answer_words: int | None = option(
        None,
        'an arbiter "correct" on an answer longer than this many words is still rewarded 0; '
        "null = no rule (the reference had none here)",
    )

    def validate(self, where: str = "reward config") -> NoGTRewardConfig:
        _check_words(self.max_answer_words, where)
        return self


KINDS: dict[str, type] = {
    "executor": ExecutorRewardConfig,
    "planner": PlannerRewardConfig,
    "nogt": NoGTRewardConfig,
}

C = TypeVar("C")


def resolve_config_path(path: str | Path) -> Path:
    """A YAML file, or a name in ``configs/reward/`` (``planner`` -> ``planner.yaml``)."""
    return resolve_path(path, "reward")


def load_reward_config(cls: type[C], source: Any = None) -> C:
    """A ``cls`` (one of the reward config dataclasses) from ``source``: None (defaults), an
    instance (returned as is), a mapping / OmegaConf node, or a YAML path / config name."""
    if isinstance(source, cls):
        return source
    if source is None:
        return cls()
    where = f"reward config ({cls.__name__})"
    if isinstance(source, str | Path):
        where = f"reward config {resolve_config_path(source)}"
        source = load_dict(source, group="reward")
    return from_dict(cls, source, where)
