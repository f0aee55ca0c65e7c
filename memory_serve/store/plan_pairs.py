"""The store's plan pairs: a question with a correct and an incorrect plan (TTRL's
consolidation writes them), retrieved by similarity for the plan choice."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from memory_serve.index import TableIndex
from memory_serve.records import (
    DEFAULT_CATEGORY,
    PlanPair,
    check_timestamp,
    extra_json,
    modality_of,
)
from memory_serve.scoring import mixed_similarity, rank
from memory_serve.store.base import StoreBase, blob, check_bucket, checked, ids_over_cap

PLAN_COLS = (
    "id, data_id, question, image_caption, correct_plan, incorrect_plan, modality, category, "
    "created_at, extra"
)


def plan_from_row(row: Sequence[Any]) -> PlanPair:
    """A plan pair from the columns of :data:`PLAN_COLS`, in that order."""
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


class PlanPairs(StoreBase):
    """The ``plan_pairs`` table with its in-memory index."""

    def _read_plan_pairs(self) -> TableIndex[PlanPair]:
        table: TableIndex[PlanPair] = TableIndex(self.dim)
        for row in self._conn.execute(f"SELECT {PLAN_COLS}, q_emb, c_emb FROM plan_pairs"):
            table.add(plan_from_row(row), self._vec(row[10]), self._vec(row[11]), 0.0, True)
        return table

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
        """Store one plan pair (the oldest go past ``max_plan_pairs``); returns its id."""
        modality = modality or modality_of(image_caption)
        check_bucket(modality, category)
        q_emb, c_emb = self._embed_one(question, image_caption, q_emb, c_emb)
        created = (
            time.time() if created_at is None else checked(lambda: check_timestamp(created_at))
        )
        extra = dict(extra or {})
        extra_text = checked(lambda: extra_json(extra))
        pair = PlanPair(
            0,  # SQLite's, once inserted
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
        with self._write_lock:
            with self._txn() as cur:
                pair = self._insert_plan_pair(cur, pair, extra_text, q_emb, c_emb)
                evicted = self._evict_plan_pairs(cur)
            with self._index_lock:
                self._plans.add(pair, q_emb, c_emb, 0.0, True)
                for i in evicted:
                    self._plans.drop(i)
        return pair.id

    @staticmethod
    def _insert_plan_pair(
        cur: sqlite3.Cursor, pair: PlanPair, extra: str, q_emb: np.ndarray, c_emb: np.ndarray
    ) -> PlanPair:
        """Insert ``pair`` (``extra``: its extra as checked JSON text); it with its new id."""
        cur.execute(
            "INSERT INTO plan_pairs (data_id, question, image_caption, correct_plan, "
            "incorrect_plan, modality, category, created_at, extra, q_emb, c_emb) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                pair.data_id,
                pair.question,
                pair.image_caption,
                pair.correct_plan,
                pair.incorrect_plan,
                pair.modality,
                pair.category,
                pair.created_at,
                extra,
                blob(q_emb),
                blob(c_emb),
            ),
        )
        return replace(pair, id=int(cur.lastrowid))  # type: ignore[arg-type]

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
        ids = ids_over_cap(
            cur, "plan_pairs", self.cfg.write.max_plan_pairs, "created_at ASC, id ASC"
        )
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
        check_bucket(modality, category)
        q, c = self.embed([question], [image_caption])
        with self._index_lock:
            index = self._plans.bucket((modality, category))
            if index is None or len(index) == 0 or k <= 0:
                return []
            ids, qm, cm, _, _ = index.view()
            sim = mixed_similarity(qm, cm, q[0], c[0], r.question_weight, r.caption_weight)
            order = rank(ids, sim)[:k]
            return [(self._plans.records[int(ids[i])], float(sim[i])) for i in order]

    def plan_pairs(self) -> list[PlanPair]:
        """All plan pairs, oldest id first."""
        with self._index_lock:
            return self._plans.in_order()
