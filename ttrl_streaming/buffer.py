"""Thread-safe buffer of finished rollouts waiting for the next Planner update.

Rollouts are kept by group (the n rollouts of one question): GRPO normalises rewards within a
group, so an update always takes WHOLE groups, in arrival order, until it has at least the
requested number of rows (``train_batch_size x n``; exact when every group has n rollouts).
The reference sliced exactly that many rows and could split a group across two updates.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any


class RolloutBuffer:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._groups: OrderedDict[str, list[Any]] = OrderedDict()

    def add(self, results: Sequence[Any]) -> int:
        """Add rollouts (anything with ``.group``); returns the buffered row count."""
        with self._lock:
            for r in results:
                self._groups.setdefault(str(r.group), []).append(r)
            return self._rows()

    def _rows(self) -> int:
        return sum(len(g) for g in self._groups.values())

    @property
    def rows(self) -> int:
        with self._lock:
            return self._rows()

    @property
    def groups(self) -> int:
        with self._lock:
            return len(self._groups)

    def take(self, rows: int) -> list[Any] | None:
        """Whole groups, oldest first, until at least ``rows`` rows; None when fewer are
        buffered (nothing is removed then)."""
        with self._lock:
            if self._rows() < rows:
                return None
            out: list[Any] = []
            while self._groups and len(out) < rows:
                _, group = self._groups.popitem(last=False)
                out.extend(group)
            return out

    def take_all(self) -> list[Any]:
        with self._lock:
            out = [r for g in self._groups.values() for r in g]
            self._groups.clear()
            return out
