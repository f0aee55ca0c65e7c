"""The local backend's batching engine (:mod:`mia.llm.local_backend`, whose docstring says how
it batches, caches and samples): one worker thread that collects concurrent requests into a
left-padded batch and decodes it with a KV cache, token by token; each step samples every row
in a few batched ops (:class:`_Picker`), the Python left per row is the bookkeeping on ints.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mia.llm.base import LLMError, Message, SamplingParams
from mia.llm.decode_attention import use_for_decode
from mia.llm.local_cache import Output, PrefixCache, Request, reply_key

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

log = logging.getLogger("mia.llm.local")


@dataclass
class _Layout:
    """A batch's prefill inputs (``[B, width]`` ids and positions, ``[B, width_past + width]``
    mask), each row's cached tokens (``past``) and its token budget."""

    input_ids: Any
    attn: Any
    pos: Any
    past: list[int]
    width_past: int
    width: int
    budgets: list[int]


@dataclass
class _Rows:
    """Each row's decoding so far: sampled ids, their logprobs, its finish reason (None while
    it runs) and the length of its decoded text (where the next stop-string search starts)."""

    n: int
    tokens: list[list[int]] = field(init=False)
    lps: list[list[float]] = field(init=False)
    finish: list[str | None] = field(init=False)
    texts_len: list[int] = field(init=False)

    def __post_init__(self) -> None:
        self.tokens = [[] for _ in range(self.n)]
        self.lps = [[] for _ in range(self.n)]
        self.finish = [None] * self.n
        self.texts_len = [0] * self.n


