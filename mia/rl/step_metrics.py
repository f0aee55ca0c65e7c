"""The metrics of one GRPO learning step (rewards, advantages, lengths, the policy updates'
losses, timing, throughput, memory) and the reductions they are made of."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from mia.heap import peak_resident_bytes, resident_bytes
from mia.rl.batches import Batch
from mia.rl.rollouts import RolloutResult


def step_metrics(
    results: list[RolloutResult],
    batch: Batch,
    updates: list[dict[str, float]],
    timing: dict[str, float],
    n_dropped: int,
) -> dict[str, Any]:
    """One step's row of metrics: its (kept) ``results``, the update ``batch``, the metrics of
    each ``train_step`` in ``updates``, the phases' seconds in ``timing`` and how many results
    were dropped."""
    rewards = np.array([r.reward for r in results], dtype=np.float64)
    mask = batch["response_mask"]
    attn = batch["attention_mask"]
    policy_tokens = mask.sum(-1).double()
    n_resp = [len(r.trajectory.response_ids) for r in results]
    n_prompt = [len(r.trajectory.prompt_ids) for r in results]
    total_tokens = float(attn.sum())
    solved = {}
    for r in results:
        solved[r.group] = max(solved.get(r.group, 0.0), r.reward)
    m: dict[str, Any] = {
        "reward/mean": float(rewards.mean()),
        "reward/std": float(rewards.std()),
        "reward/max": float(rewards.max()),
        "reward/min": float(rewards.min()),
        "reward/groups_all_equal": frac_equal_groups(results),
        "advantage/abs_mean": float(batch["advantages"].abs().mean()),
        "response/policy_tokens_mean": float(policy_tokens.mean()),
        "response/policy_tokens_max": float(policy_tokens.max()),
        "response/length_mean": mean(n_resp),
        "response/length_max": float(max(n_resp)),
        "prompt/length_mean": mean(n_prompt),
        "rollout/n": float(len(results)),
        "rollout/dropped": float(n_dropped),
    }
    for key, values in numeric_extras(results).items():
        m[f"reward/{key}"] = mean(values)
    agg = {k: mean([u[k] for u in updates if k in u]) for k in updates[0]} if updates else {}
    names = {
        "loss": "actor/loss",
        "pg_loss": "actor/pg_loss",
        "kl_loss": "actor/kl_ref",
        "clipfrac": "actor/pg_clipfrac",
        "clipfrac_dual": "actor/pg_clipfrac_dual",
        "approx_kl": "actor/approx_kl",
        "ratio_mean": "actor/ratio_mean",
        "grad_norm": "actor/grad_norm",
    }
    if "token_entropy" in agg:  # old_logprobs=auto, measured by the update (one of them)
        names["token_entropy"] = "actor/entropy"
        names["rollout_logprob_diff_mean"] = "rollout/logprob_diff_mean"
        names["rollout_logprob_diff_max"] = "rollout/logprob_diff_max"
    for src, dst in names.items():
        if src in agg:
            m[dst] = agg[src]
    if "entropy" in agg and "actor/entropy" not in m:
        m["actor/entropy"] = agg["entropy"]
    m["actor/updates"] = float(len(updates))
    if updates:
        m["actor/lr"] = updates[-1]["lr"]
        m["actor/skipped"] = float(sum(u.get("skipped", 0.0) for u in updates))
    for key, seconds in timing.items():
        m[f"time/{key}"] = seconds
    m["perf/tokens_per_s"] = total_tokens / max(timing["step"], 1e-9)
    m["perf/gen_tokens_per_s"] = float(policy_tokens.sum()) / max(timing["rollout"], 1e-9)
    m["perf/total_tokens"] = total_tokens
    # This process: the generator's, and the policy's with workers.mode=single_process.
    m["perf/rss_gb"] = resident_bytes() / 2**30
    peak = peak_resident_bytes()
    if peak is not None:
        m["perf/max_rss_gb"] = peak / 2**30
    return m


def mean(values: Sequence[float]) -> float:
    return float(sum(values) / len(values)) if values else float("nan")


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    return float((values * mask).sum() / mask.sum().clamp(min=1))


def numeric_extras(results: Sequence[RolloutResult]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for r in results:
        for key, value in r.extras.items():
            if isinstance(value, bool | int | float) and math.isfinite(float(value)):
                out.setdefault(key, []).append(float(value))
    return out


def frac_equal_groups(results: Sequence[RolloutResult]) -> float:
    """Share of groups whose rewards are all equal (they get zero advantage: no signal)."""
    by_group: dict[str, list[float]] = {}
    for r in results:
        by_group.setdefault(r.group, []).append(r.reward)
    flat = [max(v) - min(v) < 1e-9 for v in by_group.values()]
    return float(sum(flat) / len(flat)) if flat else 0.0
