"""What every part of the memory store shares: the schema, the one connection and its locks,
transactions, the embedder, and the errors a write can end in."""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Self, TypeVar

import numpy as np

from memory_serve.config import StoreConfig
from memory_serve.index import TableIndex
from memory_serve.records import CATEGORIES, MODALITIES, MemoryRecord, PlanPair
from mia.embedding import Embedder
from mia.errors import MiaError
from mia.http import ApiError

log = logging.getLogger("memory_serve.store")
T = TypeVar("T")

# Version 2 added the ``memory_uses`` history table (and paging indexes); a version-1 file is
# migrated in place when opened (the new table starts empty: nothing recorded uses before).
SCHEMA_VERSION = "2"
READABLE_SCHEMAS = ("1", "2")
ID_TABLES = ("memories", "plan_pairs", "rollouts", "memory_uses")  # AUTOINCREMENT ids

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS memories (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    data_id TEXT NOT NULL DEFAULT '',
    question TEXT NOT NULL,
    image_caption TEXT NOT NULL DEFAULT '',
    workflow_summary TEXT NOT NULL,
    plan TEXT NOT NULL DEFAULT '',
    judgement TEXT NOT NULL CHECK (judgement IN ('correct', 'incorrect')),
    usage_count INTEGER NOT NULL,
    success_count INTEGER NOT NULL,
    win_rate REAL NOT NULL,
    modality TEXT NOT NULL,
    category TEXT NOT NULL,
    created_at REAL NOT NULL,
    source TEXT NOT NULL DEFAULT '',
    extra TEXT NOT NULL DEFAULT '{}',
    q_emb BLOB NOT NULL,
    c_emb BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS memories_eviction ON memories (win_rate, created_at, id);
CREATE TABLE IF NOT EXISTS plan_pairs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    data_id TEXT NOT NULL DEFAULT '',
    question TEXT NOT NULL,
    image_caption TEXT NOT NULL DEFAULT '',
    correct_plan TEXT NOT NULL,
    incorrect_plan TEXT NOT NULL,
    modality TEXT NOT NULL,
    category TEXT NOT NULL,
    created_at REAL NOT NULL,
    extra TEXT NOT NULL DEFAULT '{}',
    q_emb BLOB NOT NULL,
    c_emb BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS rollouts (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    data_id TEXT NOT NULL DEFAULT '',
    question TEXT NOT NULL,
    image_caption TEXT NOT NULL DEFAULT '',
    plan TEXT NOT NULL DEFAULT '',
    slow_plan TEXT NOT NULL DEFAULT '',
    judgement TEXT NOT NULL,
    messages TEXT NOT NULL DEFAULT '[]',
    used_memory_ids TEXT NOT NULL DEFAULT '[]',
    created_at REAL NOT NULL,
    extra TEXT NOT NULL DEFAULT '{}'
);
"""

# Schema 2: which trajectories used a memory (one row per credited use) + paging indexes.
SCHEMA_2 = """
CREATE TABLE IF NOT EXISTS memory_uses (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    memory_id INTEGER NOT NULL,
    question TEXT NOT NULL,
    data_id TEXT NOT NULL DEFAULT '',
    success INTEGER NOT NULL CHECK (success IN (0, 1)),
    source TEXT NOT NULL DEFAULT '',
    result_id INTEGER,
    created_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS memory_uses_memory ON memory_uses (memory_id, id);
-- Everything the inspector filters, sorts and searches on, without the embedding blobs: its
-- pages scan this (a few MB per 100k memories) instead of the table (~3 kB a row).
CREATE INDEX IF NOT EXISTS memories_listing ON memories (
    id, judgement, modality, category, source, win_rate, usage_count, question, workflow_summary
);
"""


class StoreFull(ApiError):
    """SQLite could not grow the file (disk full) or hand out an id: nothing was written, and
    the store stays usable for whatever still fits."""

    def __init__(self) -> None:
        message = "the memory database is full (disk space or ids); nothing was written"
        super().__init__(507, message, "storage_full")


class OutOfRange(ApiError):
    """A value SQLite cannot hold (an integer past 2^63 - 1): nothing was written."""

    def __init__(self) -> None:
        message = "a value is out of the range the memory database can hold; nothing was written"
        super().__init__(422, message, "out_of_range")


class InvalidRecord(ApiError):
    """A record outside the stored ranges (:mod:`memory_serve.records`): nothing was written."""

    def __init__(self, message: str) -> None:
        super().__init__(422, message, "invalid_request")


def checked(check: Callable[[], T]) -> T:
    """``check()``; its ValueError (a value outside the stored ranges) as :class:`InvalidRecord`."""
    try:
        return check()
    except ValueError as err:
        raise InvalidRecord(str(err)) from None


def blob(vec: np.ndarray) -> bytes:
    """An embedding as its stored float32 bytes."""
    return np.ascontiguousarray(vec, dtype=np.float32).tobytes()


def ids_over_cap(cur: sqlite3.Cursor, table: str, cap: int | None, order: str) -> list[int]:
    """The ids of the rows of ``table`` beyond ``cap`` rows (None: no cap), taken first in
    ``order`` (an SQL ``ORDER BY``): what an eviction deletes."""
    if cap is None:
        return []
    count = cur.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]
    if count <= cap:
        return []
    rows = cur.execute(
        f"SELECT id FROM {table} ORDER BY {order} LIMIT ?", (count - cap,)
    ).fetchall()
    return [int(r[0]) for r in rows]


def check_bucket(modality: str, category: str) -> None:
    if modality not in MODALITIES:
        raise MiaError(f"unknown modality {modality!r} (known: {list(MODALITIES)})")
    if category not in CATEGORIES:
        raise MiaError(f"unknown category {category!r} (known: {list(CATEGORIES)})")


class StoreBase:
    """The state every part of :class:`~memory_serve.store.MemoryStore` works on.

    - One writer: every write (and every SQL read) goes through ``_write_lock`` and ``_conn``.
    - ``_memories`` and ``_plans`` (the in-memory indexes) equal their tables whenever the write
      lock is free; they change only under ``_index_lock``, which is all retrieval takes.
    """

    db_path: Path
    cfg: StoreConfig
    embedder: Embedder
    dim: int
    _conn: sqlite3.Connection
    _write_lock: threading.RLock
    _index_lock: threading.Lock
    _memories: TableIndex[MemoryRecord]
    _plans: TableIndex[PlanPair]

    def _connect(self) -> sqlite3.Connection:
        # Autocommit mode: transactions are opened explicitly with BEGIN IMMEDIATE.
        conn = sqlite3.connect(
            str(self.db_path), check_same_thread=False, isolation_level=None, timeout=30.0
        )
        conn.execute("PRAGMA journal_mode=WAL")
        # WAL + NORMAL: a committed write survives a killed process (not a power cut).
        conn.execute("PRAGMA synchronous=NORMAL")
        return conn

    def close(self) -> None:
        with self._write_lock:
            self._conn.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _txn(self) -> Txn:
        return Txn(self._conn)

    def _load(self) -> None:
        """Rebuild the in-memory indexes from the stored embedding blobs (no encoding)."""
        raise NotImplementedError

    def _vec(self, data: bytes) -> np.ndarray:
        vec = np.frombuffer(data, dtype=np.float32)
        if vec.shape != (self.dim,):
            raise MiaError(f"{self.db_path}: stored embedding of size {vec.size}, want {self.dim}")
        return vec

    def embed(self, questions: Sequence[str], captions: Sequence[str]) -> tuple[np.ndarray, ...]:
        """Question and caption embeddings in one encoder call: ``(Q [n, d], C [n, d])``."""
        n = len(questions)
        if n == 0:
            empty = np.zeros((0, self.dim), dtype=np.float32)
            return empty, empty
        vecs = self.embedder.encode(list(questions) + list(captions))
        return vecs[:n], vecs[n:]

    def _embed_one(
        self, question: str, caption: str, q_emb: np.ndarray | None, c_emb: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray]:
        """The given embeddings of one question, or (either missing) both computed now."""
        if q_emb is None or c_emb is None:
            q, c = self.embed([question], [caption])
            return q[0], c[0]
        return q_emb, c_emb


class Txn:
    """``with store._txn() as cur``: BEGIN IMMEDIATE ... COMMIT, ROLLBACK on error."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def __enter__(self) -> sqlite3.Cursor:
        self.cur = self.conn.cursor()
        self.cur.execute("BEGIN IMMEDIATE")
        return self.cur

    def __exit__(self, _type: object, exc: BaseException | None, _tb: object) -> None:
        self.cur.close()
        if exc is None:
            try:
                self.conn.execute("COMMIT")
                return
            except sqlite3.Error as err:  # e.g. the disk filled while the WAL was written
                exc = err
        # SQLite has already rolled back after some errors (SQLITE_FULL); a second ROLLBACK
        # would fail and hide the cause.
        if self.conn.in_transaction:
            self.conn.execute("ROLLBACK")
        limit = _write_limit(exc)
        if limit is not None:
            log.warning("write refused: %s: %s", type(exc).__name__, exc)
            raise limit from None
        if _type is None:
            raise exc


def _write_limit(err: BaseException) -> ApiError | None:
    """The API error for a write SQLite could not take (None: not a limit, a bug)."""
    if getattr(err, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL:
        return StoreFull()
    if isinstance(err, OverflowError | sqlite3.DataError):
        return OutOfRange()
    return None
