"""SQLite (WAL) cache of parsed tool results (search results, image lists, scraped pages) with
a TTL. Values are JSON; ``query``/``max_results``/``locale`` only label a row for people reading
the file (for other tools: the URL or query, a count, and the tool and engine).

Keyed by sha256 of (format version, normalised query, max_results, locale): the same question
asked with different spacing or case hits the same row, and a change of the stored format
(``CACHE_VERSION``) simply misses old rows. Calls are short and synchronous; the service runs
them in a worker thread so the event loop never waits on the disk.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

CACHE_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS search_cache (
    key TEXT PRIMARY KEY,
    query TEXT NOT NULL,
    max_results INTEGER NOT NULL,
    locale TEXT NOT NULL,
    results TEXT NOT NULL,
    created_at REAL NOT NULL
)
"""


def cache_key(query: str, max_results: int, locale: str) -> str:
    """``query`` is already whitespace-normalised; case is folded here."""
    material = json.dumps([CACHE_VERSION, query.casefold(), max_results, locale])
    return hashlib.sha256(material.encode("utf-8")).hexdigest()


class SearchCache:
    def __init__(
        self, path: str | Path, ttl_s: float, clock: Callable[[], float] = time.time
    ) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.ttl_s = ttl_s
        self._clock = clock
        self._lock = threading.Lock()
        # One connection shared by the worker threads, serialised by the lock.
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute(_SCHEMA)
        self.prune()

    def get(self, key: str) -> Any:
        with self._lock:
            row = self._db.execute(
                "SELECT results, created_at FROM search_cache WHERE key = ?", (key,)
            ).fetchone()
            if row is None:
                return None
            if self._expired(row[1]):
                self._db.execute("DELETE FROM search_cache WHERE key = ?", (key,))
                return None
        return json.loads(row[0])

    def put(self, key: str, query: str, max_results: int, locale: str, results: Any) -> None:
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO search_cache VALUES (?, ?, ?, ?, ?, ?)",
                (key, query, max_results, locale, json.dumps(results), self._clock()),
            )

    def prune(self) -> int:
        """Delete expired rows; returns how many."""
        with self._lock:
            cur = self._db.execute(
                "DELETE FROM search_cache WHERE created_at < ?", (self._clock() - self.ttl_s,)
            )
            return cur.rowcount

    def count(self) -> int:
        with self._lock:
            return self._db.execute("SELECT COUNT(*) FROM search_cache").fetchone()[0]

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _expired(self, created_at: float) -> bool:
        return self._clock() - created_at > self.ttl_s
