"""Reward weights and switches. Dataclass defaults mirror ``configs/reward/{executor,planner,nogt}.yaml``.

:func:`load_reward_config` accepts what callers have at hand: nothing (the defaults), a mapping
or an OmegaConf node (a Hydra ``reward`` group), a YAML file, or a name in ``configs/reward/``.
Unknown keys are an error, so a typo never silently leaves a weight at its default.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from mia.errors import MiaError
from mia.paths import config_dir

CONFIG_DIR = config_dir("reward")

DEFAULT_TOOL_NAMES = ("search", "web_image_to_image_search")


@dataclass
class ExecutorRewardConfig:
    """``acc_weight*acc + tool_weight*tool + format_weight*format`` (docs/reference.md §7.1)."""

    acc_weight: float = 0.7
    tool_weight: float = 0.2
    format_weight: float = 0.1
    # Added to acc when the first attempt is correct without a replan (acc 1.2 in the reference).
    first_attempt_bonus: float = 0.2
    # An answer with more words than this scores acc 0 without asking the judge. The reference
    # meant "too long" but counted characters (>100); null disables the rule.
    max_answer_words: int | None = 30
    # Tool calls that count for the tool score and are accepted by the format rules.
    tool_names: list[str] = field(default_factory=lambda: list(DEFAULT_TOOL_NAMES))


@dataclass
class PlannerRewardConfig:
    """``acc_final_weight*acc2 + acc_first_weight*acc1 + format_weight*format +
    decision_weight*decision`` (docs/reference.md §7.2)."""

    acc_final_weight: float = 0.7
    acc_first_weight: float = 0.2
    format_weight: float = 0.05
    decision_weight: float = 0.05


@dataclass
class NoGTRewardConfig:
    """``verdict_weight*panel_verdict + format_weight*format`` (docs/reference.md §7.3)."""

    verdict_weight: float = 0.9
    format_weight: float = 0.1
    # An arbiter "correct" on an answer longer than this is still rewarded 0; null = no rule
    # (the reference had none for the no-ground-truth reward).
    max_answer_words: int | None = None


KINDS: dict[str, type] = {
    "executor": ExecutorRewardConfig,
    "planner": PlannerRewardConfig,
    "nogt": NoGTRewardConfig,
}

C = TypeVar("C")


def _plain(data: Any) -> Any:
    try:
        from omegaconf import DictConfig, OmegaConf

        if isinstance(data, DictConfig):
            return OmegaConf.to_container(data, resolve=True)
    except ImportError:  # pragma: no cover - omegaconf is a dependency
        pass
    return data


def resolve_config_path(path: str | Path) -> Path:
    """A YAML file, or a name in ``configs/reward/`` (``planner`` -> ``planner.yaml``)."""
    p = Path(path).expanduser()
    if p.is_file():
        return p
    named = CONFIG_DIR / (p.name if p.suffix == ".yaml" else f"{p.name}.yaml")
    if named.is_file():
        return named
    raise MiaError(f"reward config not found: {path} (also looked for {named})")


def _check(cfg: Any, where: str) -> None:
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if f.name.endswith("_weight") or f.name == "first_attempt_bonus":
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise MiaError(f"{where}: {f.name} must be a number, got {value!r}")
            setattr(cfg, f.name, float(value))
        elif f.name == "max_answer_words" and value is not None:
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise MiaError(f"{where}: max_answer_words must be a positive integer or null")
        elif f.name == "tool_names" and (
            not isinstance(value, list | tuple) or not all(isinstance(n, str) for n in value)
        ):
            raise MiaError(f"{where}: tool_names must be a list of tool names")


def load_reward_config(cls: type[C], source: Any = None) -> C:
    """A ``cls`` (one of the reward config dataclasses) from ``source``: None (defaults), an
    instance (returned as is), a mapping / OmegaConf node, or a YAML path / config name."""
    if isinstance(source, cls):
        return source
    where = f"reward config ({cls.__name__})"
    if source is None:
        data: Any = {}
    elif isinstance(source, str | Path):
        from omegaconf import OmegaConf

        path = resolve_config_path(source)
        where = f"reward config {path}"
        data = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    else:
        data = _plain(source)
    if not isinstance(data, Mapping):
        raise MiaError(f"{where}: expected a mapping, got {type(data).__name__}")
    known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - known)
    if unknown:
        raise MiaError(f"{where}: unknown key(s) {unknown} (known: {sorted(known)})")
    cfg = cls(**dict(data))
    _check(cfg, where)
    return cfg
