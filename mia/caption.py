"""The one caption rule (docs/reference.md §3.1): a caption is a string or a list of strings, and
of a list the first non-empty one is used. memory_serve, the streaming server and the data loaders
all apply it, so a question is bucketed (text-only / text-image) and embedded the same way
whichever route it came through."""

from __future__ import annotations

from collections.abc import Sequence


def caption_text(caption: str | Sequence[str] | None) -> str:
    """The caption as one stripped string: a list gives its first non-empty string, else ""."""
    if caption is None:
        return ""
    if isinstance(caption, str):
        return caption.strip()
    for item in caption:
        if isinstance(item, str) and item.strip():
            return item.strip()
    return ""
