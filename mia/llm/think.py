"""Removing ``<think>...</think>`` reasoning from a reply (Qwen3-style thinking models).

Consumers want the text after the reasoning: everything after the LAST ``</think>``. A reply cut
off while still thinking (an opening ``<think>`` with no close after it) has no answer at all.
"""

from __future__ import annotations

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"


def strip_think(text: str) -> str:
    """The text after the last ``</think>``; ``""`` if the reply ends inside an open ``<think>``."""
    close = text.rfind(THINK_CLOSE)
    if close != -1:
        text = text[close + len(THINK_CLOSE) :]
    # An unclosed <think> after the last close means the reply was truncated mid-reasoning.
    open_ = text.find(THINK_OPEN)
    if open_ != -1:
        text = text[:open_]
    return text.strip()


_END_TOKENS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>")


def text_after_think(text: str) -> str:
    """The answer part of a reply: after the last ``</think>``, chat end tokens removed
    (``""`` when the reply stops inside an unclosed ``<think>``)."""
    for tok in _END_TOKENS:
        text = text.replace(tok, "")
    return strip_think(text)
