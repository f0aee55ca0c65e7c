"""The Executor service's config schema (``python -m serve --help-config`` lists every key).

Every default lives here; ``configs/serve/*.yaml`` hold only what differs (``vllm.yaml``: the
Executor on a vLLM server). Loaded with :func:`mia.config.load_config`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from mia.agent.config import AgentConfig
from mia.config import from_dict, load_dict, merge, option, section
from mia.errors import MiaError
from mia.llm.config import LLMConfig

# The image budget of one request (ServeConfig.max_request_pixels / max_request_images).
MAX_REQUEST_PIXELS = 50_000_000
MAX_REQUEST_IMAGES = 16


def default_llm() -> LLMConfig:
    """The embedded default model, in-process, with the Executor's sampling."""
    return LLMConfig(
        backend="local",
        model_path="embedded",
        sampling={"temperature": 0.0, "top_p": 1.0, "max_tokens": 512, "presence_penalty": 1.1},
    )


@dataclass
class ServeConfig:
    """The Executor service (``python -m serve``)."""

    llm: LLMConfig = section(
        default_llm,
        "the Executor LLM (mia.llm.LLMConfig; configs/llm/ shows the fields): by default the "
        "embedded SmolLM2-135M-Instruct in-process; llm.backend=openai llm.base_url=URL for vLLM",
    )
    agent: AgentConfig = section(
        AgentConfig,
        "the Executor loop (configs/agent/ keys), e.g. agent.tools.search.params.url=URL or "
        "agent.tools.web_image_to_image_search.params.cache_roots=[/data/cache]",
    )
    max_concurrency: int = option(8, "Executor runs at once; further requests wait")
    chars_per_token: float = option(
        3.0, "context estimate when the LLM does not report token counts"
    )
    image_tokens: int = option(256, "context estimate per image")
    images_from: list[str] = option(
        [],
        "QA files (parquet / JSON / JSONL, the reference formats) whose images a request without "
        "images gets by its data_id (the first image, as the reference's Executor services did)",
    )
    max_request_pixels: int = option(
        MAX_REQUEST_PIXELS,
        "pixels (width x height, read from the image headers before decoding) that all images "
        "of one request may declare in all: those sent, those stored for its data_id and those "
        "inside /continue's messages; more answers 413. Each image is also held to PIL's "
        "per-image limit (about 89 megapixels, mia.vision; over it: 422)",
    )
    max_request_images: int = option(
        MAX_REQUEST_IMAGES,
        "images one request may carry, counted as for max_request_pixels; more answers 413",
    )

    def validate(self) -> ServeConfig:
        if self.max_concurrency < 1:
            raise MiaError("serve config: max_concurrency must be >= 1")
        if self.max_request_pixels < 1 or self.max_request_images < 1:
            raise MiaError("serve config: max_request_pixels and max_request_images must be >= 1")
        if self.chars_per_token <= 0 or self.image_tokens < 0:
            raise MiaError("serve config: chars_per_token must be > 0 and image_tokens >= 0")
        self.llm.validate("serve config: llm")
        self.agent.validate()
        return self


def load_images_by_id(paths: Sequence[str]) -> dict[str, list[bytes]]:
    """``images_from`` read once at start-up: data_id -> ``[first image]`` (questions with images)."""
    from mia.data.formats import DataFormatError, load_qa

    out: dict[str, list[bytes]] = {}
    for path in paths:
        try:
            items = load_qa(path, require_answer=False)
        except (DataFormatError, OSError) as err:
            raise MiaError(f"serve config: images_from {path}: {err}") from None
        out.update({it.id: it.images[:1] for it in items if it.images})
    return out


def load_serve_config(
    path: str | os.PathLike[str] | None = None,
    overrides: Sequence[str] = (),
    agent_path: str | os.PathLike[str] | None = None,
) -> ServeConfig:
    """Defaults <- YAML ``path`` (a file or a name in configs/serve/) <- ``agent_path`` (a file
    or a name in configs/agent/, into ``agent``) <- ``key=value`` overrides."""
    data = load_dict(path, group="serve")
    if agent_path is not None:
        data["agent"] = merge(data.get("agent"), load_dict(agent_path, group="agent"))
    return from_dict(ServeConfig, load_dict(data, overrides), "serve config")
