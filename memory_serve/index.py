"""In-memory vector indexes: one bucket's growing numpy matrices with O(dim) add/remove, and one
table's records filed into such buckets.

Not thread-safe by themselves: the store guards every index with its index lock.
"""

from __future__ import annotations

from typing import Generic, Protocol, TypeVar

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


Bucket = tuple[str, str]  # (modality, category)


class Filed(Protocol):
    """A stored row the store keeps in memory: its id and the bucket it is filed under."""

    @property
    def id(self) -> int: ...
    @property
    def modality(self) -> str: ...
    @property
    def category(self) -> str: ...


R = TypeVar("R", bound=Filed)


class TableIndex(Generic[R]):
    """The in-memory side of one table: its records by id, and a :class:`BucketIndex` per
    bucket over their embeddings. Not thread-safe either (the store's index lock guards it)."""

    def __init__(self, dim: int) -> None:
        self.dim = dim
        self.records: dict[int, R] = {}
        self.buckets: dict[Bucket, BucketIndex] = {}

    def __len__(self) -> int:
        return len(self.records)

    def in_order(self) -> list[R]:
        """Every record, oldest id first."""
        return [self.records[i] for i in sorted(self.records)]

    def bucket(self, key: Bucket) -> BucketIndex | None:
        return self.buckets.get(key)

    def add(self, rec: R, q: np.ndarray, c: np.ndarray, win_rate: float, correct: bool) -> None:
        self.records[rec.id] = rec
        index = self.buckets.setdefault((rec.modality, rec.category), BucketIndex(self.dim))
        index.add(rec.id, q, c, win_rate, correct)

    def drop(self, item_id: int) -> None:
        rec = self.records.pop(item_id, None)
        if rec is not None:
            self.buckets[(rec.modality, rec.category)].remove(item_id)

    def set_win_rate(self, rec: R, win_rate: float) -> None:
        """``rec`` replaces the record of its id (same bucket), now ranked with ``win_rate``."""
        self.records[rec.id] = rec
        self.buckets[(rec.modality, rec.category)].set_win_rate(rec.id, win_rate)
