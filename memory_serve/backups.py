"""``/save_memory`` and ``/load_memory``: the store copied to files (a SQLite backup, a
reference-layout JSON file, or a folder with both) and replaced or merged from them.

Paths go through the service's :class:`~memory_serve.persist.PersistPolicy`; nothing but a
memory backup is ever overwritten, and a load replaces the store only when all of it succeeded
(:meth:`MemoryStore.rebuild`).
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

from memory_serve.persist import (
    PersistPolicy,
    check_folder,
    check_target,
    os_reason,
    shown_in,
)
from memory_serve.refjson import (
    export_plan_pairs,
    export_workflows,
    is_plan_layout,
    parse_plan_pairs,
    parse_workflows,
    read_json,
    write_json,
)
from memory_serve.store import MemoryStore
from mia.errors import MiaError
from mia.http import ApiError
from mia.services import memory as memory_api

SQLITE_SUFFIXES = (".sqlite", ".sqlite3", ".db")
JSON_SUFFIXES = (".json", ".jsonl")
DIR_SQLITE, DIR_WORKFLOWS, DIR_PLANS = "memory.sqlite", "workflow_memory.jsonl", "plan_memory.jsonl"


def format_of(path: Path, fmt: str) -> str:
    """``fmt``, or for ``auto`` the format the path's suffix names (a folder without one)."""
    if fmt != "auto":
        return fmt
    if path.suffix.lower() in SQLITE_SUFFIXES:
        return "sqlite"
    if path.suffix.lower() in JSON_SUFFIXES:
        return "json"
    return "dir"


class Backups:
    """Saving and loading one store. ``default_dir``: where a save without a path goes (the
    operator's ``ttrl.output_dir``)."""

    def __init__(self, store: MemoryStore, persist: PersistPolicy, default_dir: str | None):
        self.store = store
        self.persist = persist
        self.default_dir = default_dir

    # ------------------------------------------------------------------ save

    async def save(self, req: memory_api.SaveRequest) -> memory_api.SaveResponse:
        raw = req.path or self.default_dir
        if not raw:
            raise ApiError(400, "no path in the request and ttrl.output_dir is not set")
        path = self.persist.resolve(raw)
        fmt = "dir" if req.path is None and req.format == "auto" else format_of(path, req.format)
        self._check_targets(path, fmt, raw)
        try:
            files = await asyncio.to_thread(self._write, path, fmt)
        except OSError as err:
            raise ApiError(400, f"cannot save to {raw}: {os_reason(err)}") from None
        except sqlite3.Error as err:
            raise ApiError(400, f"cannot save to {raw}: {err}") from None
        return memory_api.SaveResponse(
            format=fmt,  # type: ignore[arg-type]
            files=files,
            memories=len(self.store),
            plan_pairs=len(self.store.plan_pairs()),
        )

    def _check_targets(self, path: Path, fmt: str, raw: str) -> None:
        """409 unless the save replaces nothing but memory backups (never the live database)."""
        live = self.store.db_path
        if fmt != "dir":
            check_target(path, fmt, raw, live)
            return
        check_folder(path, raw)
        for name, kind in ((DIR_SQLITE, "sqlite"), (DIR_WORKFLOWS, "json"), (DIR_PLANS, "json")):
            check_target(path / name, kind, shown_in(raw, name), live)

    def _write(self, path: Path, fmt: str) -> list[str]:
        """Write the copy; the files written."""
        store = self.store
        if fmt == "sqlite":
            return [str(store.backup(path))]
        if fmt == "json":
            write_json(path, export_workflows(store.records()))
            return [str(path)]
        path.mkdir(parents=True, exist_ok=True)
        store.backup(path / DIR_SQLITE)
        write_json(path / DIR_WORKFLOWS, export_workflows(store.records()))
        write_json(path / DIR_PLANS, export_plan_pairs(store.plan_pairs()))
        return [str(path / n) for n in (DIR_SQLITE, DIR_WORKFLOWS, DIR_PLANS)]

    # ------------------------------------------------------------------ load

    async def load(self, req: memory_api.LoadRequest) -> memory_api.LoadResponse:
        raw = req.path
        path = self.persist.resolve(raw)
        try:
            exists = path.exists()
        except OSError as err:  # e.g. a file name over the OS limit
            raise ApiError(400, f"cannot load {raw[:200]!r}: {os_reason(err)}") from None
        if not exists:
            raise ApiError(404, f"nothing to load at {raw}")
        fmt = format_of(path, req.format)
        if fmt == "dir" and not path.is_dir():
            raise ApiError(400, f"{raw} is not a folder (use format sqlite or json)")
        try:
            imported = await asyncio.to_thread(self._read, req, path, fmt)
        except OSError as err:
            raise ApiError(400, f"cannot load {raw}: {os_reason(err)}") from None
        except (MiaError, ValueError, TypeError, sqlite3.Error) as err:
            # ValueError covers text a JSON file holds that SQLite cannot store (UnicodeError).
            raise ApiError(400, str(err) or type(err).__name__) from None
        return memory_api.LoadResponse(
            format=fmt,  # type: ignore[arg-type]
            memories=len(self.store),
            plan_pairs=len(self.store.plan_pairs()),
            imported=imported,
        )

    def _read(self, req: memory_api.LoadRequest, path: Path, fmt: str) -> int:
        """Load ``path`` (of format ``fmt``) into the store; how many entries came in."""
        raw, store = req.path, self.store
        if fmt == "sqlite" or (fmt == "dir" and (path / DIR_SQLITE).is_file()):
            if req.mode != "replace":
                raise MiaError("a SQLite copy can only be loaded with mode=replace")
            src, shown = (
                (path / DIR_SQLITE, shown_in(raw, DIR_SQLITE)) if fmt == "dir" else (path, raw)
            )
            store.restore(src, reembed_on_mismatch=req.reembed, shown=shown)
            return len(store) + len(store.plan_pairs())
        if fmt == "json":
            return self._import_json([(path, raw)], req.mode)
        files = [
            (path / n, shown_in(raw, n)) for n in (DIR_WORKFLOWS, DIR_PLANS) if (path / n).is_file()
        ]
        if not files:
            raise MiaError(f"{raw} holds no {DIR_SQLITE}, {DIR_WORKFLOWS} or {DIR_PLANS}")
        return self._import_json(files, req.mode)

    def _import_json(self, files: list[tuple[Path, str]], mode: str) -> int:
        """Import reference-layout files (``(path, name shown)``), workflows or plan pairs."""
        # Everything is parsed before the store is touched, then written into a copy of the
        # store that replaces it only when the whole import succeeded.
        parsed = []
        for f, shown in files:
            data = read_json(f, shown)
            if is_plan_layout(data):
                parsed.append((parse_plan_pairs(data, shown), True))
            else:
                parsed.append((parse_workflows(data, shown), False))

        def fill(staging: MemoryStore) -> int:
            if mode == "replace":  # replace the kinds being loaded, keep the others
                staging.clear(
                    memories=any(not plans for _, plans in parsed),
                    plan_pairs=any(plans for _, plans in parsed),
                    rollouts=False,
                )
            n = 0
            for entries, plans in parsed:
                if plans:
                    n += staging.import_plan_pairs(entries)
                else:
                    n += len(staging.import_memories(entries, progress=True))
            return n

        return self.store.rebuild(fill, copy_live=True)
