"""The store's workflow memories: writes through the dedup policy, win-rate credit and its
history, eviction, retrieval, and the inspector's paging."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from tqdm import tqdm

from memory_serve.index import Bucket, TableIndex
from memory_serve.records import (
    CORRECT,
    DEFAULT_CATEGORY,
    INCORRECT,
    MAX_COUNT,
    MemoryRecord,
    NewMemory,
    Retrieval,
    ScoredMemory,
    WriteResult,
    check_new_memory,
    modality_of,
)
from memory_serve.scoring import combined_score, minmax, mixed_similarity, top_positions
from memory_serve.store.base import StoreBase, blob, check_bucket, checked, ids_over_cap
from mia.errors import MiaError

SORTS = {
    "newest": "id DESC",
    "oldest": "id ASC",
    "win_rate": "win_rate DESC, id DESC",
    "win_rate_asc": "win_rate ASC, id DESC",
    "uses": "usage_count DESC, id DESC",
}

MEMORY_COLS = (
    "id, data_id, question, image_caption, workflow_summary, plan, judgement, usage_count, "
    "success_count, win_rate, modality, category, created_at, source, extra"
)


@dataclass(frozen=True)
class Use:
    """The trajectory behind a credit: one row of a memory's history."""

    question: str = ""
    data_id: str = ""
    source: str = ""
    result_id: int | None = None  # the memory that trajectory became (None: not stored)


def memory_from_row(row: Sequence[Any]) -> MemoryRecord:
    """A record from the columns of :data:`MEMORY_COLS`, in that order."""
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


def placed(mem: NewMemory) -> tuple[str, str]:
    """``(judgement, modality)`` a new memory is stored under: anything but correct is
    incorrect, and the bucket (modality from the caption unless given) must exist."""
    judgement = CORRECT if mem.judgement == CORRECT else INCORRECT
    modality = mem.modality or modality_of(mem.image_caption)
    check_bucket(modality, mem.category)
    return judgement, modality


