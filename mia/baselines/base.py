"""What every memory baseline shares: the interface the harness talks to, the SQLite item
store with embeddings, and tolerant JSON parsing of LLM replies.

The interface is the one ``mia`` has through memory_serve: **retrieve** for a question (a text
context for the Planner or the Executor, and the ids of the trajectories it came from) and
**write** a finished, judged trajectory. A write runs its LLM calls first and then applies all
of its edits (and a ``writes`` row naming the question) in one SQLite transaction, so a crash
leaves either the whole write or none of it, and :meth:`ItemStore.find` tells a resumed run
which questions are already in memory.
"""

from __future__ import annotations

import asyncio
import json
import re
import sqlite3
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

import numpy as np

from mia.embedding import Embedder
from mia.llm.base import ChatBackend, LLMError, Message, SamplingParams
from mia.llm.think import strip_think


@dataclass
class Finished:
    """A finished, judged trajectory (what the harness writes after each question)."""

    data_id: str
    question: str
    plan: str
    trace: str  # the Executor's formatted trace (mia.trace.format_trace)
    answer: str
    correct: bool
    image_caption: str = ""
    source: str = ""

    @property
    def outcome(self) -> str:
        return "correct" if self.correct else "incorrect"


@dataclass
class Retrieval:
    """What a question gets from memory. ``context`` is empty when nothing was found (the
    Executor then runs without a guide, as ``rag`` on an empty memory); ``origins`` are the
    write ids of the trajectories the shown items came from (``used_memory_ids`` of a row)."""

    context: str
    item_ids: list[int] = field(default_factory=list)
    origins: list[int] = field(default_factory=list)

    @classmethod
    def of(cls, context: str, shown: Sequence[Item]) -> Retrieval:
        """``context`` made of the ``shown`` items: their ids, and the writes they came from."""
        return cls(context, [it.id for it in shown], unique(it.origin for it in shown))


@dataclass
class WriteResult:
    """One write: its id (the receipt's ``memory_id``), the edits it made, and how many LLM
    replies could not be parsed (each turned into a no-op)."""

    write_id: int
    ops: dict[str, int] = field(default_factory=dict)
    junk: int = 0


class BaselineMemory(Protocol):
    """A memory baseline behind the harness. ``planner``: its context feeds a Planner (expel,
    memento) rather than the Executor's guide slot (mem0, amem, reasoningbank)."""

    name: str
    planner: bool

    async def retrieve(self, question: str, image_caption: str = "") -> Retrieval: ...

    async def write(self, item: Finished) -> WriteResult: ...

    def find(self, data_ids: Sequence[str], source: str) -> dict[str, int]: ...

    def clear(self) -> None: ...

    def stats(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


# ----------------------------------------------------------------------------- JSON replies

_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.S | re.I)


def parse_json(text: str) -> Any | None:
    """The JSON value in an LLM reply, or None: the whole reply, a fenced block, or the first
    balanced ``{...}`` / ``[...]`` span that parses (small models wrap JSON in prose)."""
    text = strip_think(text or "").strip()
    candidates = [text, *(m.group(1).strip() for m in _FENCE.finditer(text))]
    for c in candidates:
        try:
            return json.loads(c)
        except ValueError:
            pass
    for start, ch in enumerate(text):
        if ch not in "{[":
            continue
        close = "}" if ch == "{" else "]"
        depth = 0
        in_str = esc = False
        for end in range(start, len(text)):
            c = text[end]
            if in_str:
                if esc:
                    esc = False
                elif c == "\\":
                    esc = True
                elif c == '"':
                    in_str = False
            elif c == '"':
                in_str = True
            elif c == ch:
                depth += 1
            elif c == close:
                depth -= 1
                if depth == 0:
                    try:
                        return json.loads(text[start : end + 1])
                    except ValueError:
                        break
    return None


def str_list(value: Any) -> list[str]:
    """A list of non-empty strings from whatever the LLM put there (a string becomes [it])."""
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        return []
    return [str(v).strip() for v in value if isinstance(v, str | int | float) and str(v).strip()]


def caption_line(image_caption: str) -> str:
    """The ``Image caption: ...`` line a prompt shows after the question ('' for none)."""
    return f"\nImage caption: {image_caption}" if image_caption else ""


def cut(text: str, limit: int) -> str:
    """``text`` cut in the middle to ``limit`` characters (0: no cut)."""
    if limit <= 0 or len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - limit} characters omitted ...]\n{text[-half:]}"


