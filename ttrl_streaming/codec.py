"""Tensors on the wire between the streaming client and server: JSON or safetensors, never
pickle (docs/reference.md §3.6 sent a JSON codec; anything that unpickles request bodies runs code).

JSON form of a tensor (and of a numeric numpy array)::

    {"__tensor__": true, "dtype": "int64", "shape": [2, 3], "data": [1, 2, 3, 4, 5, 6]}

:func:`encode` / :func:`decode` walk nested dicts and lists. Binary form: a safetensors file
whose ``__metadata__`` holds the non-tensor fields as JSON strings
(:func:`rollouts_to_safetensors` packs ragged token rows as one flat tensor + offsets).
Decoding validates dtype (an allowlist), shape and size and raises :class:`CodecError` (a 4xx
for the server) on anything malformed.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from mia.errors import MiaError

TENSOR_KEY = "__tensor__"
DTYPES: dict[str, torch.dtype] = {
    "bool": torch.bool,
    "uint8": torch.uint8,
    "int8": torch.int8,
    "int16": torch.int16,
    "int32": torch.int32,
    "int64": torch.int64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "float64": torch.float64,
}
_NAMES = {v: k for k, v in DTYPES.items()}
MAX_ELEMENTS = 50_000_000


class CodecError(MiaError):
    """A malformed tensor payload."""


def encode_tensor(t: Any) -> dict[str, Any]:
    if not isinstance(t, torch.Tensor):
        t = torch.as_tensor(t)  # numpy arrays
    t = t.detach().cpu()
    if t.dtype not in _NAMES:
        raise CodecError(f"cannot encode dtype {t.dtype}")
    data = t.float() if t.dtype == torch.bfloat16 else t
    return {
        TENSOR_KEY: True,
        "dtype": _NAMES[t.dtype],
        "shape": list(t.shape),
        "data": data.reshape(-1).tolist(),
    }


def decode_tensor(obj: Mapping[str, Any]) -> torch.Tensor:
    dtype = DTYPES.get(str(obj.get("dtype")))
    if dtype is None:
        raise CodecError(f"tensor dtype must be one of {sorted(DTYPES)}, got {obj.get('dtype')!r}")
    shape = obj.get("shape")
    if not isinstance(shape, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise CodecError("tensor shape must be a list of non-negative integers")
    size = math.prod(shape)
    if size > MAX_ELEMENTS:
        raise CodecError(f"tensor of {size} elements is over the limit of {MAX_ELEMENTS}")
    data = obj.get("data")
    if not isinstance(data, list) or len(data) != size:
        raise CodecError(f"tensor data must be a flat list of {size} numbers")
    if not all(isinstance(x, int | float) for x in data):  # bools are ints: fine for bool tensors
        raise CodecError("tensor data must hold numbers only")
    try:
        return torch.tensor(data, dtype=dtype).reshape(shape)
    except (TypeError, ValueError, RuntimeError, OverflowError) as err:
        raise CodecError(f"bad tensor data: {err}") from None


def _is_array(value: Any) -> bool:
    return type(value).__module__ == "numpy" and hasattr(value, "dtype") and hasattr(value, "shape")


def encode(obj: Any) -> Any:
    """JSON-ready copy of ``obj`` with tensors (and numeric numpy arrays) encoded."""
    if isinstance(obj, torch.Tensor) or _is_array(obj):
        return encode_tensor(obj)
    if isinstance(obj, Mapping):
        return {str(k): encode(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [encode(v) for v in obj]
    return obj


def decode(obj: Any) -> Any:
    """Inverse of :func:`encode`: tensor dicts become ``torch.Tensor``."""
    if isinstance(obj, Mapping):
        if obj.get(TENSOR_KEY) is True:
            return decode_tensor(obj)
        return {k: decode(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [decode(v) for v in obj]
    return obj


def as_list(value: Any, kind: type, what: str) -> list[Any]:
    """A flat list of ``kind`` from a JSON list or a 1-D tensor (JSON-encoded or decoded)."""
    if isinstance(value, Mapping) and value.get(TENSOR_KEY) is True:
        value = decode_tensor(value)
    if isinstance(value, torch.Tensor):
        if value.dim() != 1:
            raise CodecError(f"{what} must be 1-D, got shape {list(value.shape)}")
        value = value.tolist()
    if not isinstance(value, list):
        raise CodecError(f"{what} must be a list or a 1-D tensor")
    out = []
    for x in value:
        if isinstance(x, bool) or not isinstance(x, int | float):
            raise CodecError(f"{what} must hold numbers only")
        if kind is int:
            if float(x) != int(x):
                raise CodecError(f"{what} must hold integers")
            x = int(x)
        else:
            x = float(x)
            if not math.isfinite(x):
                raise CodecError(f"{what} must hold finite numbers")
        out.append(x)
    return out


# ----------------------------------------------------------------------------- safetensors


def to_safetensors(tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, Any]) -> bytes:
    from safetensors.torch import save

    meta = {str(k): json.dumps(v) for k, v in metadata.items()}
    return save({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, metadata=meta)


def from_safetensors(data: bytes) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """``(tensors, metadata)`` of safetensors bytes; metadata values JSON-decoded."""
    from safetensors import SafetensorError
    from safetensors.torch import load

    if len(data) < 8:
        raise CodecError("safetensors payload is too short")
    (n,) = struct.unpack("<Q", data[:8])
    if n > len(data) - 8:
        raise CodecError("safetensors header is longer than the payload")
    try:
        header = json.loads(data[8 : 8 + n])
        tensors = load(data)
    except (ValueError, SafetensorError) as err:
        raise CodecError(f"not a safetensors payload: {err}") from None
    raw = header.get("__metadata__") or {}
    try:
        meta = {k: json.loads(v) for k, v in raw.items()}
    except (TypeError, ValueError):
        raise CodecError("safetensors metadata values must be JSON strings") from None
    return tensors, meta


ROW_FIELDS = ("prompt_ids", "response_ids", "response_mask", "rollout_logprobs")


def rollouts_to_safetensors(rows: Sequence[Mapping[str, Any]], **extra: Any) -> bytes:
    """Token rollouts (``group``, ``prompt_ids``, ``response_ids``, ``response_mask``, optional
    ``rollout_logprobs``, ``reward``, optional ``extras``) as one safetensors payload."""
    tensors: dict[str, torch.Tensor] = {}
    for name in ROW_FIELDS:
        present = [r.get(name) is not None for r in rows]
        if name == "rollout_logprobs" and not all(present):
            continue
        values = [list(r[name]) for r in rows]
        dtype = torch.float32 if name == "rollout_logprobs" else torch.int64
        flat = [x for v in values for x in v]
        tensors[name] = torch.tensor(flat, dtype=dtype)
        tensors[f"{name}_lengths"] = torch.tensor([len(v) for v in values], dtype=torch.int64)
    meta = {
        "groups": [str(r["group"]) for r in rows],
        "rewards": [float(r["reward"]) for r in rows],
        "extras": [dict(r.get("extras") or {}) for r in rows],
        **extra,
    }
    return to_safetensors(tensors, meta)


def rollouts_from_safetensors(data: bytes) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Inverse of :func:`rollouts_to_safetensors`: ``(rows, other metadata)``."""
    tensors, meta = from_safetensors(data)
    groups, rewards = meta.pop("groups", None), meta.pop("rewards", None)
    extras = meta.pop("extras", None)
    if not isinstance(groups, list) or not isinstance(rewards, list) or len(groups) != len(rewards):
        raise CodecError("safetensors metadata needs 'groups' and 'rewards' lists of equal length")
    n = len(groups)
    rows: list[dict[str, Any]] = [
        {"group": groups[i], "reward": rewards[i], "extras": (extras or [{}] * n)[i]}
        for i in range(n)
    ]
    for name in ROW_FIELDS:
        if name not in tensors:
            if name == "rollout_logprobs":
                continue
            raise CodecError(f"safetensors payload has no {name!r} tensor")
        flat, lengths = tensors[name], tensors.get(f"{name}_lengths")
        if lengths is None or lengths.dim() != 1 or len(lengths) != n:
            raise CodecError(f"{name}_lengths must hold one length per row ({n})")
        if flat.dim() != 1 or int(lengths.sum()) != flat.numel() or bool((lengths < 0).any()):
            raise CodecError(f"{name}: lengths do not add up to the flat tensor")
        for i, part in enumerate(torch.split(flat, lengths.tolist())):
            rows[i][name] = part.tolist()
    return rows, meta
