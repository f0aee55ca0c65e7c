"""In-memory vector index of one bucket: growing numpy matrices with O(dim) add/remove.

Not thread-safe by itself: the store guards every index with its index lock.
"""

from __future__ import annotations

import numpy as np


class BucketIndex:
    """Question/caption embeddings, win-rates and correctness of the entries of one bucket.

    Rows are kept dense (removal moves the last row into the hole), so row order is arbitrary;
    ranking breaks ties by id, never by row position.
    """

    def __init__(self, dim: int, capacity: int = 16) -> None:
        self.dim = dim
        self.n = 0
        self.ids = np.zeros(capacity, dtype=np.int64)
        self.q = np.zeros((capacity, dim), dtype=np.float32)
        self.c = np.zeros((capacity, dim), dtype=np.float32)
        self.win = np.zeros(capacity, dtype=np.float64)
        self.correct = np.zeros(capacity, dtype=bool)
        self._pos: dict[int, int] = {}

    def __len__(self) -> int:
        return self.n

    def __contains__(self, item_id: int) -> bool:
        return item_id in self._pos

    def _grow(self) -> None:
        cap = max(16, 2 * len(self.ids))
        for name in ("ids", "q", "c", "win", "correct"):
            old = getattr(self, name)
            new = np.zeros((cap, *old.shape[1:]), dtype=old.dtype)
            new[: self.n] = old[: self.n]
            setattr(self, name, new)

    def add(
        self, item_id: int, q: np.ndarray, c: np.ndarray, win_rate: float, correct: bool
    ) -> None:
        if item_id in self._pos:
            raise KeyError(f"id {item_id} already indexed")
        if self.n == len(self.ids):
            self._grow()
        i = self.n
        self.ids[i], self.q[i], self.c[i] = item_id, q, c
        self.win[i], self.correct[i] = win_rate, correct
        self._pos[item_id] = i
        self.n += 1

    def remove(self, item_id: int) -> None:
        i = self._pos.pop(item_id)
        last = self.n - 1
        if i != last:
            moved = int(self.ids[last])
            for arr in (self.ids, self.q, self.c, self.win, self.correct):
                arr[i] = arr[last]
            self._pos[moved] = i
        self.n = last

    def set_win_rate(self, item_id: int, win_rate: float) -> None:
        self.win[self._pos[item_id]] = win_rate

    def view(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``(ids, q, c, win, correct)`` for the live rows (views: use under the index lock)."""
        n = self.n
        return self.ids[:n], self.q[:n], self.c[:n], self.win[:n], self.correct[:n]
