"""The memory store: SQLite (WAL) on disk, numpy indexes per bucket in memory.

- Durable state lives in SQLite: workflow memories, plan pairs, the TTRL rollout buffer, and the
  question/caption embeddings as float32 blobs (never recomputed on load).
- One writer: every write (and every SQL read) goes through ``_write_lock`` and one connection.
  The in-memory indexes are rebuilt from the DB at start and updated after each commit under
  ``_index_lock``; retrieval only takes ``_index_lock``, so reads never wait for disk.
- Embedding (the slow part) happens before either lock is taken.

Usable directly from Python: ``MemoryStore(db_path, embedder, StoreConfig())``.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from tqdm import tqdm

from memory_serve.config import StoreConfig
from memory_serve.index import BucketIndex
from memory_serve.records import (
    CATEGORIES,
    CORRECT,
    DEFAULT_CATEGORY,
    INCORRECT,
    MAX_COUNT,
    MAX_ID,
    MODALITIES,
    MemoryRecord,
    NewMemory,
    PlanPair,
    Retrieval,
    Rollout,
    ScoredMemory,
    WriteResult,
    check_depth,
    check_new_memory,
    check_timestamp,
    extra_json,
    modality_of,
)
from memory_serve.restore import BackupInfo, copy_rows, open_backup, read_meta
from memory_serve.scoring import combined_score, minmax, mixed_similarity, rank, top_positions
from mia.embedding import Embedder, template_embedder
from mia.errors import MiaError
from mia.http import ApiError

log = logging.getLogger("memory_serve.store")
T = TypeVar("T")

# Version 2 added the ``memory_uses`` history table (and paging indexes); a version-1 file is
# migrated in place when opened (the new table starts empty: nothing recorded uses before).
SCHEMA_VERSION = "2"
READABLE_SCHEMAS = ("1", "2")
Bucket = tuple[str, str]  # (modality, category)
ID_TABLES = ("memories", "plan_pairs", "rollouts", "memory_uses")  # AUTOINCREMENT ids

_SCHEMA = """
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
_SCHEMA_2 = """
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
SORTS = {
    "newest": "id DESC",
    "oldest": "id ASC",
    "win_rate": "win_rate DESC, id DESC",
    "win_rate_asc": "win_rate ASC, id DESC",
    "uses": "usage_count DESC, id DESC",
}

_MEMORY_COLS = (
    "id, data_id, question, image_caption, workflow_summary, plan, judgement, usage_count, "
    "success_count, win_rate, modality, category, created_at, source, extra"
)
_PLAN_COLS = (
    "id, data_id, question, image_caption, correct_plan, incorrect_plan, modality, category, "
    "created_at, extra"
)


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


def _checked(check: Callable[[], T]) -> T:
    try:
        return check()
    except ValueError as err:
        raise InvalidRecord(str(err)) from None


@dataclass(frozen=True)
class Use:
    """The trajectory behind a credit: one row of a memory's history."""

    question: str = ""
    data_id: str = ""
    source: str = ""
    result_id: int | None = None  # the memory that trajectory became (None: not stored)


def _blob(vec: np.ndarray) -> bytes:
    return np.ascontiguousarray(vec, dtype=np.float32).tobytes()


def _memory_from_row(row: Sequence[Any]) -> MemoryRecord:
    return MemoryRecord(
        id=int(row[0]),
        data_id=row[1],
        question=row[2],
        image_caption=row[3],
        workflow_summary=row[4],
        plan=row[5],
        judgement=row[6],
        usage_count=int(row[7]),
        success_count=int(row[8]),
        win_rate=float(row[9]),
        modality=row[10],
        category=row[11],
        created_at=float(row[12]),
        source=row[13],
        extra=json.loads(row[14] or "{}"),
    )


def _plan_from_row(row: Sequence[Any]) -> PlanPair:
    return PlanPair(
        id=int(row[0]),
        data_id=row[1],
        question=row[2],
        image_caption=row[3],
        correct_plan=row[4],
        incorrect_plan=row[5],
        modality=row[6],
        category=row[7],
        created_at=float(row[8]),
        extra=json.loads(row[9] or "{}"),
    )


def _rollout_json(r: dict[str, Any]) -> tuple[str, str]:
    """A rollout's ``messages`` and ``extra`` as stored (bounded as a backup load checks)."""
    messages = r.get("messages", [])
    check_depth(messages, "messages")
    return json.dumps(messages, ensure_ascii=False), extra_json(r.get("extra", {}))


def _check_bucket(modality: str, category: str) -> None:
    if modality not in MODALITIES:
        raise MiaError(f"unknown modality {modality!r} (known: {list(MODALITIES)})")
    if category not in CATEGORIES:
        raise MiaError(f"unknown category {category!r} (known: {list(CATEGORIES)})")


