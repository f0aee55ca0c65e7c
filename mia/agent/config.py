"""Tunables of the Executor loop; defaults mirror ``configs/agent/default.yaml``."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mia.config import load_config
from mia.errors import MiaError
from mia.llm.base import SamplingParams
from mia.prompts.executor import VARIANTS


def default_tools() -> dict[str, Any]:
    return {
        "search": {
            "type": "search",
            "params": {
                "backend": "local",
                "url": "http://127.0.0.1:8001",
                "topk": 3,
                "timeout_s": 30,
                "max_queries": 8,
            },
        },
        "web_image_to_image_search": {
            "type": "web_image_to_image_search",
            "params": {"cache_roots": [], "max_results": 3, "once": True, "image_size": 448},
        },
    }


@dataclass
class AgentConfig:
    # Limits per run / per continuation (a replan gets a fresh budget, as the reference's
    # /replan call does).
    max_turns: int = 20  # assistant turns (LLM calls)
    max_tool_calls: int = 20  # calls past this get the "answer now" turn instead
    max_replans: int = 1
    tool_timeout_s: float = 60.0  # per call, unless the tool sets its own timeout_s
    tool_output_max_chars: int | None = 4096  # observation text cap (veRL's tool-response cap)
    tool_output_max_words: int | None = None  # alternative cap in words (head kept)
    truncate_side: str = "middle"  # middle | end (for the character cap)
    # Tokens of context (prompt + response). An observation that would leave less than
    # answer_reserve_tokens is replaced by the "answer now" turn.
    context_budget: int = 32000
    answer_reserve_tokens: int = 512
    chars_per_token: float = 3.0  # estimate for backends that do not count tokens
    image_token_estimate: int = 256
    observation_role: str = "user"  # user: <tool_response> text in a user turn; tool: tool role
    image_size: int | None = 448  # question and tool images resized to this square; null = keep
    image_format: str = "PNG"  # data-URL encoding of images in messages
    prompt_variant: str = "auto"  # auto | text | image
    stop: list[str] = field(default_factory=lambda: ["</tool_call>", "<tool_response>"])
    sampling: dict[str, Any] = field(default_factory=dict)  # overrides of the LLM's defaults
    tools: dict[str, Any] = field(default_factory=default_tools)

    def validate(self) -> AgentConfig:
        checks = [
            (self.max_turns >= 1, "max_turns must be >= 1"),
            (self.max_tool_calls >= 0, "max_tool_calls must be >= 0"),
            (self.max_replans >= 0, "max_replans must be >= 0"),
            (self.tool_timeout_s > 0, "tool_timeout_s must be > 0"),
            (self.context_budget >= 1, "context_budget must be >= 1"),
            (self.answer_reserve_tokens >= 0, "answer_reserve_tokens must be >= 0"),
            (self.chars_per_token > 0, "chars_per_token must be > 0"),
            (self.truncate_side in ("middle", "end"), "truncate_side must be middle or end"),
            (self.observation_role in ("user", "tool"), "observation_role must be user or tool"),
            (self.prompt_variant in VARIANTS, f"prompt_variant must be one of {VARIANTS}"),
            (self.image_size is None or self.image_size >= 1, "image_size must be >= 1 or null"),
            (self.image_format.upper() in ("PNG", "JPEG"), "image_format must be PNG or JPEG"),
        ]
        for ok, message in checks:
            if not ok:
                raise MiaError(f"agent config: {message}")
        known = {f.name for f in dataclasses.fields(SamplingParams)} - {"stop"}
        bad = sorted(set(self.sampling) - known)
        if bad:
            raise MiaError(f"agent config: unknown sampling key(s) {bad} (known: {sorted(known)})")
        return self


def load_agent_config(
    source: str | os.PathLike[str] | Mapping[str, Any] | None = None,
    overrides: Sequence[str] = (),
) -> AgentConfig:
    """Defaults <- a YAML file (or a name in configs/agent/) or mapping <- ``key=value``
    overrides (Hydra-style dot paths)."""
    return load_config(AgentConfig, source, overrides, group="agent", where="bad agent config")
