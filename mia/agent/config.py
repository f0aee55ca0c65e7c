"""The Executor loop's config schema; every default lives here (``configs/agent/*.yaml`` hold
only what differs: ``train.yaml``, ``web.yaml``)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mia.config import load_config, option, section
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
    """The Executor loop (``mia.agent``): limits per run and per continuation (a revised plan
    gets a fresh budget, as the reference's /replan call does), sampling and tools. Used by
    training, serving (serve's ``agent``) and evaluation."""

    max_turns: int = option(
        20, "assistant turns (LLM calls) per run; the reference serves with 20, RL uses 10"
    )
    max_tool_calls: int = option(
        20, 'a call past this gets the "answer now" turn instead of a result'
    )
    max_replans: int = option(1, "revised plans per trajectory")
    tool_timeout_s: float = option(60.0, "seconds per tool call, unless a tool sets timeout_s")
    tool_output_max_chars: int | None = option(
        4096, "observation text cap (veRL's max_tool_response_length); null = none"
    )
    tool_output_max_words: int | None = option(
        None, "optional cap in words (the head is kept); null = none"
    )
    truncate_side: str = option(
        "middle", "where the character cap cuts: middle (head + tail, as veRL) | end"
    )
    context_budget: int = option(
        32000, "tokens of prompt + response; clipped to the model's context length"
    )
    answer_reserve_tokens: int = option(
        512, 'an observation leaving less than this becomes the "answer now" turn'
    )
    chars_per_token: float = option(3.0, "token estimate for backends that do not count tokens")
    image_token_estimate: int = option(256, "tokens counted per image in the context estimate")
    observation_role: str = option(
        "user", "user: <tool_response> block in a user turn | tool: a tool-role message"
    )
    image_size: int | None = option(
        448, "question and tool images resized to this square; null = keep"
    )
    image_format: str = option("PNG", "data-URL encoding of images inside messages: PNG | JPEG")
    prompt_variant: str = option(
        "auto", "auto (the image prompt iff the question has images) | text | image"
    )
    stop: list[str] = option(["</tool_call>", "<tool_response>"], "stop strings of every turn")
    sampling: dict[str, Any] = option(
        {}, "overrides of the Executor LLM's sampling defaults (temperature, max_tokens, ...)"
    )
    tools: dict[str, Any] = section(
        default_tools,
        'name -> {type | _target_: "module:Class", params}; null disables one. search.params: '
        "backend local (local_search /retrieve) | web (web_tools gateway), url, topk, "
        "timeout_s, max_queries; web_image_to_image_search.params: cache_roots (<root>/"
        "<data_id>/meta.json), max_results, once (a second call per question is an error), "
        "image_size. Checked by mia.agent.build_tools",
    )

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