class LLMCaller:
    """One LLM role with counters: every reply that is not the JSON asked for counts as junk
    (the caller falls back to a no-op), an LLM failure propagates (the harness records a
    failed write)."""

    def __init__(self, backend: ChatBackend, max_tokens: int | None = None) -> None:
        self.backend = backend
        self.max_tokens = max_tokens
        self.calls = 0
        self.junk = 0

    async def text(self, prompt: str, system: str | None = None) -> str:
        messages: list[Message] = []
        if system:
            messages.append({"role": "system", "content": system})
        messages.append({"role": "user", "content": prompt})
        params = None
        if self.max_tokens is not None:
            defaults = getattr(self.backend, "defaults", None)
            base = defaults if isinstance(defaults, SamplingParams) else SamplingParams()
            params = SamplingParams(**{**base.__dict__, "max_tokens": self.max_tokens})
        self.calls += 1
        result = await self.backend.chat(messages, params)
        return result.text

    async def json(self, prompt: str, system: str | None = None) -> Any | None:
        """The parsed reply, or None (counted in ``junk``)."""
        value = parse_json(await self.text(prompt, system))
        if value is None:
            self.junk += 1
        return value


# ----------------------------------------------------------------------------- the store


@dataclass
class Item:
    id: int
    kind: str
    text: str
    data: dict[str, Any]
    origin: int
    created: float
    updated: float


SCHEMA = """
CREATE TABLE IF NOT EXISTS items (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL,
    text TEXT NOT NULL,
    data TEXT NOT NULL,
    vec BLOB NOT NULL,
    origin INTEGER NOT NULL,
    created REAL NOT NULL,
    updated REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS items_kind ON items(kind);
CREATE TABLE IF NOT EXISTS writes (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    data_id TEXT NOT NULL,
    source TEXT NOT NULL,
    correct INTEGER NOT NULL,
    ops TEXT NOT NULL,
    junk INTEGER NOT NULL,
    created REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS writes_data_id ON writes(data_id, source);
"""


class Tx:
    """The edits of one write, applied on commit of :meth:`ItemStore.transaction`."""

    def __init__(self, store: ItemStore, con: sqlite3.Connection, write_id: int) -> None:
        self.store = store
        self.con = con
        self.write_id = write_id
        self.ops: dict[str, int] = {}

    def count(self, op: str, n: int = 1) -> None:
        self.ops[op] = self.ops.get(op, 0) + n

    def result(self) -> WriteResult:
        """What the write answers: its id, its edits and its junk replies."""
        return WriteResult(self.write_id, dict(self.ops), self.ops.get("junk", 0))

    def add(self, kind: str, text: str, vec: np.ndarray, data: dict[str, Any] | None = None) -> int:
        now = time.time()
        cur = self.con.execute(
            "INSERT INTO items (kind, text, data, vec, origin, created, updated) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            (kind, text, json.dumps(data or {}), _blob(vec), self.write_id, now, now),
        )
        return int(cur.lastrowid or 0)

    def update(
        self,
        item_id: int,
        *,
        text: str | None = None,
        data: dict[str, Any] | None = None,
        vec: np.ndarray | None = None,
        origin: bool = True,
    ) -> None:
        """Change an item; ``origin``: it now comes from this write too (newest wins)."""
        sets, args = ["updated = ?"], [time.time()]
        for col, value in (
            ("text", text),
            ("data", None if data is None else json.dumps(data)),
            ("vec", None if vec is None else _blob(vec)),
        ):
            if value is not None:
                sets.append(f"{col} = ?")
                args.append(value)
        if origin:
            sets.append("origin = ?")
            args.append(self.write_id)
        self.con.execute(f"UPDATE items SET {', '.join(sets)} WHERE id = ?", (*args, item_id))

    def delete(self, item_id: int) -> None:
        self.con.execute("DELETE FROM items WHERE id = ?", (item_id,))


def _blob(vec: np.ndarray) -> bytes:
    return np.asarray(vec, dtype=np.float32).reshape(-1).tobytes()


