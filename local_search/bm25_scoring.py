"""Exact top-k over bm25s' eager index: a term x passage CSC matrix of precomputed scores.

A query's score for a passage is the sum, over its terms (with repeats), of the matrix entries.
Two paths, both exact:

* **pruned** (most queries): score exactly only the passages found in the rarest terms'
  postings (at most ``budget`` postings), adding the common terms' contributions by binary search
  in their sorted postings. Any other passage holds only common terms, so its score is at most
  the sum of those terms' largest entries (``term_max``, saved at build). When that bound is
  below the k-th best candidate score, the candidates hold the top k (MaxScore's argument).
* **exhaustive** (when the bound cannot prove it): accumulate all postings into a dense score
  vector (a fancy-index ``+=`` is exact since a term lists each passage once, and much faster
  than ``np.add.at``) and select among passages with a positive score.

Ties go to the lower row, so results are reproducible. Passages scoring 0 (no query term) are
never returned, as with Pyserini.
"""

from __future__ import annotations

import numpy as np

DEFAULT_BUDGET = 65_536


def term_max_and_sorted(
    data: np.ndarray, indices: np.ndarray, indptr: np.ndarray
) -> tuple[np.ndarray, bool]:
    """Per-term largest entry, and whether each term's postings are sorted by row (the pruned
    path binary-searches them; bm25s builds them sorted, this checks it at build time)."""
    n_terms = len(indptr) - 1
    starts = np.asarray(indptr[:-1], dtype=np.int64)
    nonempty = np.asarray(indptr[1:], dtype=np.int64) > starts
    term_max = np.zeros(n_terms, dtype=np.float32)
    if len(data):
        term_max[nonempty] = np.maximum.reduceat(np.asarray(data), starts[nonempty])
    step = np.diff(np.asarray(indices, dtype=np.int64))
    breaks = np.flatnonzero(step <= 0) + 1  # positions where the row order restarts
    sorted_ok = bool(np.isin(breaks, starts).all())
    return term_max, sorted_ok


class ImpactScorer:
    def __init__(
        self,
        data: np.ndarray,
        indices: np.ndarray,
        indptr: np.ndarray,
        num_docs: int,
        term_max: np.ndarray | None = None,
        budget: int = DEFAULT_BUDGET,
    ) -> None:
        self.data = data
        self.indices = indices
        self.indptr = indptr
        self.num_docs = num_docs
        self.term_max = term_max  # None: always exhaustive
        self.budget = budget

    def top_k(self, term_ids: list[int], k: int) -> list[tuple[int, float]]:
        if not term_ids or k < 1:
            return []
        terms, counts = np.unique(np.asarray(term_ids, dtype=np.int64), return_counts=True)
        starts = np.asarray(self.indptr[terms], dtype=np.int64)
        ends = np.asarray(self.indptr[terms + 1], dtype=np.int64)
        present = ends > starts
        if not present.any():
            return []
        terms, counts, starts, ends = (
            terms[present],
            counts[present],
            starts[present],
            ends[present],
        )
        floor = 0.0
        if self.term_max is not None:
            hits, floor = self._pruned(terms, counts, starts, ends, k)
            if hits is not None:
                return hits
        return self._exhaustive(counts, starts, ends, k, floor)

    def _postings(self, start: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        return self.indices[start:end], self.data[start:end]

    def _pruned(
        self, terms: np.ndarray, counts: np.ndarray, starts: np.ndarray, ends: np.ndarray, k: int
    ) -> tuple[list[tuple[int, float]] | None, float]:
        """(hits, 0) when the candidates provably hold the top k, else (None, floor) with
        ``floor`` a lower bound of the k-th best score (real passages reach it)."""
        assert self.term_max is not None
        order = np.argsort(ends - starts, kind="stable")
        n_rare = max(
            1, int(np.searchsorted(np.cumsum((ends - starts)[order]), self.budget, "right"))
        )
        rare, common = order[:n_rare], order[n_rare:]
        bound = float(sum(counts[i] * float(self.term_max[terms[i]]) for i in common))
        rows_parts, weight_parts = [], []
        for i in rare:
            rows, vals = self._postings(starts[i], ends[i])
            rows_parts.append(rows)
            weight_parts.append(vals.astype(np.float64) * counts[i])
        cand, inverse = np.unique(np.concatenate(rows_parts), return_inverse=True)
        if len(cand) < k and len(common):
            return None, 0.0  # passages outside the candidates may still enter the top k
        scores = np.bincount(inverse, weights=np.concatenate(weight_parts), minlength=len(cand))
        for i in common:
            rows, vals = self._postings(starts[i], ends[i])
            pos = np.minimum(np.searchsorted(rows, cand), len(rows) - 1)
            found = rows[pos] == cand
            scores[found] += vals[pos[found]].astype(np.float64) * counts[i]
        if len(common):
            kth = np.partition(scores, len(scores) - k)[len(scores) - k]
            # Margin for float rounding: prune only when clearly below the k-th candidate.
            if not bound * (1 + 1e-5) + 1e-9 < kth:
                return None, float(kth) * (1 - 1e-5)
        return _select(cand, scores, k), 0.0

    def _exhaustive(
        self, counts: np.ndarray, starts: np.ndarray, ends: np.ndarray, k: int, floor: float
    ) -> list[tuple[int, float]]:
        scores = np.zeros(self.num_docs, dtype=np.float32)
        for c, s, e in zip(counts, starts, ends, strict=True):
            rows, vals = self._postings(s, e)
            scores[rows] += vals if c == 1 else vals * np.float32(c)
        # With a known floor only the few passages reaching it are selected from.
        rows = np.flatnonzero(scores >= floor) if floor > 0 else np.flatnonzero(scores)
        return _select(rows, scores[rows], k)


def _select(rows: np.ndarray, scores: np.ndarray, k: int) -> list[tuple[int, float]]:
    """The k best (row, score) pairs, best first, ties to the lower row; zeros dropped.

    ``rows`` must be ascending: of the passages tied at the k-th score the first ones are
    kept without sorting them all (a template-made corpus can tie thousands).
    """
    keep = scores > 0
    rows, scores = rows[keep], scores[keep]
    if len(rows) > k:
        kth = np.partition(scores, len(scores) - k)[len(scores) - k]
        above = np.flatnonzero(scores > kth)
        tied = np.flatnonzero(scores == kth)[: k - len(above)]
        pick = np.concatenate([above, tied])
        rows, scores = rows[pick], scores[pick]
    order = np.lexsort((rows, -scores))[:k]
    return [(int(rows[i]), float(scores[i])) for i in order]
