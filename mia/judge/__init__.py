"""Judges: rule-based EM/F1/containment, SimpleQA-style LLM judge, the no-ground-truth panel, majority vote.

``build_judge(cfg)`` makes one from a ``judge`` config (``configs/judge/{rules,llm,panel}.yaml``).
LLM-backed judges take their chat backend from ``backend=`` or from ``roles[cfg.role]`` (the
output of :func:`mia.llm.roles_from_config`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mia.config import from_dict, option
from mia.errors import MiaError
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
    """A judge (``configs/judge/{rules,llm,panel}.yaml``, each holding what differs from these
    defaults: its ``type``)."""

    type: str = option(
        "rules",
        "rules (EM / F1 / containment, no LLM) | llm (SimpleQA-style, with ground truth) | "
        "panel (no ground truth: three critics + an arbiter)",
    )
    mode: str = option(
        "contains",
        "rules, and the llm judge's fallback: em | f1 | contains (a gold answer occurs as whole "
        "words in the prediction)",
    )
    f1_threshold: float = option(0.5, "f1 mode: correct when token F1 >= this")
    role: str = option("judge", "llm and panel: which LLM role (configs/llm/*.yaml) grades")
    fallback: str | None = option(
        None,
        'llm: null = a failed judge call is an error; "rules" = grade by rules instead (recorded '
        'as "rules:<mode> (fallback)")',
    )
    sampling: dict[str, Any] = option(
        {"temperature": 0.0, "max_tokens": 256},
        "llm: sampling of the judge call (the reference used 0.1 for Executor RL rewards, 0 for "
        "evaluation)",
    )
    critic_sampling: dict[str, Any] = option(
        {"temperature": 0.1, "max_tokens": 1000}, "panel: sampling of the three critics"
    )
    arbiter_sampling: dict[str, Any] = option(
        {"temperature": 0.0, "max_tokens": 16}, "panel: sampling of the arbiter (A/B)"
    )
    weights: list[float] = option(
        [0.5, 0.3, 0.2],
        "panel: reasoning / information sourcing / result validity (told to the arbiter)",
    )
    max_trajectory_chars: int | None = option(
        20000, "panel: longer trajectories keep their start and end; null = no cut"
    )


def _config(cfg: Any) -> JudgeConfig:
    if isinstance(cfg, JudgeConfig):
        return cfg
    try:
        return from_dict(JudgeConfig, cfg, "judge config")
    except JudgeError:
        raise
    except MiaError as err:
        raise JudgeError(str(err)) from None


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