class ItemStore:
    """Items (facts, notes, insights, cases, strategies) with one embedding each, in SQLite.
    Similarity search is exact (cosine on unit vectors) over the items of one kind."""

    def __init__(self, path: str | Path, embedder: Embedder) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.embedder = embedder
        self.con = sqlite3.connect(str(self.path), isolation_level=None)
        self.con.execute("PRAGMA journal_mode=WAL")
        self.con.executescript(SCHEMA)
        self._lock = asyncio.Lock()  # one write at a time: edits see the previous write

    @property
    def write_lock(self) -> asyncio.Lock:
        return self._lock

    async def embed(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.embedder.dim), dtype=np.float32)
        return await asyncio.to_thread(self.embedder.encode, texts)

    # ---- reads
    def _rows(self, sql: str, args: Iterable[Any] = ()) -> list[Item]:
        return [
            Item(r[0], r[1], r[2], json.loads(r[3]), r[4], r[5], r[6])
            for r in self.con.execute(sql, tuple(args))
        ]

    def items(self, kind: str) -> list[Item]:
        cols = "id, kind, text, data, origin, created, updated"
        return self._rows(f"SELECT {cols} FROM items WHERE kind = ? ORDER BY id", (kind,))

    def get(self, item_id: int) -> Item | None:
        cols = "id, kind, text, data, origin, created, updated"
        rows = self._rows(f"SELECT {cols} FROM items WHERE id = ?", (item_id,))
        return rows[0] if rows else None

    def count(self, kind: str) -> int:
        row = self.con.execute("SELECT COUNT(*) FROM items WHERE kind = ?", (kind,)).fetchone()
        return int(row[0])

    def search(
        self,
        kind: str,
        vec: np.ndarray,
        k: int,
        *,
        min_score: float | None = None,
        where: Any = None,
    ) -> list[tuple[Item, float]]:
        """The ``k`` items of ``kind`` most similar to ``vec`` (ties: older first); ``where``
        filters items first (a predicate on :class:`Item`)."""
        if k <= 0:
            return []
        cols = "id, kind, text, data, origin, created, updated, vec"
        found = []
        for r in self.con.execute(f"SELECT {cols} FROM items WHERE kind = ? ORDER BY id", (kind,)):
            item = Item(r[0], r[1], r[2], json.loads(r[3]), r[4], r[5], r[6])
            if where is not None and not where(item):
                continue
            found.append((item, np.frombuffer(r[7], dtype=np.float32)))
        if not found:
            return []
        mat = np.stack([v for _, v in found])
        scores = mat @ np.asarray(vec, dtype=np.float32).reshape(-1)
        order = sorted(range(len(found)), key=lambda i: (-float(scores[i]), found[i][0].id))
        out = [(found[i][0], float(scores[i])) for i in order]
        if min_score is not None:
            out = [(it, s) for it, s in out if s >= min_score]
        return out[:k]

    # ---- writes
    @contextmanager
    def transaction(self, item: Finished) -> Iterator[Tx]:
        """``with store.transaction(item) as tx: tx.add(...)``: every edit and the ``writes``
        row commit together (or not at all)."""
        con = self.con
        con.execute("BEGIN IMMEDIATE")
        try:
            cur = con.execute(
                "INSERT INTO writes (data_id, source, correct, ops, junk, created) "
                "VALUES (?, ?, ?, '{}', 0, ?)",
                (item.data_id, item.source, int(item.correct), time.time()),
            )
            tx = Tx(self, con, int(cur.lastrowid or 0))
            yield tx
            con.execute(
                "UPDATE writes SET ops = ?, junk = ? WHERE id = ?",
                (json.dumps(tx.ops, sort_keys=True), tx.ops.get("junk", 0), tx.write_id),
            )
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise

    def find(self, data_ids: Sequence[str], source: str) -> dict[str, int]:
        """data_id -> write id of the questions already written with this source."""
        out: dict[str, int] = {}
        for data_id in data_ids:
            row = self.con.execute(
                "SELECT id FROM writes WHERE data_id = ? AND source = ? ORDER BY id DESC LIMIT 1",
                (data_id, source),
            ).fetchone()
            if row is not None:
                out[data_id] = int(row[0])
        return out

    def writes(self) -> list[dict[str, Any]]:
        rows = self.con.execute("SELECT id, data_id, source, correct, ops, junk FROM writes")
        return [
            {"id": r[0], "data_id": r[1], "source": r[2], "correct": bool(r[3]),
             "ops": json.loads(r[4]), "junk": r[5]}
            for r in rows
        ]  # fmt: skip

    def clear(self) -> None:
        self.con.execute("DELETE FROM items")
        self.con.execute("DELETE FROM writes")

    def close(self) -> None:
        self.con.close()


