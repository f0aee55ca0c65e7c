"""The trainer's data position: batches of dataset indices, reshuffled each epoch."""

from __future__ import annotations

import numpy as np

from mia.errors import MiaError


class DataCursor:
    """Batches of dataset indices, reshuffled each epoch from (seed, epoch); drop-last.

    Its state (epoch, cursor) is all a resumed run needs to continue with the next batch.
    """

    def __init__(
        self, size: int, batch_size: int, shuffle: bool, seed: int, epoch: int = 0, cursor: int = 0
    ) -> None:
        if size < batch_size:
            raise MiaError(f"the dataset has {size} samples, fewer than batch_size={batch_size}")
        self.size, self.batch_size, self.shuffle, self.seed = size, batch_size, shuffle, seed
        self.epoch, self.cursor = epoch, cursor
        self._order = self._make_order(epoch)

    @property
    def steps_per_epoch(self) -> int:
        return self.size // self.batch_size

    def _make_order(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(self.size)
        return np.random.default_rng([self.seed, epoch]).permutation(self.size)

    def next(self) -> list[int]:
        if self.cursor + self.batch_size > self.size:
            self.epoch += 1
            self.cursor = 0
            self._order = self._make_order(self.epoch)
        idx = self._order[self.cursor : self.cursor + self.batch_size].tolist()
        self.cursor += self.batch_size
        return [int(i) for i in idx]

    def state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "cursor": self.cursor}
