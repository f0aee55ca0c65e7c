"""The run folder of one policy: results JSONL as the journal, memory-write receipts, manifest.

Crash safety (a killed ``mia eval`` resumes with the same command):

1. A question's row is appended to ``results.jsonl`` (flushed) *before* its memory is written.
   A question whose row exists (without ``error``) is never run again.
2. The memory write carries the question id as ``data_id`` and the run's ``source`` tag; its
   receipt (memory id, action) is then appended to ``memory_writes.jsonl``.
3. On resume, a row that should be in memory but has no receipt is in the crash window
   between 1 and 2: the harness asks memory_serve (``/memories/find``) whether a memory with
   that ``data_id`` and ``source`` exists and only writes it when it does not. So a crash at
   any point gives exactly one memory per answered question.

A process killed mid-line leaves a torn last line; :func:`read_jsonl` drops it (and truncates
the file to the last complete line, so later appends stay well-formed).
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mia.errors import MiaError
from mia.paths import atomic_write_text

RESULTS = "results.jsonl"
WRITES = "memory_writes.jsonl"
MANIFEST = "run.json"
FORMAT = "mia-eval-run"
VERSION = 1
# Manifest fields that must match for a resume (anything else may change between attempts).
PINNED = ("policy", "order", "batch_size", "dataset", "question_ids_sha")


def read_jsonl(path: Path, repair: bool = False) -> list[dict[str, Any]]:
    """Rows of a JSONL file; a torn last line (killed writer) is ignored, and with ``repair``
    cut off the file. A bad line elsewhere is corruption: one-line error."""
    if not path.exists():
        return []
    data = path.read_bytes()
    rows: list[dict[str, Any]] = []
    good_end = 0
    pos = 0
    lines = data.split(b"\n")
    for n, raw in enumerate(lines):
        is_last = n == len(lines) - 1
        end = pos + len(raw) + (0 if is_last else 1)
        if raw.strip():
            try:
                row = json.loads(raw)
                if not isinstance(row, dict):
                    raise ValueError("not an object")
            except ValueError:
                if is_last:
                    break  # torn tail: the writer died mid-line
                raise MiaError(f"{path} line {n + 1} is not valid JSON: delete or fix it") from None
            if is_last:
                break  # complete JSON but no newline yet: treat as torn, it is rewritten
            rows.append(row)
        good_end = end
        pos = end
    if repair and good_end < len(data):
        with path.open("r+b") as f:
            f.truncate(good_end)
    return rows


class Appender:
    """Append-only JSONL writer: one ``write`` + flush per row (a killed process loses at most
    the row being written, never an earlier one)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._f = path.open("a", encoding="utf-8")

    def append(self, row: dict[str, Any]) -> None:
        self._f.write(json.dumps(row, ensure_ascii=False) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


class RunJournal:
    """``results.jsonl`` + ``memory_writes.jsonl`` + ``run.json`` of one policy run."""

    def __init__(self, run_dir: Path) -> None:
        self.dir = run_dir
        self.results_path = run_dir / RESULTS
        self.writes_path = run_dir / WRITES
        self.manifest_path = run_dir / MANIFEST
        self.manifest: dict[str, Any] = {}
        self.rows: dict[str, dict[str, Any]] = {}  # last row per question id
        self.receipts: dict[str, dict[str, Any]] = {}  # question id -> memory receipt
        self._results: Appender | None = None
        self._writes: Appender | None = None

    # ------------------------------------------------------------------ open / resume
    def open(self, manifest: dict[str, Any], restart: bool = False) -> bool:
        """Start or resume; returns True when earlier rows were found (a resume)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        if restart:
            for p in (self.results_path, self.writes_path, self.manifest_path):
                p.unlink(missing_ok=True)
        old = self._read_manifest()
        if old is not None:
            for key in PINNED:
                if old.get(key) != manifest.get(key):
                    raise MiaError(
                        f"{self.dir} holds a run with {key}={old.get(key)!r}, not "
                        f"{manifest.get(key)!r}: use another --out, or --restart to discard it"
                    )
            self.manifest = old
        else:
            self.manifest = {
                "format": FORMAT,
                "version": VERSION,
                "run_id": uuid.uuid4().hex[:12],
                "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
                **manifest,
            }
            atomic_write_text(self.manifest_path, json.dumps(self.manifest, indent=2) + "\n")
        for row in read_jsonl(self.results_path, repair=True):
            self.rows[str(row["id"])] = row  # a retried question: the last row wins
        for rec in read_jsonl(self.writes_path, repair=True):
            self.receipts[str(rec["id"])] = rec
        self._results = Appender(self.results_path)
        self._writes = Appender(self.writes_path)
        return bool(self.rows)

    def _read_manifest(self) -> dict[str, Any] | None:
        if not self.manifest_path.exists():
            if self.results_path.exists() and self.results_path.stat().st_size:
                raise MiaError(f"{self.results_path} exists without {MANIFEST}: use --restart")
            return None
        try:
            data = json.loads(self.manifest_path.read_text())
        except ValueError:
            raise MiaError(f"{self.manifest_path} is not valid JSON: use --restart") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise MiaError(f"{self.manifest_path} is not a mia eval run manifest")
        return data

    @property
    def run_id(self) -> str:
        return str(self.manifest["run_id"])

    @property
    def source(self) -> str:
        """The ``source`` of this run's memories (the idempotency key is data_id + source)."""
        return f"eval:{self.run_id}"

    # ------------------------------------------------------------------ state
    def done(self, qid: str) -> bool:
        row = self.rows.get(qid)
        return row is not None and not row.get("error")

    def needs_write(self, qid: str) -> bool:
        row = self.rows.get(qid)
        return (
            row is not None
            and row.get("memory") == "pending"
            and not row.get("error")
            and qid not in self.receipts
        )

    def memory_owner(self) -> dict[int, str]:
        """memory id -> question id, for the memories this run wrote."""
        return {
            int(r["memory_id"]): qid
            for qid, r in self.receipts.items()
            if r.get("memory_id") is not None
        }

    # ------------------------------------------------------------------ appends
    def add_row(self, row: dict[str, Any]) -> None:
        assert self._results is not None
        self._results.append(row)
        self.rows[str(row["id"])] = row

    def add_receipt(self, receipt: dict[str, Any]) -> None:
        assert self._writes is not None
        self._writes.append(receipt)
        self.receipts[str(receipt["id"])] = receipt

    def close(self) -> None:
        for a in (self._results, self._writes):
            if a is not None:
                a.close()
        self._results = self._writes = None

    def ordered_rows(self, order: list[str]) -> Iterator[dict[str, Any]]:
        for qid in order:
            if qid in self.rows:
                yield self.rows[qid]


def fault_point(kind: str, count: int) -> None:
    """Fault injection for crash tests: ``MIA_EVAL_FAULT=after_row:N`` (or ``after_write:N``)
    kills this process with SIGKILL right after the N-th row (memory write) of this process,
    before the next journal step. Not for normal use."""
    spec = os.environ.get("MIA_EVAL_FAULT", "")
    if not spec:
        return
    want, _, n = spec.partition(":")
    if want == kind and n.isdigit() and int(n) == count:
        import signal

        os.kill(os.getpid(), signal.SIGKILL)
