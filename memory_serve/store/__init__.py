"""The memory store: SQLite (WAL) on disk, numpy indexes per bucket in memory.

- Durable state lives in SQLite: workflow memories, plan pairs, the TTRL rollout buffer, and the
  question/caption embeddings as float32 blobs (never recomputed on load).
- One writer: every write (and every SQL read) goes through ``_write_lock`` and one connection.
  The in-memory indexes are rebuilt from the DB at start and updated after each commit under
  ``_index_lock``; retrieval only takes ``_index_lock``, so reads never wait for disk.
- Embedding (the slow part) happens before either lock is taken.

:class:`MemoryStore` is the one object callers use, composed of its parts: the memories
(:mod:`.memories`), the plan pairs (:mod:`.plan_pairs`), the rollout buffer (:mod:`.rollouts`)
and the file itself (:mod:`.persistence`), all over the shared state of :mod:`.base`.

Usable directly from Python: ``MemoryStore(db_path, embedder, StoreConfig())``.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import Any

from memory_serve.config import StoreConfig
from memory_serve.index import TableIndex
from memory_serve.store.base import (
    SCHEMA,
    SCHEMA_2,
    InvalidRecord,
    OutOfRange,
    StoreFull,
)
from memory_serve.store.memories import SORTS, Memories, Use
from memory_serve.store.persistence import Persistence
from memory_serve.store.plan_pairs import PlanPairs
from memory_serve.store.rollouts import RolloutBuffer
from mia.embedding import Embedder, template_embedder
from mia.errors import MiaError

__all__ = ["SORTS", "InvalidRecord", "MemoryStore", "OutOfRange", "StoreFull", "Use"]


class MemoryStore(Memories, PlanPairs, RolloutBuffer, Persistence):
    """Workflow memories + plan pairs + rollout buffer over one SQLite file."""

    def __init__(
        self,
        db_path: str | Path,
        embedder: Embedder,
        cfg: StoreConfig | None = None,
        *,
        reembed_on_mismatch: bool = False,
    ) -> None:
        self.db_path = Path(db_path)
        self.db_path.parent.mkdir(parents=True, exist_ok=True)
        self.cfg = cfg or StoreConfig()
        # key=template: every question (stored or asked) is embedded as its template; the
        # embedder's name says so, so a store written with the other key is re-embedded or refused.
        self.embedder = (
            template_embedder(embedder) if self.cfg.retrieval.key == "template" else embedder
        )
        self.dim = int(embedder.dim)
        self._write_lock = threading.RLock()
        self._index_lock = threading.Lock()
        self._memories = TableIndex(self.dim)
        self._plans = TableIndex(self.dim)
        with self._write_lock:
            try:
                self._conn = self._connect()
                self._conn.executescript(SCHEMA + SCHEMA_2)
                self._check_meta(reembed_on_mismatch)
                self._repair_ids()
                self._load()
            except (sqlite3.DatabaseError, ValueError, TypeError) as err:
                if getattr(err, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL:
                    raise StoreFull() from None  # e.g. a load's staging file on a full disk
                # A damaged file is one clear line at start-up, not a traceback.
                raise MiaError(f"cannot open the memory store {self.db_path}: {err}") from None

    def _load(self) -> None:
        """Rebuild the in-memory indexes from the stored embedding blobs (no encoding)."""
        memories, plans = self._read_memories(), self._read_plan_pairs()
        with self._index_lock:
            self._memories, self._plans = memories, plans

    def clear(
        self, *, memories: bool = True, plan_pairs: bool = True, rollouts: bool = True
    ) -> None:
        """Forget the memories, plan pairs and/or rollout buffer. Ids are never reused."""
        tables = [
            t
            for t, on in (
                ("memories", memories),
                ("memory_uses", memories),
                ("plan_pairs", plan_pairs),
                ("rollouts", rollouts),
            )
            if on
        ]
        with self._write_lock:
            with self._txn() as cur:
                self._reset_sequences(cur)  # before the rows go: ids in use are not reused
                for table in tables:
                    cur.execute(f"DELETE FROM {table}")
            self._load()

    def stats(self) -> dict[str, Any]:
        """Counts per bucket and judgement, the rollout buffer's size, and what embeds."""
        with self._index_lock:
            buckets: dict[str, dict[str, int]] = {}
            for rec in self._memories.records.values():
                entry = buckets.setdefault(
                    f"{rec.modality}/{rec.category}", {"correct": 0, "incorrect": 0}
                )
                entry[rec.judgement] += 1
            memories, plan_pairs = len(self._memories), len(self._plans)
        with self._write_lock:
            n_roll, n_q = self._conn.execute(
                "SELECT COUNT(*), COUNT(DISTINCT CASE WHEN data_id != '' THEN data_id "
                "ELSE 'question:' || question END) FROM rollouts"
            ).fetchone()
        return {
            "memories": memories,
            "plan_pairs": plan_pairs,
            "buckets": dict(sorted(buckets.items())),
            "buffered_rollouts": int(n_roll),
            "buffered_questions": int(n_q),
            "embedder": self.embedder.name,
            "dim": self.dim,
            "db_path": str(self.db_path),
        }
