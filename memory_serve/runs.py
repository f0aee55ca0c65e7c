"""Runs for the inspector's Runs tab: TTRL curves and ``mia eval`` tables found under a folder.

A TTRL run writes ``accuracy.jsonl`` (one row per batch, ``ttrl/curve.py``); an evaluation writes
``summary.json`` (``{"policies": [...]}``, ``mia/eval/report.py``). Both are found by name under
the runs folder (hidden folders skipped, depth and count bounded) and read as plain JSON: only
numbers and short labels go to the page (per-question detail stays on disk).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from mia.http import ApiError

RUN_FILES = {"accuracy.jsonl": "ttrl", "summary.json": "eval"}
MAX_DEPTH = 6
MAX_RUNS = 500
MAX_FILE_BYTES = 32 * 1024 * 1024
MAX_ROWS = 10_000


def _scalar(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    return (
        value is None
        or isinstance(value, bool | int)
        or (isinstance(value, str) and len(value) <= 200)
    )


def _flat(row: Any) -> dict[str, Any]:
    """The row's scalar fields (numbers, short strings); nested detail is left out."""
    if not isinstance(row, dict):
        return {}
    return {str(k): v for k, v in row.items() if _scalar(v)}


def find_runs(root: Path) -> tuple[list[dict[str, Any]], bool]:
    """``(runs newest first, truncated)``; each ``{id, kind, name, modified}``."""
    found: list[dict[str, Any]] = []
    truncated = False
    if not root.is_dir():
        return found, truncated
    base_depth = len(root.parts)
    for folder, dirs, files in os.walk(root):
        here = Path(folder)
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        if len(here.parts) - base_depth >= MAX_DEPTH:
            dirs[:] = []
        for name, kind in RUN_FILES.items():
            if name not in files:
                continue
            if len(found) >= MAX_RUNS:
                truncated = True
                break
            path = here / name
            rel = path.relative_to(root)
            label = str(rel.parent) if rel.parent != Path(".") else root.name
            try:
                modified = path.stat().st_mtime
            except OSError:
                continue
            found.append({"id": rel.as_posix(), "kind": kind, "name": label, "modified": modified})
    found.sort(key=lambda r: (-r["modified"], r["id"]))
    return found, truncated


def resolve_run(root: Path, run_id: str) -> tuple[Path, str]:
    """The run file named by ``run_id`` (a path under ``root``), and its kind; 4xx otherwise."""
    if not run_id or any(ord(ch) < 32 for ch in run_id):
        raise ApiError(400, f"not a run id: {run_id[:200]!r}", "bad_run_id")
    rel = Path(run_id)
    if rel.is_absolute() or ".." in rel.parts or rel.name not in RUN_FILES:
        raise ApiError(400, f"not a run id: {run_id[:200]!r}", "bad_run_id")
    path = root / rel
    try:
        inside = path.resolve().is_relative_to(root.resolve()) and path.is_file()
    except (OSError, ValueError):
        inside = False
    if not inside:
        raise ApiError(404, f"no run {run_id[:200]!r} under the runs folder", "no_such_run")
    return path, RUN_FILES[rel.name]


def load_run(root: Path, run_id: str) -> dict[str, Any]:
    path, kind = resolve_run(root, run_id)
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise ApiError(413, f"run file {run_id!r} is over {MAX_FILE_BYTES} bytes")
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        reason = getattr(err, "strerror", None) or type(err).__name__
        raise ApiError(400, f"cannot read run {run_id!r}: {reason}") from None
    try:
        if kind == "ttrl":
            rows = [_flat(json.loads(line)) for line in text.splitlines() if line.strip()]
            rows = [r for r in rows if isinstance(r.get("batch"), int)]
            rows.sort(key=lambda r: r["batch"])
        else:
            data = json.loads(text)
            policies = data.get("policies") if isinstance(data, dict) else None
            rows = [_flat(p) for p in policies] if isinstance(policies, list) else []
    except ValueError as err:
        raise ApiError(400, f"run {run_id!r} is not valid JSON: {err}") from None
    rel = Path(run_id)
    return {
        "id": run_id,
        "kind": kind,
        "name": str(rel.parent) if rel.parent != Path(".") else root.name,
        "modified": path.stat().st_mtime,
        "rows": rows[:MAX_ROWS],
    }
