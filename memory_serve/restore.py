"""Checking a SQLite memory backup row by row while copying it into a fresh database.

``/load_memory`` never lets a backup touch the live store: every row of the backup is read with
an explicit column list, checked against the stored ranges of :mod:`memory_serve.records`
(ids, counters, win-rates, timestamps, UTF-8 text, judgements, buckets, JSON depth and size, and
every embedding blob: a whole number of float32 values, exactly the backup's dimension, finite)
and inserted into a staging database created with the store's own schema. Only a staging file
that passed everything is swapped in (:meth:`MemoryStore.restore`). Rebuilding instead of
copying pages also means nothing but rows comes across: no foreign triggers, views or tables.

A file that is no memory backup is a 400 (:class:`BadBackup`); a backup with a value out of
range is a 422 naming the table, the row and the field (:class:`BadField`).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from memory_serve.records import (
    CATEGORIES,
    CORRECT,
    INCORRECT,
    MAX_ID,
    MODALITIES,
    check_counters,
    check_depth,
    check_text,
    check_timestamp,
    check_whole,
    extra_json,
)
from mia.errors import MiaError
from mia.http import ApiError

SQLITE_MAGIC = b"SQLite format 3\x00"
JUDGEMENTS = (CORRECT, INCORRECT)
MEMORY_COLUMNS = (
    "id", "data_id", "question", "image_caption", "workflow_summary", "plan", "judgement",
    "usage_count", "success_count", "win_rate", "modality", "category", "created_at", "source",
    "extra", "q_emb", "c_emb",
)  # fmt: skip
PLAN_COLUMNS = (
    "id", "data_id", "question", "image_caption", "correct_plan", "incorrect_plan", "modality",
    "category", "created_at", "extra", "q_emb", "c_emb",
)  # fmt: skip
ROLLOUT_COLUMNS = (
    "id", "data_id", "question", "image_caption", "plan", "slow_plan", "judgement", "messages",
    "used_memory_ids", "created_at", "extra",
)  # fmt: skip
USE_COLUMNS = (
    "id", "memory_id", "question", "data_id", "success", "source", "result_id", "created_at",
)  # fmt: skip
TABLES = ("memories", "plan_pairs", "rollouts")


class BadBackup(MiaError):
    """The file is not a loadable backup (a 400 through the load route); the message names it
    as the client did."""


class BadField(ApiError):
    """A backup row (or entry) holds a value outside the stored ranges: 422, naming the table,
    the row and the field. An ``ApiError`` so the load route answers with this status as is."""

    def __init__(self, message: str) -> None:
        super().__init__(422, message, "invalid_backup")


@dataclass
class BackupInfo:
    embedder: str
    dim: int
    rows: dict[str, int] = field(default_factory=dict)
    # Highest id each table ever handed out in the backup (ids are never reused).
    sequences: dict[str, int] = field(default_factory=dict)
    tables: list[str] = field(default_factory=lambda: list(TABLES))  # the tables to copy


# ----------------------------------------------------------------------------- field checks


def _texts(r: dict[str, Any], *names: str) -> None:
    for name in names:
        check_text(r[name], name)


def _choice(value: Any, name: str, allowed: Sequence[Any]) -> Any:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {list(allowed)}, got {value!r:.40}")
    return value


def _json(value: Any, name: str, kind: type) -> Any:
    try:
        data = json.loads(check_text(value, name))
    except (ValueError, RecursionError):  # RecursionError: nested past Python's own limit
        raise ValueError(f"{name} is not valid JSON") from None
    if not isinstance(data, kind):
        raise ValueError(f"{name} must be a JSON {kind.__name__}")
    check_depth(data, name)
    return data


def _embedding(value: Any, name: str, dim: int) -> bytes:
    if not isinstance(value, bytes):
        raise ValueError(f"{name} must be a blob, got {type(value).__name__}")
    if len(value) % 4 or len(value) != dim * 4:
        raise ValueError(f"{name} holds {len(value)} bytes, want {dim} float32 values ({dim * 4})")
    if not np.isfinite(np.frombuffer(value, dtype=np.float32)).all():
        raise ValueError(f"{name} holds NaN or infinite values")
    return value


def _ref(value: Any, name: str) -> None:
    check_whole(value, name, 1, MAX_ID)


def check_memory(r: dict[str, Any], dim: int) -> None:
    _texts(r, "data_id", "question", "image_caption", "workflow_summary", "plan", "source")
    _choice(r["judgement"], "judgement", JUDGEMENTS)
    check_counters(r["usage_count"], r["success_count"], r["win_rate"])
    _bucket_and_rest(r, dim)


def check_plan_pair(r: dict[str, Any], dim: int) -> None:
    _texts(r, "data_id", "question", "image_caption", "correct_plan", "incorrect_plan")
    _bucket_and_rest(r, dim)


def _bucket_and_rest(r: dict[str, Any], dim: int) -> None:
    _choice(r["modality"], "modality", MODALITIES)
    _choice(r["category"], "category", CATEGORIES)
    check_timestamp(r["created_at"])
    extra_json(_json(r["extra"], "extra", dict))
    _embedding(r["q_emb"], "q_emb", dim)
    _embedding(r["c_emb"], "c_emb", dim)


def check_rollout(r: dict[str, Any], dim: int) -> None:
    _texts(r, "data_id", "question", "image_caption", "plan", "slow_plan")
    _choice(r["judgement"], "judgement", JUDGEMENTS)
    if not all(isinstance(m, dict) for m in _json(r["messages"], "messages", list)):
        raise ValueError("messages must be a JSON list of objects")
    ids = _json(r["used_memory_ids"], "used_memory_ids", list)
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise ValueError("used_memory_ids must be a JSON list of integers")
    check_timestamp(r["created_at"])
    extra_json(_json(r["extra"], "extra", dict))


def check_use(r: dict[str, Any], dim: int) -> None:
    _texts(r, "question", "data_id", "source")
    _ref(r["memory_id"], "memory_id")
    if r["result_id"] is not None:
        _ref(r["result_id"], "result_id")
    _choice(r["success"], "success", (0, 1))
    check_timestamp(r["created_at"])


CHECKS: dict[str, tuple[tuple[str, ...], Callable[[dict[str, Any], int], None]]] = {
    "memories": (MEMORY_COLUMNS, check_memory),
    "plan_pairs": (PLAN_COLUMNS, check_plan_pair),
    "rollouts": (ROLLOUT_COLUMNS, check_rollout),
    "memory_uses": (USE_COLUMNS, check_use),
}


# ----------------------------------------------------------------------------- the copy


def open_backup(path: Path, shown: str) -> sqlite3.Connection:
    """A read-only connection to a SQLite file (refused before SQLite parses anything else)."""
    try:
        with path.open("rb") as f:
            magic = f.read(len(SQLITE_MAGIC))
    except OSError as err:
        raise BadBackup(f"cannot read {shown}: {err.strerror or type(err).__name__}") from None
    if magic != SQLITE_MAGIC:
        raise BadBackup(f"{shown} is not a SQLite memory backup")
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    # A crafted file's schema must not run functions (views, triggers, defaults) on our side.
    conn.execute("PRAGMA trusted_schema=OFF")
    # Text that is not UTF-8 reaches the field checks (which name the row) instead of failing
    # the whole read inside sqlite3.
    conn.text_factory = lambda raw: raw.decode("utf-8", "surrogateescape")
    return conn


def read_meta(src: sqlite3.Connection, shown: str, schema_versions: Sequence[str]) -> BackupInfo:
    tables = {r[0] for r in src.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    missing = sorted({"meta", *TABLES} - tables)
    if missing:
        raise BadBackup(f"{shown} is not a MIA memory database (no table {', '.join(missing)})")
    if src.execute("PRAGMA quick_check").fetchone() != ("ok",):
        raise BadBackup(f"{shown} is a damaged SQLite file (integrity check failed)")
    meta = {}
    for key, value in src.execute("SELECT key, value FROM meta"):
        if not isinstance(key, str) or not isinstance(value, str):
            raise BadBackup(f"{shown}: meta rows must be text")
        meta[key] = value
    if meta.get("schema_version") not in schema_versions:
        raise BadBackup(f"{shown}: unsupported schema {meta.get('schema_version')!r}")
    dim = meta.get("dim", "")
    if not dim.isdigit() or not 0 < int(dim) <= 65536 or not meta.get("embedder"):
        raise BadBackup(f"{shown}: meta needs an embedder name and a dimension, got {meta!r:.200}")
    info = BackupInfo(embedder=meta["embedder"], dim=int(dim))
    info.tables = [t for t in CHECKS if t in tables]
    if "sqlite_sequence" in tables:
        rows = src.execute("SELECT name, seq FROM sqlite_sequence ORDER BY rowid")
        for n, (name, seq) in enumerate(rows, 1):
            if name in CHECKS:
                # The next id follows this counter: past MAX_ID every insert would fail.
                info.sequences[name] = max(info.sequences.get(name, 0), _seq(seq, name, n, shown))
    return info


def _seq(value: Any, table: str, n: int, shown: str) -> int:
    try:
        return check_whole(value, "seq", 0, MAX_ID)
    except ValueError as err:
        raise BadField(f"{shown}: sqlite_sequence row {n} ({table}): {err}") from None


def copy_rows(
    src: sqlite3.Connection, dst: sqlite3.Cursor, info: BackupInfo, shown: str
) -> BackupInfo:
    """Check every row of every table and insert it (ids kept) through ``dst``."""
    for table, (columns, check) in CHECKS.items():
        if table not in info.tables:
            continue
        cols = ", ".join(columns)
        try:
            rows = src.execute(f"SELECT {cols} FROM {table} ORDER BY rowid")
        except sqlite3.OperationalError as err:  # e.g. "no such column: q_emb"
            raise BadBackup(f"{shown}: table {table}: {err}") from None
        seen: set[int] = set()
        insert = f"INSERT INTO {table} ({cols}) VALUES ({', '.join('?' * len(columns))})"
        for n, row in enumerate(rows, 1):
            item = row[0]
            try:
                if check_whole(item, "id", 1, MAX_ID) in seen:
                    raise ValueError("duplicate id")
                check(dict(zip(columns, row, strict=True)), info.dim)
            except ValueError as err:
                raise BadField(f"{shown}: {table} row {n} (id {item!r:.40}): {err}") from None
            seen.add(item)
            dst.execute(insert, row)
        info.rows[table] = len(seen)
        info.sequences[table] = max(info.sequences.get(table, 0), max(seen, default=0))
    return info
