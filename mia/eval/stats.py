"""Accuracy with 95% bootstrap intervals, and paired differences between policies.

Every comparison MIA prints (``mia demo``, ``bench/efficacy_bench.py``) is over the same
questions, so a difference between two policies is a *paired* one: resampling questions keeps
each question's pair of outcomes together, which gives a much tighter (and honest) interval
than two independent intervals would.

    bootstrap_ci([1, 0, 1, 1])                  # (mean, low, high)
    paired_bootstrap_ci(mia, none)              # mean of mia - none over the same questions
    cluster_bootstrap_ci(x, clusters)           # linked questions resampled together
    comparison(outcomes, baseline="none")       # one row per policy, with both intervals
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

N_BOOT = 10_000
ALPHA = 0.05


def bootstrap_ci(
    values: Sequence[float], *, n_boot: int = N_BOOT, alpha: float = ALPHA, seed: int = 0
) -> tuple[float, float, float]:
    """``(mean, low, high)``: the mean and its percentile bootstrap interval (1 - alpha)."""
    x = np.asarray([float(v) for v in values], dtype=float)
    if x.size == 0:
        return (math.nan, math.nan, math.nan)
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, size=(n_boot, x.size))].mean(axis=1)
    lo, hi = np.quantile(means, [alpha / 2, 1 - alpha / 2])
    return (float(x.mean()), float(lo), float(hi))


def paired_bootstrap_ci(
    a: Sequence[float], b: Sequence[float], **kwargs: Any
) -> tuple[float, float, float]:
    """Mean of ``a - b`` over the same questions (paired) with its bootstrap interval."""
    if len(a) != len(b):
        raise ValueError(f"paired bootstrap needs equal lengths, got {len(a)} and {len(b)}")
    return bootstrap_ci([float(x) - float(y) for x, y in zip(a, b, strict=True)], **kwargs)


def cluster_bootstrap_ci(
    values: Sequence[float],
    clusters: Sequence[Any],
    *,
    n_boot: int = N_BOOT,
    alpha: float = ALPHA,
    seed: int = 0,
) -> tuple[float, float, float]:
    """``(mean, low, high)`` where whole clusters are resampled together: questions that are
    linked (the same template in the same world, answered through one memory) move as one, so
    the interval is as wide as the number of independent units allows. The mean is over
    questions (a cluster weighs by its size)."""
    x = np.asarray([float(v) for v in values], dtype=float)
    if x.size == 0:
        return (math.nan, math.nan, math.nan)
    if len(clusters) != x.size:
        raise ValueError(f"{x.size} values but {len(clusters)} cluster labels")
    labels = {c: i for i, c in enumerate(dict.fromkeys(clusters))}
    idx = np.asarray([labels[c] for c in clusters])
    sums = np.bincount(idx, weights=x, minlength=len(labels))
    sizes = np.bincount(idx, minlength=len(labels)).astype(float)
    rng = np.random.default_rng(seed)
    pick = rng.integers(0, len(labels), size=(n_boot, len(labels)))
    means = sums[pick].sum(axis=1) / sizes[pick].sum(axis=1)
    lo, hi = np.quantile(means, [alpha / 2, 1 - alpha / 2])
    return (float(x.mean()), float(lo), float(hi))


def paired_cluster_bootstrap_ci(
    a: Sequence[float], b: Sequence[float], clusters: Sequence[Any], **kwargs: Any
) -> tuple[float, float, float]:
    """Mean of ``a - b`` over the same questions, whole clusters resampled together."""
    if len(a) != len(b):
        raise ValueError(f"paired bootstrap needs equal lengths, got {len(a)} and {len(b)}")
    diffs = [float(x) - float(y) for x, y in zip(a, b, strict=True)]
    return cluster_bootstrap_ci(diffs, clusters, **kwargs)


def comparison(
    outcomes: Mapping[str, Mapping[str, float]],
    *,
    baseline: str = "none",
    groups: Mapping[str, str] | None = None,
    clusters: Mapping[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """One row per policy: accuracy with its interval and, on the questions every policy
    answered, the paired difference to ``baseline``. ``outcomes``: policy -> {question id ->
    correct (0/1)}. ``groups``: question id -> group name; adds per-group accuracies.
    ``clusters``: question id -> cluster (e.g. its template): the intervals resample whole
    clusters (:func:`cluster_bootstrap_ci`); without it, questions."""
    common = set.intersection(*(set(o) for o in outcomes.values())) if outcomes else set()
    ids = sorted(common)
    labels = [clusters.get(i, i) for i in ids] if clusters is not None else None
    rows = []
    for policy, o in outcomes.items():
        values = [o[i] for i in ids]
        if labels is None:
            mean, lo, hi = bootstrap_ci(values)
        else:
            mean, lo, hi = cluster_bootstrap_ci(values, labels)
        row: dict[str, Any] = {
            "policy": policy,
            "n": len(ids),
            "accuracy": mean,
            "ci": [lo, hi],
        }
        if baseline in outcomes and policy != baseline:
            base = [outcomes[baseline][i] for i in ids]
            if labels is None:
                d, dlo, dhi = paired_bootstrap_ci(values, base)
            else:
                d, dlo, dhi = paired_cluster_bootstrap_ci(values, base, labels)
            row["delta"] = {"vs": baseline, "mean": d, "ci": [dlo, dhi]}
        if groups:
            by: dict[str, list[float]] = {}
            for i in ids:
                by.setdefault(groups.get(i, "other"), []).append(o[i])
            row["groups"] = {g: {"n": len(v), "accuracy": sum(v) / len(v)} for g, v in by.items()}
        rows.append(row)
    return rows


def _pct(x: float) -> str:
    return "  n/a" if x is None or math.isnan(x) else f"{100 * x:5.1f}"


def format_comparison(rows: Sequence[Mapping[str, Any]], extra: Mapping[str, Mapping] = {}) -> str:  # noqa: B006
    """A plain-text table of :func:`comparison` rows (accuracy and differences in points);
    ``extra``: policy -> {"tools", "tokens", "seconds"} per question."""
    groups = sorted({g for r in rows for g in (r.get("groups") or {})})
    head = ["policy", "n", "acc %", "95% CI", "vs none", "95% CI"]
    head += [f"{g} %" for g in groups] + ["tools/q", "tokens/q", "s/q"]
    lines = []
    for r in rows:
        d = r.get("delta")
        e = extra.get(r["policy"], {})
        cells = [
            r["policy"],
            str(r["n"]),
            _pct(r["accuracy"]),
            f"[{_pct(r['ci'][0])}, {_pct(r['ci'][1])}]",
            f"{100 * d['mean']:+5.1f}" if d else "    -",
            f"[{100 * d['ci'][0]:+5.1f}, {100 * d['ci'][1]:+5.1f}]" if d else "-",
        ]
        cells += [
            _pct((r.get("groups") or {}).get(g, {}).get("accuracy", math.nan)) for g in groups
        ]
        for key, fmt in (("tools", "{:.2f}"), ("tokens", "{:.0f}"), ("seconds", "{:.1f}")):
            value = e.get(key)
            cells.append(fmt.format(value) if isinstance(value, int | float) else "-")
        lines.append(cells)
    widths = [max(len(str(x)) for x in col) for col in zip(head, *lines, strict=True)]

    def line(cells: Sequence[str]) -> str:  # the policy name left, numbers right
        first = cells[0].ljust(widths[0])
        return "  ".join([first, *(c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True))])

    return "\n".join([line(head), *(line(c) for c in lines)])
