"""The store's file: which embedder and schema wrote it, ids kept in range, backups, and
replacing the whole store atomically (a load, a restore)."""

from __future__ import annotations

import os
import sqlite3
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Self, TypeVar

from memory_serve.records import MAX_ID
from memory_serve.restore import BackupInfo, copy_rows, open_backup, read_meta
from memory_serve.store.base import (
    ID_TABLES,
    READABLE_SCHEMAS,
    SCHEMA_VERSION,
    StoreBase,
    blob,
    log,
)
from mia.errors import MiaError

T = TypeVar("T")


class Persistence(StoreBase):
    """The file under the store: its meta row, id ranges, backups and atomic replacement."""

    # ------------------------------------------------------------------ meta: embedder, schema

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
        """Migrate an older schema; refuse (or re-embed) rows another embedder wrote."""
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
                        [(blob(q[i]), blob(c[i]), r[0]) for i, r in enumerate(rows)],
                    )
            with self._txn():
                self._set_meta()

    # ------------------------------------------------------------------ ids

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

    # ------------------------------------------------------------------ backups

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

        def fill(staging: Self) -> BackupInfo:
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

    # ------------------------------------------------------------------ atomic replacement

    def rebuild(self, fill: Callable[[Self], T], *, copy_live: bool = False) -> T:
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
                # type(self): the whole MemoryStore this part belongs to.
                staging = type(self)(staging_path, self.embedder, self.cfg)
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

    def _seal(self) -> None:
        """Make the file self-contained (no WAL beside it) and durable before it is renamed."""
        with self._write_lock:
            self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            self._conn.execute("PRAGMA journal_mode=DELETE")
        _fsync(self.db_path)

    def _swap_in(self, staging_path: Path, staging: StoreBase) -> None:
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
        _fsync(self.db_path.parent)  # the rename itself is durable
        self._conn = self._connect()
        with self._index_lock:
            self._memories, self._plans = staging._memories, staging._plans


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
