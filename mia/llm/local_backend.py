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

Sampling is per request: temperature 0 is greedy; otherwise temperature + top-p, drawn for the
whole batch at once by inverse CDF from uniforms each request draws up front from a private
``torch.Generator`` seeded from ``params.seed`` (so a seeded request gives the same reply whether
it ran alone or in a batch). ``presence_penalty`` works as in vLLM (subtracted once from every
token already generated). A vision model never samples its image/video pad tokens (they stand
for pixel features; logprobs stay those of the raw distribution). Chat messages are text only (image parts are refused with a clear
error); id-level requests may carry Qwen2.5-VL vision inputs (``pixel_values``,
``image_grid_thw``) for prompts whose image pads are already expanded.

On a CPU, text models that use ``sdpa`` attention decode with :mod:`mia.llm.decode_attention`
(grouped-query attention over the cache in place; 1.7x faster steps at 1,000 cached tokens).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mia import precision
from mia.llm.base import ChatResult, LLMError, Message, SamplingParams
from mia.llm.local_cache import (  # noqa: F401  (re-exported: importers of this module use them)
    MAX_REPLIES,
    MIN_PREFIX,
    PrefixCache,
    reply_key,
)
from mia.llm.local_engine import Engine, eos_token_ids, repeats  # noqa: F401  (as above)
from mia.llm.think import strip_think as _strip_think

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

_DTYPES = ("float32", "bfloat16", "float16", "auto")


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
        self._engine = Engine(
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
