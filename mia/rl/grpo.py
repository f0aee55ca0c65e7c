"""GRPO math in one place: advantages, the clipped policy loss, KL penalties, entropy, log-probs.

Pure torch, no model or distributed code, so every formula can be unit-tested by hand.
Shapes: ``B`` = sequences in the (micro-)batch, ``T`` = token positions, ``V`` = vocabulary.
Token tensors are aligned with ``input_ids``: ``logprobs[b, t]`` is log p(input_ids[b, t] | prefix)
and ``mask[b, t]`` is 1 where the policy produced that token (the response mask).

Conventions follow veRL (the reference trains with it), so numbers are comparable:
advantages use the unbiased group std, the ratio is clamped in log space, the dual-clip bound
``clip_ratio_c`` caps the loss of negative-advantage tokens, and ``k3`` is veRL's ``low_var_kl``.
tests/test_parity.py checks every formula against veRL's and TRL's own code (docs/rl.md, "Parity
with veRL and TRL", lists the deliberate differences).
"""

from __future__ import annotations

from typing import Literal

import torch

LossAgg = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"]
KLKind = Literal["k1", "k2", "k3", "abs", "k1+", "k3+", "abs+"]
LOSS_AGG_MODES: tuple[str, ...] = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")
# veRL's names are accepted too: kl = k1, mse = k2, low_var_kl = k3 (and low_var_kl+ = k3+).
_KL_ALIASES = {
    "k1": "k1",
    "kl": "k1",
    "abs": "abs",
    "k2": "k2",
    "mse": "k2",
    "k3": "k3",
    "low_var_kl": "k3",
}
KL_KINDS: tuple[str, ...] = tuple(_KL_ALIASES) + tuple(f"{k}+" for k in _KL_ALIASES)


# ----------------------------------------------------------------------------- advantages


def group_advantages(
    rewards: torch.Tensor,
    group_ids: torch.Tensor | list | None = None,
    group_size: int | None = None,
    norm_by_std: bool = True,
    eps: float = 1e-6,
) -> torch.Tensor:
    """GRPO outcome advantages: each reward minus its group mean (divided by the group std).

    rewards[B]; groups are given either by ``group_ids[B]`` (any hashable labels, e.g. prompt
    uids, in any order) or by ``group_size`` (consecutive blocks of that size). A group whose
    rewards are all equal gets advantage 0 (its std is 0: 0 / (0 + eps) = 0, never NaN); a group
    of one sample has no baseline and also gets 0 (veRL would pass the raw reward through).
    """
    rewards = rewards.detach().float()  # [B]
    n = rewards.shape[0]
    if (group_ids is None) == (group_size is None):
        raise ValueError("give exactly one of group_ids or group_size")
    if group_size is not None:
        if group_size < 1 or n % group_size:
            raise ValueError(f"batch of {n} rewards is not a multiple of group_size={group_size}")
        index = torch.arange(n, device=rewards.device) // group_size  # [B]
    else:
        labels = group_ids.tolist() if isinstance(group_ids, torch.Tensor) else list(group_ids)
        if len(labels) != n:
            raise ValueError(f"{len(labels)} group ids for {n} rewards")
        first_seen: dict = {}
        index = torch.tensor(
            [first_seen.setdefault(g, len(first_seen)) for g in labels], device=rewards.device
        )
    n_groups = int(index.max()) + 1 if n else 0
    count = torch.zeros(n_groups, device=rewards.device).index_add_(
        0, index, torch.ones_like(rewards)
    )
    mean = torch.zeros(n_groups, device=rewards.device).index_add_(0, index, rewards) / count  # [G]
    # A tied group is centred to exactly 0: its float mean need not equal its rewards (eight
    # rewards of 1.05 average to 1.05 - 6e-8, which the std would blow up to advantages of 0.1).
    top = torch.full((n_groups,), -torch.inf, device=rewards.device).scatter_reduce_(
        0, index, rewards, "amax"
    )
    low = torch.full((n_groups,), torch.inf, device=rewards.device).scatter_reduce_(
        0, index, rewards, "amin"
    )
    tied = (top == low)[index]  # [B]
    centered = torch.where(tied, torch.zeros_like(rewards), rewards - mean[index])  # [B]
    adv = centered
    if norm_by_std:
        sq = torch.zeros(n_groups, device=rewards.device).index_add_(0, index, centered**2)
        std = torch.sqrt(sq / (count - 1).clamp(min=1))  # unbiased, like torch.std  [G]
        adv = centered / (std[index] + eps)
    return torch.where(count[index] > 1, adv, torch.zeros_like(adv))


# ----------------------------------------------------------------------------- aggregation


