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
    """The streaming TTRL server. Its answers have no response model (their fields depend on
    what the request did: docs/reference.md §3.6): plain JSON objects."""

    service = "ttrl_streaming"

    async def submit(self, body: SubmitRequest | Mapping[str, Any]) -> dict[str, Any]:
        """``/submit_sample``: samples or rollouts to buffer (``finish``, ``flush_partial``)."""
        request = self.build(SubmitRequest, body, "/submit_sample")
        return await self.send("POST", "/submit_sample", request, dict[str, Any])

    async def save_checkpoint(self) -> dict[str, Any]:
        """``/save_checkpoint``: checkpoint the Planner now (``checkpoint_global_step``,
        ``path``)."""
        return self.parse(
            "/save_checkpoint", dict[str, Any], await self.post("/save_checkpoint", {})
        )


# ----------------------------------------------------------------------------- reference bodies

_CODEC_KEYS = ("__ndarray_object__", "__ndarray_numpy__", "__tensor__")


class ReferenceBatchError(ValueError):
    """A reference ``rollout``/``batch`` body this server cannot read (answered 422)."""


def _plain(value: Any) -> Any:
    """The reference codec's wrappers (docs/reference.md §3.6) unwrapped to plain lists."""
    if isinstance(value, Mapping) and any(value.get(k) is True for k in _CODEC_KEYS):
        return value.get("data")
    return value


def _columns(batch: Any) -> dict[str, list[Any]]:
    """Per-sample columns of a collated batch: ``non_tensor_batch`` (and ``batch``) or flat."""
    if isinstance(batch, str):  # "JSON-encoded": the batch may arrive as a JSON string
        import json

        try:
            batch = json.loads(batch)
        except ValueError as err:
            raise ReferenceBatchError(f"rollout: not JSON ({err})") from None
    if not isinstance(batch, Mapping):
        raise ReferenceBatchError("rollout: expected a collated batch (a JSON object)")
    cols: dict[str, Any] = {}
    for part in ("batch", "non_tensor_batch"):  # tensors first; non-tensor columns win
        inner = batch.get(part)
        if isinstance(inner, Mapping):
            cols.update({str(k): _plain(v) for k, v in inner.items()})
    if not cols:
        cols = {str(k): _plain(v) for k, v in batch.items() if k != "meta_info"}
    return {k: v for k, v in cols.items() if isinstance(v, list)}


def _prompt_question(prompt: Any) -> str:
    """The first user message's text of a chat prompt (the reference's ``prompt[0].content``)."""
    if isinstance(prompt, str):
        return prompt
    for msg in prompt if isinstance(prompt, list) else []:
        if isinstance(msg, Mapping) and msg.get("role", "user") == "user":
            content = msg.get("content")
            if isinstance(content, list):
                content = " ".join(
                    str(p.get("text", "")) for p in content if isinstance(p, Mapping)
                )
            return str(content or "")
    return ""


def samples_from_reference_batch(batch: Any) -> list[dict[str, Any]]:
    """``{"rollout": <collated batch>}`` -> our sample dicts (data_id, question, caption, ...).

    The question comes from ``question``, else ``extra_info.question``, else the first user
    message of ``raw_prompt``/``prompt``; ``<image>`` tokens are dropped. Tokens and ground truth
    in the batch are ignored: the server tokenises with its own Planner, and ground truth lives
    only in the reward server."""
    cols = _columns(batch)
    ids = cols.get("data_id")
    if ids is None:
        extra = cols.get("extra_info") or []
        ids = [e.get("data_id") if isinstance(e, Mapping) else None for e in extra] or None
    if not ids:
        raise ReferenceBatchError("rollout: no data_id column (non_tensor_batch.data_id)")
    out = []
    for i, data_id in enumerate(ids):

        def col(name: str, i: int = i) -> Any:
            values = cols.get(name)
            return values[i] if values is not None and i < len(values) else None

        extra = col("extra_info")
        question = col("question")
        if not question and isinstance(extra, Mapping):
            question = extra.get("question")
        if not question:
            question = _prompt_question(col("raw_prompt") or col("prompt"))
        question = str(question or "").replace("<image>", "").strip()
        if not question:
            raise ReferenceBatchError(f"rollout: sample {i} has no question")
        sample: dict[str, Any] = {"data_id": data_id, "question": question}
        for name in ("image_caption", "modality", "data_source"):
            if col(name):
                sample[name] = col(name)
        out.append(sample)
    return out


class RegisterImagesEntry(BaseModel):
    model_config = ConfigDict(extra="ignore")
    data_id: str | int
    images: list[Any] = Field(default_factory=list)


class RegisterImagesRequest(BaseModel):
    """``/streaming/register_images``: ``{"entries": [{data_id, images}]}`` or one entry."""

    model_config = ConfigDict(extra="ignore")
    entries: list[RegisterImagesEntry] | None = None
    data_id: str | int | None = None
    images: list[Any] = Field(default_factory=list)

    def all_entries(self) -> list[RegisterImagesEntry]:
        if self.entries is not None:
            return self.entries
        if self.data_id is None:
            raise ValueError("send entries or one entry (data_id, images)")
        return [RegisterImagesEntry(data_id=self.data_id, images=self.images)]
