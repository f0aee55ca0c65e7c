"""Grouped-query attention on a CPU for one-token decode steps and short half-precision passes.

transformers' ``sdpa`` attention repeats every key/value head for each query head it serves
(``repeat_kv``, a copy of the whole cache per layer per step) whenever an attention mask is given,
which is always the case for a left-padded batch; on a CPU the single-query step then goes through
the flash kernel, slow for one query. SmolLM2-135M (9 query heads, 3 KV heads), 8 rows with 1,000
cached tokens, one thread: 406 ms per step with ``sdpa``, of which the KV copies were a third and
the kernel another third; 243 ms with this function, the same greedy tokens, logits within 6e-5
(docs/llm.md, "Decode attention").

A decode step (one query token, eval mode) groups the query heads by the KV head they share and
does two batched matmuls over the cache as it is. So does a bf16/fp16 pass (a policy trained
under CPU autocast, ``mia.precision``) over at most ``SHORT_KEYS`` keys: there the CPU flash
kernel, its backward above all, is ~2x slower than the two matmuls and a softmax (the tiny
Qwen2 of ``bench/grpo_bench.py``, 64 x 62 tokens, bf16: the policy update 0.26 -> 0.20 s;
SmolLM2-sized heads, 128 keys: 25 -> 13 ms per layer, forward + backward). Every other call
(float32 prefill and training, longer sequences, dropout) goes to transformers' own
``sdpa_attention_forward`` unchanged, so a float32 forward pass computes exactly what it computed
before. The mask is built by transformers' ``sdpa_mask``.
"""

from __future__ import annotations

from typing import Any

NAME = "mia_decode"
# Half-precision passes over at most this many keys take the grouped matmuls: measured faster
# than the CPU flash kernel up to 128 keys for every head layout tried, slower from ~256-512.
SHORT_KEYS = 128
_registered = False


def decode_attention(
    module: Any,
    query: Any,
    key: Any,
    value: Any,
    attention_mask: Any,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[Any, None]:
    """``query`` [B, H, Q, D]; ``key``/``value`` [B, KV, L, D]; returns [B, Q, H, D]."""
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    special = kwargs.get("output_attentions") or kwargs.get("softcap")
    decode = query.shape[2] == 1 and not module.training
    device = query.device.type
    # Under autocast the rotary embedding hands over float32 queries; the matmuls run in bf16.
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else query.dtype
    short = (
        dtype in (torch.bfloat16, torch.float16)
        and key.shape[-2] <= SHORT_KEYS
        and not (module.training and dropout > 0)
    )
    if special or not (decode or short) or kwargs.get("cache") is not None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    return grouped_attention(module, query, key, value, attention_mask, scaling), None


def grouped_attention(
    module: Any, query: Any, key: Any, value: Any, attention_mask: Any, scaling: float | None
) -> Any:
    """softmax(q k^T * scale + mask) v with each KV head read in place by the query heads that
    share it; [B, H, Q, D] queries -> [B, Q, H, D]. ``attention_mask``: sdpa's boolean mask
    (True = attend) or an additive one, [B, 1, Q, L]; None = causal (when the module is)."""
    import torch

    b, heads, q_len, dim = query.shape
    kv_heads, keys = key.shape[1], key.shape[-2]
    groups = heads // kv_heads
    # Query head i reads KV head i // groups (repeat_kv's order), so a reshape groups them.
    q = query.reshape(b, kv_heads, groups * q_len, dim)
    scores = torch.matmul(q, key.transpose(-1, -2)) * (scaling if scaling else dim**-0.5)
    scores = scores.view(b, kv_heads, groups, q_len, keys)
    mask = attention_mask
    if mask is None and q_len > 1 and getattr(module, "is_causal", True):
        mask = torch.ones(q_len, keys, dtype=torch.bool, device=query.device).tril(keys - q_len)
        mask = mask[None, None]
    if mask is not None:
        mask = mask[:, :, -q_len:, :keys].unsqueeze(2)  # [B, 1, 1, Q, L]
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        else:
            scores = scores + mask
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(value.dtype)
    out = torch.matmul(probs.view(b, kv_heads, groups * q_len, keys), value)  # [B, KV, G*Q, D]
    return out.view(b, heads, q_len, dim).transpose(1, 2)


def register() -> str:
    """Register the attention and its mask builder with transformers (once); returns the name."""
    global _registered
    if not _registered:
        from transformers import AttentionInterface, AttentionMaskInterface
        from transformers.masking_utils import sdpa_mask

        AttentionInterface.register(NAME, decode_attention)
        AttentionMaskInterface.register(NAME, sdpa_mask)
        _registered = True
    return NAME


def use_for_decode(model: Any, device: str) -> bool:
    """Switch a text model that uses ``sdpa`` on a CPU to this attention (decode steps and short
    half-precision passes; the rest stays sdpa); True if switched. Vision models and other
    devices (whose kernels handle grouped heads) are left as they are."""
    from mia.models.hf import is_vision_config

    config = model.config
    if str(device).split(":")[0] != "cpu" or is_vision_config(config):
        return False
    if getattr(config, "_attn_implementation", None) != "sdpa":
        return False
    try:
        model.set_attn_implementation(register())
    except (AttributeError, ValueError, TypeError):  # a wrapper or class that cannot switch
        return False
    return getattr(model.config, "_attn_implementation", None) == NAME
