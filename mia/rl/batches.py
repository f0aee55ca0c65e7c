"""Policy batches: dicts of [B, L] token tensors and per-sample lists (the layout is in
:mod:`mia.rl.policy`'s docstring), sliced, split, concatenated and checked."""

from __future__ import annotations

from typing import Any

import torch

from mia.errors import MiaError

Batch = dict[str, Any]
TOKEN_KEYS = (
    "input_ids",
    "attention_mask",
    "response_mask",
    "old_logprobs",
    "ref_logprobs",
    "rollout_logprobs",
)
PER_SAMPLE_LIST_KEYS = ("pixel_values", "image_grid_thw")


def batch_size(batch: Batch) -> int:
    return int(batch["input_ids"].shape[0])


def slice_batch(batch: Batch, start: int, stop: int) -> Batch:
    """Samples [start, stop) of a batch: tensors with a batch axis and per-sample lists alike."""
    n = batch_size(batch)
    out: Batch = {}
    for key, value in batch.items():
        if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == n:
            out[key] = value[start:stop]
        elif isinstance(value, list | tuple) and len(value) == n:
            out[key] = list(value[start:stop])
        else:
            out[key] = value
    return out


def split_batch(batch: Batch, size: int) -> list[Batch]:
    n = batch_size(batch)
    return [slice_batch(batch, i, min(i + size, n)) for i in range(0, n, max(size, 1))]


def concat_batches(batches: list[Batch]) -> Batch:
    """Inverse of :func:`split_batch` for batches with the same token length."""
    out: Batch = {}
    for key, first in batches[0].items():
        if isinstance(first, torch.Tensor) and first.dim() > 0:
            out[key] = torch.cat([b[key] for b in batches])
        elif isinstance(first, list):
            out[key] = [x for b in batches for x in b[key]]
        else:
            out[key] = first
    return out


def validate_batch(batch: Batch, need: tuple[str, ...]) -> None:
    missing = [k for k in need if k not in batch]
    if missing:
        raise MiaError(f"policy batch lacks {', '.join(missing)}")
    shape = tuple(batch["input_ids"].shape)
    if len(shape) != 2:
        raise MiaError(f"input_ids must be [B, L], got {list(shape)}")
    for key in TOKEN_KEYS:
        if key in batch and batch[key] is not None and tuple(batch[key].shape) != shape:
            raise MiaError(f"{key} has shape {list(batch[key].shape)}, input_ids {list(shape)}")
    for key in PER_SAMPLE_LIST_KEYS:
        value = batch.get(key)
        if value is not None and (not isinstance(value, list) or len(value) != shape[0]):
            raise MiaError(f"{key} must be a list with one entry (tensor or None) per sample")
