"""The local backend's cache (:class:`PrefixCache`, docs/llm.md): the KV of recent prompts and
replies, reused from their longest common prefix, and the replies of greedy text requests; with
the records the batching engine (:mod:`mia.llm.local_engine`) queues and answers.
"""

from __future__ import annotations

import concurrent.futures
from dataclasses import dataclass, field, replace
from typing import Any

from mia.llm.base import SamplingParams


@dataclass
class Request:
    """One prompt to continue, with its sampling settings; ``future`` receives its output."""

    prompt_ids: list[int]
    params: SamplingParams
    future: concurrent.futures.Future[Output] = field(default_factory=concurrent.futures.Future)
    # Qwen2.5-VL: {"pixel_values": [patches, dim], "image_grid_thw": [images, 3]} for this row.
    multimodal: dict[str, Any] | None = None


@dataclass
class Output:
    """A finished reply: its text (cut at a stop string), every sampled id and its logprob."""

    text: str
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str


MIN_PREFIX = 16  # shorter common prefixes are computed again: not worth a cache copy
MAX_REPLIES = 4096  # greedy replies kept (token ids and logprobs: a few MiB at most)


def reply_key(req: Request) -> tuple[Any, ...] | None:
    """What a greedy text reply depends on, or None for a request that samples (its reply is
    a draw, never reused) or carries images."""
    p = req.params
    if p.temperature > 0 or req.multimodal:
        return None
    return (tuple(req.prompt_ids), p.max_tokens, tuple(p.stop or ()), p.presence_penalty)


class PrefixCache:
    """LRU store of ``token ids -> per-layer (keys, values)`` ([heads, tokens, dim] each), at most
    ``max_bytes``, and of the last ``MAX_REPLIES`` greedy replies (:func:`reply_key` ->
    output). Used by the batching worker thread only (no locking)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._entries: dict[int, tuple[Any, list[tuple[Any, Any]], int]] = {}  # LRU order
        self._next = 0
        self.hits = 0  # prompts that reused a prefix
        self.reused_tokens = 0
        self._replies: dict[tuple[Any, ...], Output] = {}  # LRU order
        self.reply_hits = 0  # requests answered from a stored reply

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        self._entries.clear()
        self._replies.clear()
        self.bytes = 0

    def reply(self, key: tuple[Any, ...] | None) -> Output | None:
        """The stored reply for ``key`` (a copy: callers may keep it), or None."""
        out = self._replies.pop(key, None) if key is not None else None
        if out is None:
            return None
        self._replies[key] = out  # most recently used
        self.reply_hits += 1
        return replace(out, token_ids=list(out.token_ids), logprobs=list(out.logprobs))

    def store_reply(self, key: tuple[Any, ...] | None, out: Output) -> None:
        if key is None:
            return
        self._replies.pop(key, None)
        self._replies[key] = replace(
            out, token_ids=list(out.token_ids), logprobs=list(out.logprobs)
        )
        while len(self._replies) > MAX_REPLIES:
            del self._replies[next(iter(self._replies))]  # least recently used

    def lookup(self, ids: Any, torch: Any) -> tuple[int, list[tuple[Any, Any]] | None]:
        """The longest common prefix of ``ids`` (a 1-D long tensor) with a stored sequence,
        capped so that one token is left to compute; (0, None) below ``MIN_PREFIX``."""
        best, best_key = 0, None
        for key, (tokens, _, _) in self._entries.items():
            n = min(len(tokens), len(ids) - 1)
            if n <= best:
                continue
            same = tokens[:n] == ids[:n]
            k = n if bool(same.all()) else int(torch.argmin(same.int()))
            if k > best:
                best, best_key = k, key
        if best < MIN_PREFIX or best_key is None:
            return 0, None
        entry = self._entries.pop(best_key)
        self._entries[best_key] = entry  # most recently used
        self.hits += 1
        self.reused_tokens += best
        return best, [(k[:, :best], v[:, :best]) for k, v in entry[1]]

    def store(self, ids: Any, kv: list[tuple[Any, Any]]) -> None:
        size = sum(k.numel() * k.element_size() * 2 for k, _ in kv)
        if size > self.max_bytes or len(ids) < MIN_PREFIX:
            return
        for key, (tokens, _, nbytes) in list(self._entries.items()):
            # A stored sequence that the new one extends adds nothing: drop it.
            if len(tokens) <= len(ids) and bool((tokens == ids[: len(tokens)]).all()):
                del self._entries[key]
                self.bytes -= nbytes
        while self._entries and self.bytes + size > self.max_bytes:
            _, _, nbytes = self._entries.pop(next(iter(self._entries)))  # least recently used
            self.bytes -= nbytes
        self._entries[self._next] = (ids, kv, size)
        self._next += 1
        self.bytes += size
