"""The manager and planner chat backends of the service, built from an ``llm`` config file
(``configs/llm/*.yaml``: ``common`` + ``roles``) through :mod:`mia.llm.config`."""

from __future__ import annotations

import dataclasses
from typing import Any

from memory_serve.config import LLMRolesConfig
from mia.errors import MiaError
from mia.llm.base import ChatBackend, SamplingParams


def build_roles(cfg: LLMRolesConfig) -> tuple[ChatBackend, ChatBackend]:
    """``(manager, planner)``; the planner is the manager's backend when ``cfg.planner`` is None."""
    from mia.llm.config import build_backend, load_llm_config, role_configs

    roles = role_configs(load_llm_config(cfg.config))
    wanted = [cfg.manager] + ([cfg.planner] if cfg.planner else [])
    unknown_overrides = sorted(set(cfg.overrides) - set(wanted))
    if unknown_overrides:
        raise MiaError(f"llm.overrides: roles {unknown_overrides} are not used (uses {wanted})")
    built: dict[str, ChatBackend] = {}
    for role in wanted:
        if role not in roles:
            raise MiaError(f"llm config {cfg.config}: no role {role!r} (has {sorted(roles)})")
        merged = {**dataclasses.asdict(roles[role]), **dict(cfg.overrides.get(role) or {})}
        built[role] = build_backend(merged, name=role)
    manager = built[cfg.manager]
    return manager, built[cfg.planner] if cfg.planner else manager


def sampling(backend: ChatBackend, **overrides: Any) -> SamplingParams | None:
    """The backend's own defaults with the non-None ``overrides`` applied (None if none)."""
    values = {k: v for k, v in overrides.items() if v is not None}
    if not values:
        return None
    base = getattr(backend, "defaults", None)
    if not isinstance(base, SamplingParams):
        base = SamplingParams()
    return dataclasses.replace(base, **values)
