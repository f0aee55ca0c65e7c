"""The proxy's tasks: one per conversation, kept with its plan, memories and answers in a small
SQLite file of its own until the client reports the outcome; and how a conversation is named,
given its plan, and turned into the trajectory memory stores."""

from __future__ import annotations

import contextlib
import hashlib
import json
import sqlite3
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memory_serve.config import ProxyConfig
from mia.trace import content_text

_TASKS_SCHEMA = """
CREATE TABLE IF NOT EXISTS tasks (
    task_id TEXT PRIMARY KEY,
    conv_key TEXT NOT NULL,
    question TEXT NOT NULL,
    plan TEXT NOT NULL DEFAULT '',
    injection TEXT NOT NULL DEFAULT '',
    memory_ids TEXT NOT NULL DEFAULT '[]',
    messages TEXT NOT NULL DEFAULT '[]',
    model TEXT NOT NULL DEFAULT '',
    turns INTEGER NOT NULL DEFAULT 0,
    status TEXT NOT NULL DEFAULT 'open',
    result TEXT,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS tasks_conv ON tasks (conv_key, created_at);
CREATE INDEX IF NOT EXISTS tasks_updated ON tasks (updated_at);
CREATE TABLE IF NOT EXISTS completions (
    completion_id TEXT PRIMARY KEY,
    task_id TEXT NOT NULL
);
"""


@dataclass
class Task:
    task_id: str
    conv_key: str
    question: str
    plan: str = ""
    injection: str = ""
    memory_ids: list[int] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    model: str = ""
    turns: int = 0
    status: str = "open"  # open | failed (the last exchange did) | recording | recorded
    result: dict[str, Any] | None = None
    created_at: float = 0.0


class TaskStore:
    """Open tasks (and which completion ids belong to them) in their own SQLite file."""

    def __init__(self, path: str | Path, ttl_s: float) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.ttl_s = ttl_s
        self._lock = threading.Lock()
        self._conn = sqlite3.connect(str(self.path), check_same_thread=False, timeout=30.0)
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.executescript(_TASKS_SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    _COLS = (
        "task_id, conv_key, question, plan, injection, memory_ids, messages, model, turns, "
        "status, result, created_at"
    )

    @staticmethod
    def _task(row: tuple[Any, ...]) -> Task:
        return Task(
            task_id=row[0],
            conv_key=row[1],
            question=row[2],
            plan=row[3],
            injection=row[4],
            memory_ids=json.loads(row[5]),
            messages=json.loads(row[6]),
            model=row[7],
            turns=int(row[8]),
            status=row[9],
            result=json.loads(row[10]) if row[10] else None,
            created_at=float(row[11]),
        )

    def create(self, task: Task) -> None:
        now = time.time()
        with self._lock, self._conn:
            self._conn.execute(
                "DELETE FROM completions WHERE task_id IN "
                "(SELECT task_id FROM tasks WHERE updated_at < ?)",
                (now - self.ttl_s,),
            )
            self._conn.execute("DELETE FROM tasks WHERE updated_at < ?", (now - self.ttl_s,))
            self._conn.execute(
                f"INSERT INTO tasks ({self._COLS}, updated_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    task.task_id,
                    task.conv_key,
                    task.question,
                    task.plan,
                    task.injection,
                    json.dumps(task.memory_ids),
                    "[]",
                    task.model,
                    0,
                    "open",
                    None,
                    now,
                    now,
                ),
            )

    def get(self, task_id: str) -> Task | None:
        with self._lock:
            row = self._conn.execute(
                f"SELECT {self._COLS} FROM tasks WHERE task_id = ?", (task_id,)
            ).fetchone()
        return self._task(row) if row else None

    def by_completion(self, completion_id: str) -> Task | None:
        with self._lock:
            row = self._conn.execute(
                "SELECT task_id FROM completions WHERE completion_id = ?", (completion_id,)
            ).fetchone()
        return self.get(row[0]) if row else None

    def latest(self, conv_key: str) -> Task | None:
        """The newest task of a conversation (a repeated first message starts a new one)."""
        with self._lock:
            row = self._conn.execute(
                f"SELECT {self._COLS} FROM tasks WHERE conv_key = ? "
                "ORDER BY created_at DESC, rowid DESC LIMIT 1",
                (conv_key,),
            ).fetchone()
        return self._task(row) if row else None

    def add_turn(
        self, task_id: str, messages: list[dict[str, Any]], completion_id: str | None
    ) -> None:
        """The conversation so far, ending with the model's latest answer (a failed task whose
        turn is retried successfully is open again)."""
        with self._lock, self._conn:
            self._conn.execute(
                "UPDATE tasks SET messages = ?, turns = turns + 1, status = 'open', "
                "updated_at = ? WHERE task_id = ? AND status IN ('open', 'failed')",
                (json.dumps(messages, ensure_ascii=False), time.time(), task_id),
            )
            if completion_id:
                self._conn.execute(
                    "INSERT OR REPLACE INTO completions (completion_id, task_id) VALUES (?, ?)",
                    (completion_id, task_id),
                )

    def fail(self, task_id: str) -> None:
        """The latest exchange with the upstream failed; the answers before it stay."""
        with self._lock, self._conn:
            self._conn.execute(
                "UPDATE tasks SET status = 'failed', updated_at = ? "
                "WHERE task_id = ? AND status IN ('open', 'failed')",
                (time.time(), task_id),
            )

    def claim(self, task_id: str) -> bool:
        """open/failed -> recording; False when another feedback got there first."""
        with self._lock, self._conn:
            cur = self._conn.execute(
                "UPDATE tasks SET status = 'recording' "
                "WHERE task_id = ? AND status IN ('open', 'failed')",
                (task_id,),
            )
            return cur.rowcount == 1

    def finish(self, task_id: str, result: dict[str, Any] | None, before: str = "open") -> None:
        """recording -> recorded (with the write's result), or back to ``before`` (None: the
        write failed)."""
        with self._lock, self._conn:
            if result is None:
                self._conn.execute(
                    "UPDATE tasks SET status = ? WHERE task_id = ?", (before, task_id)
                )
            else:
                self._conn.execute(
                    "UPDATE tasks SET status = 'recorded', result = ?, updated_at = ? "
                    "WHERE task_id = ?",
                    (json.dumps(result), time.time(), task_id),
                )


