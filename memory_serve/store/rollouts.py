"""The store's TTRL rollout buffer: rollouts wait here, per question, until a consolidation or an
evaluation reads them (docs/reference.md §3.2)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from typing import Any

from memory_serve.records import Rollout, check_depth, extra_json
from memory_serve.store.base import StoreBase, checked


def _rollout_json(r: dict[str, Any]) -> tuple[str, str]:
    """A rollout's ``messages`` and ``extra`` as stored (bounded as a backup load checks)."""
    messages = r.get("messages", [])
    check_depth(messages, "messages")
    return json.dumps(messages, ensure_ascii=False), extra_json(r.get("extra", {}))


class RolloutBuffer(StoreBase):
    """The ``rollouts`` table (SQL only: nothing of it is kept in memory)."""

    def buffer_rollouts(self, rollouts: Sequence[dict[str, Any]]) -> list[int]:
        """Append rollouts (dicts with Rollout's fields minus id/created_at) to the buffer."""
        now = time.time()
        ids = []
        extras = [checked(lambda r=r: _rollout_json(r)) for r in rollouts]
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
        """Remove these rollouts from the buffer; returns how many ids were given."""
        ids = [(int(i),) for i in ids]
        with self._write_lock, self._txn() as cur:
            cur.executemany("DELETE FROM rollouts WHERE id = ?", ids)
        return len(ids)