class Engine:
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
        # A vision model's image/video pads stand for pixel features: a sampled one could be
        # neither fed back (the next prompt's pads must match its images) nor trained on (the
        # forward pass would give it vision features and positions), so they are never drawn
        # (TRL's GRPOTrainer suppresses the image token for the same reason).
        pads = (getattr(model.config, k, None) for k in ("image_token_id", "video_token_id"))
        self.placeholder_ids = sorted({int(t) for t in pads if t is not None})
        # Rust tokenizers raise "Already borrowed" when used from two threads at once.
        self.tok_lock = threading.Lock()
        # Held while a batch decodes; hold it to change the weights in place between batches.
        self.busy = threading.Lock()
        self._queue: queue.Queue[Request | None] = queue.Queue()
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
    ) -> Request:
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
        req = Request(prompt_ids=prompt_ids, params=params, multimodal=multimodal or None)
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

    def _serve(self, batch: list[Request]) -> None:
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

    def _generate(self, reqs: list[Request]) -> list[Output]:
        import torch

        with torch.inference_mode():
            return self._decode(reqs, torch)

    def _decode(self, reqs: list[Request], torch: Any) -> list[Output]:
        prompts = [torch.tensor(r.prompt_ids, dtype=torch.long) for r in reqs]
        self.prompt_tokens += sum(len(p) for p in prompts)
        # Cached prefixes (text rows only): row i computes only its last len - past[i] tokens.
        prefix = None if any(r.multimodal for r in reqs) else self.prefix
        found = [prefix.lookup(p, torch) for p in prompts] if prefix is not None else []
        batch = self._layout(reqs, prompts, [k for k, _ in found], torch)
        cache = self._past_cache(found, batch.width_past, torch) if batch.width_past else None
        vision, pos = self._vision_prefill(
            reqs, batch.input_ids, batch.attn[:, batch.width_past :], batch.pos, torch
        )
        rows, cache = self._steps(reqs, batch, cache, vision, pos, torch)
        if prefix is not None:
            try:
                self._store_prefixes(
                    prompts, batch.past, rows.tokens, cache, batch.width_past, batch.width, torch
                )
            except Exception:  # the replies are done: a cache failure must not fail them
                log.exception("local model %s: prefix cache store failed; cache emptied", self.name)
                prefix.clear()
        return self._outputs(reqs, rows)

    def _layout(
        self, reqs: list[Request], prompts: list[Any], cached: list[int], torch: Any
    ) -> _Layout:
        """The prefill inputs: each row's uncached tokens left-padded to one width, after its
        cached past (``cached``: tokens per row, [] for none) left-padded to another."""
        n = len(reqs)
        dev = self.device
        past = cached or [0] * n
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
        return _Layout(input_ids, attn, pos, past, width_past, width, budgets)

    def _uniforms(self, reqs: list[Request], budgets: list[int], torch: Any) -> Any:
        """``[B, max budget]`` float64 uniforms, row i's drawn in one call from a private
        generator seeded from its ``params.seed`` (or at random); rows that decode greedily get
        zeros. A row's t-th token is drawn with its t-th uniform (inverse CDF, :func:`_pick`),
        so a seeded request samples the same tokens alone or batched."""
        u = torch.zeros((len(reqs), max(budgets)), dtype=torch.float64, device=self.device)
        for i, r in enumerate(reqs):
            if r.params.temperature > 0:
                seed = r.params.seed if r.params.seed is not None else random.getrandbits(63)
                gen = torch.Generator(device=self.device).manual_seed(int(seed))
                u[i, : budgets[i]] = torch.rand(
                    budgets[i], generator=gen, dtype=torch.float64, device=self.device
                )
        return u

    def _steps(
        self,
        reqs: list[Request],
        batch: _Layout,
        cache: Any,
        vision: dict[str, Any],
        pos: Any,
        torch: Any,
    ) -> tuple[_Rows, Any]:
        """The prefill, then one token per live row per step until every row has finished;
        the rows' tokens and the KV cache at the end. Sampling is batched (:func:`_pick`); the
        per-row work left in Python is the bookkeeping of :meth:`_take` on plain ints."""
        n = len(reqs)
        attn = batch.attn
        dev = self.device
        penalties = torch.tensor([r.params.presence_penalty for r in reqs], device=dev)
        sampled = [i for i, r in enumerate(reqs) if r.params.temperature > 0]
        picker = _Picker(reqs, sampled, self._uniforms(reqs, batch.budgets, torch), torch)
        seen = None

        out = self.model(
            input_ids=batch.input_ids, attention_mask=attn, position_ids=pos,
            past_key_values=cache, use_cache=True, logits_to_keep=1, **vision,
        )  # fmt: skip
        cache = out.past_key_values
        logits = out.logits[:, -1, :].float()
        if bool((penalties != 0).any()):
            seen = torch.zeros_like(logits, dtype=torch.bool)

        banned = torch.tensor(self.placeholder_ids, dtype=torch.long, device=dev)
        rows = _Rows(n)
        for step in range(max(batch.budgets)):
            logp = torch.log_softmax(logits, dim=-1)
            scores = logits if seen is None else logits - penalties[:, None] * seen
            if banned.numel():
                scores = scores.index_fill(-1, banned, -torch.inf)
            nxt = picker.pick(scores, step)
            chosen = logp.gather(-1, nxt[:, None]).squeeze(-1)
            self._take(reqs, rows, nxt, chosen, seen, batch.budgets)
            if all(f is not None for f in rows.finish):
                break
            attn = torch.cat([attn, attn.new_ones((n, 1))], dim=-1)
            pos = pos[..., -1:] + 1  # [B, 1], or [4, B, 1] with vision positions
            out = self.model(
                input_ids=nxt[:, None], attention_mask=attn, position_ids=pos,
                past_key_values=cache, use_cache=True,
            )  # fmt: skip
            cache = out.past_key_values
            logits = out.logits[:, -1, :].float()
        return rows, cache

    def _take(
        self,
        reqs: list[Request],
        rows: _Rows,
        nxt: Any,
        chosen: Any,
        seen: Any,
        budgets: list[int],
    ) -> None:
        """Append each live row's chosen token and its logprob (``chosen``), and finish the rows
        that hit eos or a stop string (``stop``), their budget or a repeat (``length``); a
        finished row's next input is padding (``nxt`` is changed in place)."""
        toks = nxt.tolist()
        lps = chosen.tolist()
        done: list[int] = []
        for i, r in enumerate(reqs):
            if rows.finish[i] is not None:
                done.append(i)
                continue
            tok = toks[i]
            rows.tokens[i].append(tok)
            rows.lps[i].append(lps[i])
            if seen is not None:
                seen[i, tok] = True
            stopped = bool(r.params.stop) and self._hit_stop(
                rows.tokens[i], r.params.stop or [], rows.texts_len, i
            )
            if tok in self.eos_ids or stopped:
                rows.finish[i] = "stop"
            elif len(rows.tokens[i]) >= budgets[i]:
                rows.finish[i] = "length"
            elif self.repeat_stop and repeats(rows.tokens[i], self.repeat_stop):
                rows.finish[i] = "length"
                self.repeat_stops += 1
        if done:
            nxt[done] = self.pad_id

    def _outputs(self, reqs: list[Request], rows: _Rows) -> list[Output]:
        """Each row's reply: the text of its tokens (a final eos left out) cut at the first
        stop string, with every sampled token and its logprob."""
        results = []
        for i, r in enumerate(reqs):
            ids = rows.tokens[i]
            body = ids[:-1] if ids and ids[-1] in self.eos_ids else ids
            with self.tok_lock:
                text = self.tokenizer.decode(body, skip_special_tokens=True)
            if r.params.stop:
                cut = _first_stop(text, r.params.stop)
                if cut is not None:
                    text = text[:cut]
                    rows.finish[i] = "stop"
            results.append(
                Output(
                    text=text,
                    token_ids=ids,
                    logprobs=rows.lps[i],
                    finish_reason=rows.finish[i] or "length",
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
        self, reqs: list[Request], input_ids: Any, attn: Any, pos: Any, torch: Any
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


class _Picker:
    """The next token of every row at once: argmax for greedy rows; for sampling rows, the
    inverse CDF of softmax(scores / temperature) (top-p: of the smallest prefix of the sorted
    distribution whose mass reaches top_p, always at least the top token) at the row's
    pre-drawn uniform for this step. That is an exact draw from the same distribution the
    per-row ``torch.multinomial`` calls it replaced drew from, in a few batched ops."""

    def __init__(self, reqs: list[Request], sampled: list[int], uniforms: Any, torch: Any):
        self.torch = torch
        self.u = uniforms
        self.rows = torch.tensor(sampled, dtype=torch.long, device=uniforms.device)
        self.all_sampled = len(sampled) == len(reqs)
        dev = uniforms.device
        self.temps = torch.tensor([reqs[i].params.temperature for i in sampled], device=dev)
        top_p = [reqs[i].params.top_p for i in sampled]
        self.top_p = torch.tensor(top_p, device=dev) if any(p < 1.0 for p in top_p) else None

    def pick(self, scores: Any, step: int) -> Any:
        torch = self.torch
        nxt = torch.argmax(scores, dim=-1)
        if not self.rows.numel():
            return nxt
        z = scores if self.all_sampled else scores[self.rows]
        probs = torch.softmax(z / self.temps[:, None], dim=-1)
        order = None
        if self.top_p is not None:
            probs, order = torch.sort(probs, dim=-1, descending=True, stable=True)
            before = probs.cumsum(-1) - probs  # mass of the tokens ranked above each one
            keep = (before < self.top_p[:, None]) | (self.top_p[:, None] >= 1.0)
            probs = probs * keep
        cdf = probs.double().cumsum(-1)
        x = self.u[self.rows, step] * cdf[:, -1]
        idx = torch.searchsorted(cdf, x[:, None], right=True).clamp(max=probs.shape[-1] - 1)
        # Rounding at the very top of the CDF can land on a token of probability 0: take the
        # most likely token instead (a case of probability ~1e-16).
        zero = probs.gather(-1, idx) <= 0
        if bool(zero.any()):
            idx = torch.where(zero, probs.argmax(-1, keepdim=True), idx)
        if order is not None:
            idx = order.gather(-1, idx)
        if self.all_sampled:
            return idx.squeeze(-1)
        nxt[self.rows] = idx.squeeze(-1)
        return nxt


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