def tasks_path(cfg: ProxyConfig, db_path: Path) -> Path:
    """The task file: ``proxy.tasks_db``, else ``<store>-proxy.sqlite`` beside the store."""
    return Path(cfg.tasks_db) if cfg.tasks_db else db_path.with_name(f"{db_path.stem}-proxy.sqlite")


# ----------------------------------------------------------------------------- messages


def conversation_key(messages: list[dict[str, Any]], first_user: int) -> str:
    """A conversation is named by its messages up to and including the first user message."""
    prefix = [
        {"role": m.get("role"), "content": m.get("content")} for m in messages[: first_user + 1]
    ]
    return hashlib.sha256(json.dumps(prefix, sort_keys=True).encode()).hexdigest()


def inject(messages: list[dict[str, Any]], at: int, block: str) -> list[dict[str, Any]]:
    """``messages`` with ``block`` appended to message ``at`` (a copy)."""
    out = [dict(m) for m in messages]
    content = out[at].get("content")
    if isinstance(content, list):
        out[at]["content"] = [*content, {"type": "text", "text": "\n\n" + block}]
    else:
        out[at]["content"] = f"{content or ''}\n\n{block}"
    return out


def _tool_call_text(call: dict[str, Any]) -> str:
    fn = call.get("function") or {}
    args: Any = fn.get("arguments", "")
    with contextlib.suppress(ValueError):
        args = json.loads(args) if isinstance(args, str) and args else args
    return f"<tool_call>{json.dumps({'name': fn.get('name', ''), 'arguments': args})}</tool_call>"


def trajectory_messages(messages: list[dict[str, Any]], first_user: int) -> list[dict[str, Any]]:
    """The conversation after the task's first user message, in the Executor's text layout
    that the trace formatter and the rule summariser read: tool calls as ``<tool_call>`` JSON,
    the final answer in ``<answer>`` (when the model did not tag it itself)."""
    out: list[dict[str, Any]] = []
    rest = messages[first_user + 1 :]
    for i, m in enumerate(rest):
        role = m.get("role")
        text = content_text(m.get("content"))
        if role == "assistant":
            calls = [c for c in m.get("tool_calls") or [] if isinstance(c, dict)]
            if calls:
                text = "\n".join([text, *(_tool_call_text(c) for c in calls)]).strip()
            elif i == len(rest) - 1 and "<answer>" not in text:
                text = f"<answer>{text.strip()}</answer>"
            out.append({"role": "assistant", "content": text})
        elif role in ("tool", "user", "function"):
            out.append({"role": "user" if role == "user" else "tool", "content": text})
    return out
