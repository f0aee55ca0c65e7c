"""Training and test samples from the reference data formats (docs/reference.md §10).

:func:`load_samples` reads a parquet / JSON / JSONL file through :func:`mia.data.formats.load_qa`
and turns every row into the plain dict the episodes read:

``question``, ``data_id``, ``golds`` (canonical answer first, then aliases; ``[]`` when
unlabelled), ``modality``, ``image_caption``, ``images`` (base64 strings, for the Executor
service), ``plan`` (the precomputed plan column, or None), ``memory_context``
(``memories_context`` column, or None), ``category``, ``data_source``.

Executor and Planner RL parquets differ only in which of the optional columns they carry.
"""

from __future__ import annotations

import base64
import logging
from pathlib import Path
from typing import Any

from mia.data.formats import QAItem, load_qa
from mia.errors import MiaError

log = logging.getLogger("mia.roles.samples")


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, list):  # some parquets store one-element lists
        value = value[0] if value else None
    text = None if value is None else str(value)
    return text if text and text.strip() else None


def item_to_sample(item: QAItem) -> dict[str, Any]:
    extra = item.extra
    return {
        "question": item.question,
        "data_id": item.id,
        "golds": list(item.answers),
        "modality": item.modality,
        "image_caption": item.image_caption,
        "images": [base64.b64encode(b).decode("ascii") for b in item.images],
        "plan": _text(extra.get("plan")),
        "memory_context": _text(extra.get("memories_context")),
        "category": item.category,
        "data_source": item.data_source,
    }


def load_samples(
    path: str | Path,
    *,
    require_answer: bool = True,
    text_only: bool = False,
    limit: int | None = None,
) -> list[dict[str, Any]]:
    """Samples of one data file. ``text_only`` skips questions with images (token-mode
    rollouts of the trainable policy are text-only for now); ``limit`` keeps the first N."""
    p = Path(path)
    if not p.is_file():
        raise MiaError(f"data file not found: {p}")
    items = load_qa(p, require_answer=require_answer)
    samples = [item_to_sample(it) for it in items]
    if text_only:
        kept = [s for s in samples if not s["images"]]
        if len(kept) < len(samples):
            log.info("%s: skipped %d image questions (text_only)", p.name, len(samples) - len(kept))
        samples = kept
    if limit is not None:
        samples = samples[: int(limit)]
    if not samples:
        raise MiaError(f"{p}: no samples left to train on")
    return samples
