"""In-process chat with a transformers causal LM (the embedded default and tests).

Concurrent callers are served by ONE worker thread that collects the requests arriving within
``batch_wait_ms`` (up to ``max_batch_size``) into a single left-padded batch and decodes it with a
KV cache. The decoding loop is our own rather than ``model.generate`` because each row needs its
own sampling settings, its own stop strings and max_tokens, and the exact per-token logprob of
the model's raw distribution (what vLLM reports by default and what GRPO needs), without keeping
``steps x vocab`` logits in memory.

With ``prefix_cache_mb`` > 0 (models loaded from a folder only: a model passed in may change
under us), the worker keeps the KV of recent prompts and replies and starts a new prompt after
its longest common prefix with any of them, as vLLM's automatic prefix caching does: an agent's
fixed system prompt and its earlier turns are not computed again. Rows with different cached
lengths are left-padded in the past and in the new part alike; positions count real tokens, so
the logits are those of a full prefill up to float rounding. The same cache keeps the replies of
greedy text requests (temperature 0, at most ``MAX_REPLIES``): a request whose prompt ids and
settings repeat one already answered gets that reply without decoding, the reply a deterministic
engine would compute again (``mia eval``'s ``mia`` questions without a plan repeat ``none``'s
requests exactly, turn by turn). Loading weights in place (:meth:`LocalChat.exclusive`) empties
the cache.

With ``repeat_stop`` > 0 a reply ends (finish reason ``length``: cut, not finished) once its last
``repeat_stop`` tokens are one short n-gram repeated (period <= a quarter of the window): a small
model that starts "album album album ..." would otherwise hold its whole batch to ``max_tokens``.

Sampling is per request: temperature 0 is greedy; otherwise temperature + top-p with a private
``torch.Generator`` seeded from ``params.seed`` (so a seeded request gives the same reply whether
it ran alone or in a batch). ``presence_penalty`` works as in vLLM (subtracted once from every
token already generated). Chat messages are text only (image parts are refused with a clear
error); id-level requests may carry Qwen2.5-VL vision inputs (``pixel_values``,
``image_grid_thw``) for prompts whose image pads are already expanded.

On a CPU, text models that use ``sdpa`` attention decode with :mod:`mia.llm.decode_attention`
(grouped-query attention over the cache in place; 1.7x faster steps at 1,000 cached tokens).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import queue
import random
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mia import precision
from mia.llm.base import ChatResult, LLMError, Message, SamplingParams
from mia.llm.decode_attention import use_for_decode
from mia.llm.think import strip_think as _strip_think

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

log = logging.getLogger("mia.llm.local")

_DTYPES = ("float32", "bfloat16", "float16", "auto")


@dataclass
class _Request:
    prompt_ids: list[int]
    params: SamplingParams
    future: concurrent.futures.Future[_Output] = field(default_factory=concurrent.futures.Future)
    # Qwen2.5-VL: {"pixel_values": [patches, dim], "image_grid_thw": [images, 3]} for this row.
    multimodal: dict[str, Any] | None = None


@dataclass
class _Output:
    text: str
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str


MIN_PREFIX = 16  # shorter common prefixes are computed again: not worth a cache copy
MAX_REPLIES = 4096  # greedy replies kept (token ids and logprobs: a few MiB at most)


def reply_key(req: _Request) -> tuple[Any, ...] | None:
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
        self._replies: dict[tuple[Any, ...], _Output] = {}  # LRU order
        self.reply_hits = 0  # requests answered from a stored reply

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        self._entries.clear()
        self._replies.clear()
        self.bytes = 0

    def reply(self, key: tuple[Any, ...] | None) -> _Output | None:
        """The stored reply for ``key`` (a copy: callers may keep it), or None."""
        out = self._replies.pop(key, None) if key is not None else None
        if out is None:
            return None
        self._replies[key] = out  # most recently used
        self.reply_hits += 1
        return replace(out, token_ids=list(out.token_ids), logprobs=list(out.logprobs))

    def store_reply(self, key: tuple[Any, ...] | None, out: _Output) -> None:
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


class _Engine:
    """The loaded model + tokenizer and the batching worker; shared by every role view."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        name: str,
        device: str,
        max_batch_size: int,
        batch_wait_ms: float,
        prefix_cache_mb: float = 0.0,
        repeat_stop: int = 0,
    ) -> None:
        import torch

        if max_batch_size < 1:
            raise LLMError(f"local backend: max_batch_size must be >= 1, got {max_batch_size}")
        self.name = name
        self.model = model.to(device)
        # One-token steps read the KV cache in place instead of sdpa's per-head copies (a model
        # passed in keeps sdpa for everything else: its training forward is unchanged).
        self.decode_attention = use_for_decode(self.model, device)
        self.tokenizer = tokenizer
        self.device = torch.device(device)
        self.max_batch_size = max_batch_size
        self.batch_wait = max(0.0, batch_wait_ms) / 1000.0
        self.eos_ids = _eos_ids(model, tokenizer)
        pad = tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else min(self.eos_ids, default=0))
        self.max_positions = int(
            getattr(model.config.get_text_config(), "max_position_embeddings", 0) or 0
        )
        # Rust tokenizers raise "Already borrowed" when used from two threads at once.
        self.tok_lock = threading.Lock()
        # Held while a batch decodes; hold it to change the weights in place between batches.
        self.busy = threading.Lock()
        self._queue: queue.Queue[_Request | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._thread_lock = threading.Lock()
        self.batches = 0
        self.requests = 0
        self.max_batch_seen = 0
        self.prompt_tokens = 0
        self.prefix = PrefixCache(int(prefix_cache_mb * 2**20)) if prefix_cache_mb > 0 else None
        if repeat_stop < 0 or 0 < repeat_stop < 4:
            raise LLMError(f"local backend: repeat_stop must be 0 or >= 4, got {repeat_stop}")
        self.repeat_stop = repeat_stop
        self.repeat_stops = 0

    # ---- prompt side (caller's thread) ----
    def encode_chat(self, messages: list[Message], template_kwargs: dict[str, Any]) -> list[int]:
        flat = [_flatten(m, self.name) for m in messages]
        with self.tok_lock:
            try:
                text = self.tokenizer.apply_chat_template(
                    flat, tokenize=False, add_generation_prompt=True, **template_kwargs
                )
            except Exception as err:  # jinja errors: bad roles, missing template
                raise LLMError(f"local model {self.name}: chat template failed: {err}") from err
            ids = self.tokenizer.encode(text, add_special_tokens=False)
        return list(ids)

    def submit(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        multimodal: dict[str, Any] | None = None,
    ) -> _Request:
        if not prompt_ids:
            raise LLMError(f"local model {self.name}: empty prompt")
        if self.max_positions and len(prompt_ids) >= self.max_positions:
            raise LLMError(
                f"local model {self.name}: prompt of {len(prompt_ids)} tokens does not fit the "
                f"model's {self.max_positions}-token context"
            )
        if params.max_tokens < 1:
            raise LLMError(f"local model {self.name}: max_tokens must be >= 1")
        if params.temperature < 0 or not 0 < params.top_p <= 1:
            raise LLMError(
                f"local model {self.name}: need temperature >= 0 and 0 < top_p <= 1, got "
                f"{params.temperature}, {params.top_p}"
            )
        if multimodal:
            multimodal = self._check_multimodal(prompt_ids, multimodal)
        req = _Request(prompt_ids=prompt_ids, params=params, multimodal=multimodal or None)
        self._ensure_worker()
        self._queue.put(req)
        return req

    def _check_multimodal(self, prompt_ids: list[int], mm: dict[str, Any]) -> dict[str, Any]:
        import torch

        # "images" (the PIL images, for engines that run their own processor) is not needed.
        unknown = sorted(set(mm) - {"pixel_values", "image_grid_thw", "images"})
        if unknown:
            raise LLMError(f"local model {self.name}: unknown multimodal inputs {unknown}")
        cfg = self.model.config
        image_id = getattr(cfg, "image_token_id", None)
        if image_id is None or not hasattr(getattr(self.model, "model", None), "get_rope_index"):
            raise LLMError(f"local model {self.name}: this model takes no image inputs")
        if mm.get("pixel_values") is None or mm.get("image_grid_thw") is None:
            raise LLMError(f"local model {self.name}: images need pixel_values and image_grid_thw")
        grid = torch.as_tensor(mm["image_grid_thw"], dtype=torch.long).reshape(-1, 3)
        merge = int(cfg.vision_config.spatial_merge_size)
        want = int((grid.prod(-1) // (merge * merge)).sum())
        have = sum(1 for t in prompt_ids if t == image_id)
        if want != have:
            raise LLMError(
                f"local model {self.name}: the prompt has {have} image pad tokens but "
                f"image_grid_thw needs {want} (expand the pads before generating)"
            )
        return {"pixel_values": torch.as_tensor(mm["pixel_values"]), "image_grid_thw": grid}

    def _ensure_worker(self) -> None:
        with self._thread_lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name=f"mia-local-llm-{self.name}", daemon=True
                )
                self._thread.start()

    def close(self) -> None:
        with self._thread_lock:
            thread, self._thread = self._thread, None
        if thread is not None and thread.is_alive():
            self._queue.put(None)
            thread.join(timeout=60)

    # ---- worker thread ----
    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch = [first]
            closing = False
            deadline = time.monotonic() + self.batch_wait
            while len(batch) < self.max_batch_size:
                remaining = deadline - time.monotonic()
                try:
                    # Past the deadline, requests already queued still join this batch.
                    item = (
                        self._queue.get(timeout=remaining)
                        if remaining > 0
                        else self._queue.get_nowait()
                    )
                except queue.Empty:
                    break
                if item is None:
                    closing = True
                    break
                batch.append(item)
            self._serve(batch)
            if closing:
                return

    def _serve(self, batch: list[_Request]) -> None:
        live = [r for r in batch if r.future.set_running_or_notify_cancel()]
        if self.prefix is not None:  # greedy requests answered before: their stored replies
            keys = [reply_key(r) for r in live]
            stored = [self.prefix.reply(k) for k in keys]
            for r, out in zip(live, stored, strict=True):
                if out is not None:
                    r.future.set_result(out)
            live = [r for r, out in zip(live, stored, strict=True) if out is None]
        if not live:
            return
        self.batches += 1
        self.requests += len(live)
        self.max_batch_seen = max(self.max_batch_seen, len(live))
        try:
            with self.busy:
                outputs = self._generate(live)
        except Exception as err:  # one bad batch must not kill the worker
            log.exception("local model %s: batch of %d failed", self.name, len(live))
            error = LLMError(f"local model {self.name}: generation failed: {err}")
            for r in live:
                r.future.set_exception(error)
            return
        for r, out in zip(live, outputs, strict=True):
            if self.prefix is not None:
                self.prefix.store_reply(reply_key(r), out)
            r.future.set_result(out)

    def _generate(self, reqs: list[_Request]) -> list[_Output]:
        import torch

        with torch.inference_mode():
            return self._decode(reqs, torch)

    def _decode(self, reqs: list[_Request], torch: Any) -> list[_Output]:
        n = len(reqs)
        dev = self.device
        prompts = [torch.tensor(r.prompt_ids, dtype=torch.long) for r in reqs]
        self.prompt_tokens += sum(len(p) for p in prompts)
        # Cached prefixes (text rows only): row i computes only its last len - past[i] tokens.
        prefix = None if any(r.multimodal for r in reqs) else self.prefix
        found = [prefix.lookup(p, torch) for p in prompts] if prefix is not None else []
        past = [k for k, _ in found] or [0] * n
        width_past = max(past)
        width = max(len(p) - k for p, k in zip(prompts, past, strict=True))
        input_ids = torch.full((n, width), self.pad_id, dtype=torch.long, device=dev)
        attn = torch.zeros((n, width_past + width), dtype=torch.long, device=dev)
        pos = torch.zeros((n, width), dtype=torch.long, device=dev)
        budgets: list[int] = []
        for i, r in enumerate(reqs):
            new = prompts[i][past[i] :]
            input_ids[i, width - len(new) :] = new
            attn[i, width_past - past[i] : width_past] = 1
            attn[i, width_past + width - len(new) :] = 1
            # Left padding: positions count real tokens only, so a padded row sees the same
            # positions (and therefore the same logits) as when it runs alone.
            pos[i, width - len(new) :] = torch.arange(past[i], len(prompts[i]))
            room = (
                self.max_positions - len(prompts[i]) if self.max_positions else r.params.max_tokens
            )
            budgets.append(max(1, min(r.params.max_tokens, room)))
        cache = self._past_cache(found, width_past, torch) if width_past else None
        vision, pos = self._vision_prefill(reqs, input_ids, attn[:, width_past:], pos, torch)
        gens: list[torch.Generator | None] = []
        for r in reqs:
            if r.params.temperature > 0:
                seed = r.params.seed if r.params.seed is not None else random.getrandbits(63)
                gens.append(torch.Generator(device=dev).manual_seed(int(seed)))
            else:
                gens.append(None)
        penalties = torch.tensor([r.params.presence_penalty for r in reqs], device=dev)
        seen = None

        out = self.model(
            input_ids=input_ids, attention_mask=attn, position_ids=pos, past_key_values=cache,
            use_cache=True, logits_to_keep=1, **vision,
        )  # fmt: skip
        cache = out.past_key_values
        logits = out.logits[:, -1, :].float()
        if bool((penalties != 0).any()):
            seen = torch.zeros_like(logits, dtype=torch.bool)

        tokens: list[list[int]] = [[] for _ in reqs]
        lps: list[list[float]] = [[] for _ in reqs]
        finish: list[str | None] = [None] * n
        texts_len = [0] * n
        for _step in range(max(budgets)):
            logp = torch.log_softmax(logits, dim=-1)
            scores = logits if seen is None else logits - penalties[:, None] * seen
            nxt = torch.argmax(scores, dim=-1)
            for i, r in enumerate(reqs):
                if gens[i] is not None and finish[i] is None:
                    nxt[i] = _sample(scores[i], r.params, gens[i], torch)
            for i, r in enumerate(reqs):
                if finish[i] is not None:
                    nxt[i] = self.pad_id
                    continue
                tok = int(nxt[i])
                tokens[i].append(tok)
                lps[i].append(float(logp[i, tok]))
                if seen is not None:
                    seen[i, tok] = True
                stopped = bool(r.params.stop) and self._hit_stop(
                    tokens[i], r.params.stop or [], texts_len, i
                )
                if tok in self.eos_ids or stopped:
                    finish[i] = "stop"
                elif len(tokens[i]) >= budgets[i]:
                    finish[i] = "length"
                elif self.repeat_stop and repeats(tokens[i], self.repeat_stop):
                    finish[i] = "length"
                    self.repeat_stops += 1
            if all(f is not None for f in finish):
                break
            attn = torch.cat([attn, attn.new_ones((n, 1))], dim=-1)
            pos = pos[..., -1:] + 1  # [B, 1], or [4, B, 1] with vision positions
            out = self.model(
                input_ids=nxt[:, None], attention_mask=attn, position_ids=pos,
                past_key_values=cache, use_cache=True,
            )  # fmt: skip
            cache = out.past_key_values
            logits = out.logits[:, -1, :].float()

        if prefix is not None:
            try:
                self._store_prefixes(prompts, past, tokens, cache, width_past, width, torch)
            except Exception:  # the replies are done: a cache failure must not fail them
                log.exception("local model %s: prefix cache store failed; cache emptied", self.name)
                prefix.clear()
        results = []
        for i, r in enumerate(reqs):
            ids = tokens[i]
            body = ids[:-1] if ids and ids[-1] in self.eos_ids else ids
            with self.tok_lock:
                text = self.tokenizer.decode(body, skip_special_tokens=True)
            if r.params.stop:
                cut = _first_stop(text, r.params.stop)
                if cut is not None:
                    text = text[:cut]
                    finish[i] = "stop"
            results.append(
                _Output(
                    text=text, token_ids=ids, logprobs=lps[i], finish_reason=finish[i] or "length"
                )
            )
        return results

    def _past_cache(
        self, found: list[tuple[int, list[tuple[Any, Any]] | None]], width: int, torch: Any
    ) -> Any:
        """One batch cache from the rows' cached prefixes, each left-padded to ``width``."""
        from transformers import DynamicCache

        ref = next(kv for _, kv in found if kv is not None)
        layers = []
        for layer, (k0, v0) in enumerate(ref):
            heads, _, dim = k0.shape
            keys = k0.new_zeros((len(found), heads, width, dim))
            values = v0.new_zeros((len(found), heads, width, dim))
            for i, (n, kv) in enumerate(found):
                if kv is not None:
                    keys[i, :, width - n :] = kv[layer][0]
                    values[i, :, width - n :] = kv[layer][1]
            layers.append((keys, values))
        return DynamicCache(ddp_cache_data=layers, config=self.model.config)

    def _store_prefixes(
        self,
        prompts: list[Any],
        past: list[int],
        tokens: list[list[int]],
        cache: Any,
        width_past: int,
        width: int,
        torch: Any,
    ) -> None:
        """Keep each row's prompt + reply KV (the last sampled token was never fed). The cache's
        columns: ``width_past`` of cached past, ``width`` of new prompt, then the decoded steps."""
        assert self.prefix is not None
        prefill_width = width_past + width
        for i, prompt in enumerate(prompts):
            fed = max(0, len(tokens[i]) - 1)
            cols = torch.cat(
                [
                    torch.arange(width_past - past[i], width_past),
                    torch.arange(prefill_width - (len(prompt) - past[i]), prefill_width + fed),
                ]
            )
            kv = [
                (layer.keys[i, :, cols], layer.values[i, :, cols])  # indexing copies
                for layer in cache.layers
            ]
            ids = torch.cat([prompt, torch.tensor(tokens[i][:fed], dtype=torch.long)])
            self.prefix.store(ids, kv)

    def _vision_prefill(
        self, reqs: list[_Request], input_ids: Any, attn: Any, pos: Any, torch: Any
    ) -> tuple[dict[str, Any], Any]:
        """Qwen2.5-VL prefill inputs: every row's pixel values concatenated in row order (the
        order the model fills image pads in) and [4, B, L] positions (text row, then the 3-D
        rotary t/h/w rows), computed as the trainer's forward pass computes them."""
        rows = [r.multimodal for r in reqs if r.multimodal]
        if not rows:
            return {}, pos
        dtype = next(self.model.parameters()).dtype
        pixels = torch.cat([m["pixel_values"] for m in rows]).to(self.device, dtype)
        grid = torch.cat([m["image_grid_thw"] for m in rows]).to(self.device)
        kinds = torch.zeros_like(input_ids, dtype=torch.int)
        kinds[input_ids == self.model.config.image_token_id] = 1
        rope, _ = self.model.model.get_rope_index(
            input_ids, mm_token_type_ids=kinds, image_grid_thw=grid, attention_mask=attn
        )
        positions = torch.cat([pos[None], rope.to(pos)])
        return {"pixel_values": pixels, "image_grid_thw": grid}, positions

    def _hit_stop(self, ids: list[int], stops: list[str], seen_len: list[int], i: int) -> bool:
        with self.tok_lock:
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
        # Earlier text held no stop string, so a new one must end in the part added this step;
        # the margin covers multi-byte characters completed by the new token.
        start = max(0, seen_len[i] - max(len(s) for s in stops) - 4)
        seen_len[i] = len(text)
        return any(s and text.find(s, start) != -1 for s in stops)


def repeats(ids: list[int], window: int) -> bool:
    """True when the last ``window`` ids are one n-gram repeated, period <= window // 4
    (at least four repetitions): ``repeats([5, 7] * 8, 16)`` is True, a sentence is not."""
    if len(ids) < window:
        return False
    tail = ids[-window:]
    return any(
        all(tail[j] == tail[j - p] for j in range(p, window)) for p in range(1, window // 4 + 1)
    )


def _sample(scores: torch.Tensor, p: SamplingParams, gen: torch.Generator, torch: Any) -> int:
    probs = torch.softmax(scores / p.temperature, dim=-1)
    if p.top_p < 1.0:
        sorted_p, order = torch.sort(probs, descending=True)
        # Keep the smallest prefix whose mass reaches top_p (always at least the top token).
        keep = (sorted_p.cumsum(-1) - sorted_p) < p.top_p
        sorted_p = sorted_p * keep
        choice = torch.multinomial(sorted_p / sorted_p.sum(), 1, generator=gen)
        return int(order[choice])
    return int(torch.multinomial(probs, 1, generator=gen))


def _first_stop(text: str, stops: list[str]) -> int | None:
    hits = [text.find(s) for s in stops if s and s in text]
    return min(hits) if hits else None


def _flatten(message: Message, name: str) -> Message:
    """Text-only copy of a message: content parts joined; images refused."""
    content = message.get("content")
    if isinstance(content, list):
        texts = []
        for part in content:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "text":
                texts.append(str(part.get("text", "")))
            else:
                raise LLMError(
                    f"local model {name}: only text content is supported, got a {kind!r} part"
                )
        return {**message, "content": "".join(texts)}
    return message


def _eos_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> set[int]:
    return eos_token_ids(getattr(model, "generation_config", None), tokenizer)


def eos_token_ids(generation_config: Any, tokenizer: PreTrainedTokenizerBase) -> set[int]:
    """The ids that end a reply: generation config eos, tokenizer eos, ChatML ``<|im_end|>``.

    Public so other engines (vLLM) stop on exactly the tokens this one stops on.
    """
    ids: set[int] = set()
    gen_eos = getattr(generation_config, "eos_token_id", None)
    for value in (gen_eos, tokenizer.eos_token_id):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list | tuple):
            ids.update(int(v) for v in value)
    # ChatML models end an assistant turn with <|im_end|> even when eos says otherwise.
    template = getattr(tokenizer, "chat_template", None) or ""
    if "<|im_end|>" in str(template):
        im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        if isinstance(im_end, int) and im_end != tokenizer.unk_token_id:
            ids.add(im_end)
    return ids


def _load(path: str | Path, device: str, dtype: str) -> tuple[Any, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if dtype not in _DTYPES:
        raise LLMError(f"local backend: dtype must be one of {_DTYPES}, got {dtype!r}")
    path = Path(path)
    if not (path / "config.json").is_file():
        raise LLMError(f"local backend: {path} is not a model folder (no config.json)")
    torch_dtype = getattr(torch, precision.compute_dtype(dtype, device))
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    if (path / "preprocessor_config.json").is_file():  # Qwen2.5-VL: image-text-to-text
        from mia.models.hf import load_hf_model

        model = load_hf_model(path, dtype=torch_dtype)
    else:
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch_dtype)
    return model, tokenizer


class LocalChat:
    """Chat with a local model: ``LocalChat(model_path)`` or ``LocalChat(model=m, tokenizer=t)``.

    A model passed in is used as is (same object, current weights, its own train/eval mode), so
    a trainer can generate with the policy it is updating; call ``model.eval()`` for
    deterministic replies from a model with dropout.

    ``stats`` counts batches and requests (how well concurrent calls were batched).
    ``with_options`` makes a view that shares the loaded model but has its own name, sampling
    defaults, chat-template kwargs and think stripping (one model serving several roles).
    """

    def __init__(
        self,
        model_path: str | Path | None = None,
        *,
        model: PreTrainedModel | None = None,
        tokenizer: PreTrainedTokenizerBase | None = None,
        device: str = "cpu",
        dtype: str = "auto",
        max_batch_size: int = 8,
        batch_wait_ms: float = 5.0,
        prefix_cache_mb: float = 0.0,
        repeat_stop: int = 0,
        chat_template_kwargs: dict[str, Any] | None = None,
        strip_think: bool = False,
        defaults: SamplingParams | None = None,
        name: str | None = None,
    ) -> None:
        if (model_path is None) == (model is None):
            raise LLMError("local backend: give either model_path or model (with tokenizer)")
        if model_path is not None:
            model, tokenizer = _load(model_path, device, dtype)
            model.eval()  # a model passed in keeps its mode: it may be a policy being trained
        elif tokenizer is None:
            raise LLMError("local backend: a model needs its tokenizer")
        assert model is not None and tokenizer is not None
        if not getattr(tokenizer, "chat_template", None):
            raise LLMError("local backend: the tokenizer has no chat template")
        self.name = name or f"local:{Path(str(model_path)).name if model_path else 'model'}"
        self._engine = _Engine(
            model,
            tokenizer,
            name=self.name,
            device=device,
            max_batch_size=max_batch_size,
            batch_wait_ms=batch_wait_ms,
            # A model passed in may be trained under us: its cached prefixes would go stale.
            prefix_cache_mb=prefix_cache_mb if model_path is not None else 0.0,
            repeat_stop=repeat_stop,
        )
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.strip_think = strip_think
        self.defaults = defaults or SamplingParams()

    @property
    def model(self) -> PreTrainedModel:
        return self._engine.model

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        return self._engine.tokenizer

    @property
    def stats(self) -> dict[str, int]:
        e = self._engine
        out = {"batches": e.batches, "requests": e.requests, "max_batch": e.max_batch_seen}
        out["prompt_tokens"] = e.prompt_tokens
        if e.repeat_stop:
            out["repeat_stops"] = e.repeat_stops  # replies cut for repeating themselves
        if e.prefix is not None:
            out["prefix_hits"] = e.prefix.hits
            out["prefix_tokens"] = e.prefix.reused_tokens  # prompt tokens not computed again
            out["reply_hits"] = e.prefix.reply_hits  # greedy requests answered from the cache
        return out

    def with_options(
        self,
        *,
        name: str | None = None,
        defaults: SamplingParams | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        strip_think: bool | None = None,
    ) -> LocalChat:
        view = object.__new__(LocalChat)
        view._engine = self._engine
        view.name = name or self.name
        view.defaults = defaults or self.defaults
        view.chat_template_kwargs = dict(
            self.chat_template_kwargs if chat_template_kwargs is None else chat_template_kwargs
        )
        view.strip_think = self.strip_think if strip_think is None else strip_think
        return view

    def encode_chat(self, messages: list[Message]) -> list[int]:
        """The prompt token ids this backend would feed the model for ``messages``."""
        return self._engine.encode_chat(messages, self.chat_template_kwargs)

    async def chat(
        self, messages: list[Message], params: SamplingParams | None = None
    ) -> ChatResult:
        p = replace(params or self.defaults)
        if p.stop:
            p.stop = [s for s in p.stop if s]
        prompt_ids = self.encode_chat(messages)
        req = self._engine.submit(prompt_ids, p)
        out = await asyncio.wrap_future(req.future)
        text = out.text
        extra: dict[str, Any] = {"prompt_token_ids": prompt_ids}
        if self.strip_think:
            extra["raw_text"] = text
            text = _strip_think(text)
        return ChatResult(
            text=text,
            finish_reason=out.finish_reason,
            prompt_tokens=len(prompt_ids),
            completion_tokens=len(out.token_ids),
            token_ids=out.token_ids,
            logprobs=out.logprobs,
            extra=extra,
        )

    # ---- id-level generation (token-in/token-out rollouts, mia.agent.TokenPolicy)
    @property
    def tokenizer_lock(self) -> threading.Lock:
        """Hold this while using :attr:`tokenizer` from another thread: the batching worker
        decodes with it, and Rust tokenizers fail when two threads use one at once."""
        return self._engine.tok_lock

    @property
    def max_context(self) -> int | None:
        """The model's context length in tokens (None when the config does not say)."""
        return self._engine.max_positions or None

    async def generate_ids(
        self,
        prompt_ids: list[int],
        params: SamplingParams | None = None,
        multimodal: dict[str, Any] | None = None,
    ) -> ChatResult:
        """Continue ``prompt_ids`` exactly (no chat template, no re-tokenisation).

        ``token_ids``/``logprobs`` are every sampled token (a final eos included; tokens of a
        stop string included); ``text`` is their decoding cut at the first stop string.
        ``multimodal`` (Qwen2.5-VL): ``pixel_values`` and ``image_grid_thw`` of the images whose
        (already expanded) pads are in ``prompt_ids``.
        """
        p = replace(params or self.defaults)
        if p.stop:
            p.stop = [s for s in p.stop if s]
        ids = [int(t) for t in prompt_ids]
        req = self._engine.submit(ids, p, multimodal)
        out = await asyncio.wrap_future(req.future)
        return ChatResult(
            text=out.text,
            finish_reason=out.finish_reason,
            prompt_tokens=len(ids),
            completion_tokens=len(out.token_ids),
            token_ids=out.token_ids,
            logprobs=out.logprobs,
            extra={"prompt_token_ids": ids},
        )

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """Hold the model while no batch decodes (e.g. to load new weights in place); the next
        batch waits until the block ends."""
        with self._engine.busy:
            try:
                yield
            finally:
                if self._engine.prefix is not None:  # cached KV belongs to the old weights
                    self._engine.prefix.clear()

    async def aclose(self) -> None:
        # The worker restarts on the next call, so closing one role's view is harmless to others.
        await asyncio.to_thread(self._engine.close)