C = TypeVar("C")


class StoreMemory(Generic[C]):
    """Shared plumbing of the baselines: the store, the LLM caller, the baseline's own config
    section (``cfg``), the trace cut, and the steps every retrieve and write take."""

    name = "baseline"
    planner = False
    kinds: tuple[str, ...] = ()

    def __init__(
        self, store: ItemStore, llm: LLMCaller, cfg: C, trace_max_chars: int = 4000
    ) -> None:
        self.store = store
        self.llm = llm
        self.cfg = cfg
        self.trace_max_chars = trace_max_chars

    def find(self, data_ids: Sequence[str], source: str) -> dict[str, int]:
        return self.store.find(data_ids, source)

    def clear(self) -> None:
        self.store.clear()

    def stats(self) -> dict[str, Any]:
        writes = self.store.writes()
        ops: dict[str, int] = {}
        for w in writes:
            for op, n in w["ops"].items():
                ops[op] = ops.get(op, 0) + int(n)
        return {
            "baseline": self.name,
            "items": {k: self.store.count(k) for k in self.kinds},
            "writes": len(writes),
            "ops": dict(sorted(ops.items())),
            "llm_calls": self.llm.calls,
            "llm_junk": self.llm.junk,
        }

    def close(self) -> None:
        self.store.close()

    def trace_text(self, item: Finished) -> str:
        return cut(item.trace, self.trace_max_chars)

    async def retrieve(self, question: str, image_caption: str = "") -> Retrieval:
        """The ``cfg.top_k`` items of the baseline's kind nearest to the question (scoring at
        least ``cfg.min_score`` where the config has one), laid out by :meth:`show`; an empty
        context when there are none. (ExpeL, with two kinds, retrieves its own way.)"""
        hits = await self.nearest(
            self.kinds[0],
            question,
            image_caption,
            self.cfg.top_k,  # type: ignore[attr-defined]
            min_score=getattr(self.cfg, "min_score", None),
        )
        return self.show(hits) if hits else Retrieval("")

    def show(self, hits: list[Item]) -> Retrieval:
        """The context of the retrieved items (most similar first)."""
        raise NotImplementedError

    async def embed1(self, text: str) -> np.ndarray:
        return (await self.store.embed([text]))[0]

    async def nearest(
        self,
        kind: str,
        question: str,
        image_caption: str,
        k: int,
        *,
        min_score: float | None = None,
        where: Any = None,
    ) -> list[Item]:
        """The ``k`` items of ``kind`` nearest to a question (:meth:`ItemStore.search`)."""
        vec = await self.embed1(query_text(question, image_caption))
        hits = self.store.search(kind, vec, k, min_score=min_score, where=where)
        return [it for it, _ in hits]

    async def embed_texts(
        self, entries: Sequence[dict[str, Any]]
    ) -> tuple[list[str], dict[str, np.ndarray]]:
        """The stripped ``text`` of each LLM edit ('' for none) and the embedding of each
        non-empty one, computed before the write's transaction opens."""
        texts = [str(e.get("text") or "").strip() for e in entries]
        given = [t for t in texts if t]
        vecs = await self.store.embed(given)
        return texts, dict(zip(given, vecs, strict=True))

    @contextmanager
    def transaction(self, item: Finished, junk: int = 0) -> Iterator[Tx]:
        """:meth:`ItemStore.transaction` for ``item`` with its ``junk`` replies counted;
        ``tx.result()`` after the block is the write's answer."""
        with self.store.transaction(item) as tx:
            if junk:
                tx.count("junk", junk)
            yield tx


def query_text(question: str, image_caption: str = "") -> str:
    """The text a question is looked up by (its image caption appended when there is one)."""
    return f"{question}\n{image_caption}".strip() if image_caption else question


def unique(ids: Iterable[int]) -> list[int]:
    out: list[int] = []
    for i in ids:
        if i not in out:
            out.append(i)
    return out


__all__ = [
    "BaselineMemory",
    "Finished",
    "Item",
    "ItemStore",
    "LLMCaller",
    "LLMError",
    "Retrieval",
    "StoreMemory",
    "WriteResult",
    "caption_line",
    "cut",
    "parse_json",
    "query_text",
    "str_list",
    "unique",
]