def aggregate(
    values: torch.Tensor,
    mask: torch.Tensor,
    agg: LossAgg = "token-mean",
    denom: float | torch.Tensor | None = None,
) -> torch.Tensor:
    """Reduce per-token values[B, T] over mask[B, T] to a scalar.

    - ``token-mean``: sum of all masked tokens / number of masked tokens (every token weighs the
      same, long answers weigh more; DAPO).
    - ``seq-mean-token-mean``: mean per sequence, then mean over sequences (GRPO paper).
    - ``seq-mean-token-sum``: sum per sequence, then mean over sequences (Dr. GRPO style).

    ``denom`` replaces the local normaliser (token count for token-mean, sequence count
    otherwise) with a global one, so that micro-batches and data-parallel ranks can each add
    their share and the sum equals the loss of the whole batch.
    """
    mask = mask.to(values.dtype)
    if agg == "token-mean":
        total = (values * mask).sum()
        local = mask.sum()
    elif agg == "seq-mean-token-mean":
        per_seq = (values * mask).sum(-1) / mask.sum(-1).clamp(min=1)  # [B]
        total, local = per_seq.sum(), float(values.shape[0])
    elif agg == "seq-mean-token-sum":
        total, local = (values * mask).sum(-1).sum(), float(values.shape[0])
    else:
        raise ValueError(f"unknown loss aggregation {agg!r} (one of {', '.join(LOSS_AGG_MODES)})")
    d = local if denom is None else denom
    return total / (d.clamp(min=1) if isinstance(d, torch.Tensor) else max(float(d), 1.0))


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1)