class MemoryStore:
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
        self._records: dict[int, MemoryRecord] = {}
        self._buckets: dict[Bucket, BucketIndex] = {}
        self._plans: dict[int, PlanPair] = {}
        self._plan_buckets: dict[Bucket, BucketIndex] = {}
        with self._write_lock:
            try:
                self._conn = self._connect()
                self._conn.executescript(_SCHEMA + _SCHEMA_2)
                self._check_meta(reembed_on_mismatch)
                self._repair_ids()
                self._load()
            except (sqlite3.DatabaseError, ValueError, TypeError) as err:
                if getattr(err, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL:
                    raise StoreFull() from None  # e.g. a load's staging file on a full disk
                # A damaged file is one clear line at start-up, not a traceback.
                raise MiaError(f"cannot open the memory store {self.db_path}: {err}") from None

    # ------------------------------------------------------------------ lifecycle / meta

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

    def __enter__(self) -> MemoryStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _meta(self) -> dict[str, str]:
        return dict(self._conn.execute("SELECT key, value FROM meta").fetchall())

    def _set_meta(self) -> None:
        values = {
            "schema_version": SCHEMA_VERSION,
            "embedder": self.embedder.name,
            "dim": str(self.dim),
        }
        self._conn.executemany(
            "INSERT INTO meta(key, value) VALUES (?, ?) "
            "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            list(values.items()),
        )

    def _check_meta(self, reembed_on_mismatch: bool) -> None:
        meta = self._meta()
        version = meta.get("schema_version", SCHEMA_VERSION)
        if version not in READABLE_SCHEMAS:
            raise MiaError(
                f"{self.db_path}: memory schema version {version} "
                f"(this MIA reads versions {', '.join(READABLE_SCHEMAS)})"
            )
        if version != SCHEMA_VERSION:
            # The tables and indexes of the newer schema were created above (IF NOT EXISTS);
            # writing the meta row below completes the migration.
            log.info(
                "%s: memory schema %s -> %s (memory history table added)",
                self.db_path,
                version,
                SCHEMA_VERSION,
            )
        same = meta.get("embedder") == self.embedder.name and meta.get("dim") == str(self.dim)
        if not meta or same:
            self._set_meta()
            return
        has_rows = self._conn.execute(
            "SELECT (SELECT COUNT(*) FROM memories) + (SELECT COUNT(*) FROM plan_pairs)"
        ).fetchone()[0]
        if not has_rows:
            self._set_meta()
            return
        if not reembed_on_mismatch:
            raise MiaError(
                f"{self.db_path} holds embeddings of {meta.get('embedder')!r} "
                f"(dim {meta.get('dim')}) but the embedder is {self.embedder.name!r} "
                f"(dim {self.dim}); use the same embedder or re-embed (--reembed)"
            )
        self._reembed_all()

    def _load(self) -> None:
        """Rebuild the in-memory indexes from the stored embedding blobs (no encoding)."""
        records: dict[int, MemoryRecord] = {}
        buckets: dict[Bucket, BucketIndex] = {}
        for row in self._conn.execute(f"SELECT {_MEMORY_COLS}, q_emb, c_emb FROM memories"):
            rec = _memory_from_row(row)
            q, c = self._vec(row[15]), self._vec(row[16])
            records[rec.id] = rec
            key = (rec.modality, rec.category)
            buckets.setdefault(key, BucketIndex(self.dim)).add(
                rec.id, q, c, rec.win_rate, rec.correct
            )
        plans: dict[int, PlanPair] = {}
        plan_buckets: dict[Bucket, BucketIndex] = {}
        for row in self._conn.execute(f"SELECT {_PLAN_COLS}, q_emb, c_emb FROM plan_pairs"):
            pair = _plan_from_row(row)
            plans[pair.id] = pair
            plan_buckets.setdefault((pair.modality, pair.category), BucketIndex(self.dim)).add(
                pair.id, self._vec(row[10]), self._vec(row[11]), 0.0, True
            )
        with self._index_lock:
            self._records, self._buckets = records, buckets
            self._plans, self._plan_buckets = plans, plan_buckets

    def _repair_ids(self) -> None:
        """Ids past ``MAX_ID`` (a crafted file, or a backup loaded before ids were checked)
        leave AUTOINCREMENT nothing to hand out, so every insert would fail: such rows get the
        next free ids and the counters come back to the highest id in use."""
        over = (
            " UNION ALL ".join(f"SELECT 1 FROM {t} WHERE id > :max" for t in ID_TABLES)
            + " UNION ALL SELECT 1 FROM sqlite_sequence WHERE seq > :max"
        )
        if not self._conn.execute(f"SELECT EXISTS ({over})", {"max": MAX_ID}).fetchone()[0]:
            return
        with self._txn() as cur:
            for table in ID_TABLES:
                self._renumber(cur, table)
            self._reset_sequences(cur)

    def _renumber(self, cur: sqlite3.Cursor, table: str) -> None:
        rows = cur.execute(f"SELECT id FROM {table} WHERE id > ? ORDER BY id", (MAX_ID,))
        old_ids = [int(r[0]) for r in rows.fetchall()]
        if not old_ids:
            return
        top = cur.execute(f"SELECT COALESCE(MAX(id), 0) FROM {table} WHERE id <= ?", (MAX_ID,))
        first = int(top.fetchone()[0]) + 1
        for new, old in enumerate(old_ids, first):
            cur.execute(f"UPDATE {table} SET id = ? WHERE id = ?", (new, old))
            if table == "memories":  # the history follows its memory
                cur.execute("UPDATE memory_uses SET memory_id = ? WHERE memory_id = ?", (new, old))
                cur.execute("UPDATE memory_uses SET result_id = ? WHERE result_id = ?", (new, old))
        log.warning("%s: %d %s ids past %d renumbered", self.db_path, len(old_ids), table, MAX_ID)

    @staticmethod
    def _reset_sequences(cur: sqlite3.Cursor) -> None:
        """A counter past ``MAX_ID`` goes back to the highest id in range (a sane counter
        stays: ids are never reused)."""
        for table in ID_TABLES:
            cur.execute(
                f"UPDATE sqlite_sequence SET seq = (SELECT COALESCE(MAX(id), 0) FROM {table} "
                "WHERE id <= :max) WHERE name = :name AND seq > :max",
                {"name": table, "max": MAX_ID},
            )

    def _vec(self, blob: bytes) -> np.ndarray:
        vec = np.frombuffer(blob, dtype=np.float32)
        if vec.shape != (self.dim,):
            raise MiaError(f"{self.db_path}: stored embedding of size {vec.size}, want {self.dim}")
        return vec

    # ------------------------------------------------------------------ embedding

    def embed(self, questions: Sequence[str], captions: Sequence[str]) -> tuple[np.ndarray, ...]:
        """Question and caption embeddings in one encoder call: ``(Q [n, d], C [n, d])``."""
        n = len(questions)
        if n == 0:
            empty = np.zeros((0, self.dim), dtype=np.float32)
            return empty, empty
        vecs = self.embedder.encode(list(questions) + list(captions))
        return vecs[:n], vecs[n:]

    # ------------------------------------------------------------------ transactions

    def _txn(self) -> _Txn:
        return _Txn(self._conn)

    # ------------------------------------------------------------------ workflow memories

    def add(self, mem: NewMemory) -> WriteResult:
        """Embed and write one memory through the write policy."""
        q, c = self.embed([mem.question], [mem.image_caption])
        return self.write(mem, q[0], c[0])

    def add_many(self, mems: Sequence[NewMemory]) -> list[WriteResult]:
        q, c = self.embed([m.question for m in mems], [m.image_caption for m in mems])
        return [self.write(m, q[i], c[i]) for i, m in enumerate(mems)]

    def write(self, mem: NewMemory, q_emb: np.ndarray, c_emb: np.ndarray) -> WriteResult:
        """Dedup/replace, then insert, credit the used memories, evict over capacity.

        Duplicate (best mixed cosine in the bucket >= ``dedup_threshold``):
        an incorrect existing memory is replaced; a correct one is replaced only by a correct
        memory with a shorter summary; a correct memory is never replaced by an incorrect one.
        """
        judgement = CORRECT if mem.judgement == CORRECT else INCORRECT
        modality = mem.modality or modality_of(mem.image_caption)
        _check_bucket(modality, mem.category)
        w = self.cfg.write
        with self._write_lock:
            dup_id, dup_sim = self._best_duplicate(
                (modality, mem.category), q_emb, c_emb, judgement, mem.question
            )
            action, replaced = "inserted", None
            if dup_id is not None and dup_sim >= w.dedup_threshold:
                existing = self._records[dup_id]
                if not existing.correct or (
                    judgement == CORRECT
                    and len(mem.workflow_summary.split()) < len(existing.workflow_summary.split())
                ):
                    action, replaced = "replaced", existing.id
                else:
                    action = "kept_existing"
            # The reference credited only appended memories (credit_on_duplicate=False).
            credit = action == "inserted" or w.credit_on_duplicate
            used = (
                [i for i in dict.fromkeys(mem.used_memory_ids) if i != replaced] if credit else []
            )
            with self._txn() as cur:
                if replaced is not None:
                    self._delete_rows(cur, [replaced])
                new_rec = None
                if action != "kept_existing":
                    new_rec = self._insert_memory(cur, mem, judgement, modality, q_emb, c_emb)
                use = Use(
                    question=mem.question,
                    data_id=mem.data_id,
                    source=mem.source,
                    result_id=new_rec.id if new_rec is not None else dup_id,
                )
                credited = self._credit(cur, used, judgement == CORRECT, use)
                evicted = self._evict_memories(cur) if new_rec is not None else []
            with self._index_lock:
                if replaced is not None:
                    self._drop_record(replaced)
                if new_rec is not None:
                    self._index_record(new_rec, q_emb, c_emb)
                for rec in credited:
                    self._records[rec.id] = rec
                    self._buckets[(rec.modality, rec.category)].set_win_rate(rec.id, rec.win_rate)
                for item_id in evicted:
                    self._drop_record(item_id)
        return WriteResult(
            action=action,
            id=new_rec.id if new_rec is not None else int(dup_id),  # type: ignore[arg-type]
            replaced_id=replaced,
            credited_ids=tuple(r.id for r in credited),
            evicted_ids=tuple(evicted),
        )

    def _best_duplicate(
        self, bucket: Bucket, q_emb: np.ndarray, c_emb: np.ndarray, judgement: str, question: str
    ) -> tuple[int | None, float]:
        r = self.cfg.retrieval
        with self._index_lock:
            index = self._buckets.get(bucket)
            if index is None or len(index) == 0:
                return None, -np.inf
            ids, q, c, _, correct = index.view()
            sim = mixed_similarity(q, c, q_emb, c_emb, r.question_weight, r.caption_weight)
            if self.cfg.write.dedup_scope == "question_judgement":
                sim = np.where(correct == (judgement == CORRECT), sim, -np.inf)
            if r.key == "template":  # every question of a template embeds alike: compare texts
                same = np.array([self._records[int(i)].question == question for i in ids])
                sim = np.where(same, sim, -np.inf)
            best = int(np.argmax(sim))
            if not np.isfinite(sim[best]):
                return None, -np.inf
            return int(ids[best]), float(sim[best])

    def _insert_memory(
        self,
        cur: sqlite3.Cursor,
        mem: NewMemory,
        judgement: str,
        modality: str,
        q_emb: np.ndarray,
        c_emb: np.ndarray,
    ) -> MemoryRecord:
        extra = _checked(lambda: check_new_memory(mem))
        created = time.time() if mem.created_at is None else float(mem.created_at)
        values = (
            mem.data_id,
            mem.question,
            mem.image_caption,
            mem.workflow_summary,
            mem.plan,
            judgement,
            int(mem.usage_count),
            int(mem.success_count),
            float(mem.win_rate),
            modality,
            mem.category,
            created,
            mem.source,
            extra,
        )
        cur.execute(
            "INSERT INTO memories (data_id, question, image_caption, workflow_summary, plan, "
            "judgement, usage_count, success_count, win_rate, modality, category, created_at, "
            "source, extra, q_emb, c_emb) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (*values, _blob(q_emb), _blob(c_emb)),
        )
        return MemoryRecord(
            id=int(cur.lastrowid),  # type: ignore[arg-type]
            data_id=mem.data_id,
            question=mem.question,
            image_caption=mem.image_caption,
            workflow_summary=mem.workflow_summary,
            plan=mem.plan,
            judgement=judgement,
            usage_count=int(mem.usage_count),
            success_count=int(mem.success_count),
            win_rate=float(mem.win_rate),
            modality=modality,
            category=mem.category,
            created_at=created,
            source=mem.source,
            extra=dict(mem.extra),
        )

    def _credit(
        self, cur: sqlite3.Cursor, ids: Iterable[int], success: bool, use: Use | None = None
    ) -> list[MemoryRecord]:
        """usage+1 (success+1 if the trajectory was correct), win_rate = success / usage; each
        credited use is also a row of the memory's history (``memory_uses``)."""
        updated = []
        now = time.time()
        for item_id in ids:
            rec = self._records.get(int(item_id))
            if rec is None:  # evicted, replaced or never existed: nothing to credit
                continue
            # Saturate: a counter at its bound stays there instead of overflowing the column.
            usage = min(max(rec.usage_count, 0) + 1, MAX_COUNT)
            succ = min(max(rec.success_count, 0) + (1 if success else 0), usage)
            win = succ / usage
            cur.execute(
                "UPDATE memories SET usage_count = ?, success_count = ?, win_rate = ? WHERE id = ?",
                (usage, succ, win, rec.id),
            )
            u = use or Use()
            cur.execute(
                "INSERT INTO memory_uses (memory_id, question, data_id, success, source, "
                "result_id, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (rec.id, u.question, u.data_id, int(success), u.source, u.result_id, now),
            )
            updated.append(replace(rec, usage_count=usage, success_count=succ, win_rate=win))
        return updated

    def credit(
        self, ids: Iterable[int], success: bool, *, question: str = "", data_id: str = ""
    ) -> list[int]:
        """Win-rate credit without a new memory; returns the ids that exist and were updated.
        ``question``/``data_id``: the trajectory that used them (kept in their history)."""
        use = Use(question=question, data_id=data_id)
        with self._write_lock:
            with self._txn() as cur:
                credited = self._credit(cur, list(dict.fromkeys(ids)), success, use)
            with self._index_lock:
                for rec in credited:
                    self._records[rec.id] = rec
                    self._buckets[(rec.modality, rec.category)].set_win_rate(rec.id, rec.win_rate)
        return [r.id for r in credited]

    def _evict_memories(self, cur: sqlite3.Cursor) -> list[int]:
        cap = self.cfg.write.max_memories
        if cap is None:
            return []
        count = cur.execute("SELECT COUNT(*) FROM memories").fetchone()[0]
        if count <= cap:
            return []
        rows = cur.execute(
            "SELECT id FROM memories ORDER BY win_rate ASC, created_at ASC, id ASC LIMIT ?",
            (count - cap,),
        ).fetchall()
        ids = [int(r[0]) for r in rows]
        self._delete_rows(cur, ids)
        return ids

    @staticmethod
    def _delete_rows(cur: sqlite3.Cursor, ids: Sequence[int]) -> None:
        """Memories and their history."""
        cur.executemany("DELETE FROM memories WHERE id = ?", [(i,) for i in ids])
        cur.executemany("DELETE FROM memory_uses WHERE memory_id = ?", [(i,) for i in ids])

    def _index_record(self, rec: MemoryRecord, q: np.ndarray, c: np.ndarray) -> None:
        self._records[rec.id] = rec
        key = (rec.modality, rec.category)
        self._buckets.setdefault(key, BucketIndex(self.dim)).add(
            rec.id, q, c, rec.win_rate, rec.correct
        )

    def _drop_record(self, item_id: int) -> None:
        rec = self._records.pop(item_id, None)
        if rec is not None:
            self._buckets[(rec.modality, rec.category)].remove(item_id)

    def delete(self, ids: Iterable[int]) -> list[int]:
        ids = [int(i) for i in dict.fromkeys(ids)]
        with self._write_lock:
            present = [i for i in ids if i in self._records]
            with self._txn() as cur:
                self._delete_rows(cur, present)
            with self._index_lock:
                for i in present:
                    self._drop_record(i)
        return present

    def import_memories(
        self, mems: Sequence[NewMemory], *, batch_size: int = 256, progress: bool = False
    ) -> list[int]:
        """Bulk insert as-is (no dedup, no credit, counters kept): for restoring exports.

        Embeds every question and caption (the reference layout has no embeddings).
        """
        ids: list[int] = []
        bar = tqdm(
            total=len(mems),
            desc="import memories",
            unit="mem",
            disable=not progress or len(mems) < batch_size,
        )
        for start in range(0, len(mems), batch_size):
            chunk = mems[start : start + batch_size]
            q, c = self.embed([m.question for m in chunk], [m.image_caption for m in chunk])
            with self._write_lock:
                recs = []
                with self._txn() as cur:
                    for i, m in enumerate(chunk):
                        judgement = CORRECT if m.judgement == CORRECT else INCORRECT
                        modality = m.modality or modality_of(m.image_caption)
                        _check_bucket(modality, m.category)
                        recs.append(
                            (self._insert_memory(cur, m, judgement, modality, q[i], c[i]), i)
                        )
                with self._index_lock:
                    for rec, i in recs:
                        self._index_record(rec, q[i], c[i])
                ids.extend(rec.id for rec, _ in recs)
            bar.update(len(chunk))
        bar.close()
        return ids

    # ------------------------------------------------------------------ retrieval

    def retrieve(
        self,
        question: str,
        image_caption: str = "",
        *,
        category: str = DEFAULT_CATEGORY,
        modality: str | None = None,
        top_k: int | None = None,
        pass_num: int = 0,
        min_similarity: float | None = None,
        q_emb: np.ndarray | None = None,
        c_emb: np.ndarray | None = None,
    ) -> Retrieval:
        """Top-k correct and top-k incorrect memories of the query's bucket, skipping
        ``pass_num`` of each (docs/reference.md §4.4)."""
        r = self.cfg.retrieval
        k = r.top_k if top_k is None else top_k
        floor = r.min_similarity if min_similarity is None else min_similarity
        modality = modality or modality_of(image_caption)
        _check_bucket(modality, category)
        if q_emb is None or c_emb is None:
            q, c = self.embed([question], [image_caption])
            q_emb, c_emb = q[0], c[0]
        with self._index_lock:
            index = self._buckets.get((modality, category))
            if index is None or len(index) == 0 or k <= 0:
                return Retrieval((), (), 0 if index is None else len(index))
            ids, qm, cm, win, correct = index.view()
            sim = mixed_similarity(qm, cm, q_emb, c_emb, r.question_weight, r.caption_weight)
            norm = minmax(sim)
            score = combined_score(norm, win, r.similarity_weight, r.win_rate_weight)
            keep = np.ones(len(ids), dtype=bool) if floor is None else sim >= floor
            pos = top_positions(ids, score, keep & correct, pass_num + k)[pass_num:]
            neg = top_positions(ids, score, keep & ~correct, pass_num + k)[pass_num:]

            def scored(rows: np.ndarray) -> tuple[ScoredMemory, ...]:
                return tuple(
                    ScoredMemory(
                        self._records[int(ids[i])], float(sim[i]), float(norm[i]), float(score[i])
                    )
                    for i in rows
                )

            return Retrieval(
                scored(pos), scored(neg), len(index), float(sim.min()), float(sim.max())
            )

    # ------------------------------------------------------------------ plan pairs

    def add_plan_pair(
        self,
        question: str,
        correct_plan: str,
        incorrect_plan: str,
        *,
        data_id: str = "",
        image_caption: str = "",
        category: str = DEFAULT_CATEGORY,
        modality: str | None = None,
        extra: dict[str, Any] | None = None,
        created_at: float | None = None,
        q_emb: np.ndarray | None = None,
        c_emb: np.ndarray | None = None,
    ) -> int:
        modality = modality or modality_of(image_caption)
        _check_bucket(modality, category)
        if q_emb is None or c_emb is None:
            q, c = self.embed([question], [image_caption])
            q_emb, c_emb = q[0], c[0]
        created = (
            time.time() if created_at is None else _checked(lambda: check_timestamp(created_at))
        )
        extra = dict(extra or {})
        extra_text = _checked(lambda: extra_json(extra))
        with self._write_lock:
            with self._txn() as cur:
                cur.execute(
                    "INSERT INTO plan_pairs (data_id, question, image_caption, correct_plan, "
                    "incorrect_plan, modality, category, created_at, extra, q_emb, c_emb) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        data_id,
                        question,
                        image_caption,
                        correct_plan,
                        incorrect_plan,
                        modality,
                        category,
                        created,
                        extra_text,
                        _blob(q_emb),
                        _blob(c_emb),
                    ),
                )
                new_id = int(cur.lastrowid)  # type: ignore[arg-type]
                evicted = self._evict_plan_pairs(cur)
            pair = PlanPair(
                new_id,
                data_id,
                question,
                image_caption,
                correct_plan,
                incorrect_plan,
                modality,
                category,
                created,
                extra,
            )
            with self._index_lock:
                self._plans[new_id] = pair
                self._plan_buckets.setdefault((modality, category), BucketIndex(self.dim)).add(
                    new_id, q_emb, c_emb, 0.0, True
                )
                for i in evicted:
                    old = self._plans.pop(i)
                    self._plan_buckets[(old.modality, old.category)].remove(i)
        return new_id

    def import_plan_pairs(self, pairs: Sequence[dict[str, Any]], *, batch_size: int = 256) -> int:
        """Bulk insert plan pairs (dicts of :meth:`add_plan_pair` arguments), re-embedding them."""
        for start in range(0, len(pairs), batch_size):
            chunk = pairs[start : start + batch_size]
            q, c = self.embed(
                [p["question"] for p in chunk], [p.get("image_caption", "") for p in chunk]
            )
            for i, p in enumerate(chunk):
                args = dict(p)
                self.add_plan_pair(
                    args.pop("question"),
                    args.pop("correct_plan"),
                    args.pop("incorrect_plan"),
                    q_emb=q[i],
                    c_emb=c[i],
                    **args,
                )
        return len(pairs)

    def _evict_plan_pairs(self, cur: sqlite3.Cursor) -> list[int]:
        cap = self.cfg.write.max_plan_pairs
        if cap is None:
            return []
        count = cur.execute("SELECT COUNT(*) FROM plan_pairs").fetchone()[0]
        if count <= cap:
            return []
        rows = cur.execute(
            "SELECT id FROM plan_pairs ORDER BY created_at ASC, id ASC LIMIT ?", (count - cap,)
        ).fetchall()
        ids = [int(r[0]) for r in rows]
        cur.executemany("DELETE FROM plan_pairs WHERE id = ?", [(i,) for i in ids])
        return ids

    def retrieve_plan_pairs(
        self,
        question: str,
        image_caption: str = "",
        *,
        category: str = DEFAULT_CATEGORY,
        modality: str | None = None,
        top_k: int | None = None,
    ) -> list[tuple[PlanPair, float]]:
        """The most similar plan pairs (sorted by similarity: the reference forgot to sort)."""
        r = self.cfg.retrieval
        k = r.plan_pair_top_k if top_k is None else top_k
        modality = modality or modality_of(image_caption)
        _check_bucket(modality, category)
        q, c = self.embed([question], [image_caption])
        with self._index_lock:
            index = self._plan_buckets.get((modality, category))
            if index is None or len(index) == 0 or k <= 0:
                return []
            ids, qm, cm, _, _ = index.view()
            sim = mixed_similarity(qm, cm, q[0], c[0], r.question_weight, r.caption_weight)
            order = rank(ids, sim)[:k]
            return [(self._plans[int(ids[i])], float(sim[i])) for i in order]

    # ------------------------------------------------------------------ rollout buffer (TTRL)

    def buffer_rollouts(self, rollouts: Sequence[dict[str, Any]]) -> list[int]:
        """Append rollouts (dicts with Rollout's fields minus id/created_at) to the buffer."""
        now = time.time()
        ids = []
        extras = [_checked(lambda r=r: _rollout_json(r)) for r in rollouts]
        with self._write_lock, self._txn() as cur:
            for r, (messages, extra) in zip(rollouts, extras, strict=True):
                cur.execute(
                    "INSERT INTO rollouts (data_id, question, image_caption, plan, slow_plan, "
                    "judgement, messages, used_memory_ids, created_at, extra) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        r.get("data_id", ""),
                        r["question"],
                        r.get("image_caption", ""),
                        r.get("plan", ""),
                        r.get("slow_plan", ""),
                        r["judgement"],
                        messages,
                        json.dumps([int(i) for i in r.get("used_memory_ids", [])]),
                        now,
                        extra,
                    ),
                )
                ids.append(int(cur.lastrowid))  # type: ignore[arg-type]
        return ids

    def rollouts(self) -> list[Rollout]:
        """Every buffered rollout, oldest first."""
        with self._write_lock:
            rows = self._conn.execute(
                "SELECT id, data_id, question, image_caption, plan, judgement, messages, "
                "used_memory_ids, created_at, slow_plan, extra FROM rollouts ORDER BY id"
            ).fetchall()
        return [
            Rollout(
                id=int(r[0]),
                data_id=r[1],
                question=r[2],
                image_caption=r[3],
                plan=r[4],
                judgement=r[5],
                messages=json.loads(r[6]),
                used_memory_ids=json.loads(r[7]),
                created_at=float(r[8]),
                slow_plan=r[9],
                extra=json.loads(r[10]),
            )
            for r in rows
        ]

    def delete_rollouts(self, ids: Iterable[int]) -> int:
        ids = [(int(i),) for i in ids]
        with self._write_lock, self._txn() as cur:
            cur.executemany("DELETE FROM rollouts WHERE id = ?", ids)
        return len(ids)

    # ------------------------------------------------------------------ whole-store operations

    def get(self, item_id: int) -> MemoryRecord | None:
        with self._index_lock:
            return self._records.get(int(item_id))

    def records(self) -> list[MemoryRecord]:
        """All memories, oldest id first."""
        with self._index_lock:
            return [self._records[i] for i in sorted(self._records)]

    def page(
        self,
        *,
        offset: int = 0,
        limit: int = 50,
        query: str = "",
        judgement: str | None = None,
        modality: str | None = None,
        category: str | None = None,
        source: str | None = None,
        sort: str = "newest",
    ) -> tuple[int, list[MemoryRecord]]:
        """``(matching count, one page of memories)``, filtered and sorted in SQL (never the
        whole store in Python). ``query``: case-insensitive substring of the question or the
        workflow summary (a number also matches that id)."""
        if sort not in SORTS:
            raise MiaError(f"unknown sort {sort!r} (known: {list(SORTS)})")
        where: list[str] = ["1"]
        args: list[Any] = []
        for column, value in (
            ("judgement", judgement),
            ("modality", modality),
            ("category", category),
            ("source", source),
        ):
            if value is not None:
                where.append(f"{column} = ?")
                args.append(value)
        text = query.strip()
        if text:
            like = "%" + text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
            match = "question LIKE ? ESCAPE '\\' OR workflow_summary LIKE ? ESCAPE '\\'"
            args.extend([like, like])
            if text.lstrip("#").isdigit() and len(text) < 19:
                match += " OR id = ?"
                args.append(int(text.lstrip("#")))
            where.append(f"({match})")
        cond = " AND ".join(where)
        source_sql = "memories INDEXED BY memories_listing"  # covering: no blob is read
        with self._write_lock:
            total = self._conn.execute(f"SELECT COUNT(*) FROM {source_sql} WHERE {cond}", args)
            total = int(total.fetchone()[0])
            ids = self._conn.execute(
                f"SELECT id FROM {source_sql} WHERE {cond} ORDER BY {SORTS[sort]} LIMIT ? OFFSET ?",
                [*args, max(0, int(limit)), max(0, int(offset))],
            ).fetchall()
            # The in-memory records equal the table while the write lock is held.
            with self._index_lock:
                return total, [self._records[int(r[0])] for r in ids]

    def history(self, memory_id: int, *, limit: int = 200) -> tuple[int, list[dict[str, Any]]]:
        """``(uses, the latest ``limit`` of them)``: the trajectories that used (were credited
        with) this memory, newest first: question, data_id, success, source, result_id."""
        with self._write_lock:
            total = self._conn.execute(
                "SELECT COUNT(*) FROM memory_uses WHERE memory_id = ?", (int(memory_id),)
            ).fetchone()[0]
            rows = self._conn.execute(
                "SELECT id, question, data_id, success, source, result_id, created_at "
                "FROM memory_uses WHERE memory_id = ? ORDER BY id DESC LIMIT ?",
                (int(memory_id), max(0, int(limit))),
            ).fetchall()
        return int(total), [
            {
                "id": int(r[0]),
                "question": r[1],
                "data_id": r[2],
                "success": bool(r[3]),
                "source": r[4],
                "result_id": None if r[5] is None else int(r[5]),
                "created_at": float(r[6]),
            }
            for r in rows
        ]

    def plan_pairs(self) -> list[PlanPair]:
        with self._index_lock:
            return [self._plans[i] for i in sorted(self._plans)]

    def __len__(self) -> int:
        with self._index_lock:
            return len(self._records)

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
        with self._index_lock:
            buckets: dict[str, dict[str, int]] = {}
            for rec in self._records.values():
                entry = buckets.setdefault(
                    f"{rec.modality}/{rec.category}", {"correct": 0, "incorrect": 0}
                )
                entry[rec.judgement] += 1
            memories, plan_pairs = len(self._records), len(self._plans)
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

    def backup(self, path: str | Path) -> Path:
        """A consistent copy of the whole DB (SQLite backup API), written atomically."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp-{threading.get_ident()}")
        tmp.unlink(missing_ok=True)
        dst = sqlite3.connect(str(tmp))
        try:
            with self._write_lock:
                self._conn.backup(dst)
            dst.execute("PRAGMA journal_mode=DELETE")  # a self-contained single file
        finally:
            dst.close()
        tmp.replace(path)
        return path

    def restore(
        self, path: str | Path, *, reembed_on_mismatch: bool = False, shown: str | None = None
    ) -> BackupInfo:
        """Replace the whole store by a SQLite backup (one made by :meth:`backup`).

        Every row and embedding blob is checked while it is copied into a new file, which is
        swapped in only when complete (:meth:`rebuild`): a bad backup changes nothing, on disk
        or in memory. ``shown`` names the file in error messages (default: ``path``).
        """
        path, shown = Path(path), shown or str(path)
        if not path.is_file():
            raise MiaError(f"no memory database at {shown}")

        def fill(staging: MemoryStore) -> BackupInfo:
            src = open_backup(path, shown)
            try:
                info = read_meta(src, shown, READABLE_SCHEMAS)
                same = info.embedder == self.embedder.name and info.dim == self.dim
                if not same and not reembed_on_mismatch:
                    raise MiaError(
                        f"{shown} holds embeddings of {info.embedder!r} (dim {info.dim}) but the "
                        f"embedder is {self.embedder.name!r} (dim {self.dim}); pass reembed to "
                        "convert it"
                    )
                with staging._txn() as cur:
                    copy_rows(src, cur, info, shown)
            finally:
                src.close()
            staging._raise_sequences(info.sequences)
            if not same:
                staging._reembed_all()
            return info

        try:
            return self.rebuild(fill)
        except sqlite3.DatabaseError as err:
            raise MiaError(f"cannot read memory database {shown}: {err}") from None

    def rebuild(self, fill: Callable[[MemoryStore], T], *, copy_live: bool = False) -> T:
        """Write the next version of the store into a new file, then swap it in atomically.

        ``fill`` gets a staging store over a fresh database beside the live one (a copy of it
        when ``copy_live``) and writes what the new store should hold. Only when it returns is
        the staging file checked, sealed and renamed over the live database, and only then are
        the in-memory indexes replaced. Any error leaves the live store, file and memory, as it
        was. Writes wait meanwhile; ids never go below what the live store handed out.
        """
        staging_path = self.db_path.with_name(
            f".{self.db_path.name}.load-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        )
        with self._write_lock:
            try:
                if copy_live:
                    self.backup(staging_path)
                staging = MemoryStore(staging_path, self.embedder, self.cfg)
                try:
                    result = fill(staging)
                    staging._raise_sequences(self._sequences())
                    staging._load()
                    staging._seal()
                finally:
                    staging.close()
                self._swap_in(staging_path, staging)
                return result
            finally:
                for suffix in ("", "-wal", "-shm", "-journal"):
                    Path(f"{staging_path}{suffix}").unlink(missing_ok=True)

    def _sequences(self) -> dict[str, int]:
        rows = self._conn.execute("SELECT name, seq FROM sqlite_sequence").fetchall()
        return {str(name): int(seq) for name, seq in rows}

    def _raise_sequences(self, sequences: dict[str, int]) -> None:
        """AUTOINCREMENT counters at least ``sequences`` (so no id is ever handed out twice)."""
        with self._write_lock, self._txn() as cur:
            for name, seq in sequences.items():
                # A live counter past MAX_ID (written before ids were checked) is not carried
                # into the next store: it would leave no id to hand out.
                if name not in ID_TABLES or seq > MAX_ID:
                    continue
                cur.execute(
                    "UPDATE sqlite_sequence SET seq = MAX(seq, ?) WHERE name = ?", (seq, name)
                )
                if cur.rowcount == 0:
                    cur.execute(
                        "INSERT INTO sqlite_sequence (name, seq) VALUES (?, ?)", (name, seq)
                    )

    def _seal(self) -> None:
        """Make the file self-contained (no WAL beside it) and durable before it is renamed."""
        with self._write_lock:
            self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            self._conn.execute("PRAGMA journal_mode=DELETE")
        fd = os.open(self.db_path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _swap_in(self, staging_path: Path, staging: MemoryStore) -> None:
        """Rename the sealed ``staging_path`` over the live database and adopt ``staging``'s
        indexes. Called with the write lock held."""
        self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        self._conn.close()
        try:
            os.replace(staging_path, self.db_path)
        except OSError:
            self._conn = self._connect()  # the old file is still in place
            raise
        # The old file's WAL and shared-memory index must not be applied to the new one.
        for suffix in ("-wal", "-shm"):
            Path(f"{self.db_path}{suffix}").unlink(missing_ok=True)
        fd = os.open(self.db_path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)  # the rename itself is durable
        finally:
            os.close(fd)
        self._conn = self._connect()
        with self._index_lock:
            self._records, self._buckets = staging._records, staging._buckets
            self._plans, self._plan_buckets = staging._plans, staging._plan_buckets

    def _reembed_all(self) -> None:
        """Recompute every stored embedding with the current embedder (model switch)."""
        with self._write_lock:
            for table in ("memories", "plan_pairs"):
                rows = self._conn.execute(f"SELECT id, question, image_caption FROM {table}")
                rows = rows.fetchall()
                if rows:
                    log.info(
                        "re-embedding %d rows of %s with %s", len(rows), table, self.embedder.name
                    )
                q, c = self.embed([r[1] for r in rows], [r[2] for r in rows])
                with self._txn() as cur:
                    cur.executemany(
                        f"UPDATE {table} SET q_emb = ?, c_emb = ? WHERE id = ?",
                        [(_blob(q[i]), _blob(c[i]), r[0]) for i, r in enumerate(rows)],
                    )
            with self._txn():
                self._set_meta()


class _Txn:
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
