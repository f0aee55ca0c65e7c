"""Judges: rule-based EM/F1/containment, SimpleQA-style LLM judge, the no-ground-truth panel, majority vote.

``build_judge(cfg)`` makes one from a ``judge`` config (``configs/judge/{rules,llm,panel}.yaml``).
LLM-backed judges take their chat backend from ``backend=`` or from ``roles[cfg.role]`` (the
output of :func:`mia.llm.roles_from_config`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from mia.judge.base import Judge, JudgeError, Judgement
from mia.judge.llm_judge import LLMJudge
from mia.judge.panel import PanelJudge
from mia.judge.rules import (
    RuleJudge,
    contains,
    exact_match,
    extract_answer,
    normalize_answer,
    token_f1,
)
from mia.judge.vote import VoteResult, majority_vote
from mia.llm.base import ChatBackend, SamplingParams

__all__ = [
    "Judge",
    "JudgeConfig",
    "JudgeError",
    "Judgement",
    "LLMJudge",
    "PanelJudge",
    "RuleJudge",
    "VoteResult",
    "build_judge",
    "contains",
    "exact_match",
    "extract_answer",
    "majority_vote",
    "normalize_answer",
    "token_f1",
]

TYPES = ("rules", "llm", "panel")


@dataclass
class JudgeConfig:
    """Defaults mirror ``configs/judge/rules.yaml`` (type) and llm/panel.yaml (the rest)."""

    type: str = "rules"
    # rules (also the llm judge's fallback)
    mode: str = "contains"
    f1_threshold: float = 0.5
    # llm and panel
    role: str = "judge"
    fallback: str | None = None
    sampling: dict[str, Any] = field(
        default_factory=lambda: {"temperature": 0.0, "max_tokens": 256}
    )
    # panel
    critic_sampling: dict[str, Any] = field(
        default_factory=lambda: {"temperature": 0.1, "max_tokens": 1000}
    )
    arbiter_sampling: dict[str, Any] = field(
        default_factory=lambda: {"temperature": 0.0, "max_tokens": 16}
    )
    weights: list[float] = field(default_factory=lambda: [0.5, 0.3, 0.2])
    max_trajectory_chars: int | None = 20000


def _config(cfg: Any) -> JudgeConfig:
    if isinstance(cfg, JudgeConfig):
        return cfg
    if cfg is None:
        return JudgeConfig()
    try:
        from omegaconf import DictConfig, OmegaConf

        if isinstance(cfg, DictConfig):
            cfg = OmegaConf.to_container(cfg, resolve=True)
    except ImportError:  # pragma: no cover - omegaconf is a dependency
        pass
    if not isinstance(cfg, Mapping):
        raise JudgeError(f"judge config must be a mapping, got {type(cfg).__name__}")
    known = {f.name for f in dataclasses.fields(JudgeConfig)}
    unknown = sorted(set(cfg) - known)
    if unknown:
        raise JudgeError(f"judge config: unknown key(s) {unknown} (known: {sorted(known)})")
    return JudgeConfig(**dict(cfg))


def _params(data: Mapping[str, Any], what: str) -> SamplingParams:
    try:
        return SamplingParams(**dict(data))
    except TypeError as err:
        raise JudgeError(f"judge config: bad {what}: {err}") from None


def build_judge(
    cfg: Any = None,
    backend: ChatBackend | None = None,
    roles: Mapping[str, ChatBackend] | None = None,
) -> Judge:
    """A judge from config: ``type`` rules | llm | panel (default: rules, containment)."""
    c = _config(cfg)
    if c.type not in TYPES:
        raise JudgeError(f"judge config: type must be one of {TYPES}, got {c.type!r}")
    rules = RuleJudge(mode=c.mode, f1_threshold=c.f1_threshold)
    if c.type == "rules":
        return rules
    if backend is None:
        if roles is None or c.role not in roles:
            have = sorted(roles) if roles else []
            raise JudgeError(
                f"judge type {c.type!r} needs a chat backend: pass backend= or roles with "
                f"role {c.role!r} (have {have})"
            )
        backend = roles[c.role]
    if c.type == "llm":
        return LLMJudge(
            backend,
            params=_params(c.sampling, "sampling"),
            fallback=c.fallback,
            fallback_judge=rules,
        )
    if c.fallback is not None:
        raise JudgeError("judge config: the panel judge has no fallback (it has no ground truth)")
    return PanelJudge(
        backend,
        critic_params=_params(c.critic_sampling, "critic_sampling"),
        arbiter_params=_params(c.arbiter_sampling, "arbiter_sampling"),
        weights=c.weights,
        max_trajectory_chars=c.max_trajectory_chars,
    )