# ----------------------------------------------------------------------------- policy loss


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    clip_ratio_c: float | None = 3.0,
    agg: LossAgg = "token-mean",
    denom: float | torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO/GRPO clipped surrogate loss (to minimise) and detached metrics.

    logprobs[B, T] (with grad), old_logprobs[B, T] (behaviour policy), advantages[B] (one per
    sequence, broadcast over its tokens) or [B, T], mask[B, T]. ``clip_high`` > ``clip_low`` is
    DAPO's clip-higher (e.g. 0.28). ``clip_ratio_c`` is the dual-clip bound for negative advantages
    (None disables it; when set it must be > 1, as in veRL: the bound lies above the clipped
    ratio). Metrics are masked token means of this call's tokens.
    """
    if clip_ratio_c is not None and not clip_ratio_c > 1.0:
        raise ValueError(f"clip_ratio_c must be > 1 (dual clip) or None (off), got {clip_ratio_c}")
    if advantages.dim() == 1:
        advantages = advantages[:, None]  # [B, 1] -> broadcasts over T
    advantages = advantages.to(logprobs.dtype)
    mask = mask.to(logprobs.dtype)
    log_ratio = (logprobs - old_logprobs).clamp(-20.0, 20.0)  # [B, T]; clamp keeps exp finite
    ratio = torch.exp(log_ratio)
    loss_unclipped = -advantages * ratio  # [B, T]
    loss_clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss_ppo = torch.maximum(loss_unclipped, loss_clipped)  # pessimistic bound
    loss_tok = loss_ppo
    dual_clipped = torch.zeros_like(loss_ppo, dtype=torch.bool)
    if clip_ratio_c is not None:
        # Dual clip: for A < 0 a huge ratio would make the loss unbounded; cap it at -A * c.
        loss_dual = torch.minimum(loss_ppo, -advantages * clip_ratio_c)
        loss_tok = torch.where(advantages < 0, loss_dual, loss_ppo)
        dual_clipped = (advantages < 0) & (loss_ppo > -advantages * clip_ratio_c)
    loss = aggregate(loss_tok, mask, agg, denom)

    with torch.no_grad():
        big = torch.finfo(ratio.dtype).max
        sel = mask.bool()
        metrics = {
            "clipfrac": masked_mean((loss_clipped > loss_unclipped).to(ratio.dtype), mask),
            "clipfrac_dual": masked_mean(dual_clipped.to(ratio.dtype), mask),
            # First-order estimate of KL(old || new) on the sampled tokens (veRL's ppo_kl).
            "approx_kl": masked_mean(-log_ratio, mask),
            "ratio_mean": masked_mean(ratio, mask),
            "ratio_max": torch.where(sel, ratio, torch.full_like(ratio, -big)).max(),
            "ratio_min": torch.where(sel, ratio, torch.full_like(ratio, big)).min(),
        }
    return loss, {k: v.detach() for k, v in metrics.items()}


# ----------------------------------------------------------------------------- supervised loss


def sft_loss(
    logprobs: torch.Tensor,
    mask: torch.Tensor,
    agg: LossAgg = "token-mean",
    denom: float | torch.Tensor | None = None,
) -> torch.Tensor:
    """Cross-entropy (negative log-likelihood) of the mask-1 tokens: logprobs[B, T], mask[B, T].

    The same aggregation modes and global ``denom`` as :func:`policy_loss`, so supervised
    warm-ups and SFT runs share the micro-batch / data-parallel bookkeeping of GRPO.
    """
    return aggregate(-logprobs, mask, agg, denom)


# ----------------------------------------------------------------------------- KL and entropy


def kl_penalty(
    logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: str = "k3"
) -> torch.Tensor:
    """Per-token estimate of KL(policy || reference) from sampled-token log-probs, [B, T].

    k1 = log p - log q (unbiased, high variance, can be negative);
    abs = |log p - log q|;
    k2 = (log p - log q)^2 / 2;
    k3 = q/p - log(q/p) - 1 (unbiased, always >= 0, low variance; Schulman's estimator, clamped
    to [-10, 10] like veRL's ``low_var_kl`` so one outlier token cannot blow up the loss).

    A ``+`` suffix (``k1+``, ``k3+``, ``abs+``; veRL's straight-through trick) keeps the value of
    the estimator but takes the gradient of k2, whose expected gradient is the gradient of the
    true KL (the gradients of k1 and k3 are not). ``k2+`` is plain k2.
    """
    straight_through = kind.endswith("+")
    k = _KL_ALIASES.get(kind[:-1] if straight_through else kind)
    if k is None:
        raise ValueError(
            f"unknown KL estimator {kind!r} (one of k1, k2, k3, abs; a '+' suffix: k2's gradient)"
        )
    diff = logprobs - ref_logprobs
    if k == "k1":
        value = diff
    elif k == "abs":
        value = diff.abs()
    elif k == "k2":
        value = 0.5 * diff.square()
    else:
        log_q_over_p = (-diff).clamp(-20.0, 20.0)
        value = (torch.exp(log_q_over_p) - log_q_over_p - 1.0).clamp(-10.0, 10.0)
    if not straight_through or k == "k2":
        return value
    k2 = 0.5 * diff.square()
    return k2 - k2.detach() + value.detach()


def entropy_from_logits(logits: torch.Tensor, chunk_size: int | None = None) -> torch.Tensor:
    """Entropy of softmax(logits) over the last axis: logits[..., V] -> [...].

    H = logsumexp(z) - sum softmax(z) * z. ``chunk_size`` bounds the float32 temporaries to
    chunk_size x V rows at a time (the full [B*T, V] softmax is the largest tensor in RL).
    """
    flat = logits.reshape(-1, logits.shape[-1])
    step = chunk_size or flat.shape[0] or 1
    out = [_entropy_rows(flat[i : i + step]) for i in range(0, flat.shape[0], step)]
    ent = torch.cat(out) if out else flat.new_zeros(0, dtype=torch.float32)
    return ent.reshape(logits.shape[:-1])


def _entropy_rows(z: torch.Tensor) -> torch.Tensor:
    z = z.float()
    lse = torch.logsumexp(z, dim=-1)  # [N]
    return lse - (torch.softmax(z, dim=-1) * z).sum(-1)


def token_logprobs(
    logits: torch.Tensor,
    ids: torch.Tensor,
    chunk_size: int | None = 4096,
    with_entropy: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """log softmax(logits)[ids]: logits[B, T, V], ids[B, T] -> [B, T] float32.

    The float32 log-softmax is taken over ``chunk_size`` rows at a time, so the float32 upcast
    of a bf16 [B*T, V] tensor never exists at once. ``with_entropy``: also the entropy of each
    row, from the same log-softmax and without gradient (a metric; an entropy bonus takes
    :func:`entropy_from_logits`), as ``(logprobs, entropies)``. log-softmax + gather runs ~2x
    faster than logit - logsumexp, forward and backward (bench/grpo_bench.py's batch, SmolLM2's
    vocabulary), the same values to float rounding.
    """
    v = logits.shape[-1]
    flat = logits.reshape(-1, v)  # [N, V]
    flat_ids = ids.reshape(-1)  # [N]
    step = chunk_size or flat.shape[0] or 1
    out, ents = [], []
    for i in range(0, flat.shape[0], step):
        lsm = torch.log_softmax(flat[i : i + step].float(), dim=-1)
        out.append(lsm.gather(-1, flat_ids[i : i + step, None]).squeeze(-1))
        if with_entropy:
            with torch.no_grad():
                d = lsm.detach()
                ents.append(-(d.exp() * d).sum(-1))
    lp = torch.cat(out) if out else flat.new_zeros(0, dtype=torch.float32)
    if not with_entropy:
        return lp.reshape(ids.shape)
    ent = torch.cat(ents) if ents else flat.new_zeros(0, dtype=torch.float32)
    return lp.reshape(ids.shape), ent.reshape(ids.shape)
