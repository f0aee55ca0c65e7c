"""The TTRL streaming server contract (``/submit_sample``, ``/save_checkpoint``): request models
shared by the server (``ttrl_streaming.server``) and :class:`StreamingClient`."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from mia.caption import caption_text
from mia.services.base import ServiceClient


class StreamSample(BaseModel):
    """One question to learn from; ground truth lives in the reward server only."""

    model_config = ConfigDict(extra="ignore")
    data_id: str | int = Field(description="the id its ground truth is registered under")
    question: str
    image_caption: str | list[str] | None = None
    modality: str | None = None
    images: list[str] | None = Field(default=None, description="base64 images for the Executor")
    data_source: str | None = None

    @field_validator("question")
    @classmethod
    def _question(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("must not be empty")
        return v

    @field_validator("data_id")
    @classmethod
    def _data_id(cls, v: str | int) -> str:
        text = str(v).strip()
        if not text or isinstance(v, bool):
            raise ValueError("must be a non-empty string or an integer")
        return text

    def to_sample(self) -> dict[str, Any]:
        caption = caption_text(self.image_caption)  # a list: its first caption, as memory_serve
        return {
            "data_id": str(self.data_id),
            "question": self.question,
            "image_caption": caption or "",
            "modality": self.modality or ("text-image" if caption or self.images else "text-only"),
            "images": list(self.images or []),
            "data_source": self.data_source or "",
            "golds": [],
        }


class RolloutRow(BaseModel):
    model_config = ConfigDict(extra="forbid")
    group: str = Field(min_length=1, description="rows of one question share it (GRPO group)")
    prompt_ids: Any
    response_ids: Any
    response_mask: Any
    rollout_logprobs: Any = None
    reward: float
    extras: dict[str, Any] = Field(default_factory=dict)

    @field_validator("reward")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("must be finite")
        return v


class SubmitRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    samples: list[StreamSample] | None = None
    rollouts: list[RolloutRow] | None = None
    finish: bool = False
    flush_partial: bool = False
    epoch: int = 0


# ----------------------------------------------------------------------------- client


class StreamingClient(ServiceClient):
    service = "ttrl_streaming"

    def submit(self, body: Mapping[str, Any]) -> dict[str, Any]:
        return self.post_sync("/submit_sample", dict(body))

    def save_checkpoint(self) -> dict[str, Any]:
        return self.post_sync("/save_checkpoint", {})