class Memories(StoreBase):
    """The ``memories`` table and its history (``memory_uses``), with their in-memory index."""

    def _read_memories(self) -> TableIndex[MemoryRecord]:
        table: TableIndex[MemoryRecord] = TableIndex(self.dim)
        for row in self._conn.execute(f"SELECT {MEMORY_COLS}, q_emb, c_emb FROM memories"):
            rec = memory_from_row(row)
            table.add(rec, self._vec(row[15]), self._vec(row[16]), rec.win_rate, rec.correct)
        return table

    # ------------------------------------------------------------------ writes

    def add(self, mem: NewMemory) -> WriteResult:
        """Embed and write one memory through the write policy."""
        q, c = self.embed([mem.question], [mem.image_caption])
        return self.write(mem, q[0], c[0])

    def add_many(self, mems: Sequence[NewMemory]) -> list[WriteResult]:
        """Embed (one encoder call) and write each memory through the write policy."""
        q, c = self.embed([m.question for m in mems], [m.image_caption for m in mems])
        return [self.write(m, q[i], c[i]) for i, m in enumerate(mems)]

    def write(self, mem: NewMemory, q_emb: np.ndarray, c_emb: np.ndarray) -> WriteResult:
        """Dedup/replace (:meth:`_dedup`), then insert, credit the used memories, evict over
        capacity."""
        judgement, modality = placed(mem)
        with self._write_lock:
            action, dup_id, replaced = self._dedup(mem, judgement, modality, q_emb, c_emb)
            # The reference credited only appended memories (credit_on_duplicate=False).
            credit = action == "inserted" or self.cfg.write.credit_on_duplicate
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
                    self._memories.drop(replaced)
                if new_rec is not None:
                    self._memories.add(new_rec, q_emb, c_emb, new_rec.win_rate, new_rec.correct)
                self._index_credit(credited)
                for item_id in evicted:
                    self._memories.drop(item_id)
        return WriteResult(
            action=action,
            id=new_rec.id if new_rec is not None else int(dup_id),  # type: ignore[arg-type]
            replaced_id=replaced,
            credited_ids=tuple(r.id for r in credited),
            evicted_ids=tuple(evicted),
        )

    def _dedup(
        self, mem: NewMemory, judgement: str, modality: str, q_emb: np.ndarray, c_emb: np.ndarray
    ) -> tuple[str, int | None, int | None]:
        """``(action, duplicate id, replaced id)`` for a new memory.

        Duplicate (best mixed cosine in the bucket >= ``dedup_threshold``): an incorrect
        existing memory is replaced; a correct one is replaced only by a correct memory with a
        shorter summary; a correct memory is never replaced by an incorrect one.
        """
        dup_id, dup_sim = self._best_duplicate(
            (modality, mem.category), q_emb, c_emb, judgement, mem.question
        )
        if dup_id is None or dup_sim < self.cfg.write.dedup_threshold:
            return "inserted", dup_id, None
        existing = self._memories.records[dup_id]
        if not existing.correct or (
            judgement == CORRECT
            and len(mem.workflow_summary.split()) < len(existing.workflow_summary.split())
        ):
            return "replaced", dup_id, existing.id
        return "kept_existing", dup_id, None

    def _best_duplicate(
        self, bucket: Bucket, q_emb: np.ndarray, c_emb: np.ndarray, judgement: str, question: str
    ) -> tuple[int | None, float]:
        r = self.cfg.retrieval
        with self._index_lock:
            index = self._memories.bucket(bucket)
            if index is None or len(index) == 0:
                return None, -np.inf
            ids, q, c, _, correct = index.view()
            sim = mixed_similarity(q, c, q_emb, c_emb, r.question_weight, r.caption_weight)
            if self.cfg.write.dedup_scope == "question_judgement":
                sim = np.where(correct == (judgement == CORRECT), sim, -np.inf)
            if r.key == "template":  # every question of a template embeds alike: compare texts
                records = self._memories.records
                same = np.array([records[int(i)].question == question for i in ids])
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
        extra = checked(lambda: check_new_memory(mem))
        created = time.time() if mem.created_at is None else float(mem.created_at)
        rec = MemoryRecord(
            id=0,  # SQLite's, once inserted
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
        cur.execute(
            "INSERT INTO memories (data_id, question, image_caption, workflow_summary, plan, "
            "judgement, usage_count, success_count, win_rate, modality, category, created_at, "
            "source, extra, q_emb, c_emb) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                rec.data_id,
                rec.question,
                rec.image_caption,
                rec.workflow_summary,
                rec.plan,
                rec.judgement,
                rec.usage_count,
                rec.success_count,
                rec.win_rate,
                rec.modality,
                rec.category,
                rec.created_at,
                rec.source,
                extra,
                blob(q_emb),
                blob(c_emb),
            ),
        )
        return replace(rec, id=int(cur.lastrowid))  # type: ignore[arg-type]

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
                with self._txn() as cur:
                    recs = [
                        self._insert_memory(cur, m, *placed(m), q[i], c[i])
                        for i, m in enumerate(chunk)
                    ]
                with self._index_lock:
                    for i, rec in enumerate(recs):
                        self._memories.add(rec, q[i], c[i], rec.win_rate, rec.correct)
                ids.extend(rec.id for rec in recs)
            bar.update(len(chunk))
        bar.close()
        return ids

    # ------------------------------------------------------------------ credit and removal

    def _credit(
        self, cur: sqlite3.Cursor, ids: Iterable[int], success: bool, use: Use | None = None
    ) -> list[MemoryRecord]:
        """usage+1 (success+1 if the trajectory was correct), win_rate = success / usage; each
        credited use is also a row of the memory's history (``memory_uses``)."""
        updated = []
        now = time.time()
        for item_id in ids:
            rec = self._memories.records.get(int(item_id))
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

    def _index_credit(self, credited: Iterable[MemoryRecord]) -> None:
        """The credited records into the index (called with the index lock held)."""
        for rec in credited:
            self._memories.set_win_rate(rec, rec.win_rate)

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
                self._index_credit(credited)
        return [r.id for r in credited]

    def _evict_memories(self, cur: sqlite3.Cursor) -> list[int]:
        ids = ids_over_cap(
            cur, "memories", self.cfg.write.max_memories, "win_rate ASC, created_at ASC, id ASC"
        )
        self._delete_rows(cur, ids)
        return ids

    @staticmethod
    def _delete_rows(cur: sqlite3.Cursor, ids: Sequence[int]) -> None:
        """Memories and their history."""
        cur.executemany("DELETE FROM memories WHERE id = ?", [(i,) for i in ids])
        cur.executemany("DELETE FROM memory_uses WHERE memory_id = ?", [(i,) for i in ids])

    def delete(self, ids: Iterable[int]) -> list[int]:
        """Delete these memories (and their history); returns the ids that existed."""
        ids = [int(i) for i in dict.fromkeys(ids)]
        with self._write_lock:
            present = [i for i in ids if i in self._memories.records]
            with self._txn() as cur:
                self._delete_rows(cur, present)
            with self._index_lock:
                for i in present:
                    self._memories.drop(i)
        return present

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
        check_bucket(modality, category)
        q_emb, c_emb = self._embed_one(question, image_caption, q_emb, c_emb)
        with self._index_lock:
            index = self._memories.bucket((modality, category))
            if index is None or len(index) == 0 or k <= 0:
                return Retrieval((), (), 0 if index is None else len(index))
            ids, qm, cm, win, correct = index.view()
            sim = mixed_similarity(qm, cm, q_emb, c_emb, r.question_weight, r.caption_weight)
            norm = minmax(sim)
            score = combined_score(norm, win, r.similarity_weight, r.win_rate_weight)
            keep = np.ones(len(ids), dtype=bool) if floor is None else sim >= floor
            pos = top_positions(ids, score, keep & correct, pass_num + k)[pass_num:]
            neg = top_positions(ids, score, keep & ~correct, pass_num + k)[pass_num:]
            records = self._memories.records

            def scored(rows: np.ndarray) -> tuple[ScoredMemory, ...]:
                return tuple(
                    ScoredMemory(
                        records[int(ids[i])], float(sim[i]), float(norm[i]), float(score[i])
                    )
                    for i in rows
                )

            return Retrieval(
                scored(pos), scored(neg), len(index), float(sim.min()), float(sim.max())
            )

    # ------------------------------------------------------------------ reading

    def get(self, item_id: int) -> MemoryRecord | None:
        with self._index_lock:
            return self._memories.records.get(int(item_id))

    def records(self) -> list[MemoryRecord]:
        """All memories, oldest id first."""
        with self._index_lock:
            return self._memories.in_order()

    def __len__(self) -> int:
        with self._index_lock:
            return len(self._memories)

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
        filters = {"judgement": judgement, "modality": modality, "category": category}
        cond, args = _page_filter(query, {**filters, "source": source})
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
                return total, [self._memories.records[int(r[0])] for r in ids]

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


def _page_filter(query: str, equal: dict[str, str | None]) -> tuple[str, list[Any]]:
    """The WHERE condition of a page and its arguments: each given column equal to its value,
    and ``query`` a substring of the question or summary (or, a number, the id)."""
    where: list[str] = ["1"]
    args: list[Any] = []
    for column, value in equal.items():
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
    return " AND ".join(where), args
