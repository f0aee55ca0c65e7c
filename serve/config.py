"""Tunables of the Executor service; defaults mirror ``configs/serve/default.yaml``."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mia.agent.config import AgentConfig
from mia.errors import MiaError


def default_llm() -> dict[str, Any]:
    # The embedded default model, in-process; see configs/llm/ for the other fields.
    return {
        "backend": "local",
        "model_path": "embedded",
        "sampling": {"temperature": 0.0, "top_p": 1.0, "max_tokens": 512, "presence_penalty": 1.1},
    }


@dataclass
class ServeConfig:
    llm: dict[str, Any] = field(default_factory=default_llm)  # mia.llm.LLMConfig fields
    agent: AgentConfig = field(default_factory=AgentConfig)
    max_concurrency: int = 8  # Executor runs at once; more requests wait
    chars_per_token: float = 3.0  # context estimate when the LLM does not count tokens
    image_tokens: int = 256  # context estimate per image

    def validate(self) -> ServeConfig:
        if self.max_concurrency < 1:
            raise MiaError("serve config: max_concurrency must be >= 1")
        if self.chars_per_token <= 0 or self.image_tokens < 0:
            raise MiaError("serve config: chars_per_token must be > 0 and image_tokens >= 0")
        self.agent.validate()
        return self


def load_serve_config(
    path: str | os.PathLike[str] | None = None,
    overrides: Sequence[str] = (),
    agent_path: str | os.PathLike[str] | None = None,
) -> ServeConfig:
    """Defaults <- YAML file <- ``agent_path`` (into ``agent``) <- ``key=value`` overrides."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    for p in (path, agent_path):
        if p is not None and not Path(p).is_file():
            raise MiaError(f"config file not found: {p}")
    try:
        merged = OmegaConf.structured(ServeConfig)
        if path is not None:
            merged = OmegaConf.merge(merged, OmegaConf.load(path))
        if agent_path is not None:
            merged = OmegaConf.merge(merged, {"agent": OmegaConf.load(agent_path)})
        bad = [o for o in overrides if "=" not in o]
        if bad:
            raise MiaError(f"overrides must look like key=value, got {bad}")
        if overrides:
            merged = OmegaConf.merge(merged, OmegaConf.from_dotlist(list(overrides)))
        cfg = OmegaConf.to_object(merged)
    except (OmegaConfBaseException, ValueError) as err:
        raise MiaError(f"bad serve config: {str(err).splitlines()[0]}") from None
    assert isinstance(cfg, ServeConfig)
    return cfg.validate()
