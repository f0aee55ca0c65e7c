"""Retrieval scoring (docs/reference.md §4.4), pure numpy so tests and benchmarks can recompute it.

``sim = qw*cos(q, Q_i) + cw*cos(c, C_i)`` when the query has a caption, else ``cos(q, Q_i)``;
``norm = (sim - min) / (max - min + 1e-8)`` over the whole bucket;
``score = sw*norm + ww*win_rate``. Ties rank by id (older first) so results are deterministic.
"""

from __future__ import annotations

import numpy as np

MINMAX_EPS = 1e-8


def mixed_similarity(
    q_mat: np.ndarray,
    c_mat: np.ndarray,
    q_vec: np.ndarray,
    c_vec: np.ndarray | None,
    question_weight: float,
    caption_weight: float,
) -> np.ndarray:
    """Raw similarity of one query to every row (float64). ``c_vec`` None/zero = no caption."""
    sim = (q_mat @ q_vec).astype(np.float64)
    if c_vec is not None and np.any(c_vec):
        sim = question_weight * sim + caption_weight * (c_mat @ c_vec).astype(np.float64)
    return sim


def minmax(sim: np.ndarray) -> np.ndarray:
    if sim.size == 0:
        return sim
    lo, hi = float(sim.min()), float(sim.max())
    return (sim - lo) / (hi - lo + MINMAX_EPS)


def combined_score(
    norm_sim: np.ndarray, win_rate: np.ndarray, similarity_weight: float, win_rate_weight: float
) -> np.ndarray:
    return similarity_weight * norm_sim + win_rate_weight * win_rate.astype(np.float64)


def rank(ids: np.ndarray, score: np.ndarray) -> np.ndarray:
    """Positions ordered by score descending, then id ascending."""
    return np.lexsort((ids, -score))


def top_positions(ids: np.ndarray, score: np.ndarray, select: np.ndarray, n: int) -> np.ndarray:
    """The first ``n`` positions of ``rank`` restricted to ``select``, without sorting the
    whole bucket: a linear-time partition keeps every row tied with the n-th best, and only
    those few are sorted (same order as ``rank``)."""
    pos = np.flatnonzero(select)
    if n <= 0 or pos.size == 0:
        return pos[:0]
    if pos.size > n:
        s = score[pos]
        kth = np.partition(s, pos.size - n)[pos.size - n]
        pos = pos[s >= kth]
    return pos[np.lexsort((ids[pos], -score[pos]))][:n]
