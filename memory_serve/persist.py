"""Where ``/save_memory``, ``/load_memory`` and ``/batch_evaluate`` may read and write.

Safe by default: a client names paths, the server decides whether they are acceptable.

- ``persist.allowed_root: null`` (default): paths must lie under ``$MIA_HOME/memory/backups``
  or ``$MIA_HOME/runs`` (where TTRL runs keep their evaluation files and memory copies).
- ``persist.allowed_root: /some/folder``: paths must lie under that folder.
- ``persist.allowed_root: any``: the explicit opt-out; any path the server user can write.

Relative paths resolve under the first root (``$MIA_HOME/memory/backups`` unless a folder is
configured), never under the server's working directory. ``..`` and symlinks are resolved before
the check, so neither can leave the root. ``ttrl.output_dir`` is the operator's own choice and is
always allowed. An existing file is only ever replaced by a memory backup when it is one itself
(a MIA memory database, a reference-layout JSON file, an ``evaluated-<rule>.jsonl`` written by
``/batch_evaluate``); the live database is never a target. Error messages show paths as the
client gave them, never the server's absolute paths.

A path longer than ``MAX_PATH_CHARS``, with a name over ``MAX_NAME_BYTES`` or a control
character, or one the OS cannot resolve is a 422 before the file system is touched; an OS error
on an acceptable path is a 400 with the OS's reason only.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from memory_serve.records import MODALITIES
from mia.http import ApiError
from mia.paths import mia_home

ANY = "any"
SQLITE_MAGIC = b"SQLite format 3\x00"
MEMORY_TABLES = {"meta", "memories", "plan_pairs", "rollouts"}
MAX_PATH_CHARS = 1024  # as the client sends it
MAX_NAME_BYTES = 255  # one file or folder name (NAME_MAX on Linux and macOS)
MAX_RESOLVED_BYTES = 4095  # the resolved absolute path (PATH_MAX less its NUL)


def invalid_path(why: str) -> ApiError:
    return ApiError(422, f"invalid path: {why}")


def check_raw_path(raw: str) -> None:
    """422 for a path no file system takes: checked before any OS call could fail on it."""
    if len(raw) > MAX_PATH_CHARS:
        raise invalid_path(f"{len(raw)} characters, at most {MAX_PATH_CHARS}")
    control = next((c for c in raw if ord(c) < 32 or ord(c) == 127), None)
    if control is not None:
        raise invalid_path(f"it holds the control character U+{ord(control):04X}")
    longest = max(len(part.encode("utf-8", "surrogatepass")) for part in raw.split("/"))
    if longest > MAX_NAME_BYTES:
        raise invalid_path(f"a file or folder name of {longest} bytes, at most {MAX_NAME_BYTES}")


def os_reason(err: OSError) -> str:
    """An OS error without the server path its ``str`` would show."""
    return err.strerror or type(err).__name__


def shown_in(raw: str, name: str) -> str:
    """How a file inside the client's folder ``raw`` is named in messages."""
    return f"{raw.rstrip('/')}/{name}"


@contextlib.contextmanager
def os_errors(shown: str) -> Iterator[None]:
    """An OS error on a client's path: 400 with the OS's reason, never the server's folders."""
    try:
        yield
    except OSError as err:
        raise ApiError(400, f"cannot use {shown}: {os_reason(err)}") from None


def default_roots() -> tuple[Path, Path]:
    home = mia_home()
    return home / "memory" / "backups", home / "runs"


@dataclass(frozen=True)
class PersistPolicy:
    """``base``: where relative paths resolve; ``roots``: allowed folders (None = anywhere)."""

    base: Path
    roots: tuple[Path, ...] | None

    @classmethod
    def from_config(cls, allowed_root: str | None, output_dir: str | None = None) -> PersistPolicy:
        backups, runs = default_roots()
        if allowed_root is None:
            base, roots = backups, (backups, runs)
        elif str(allowed_root).strip().lower() == ANY:
            base, roots = backups, None
        else:
            base = Path(allowed_root).expanduser()
            roots = (base,)
        base = base.resolve()
        if roots is not None:
            roots = tuple(r.resolve() for r in roots)
        if output_dir and roots is not None:
            # The operator chose this folder for the service's files: always writable.
            out = Path(output_dir).expanduser()
            roots = (*roots, (out if out.is_absolute() else base / out).resolve())
        return cls(base, roots)

    def resolve(self, raw: str) -> Path:
        """The server path for a client's ``raw`` path; 422 if unusable, 403 if outside."""
        check_raw_path(raw)
        try:
            path = Path(raw).expanduser()
            path = (path if path.is_absolute() else self.base / path).resolve()
        except (ValueError, RuntimeError, OSError) as err:
            # The OS's reason only: a RuntimeError's text (symlink loop) names server folders.
            reason = getattr(err, "strerror", None) or "an unknown ~user or a symlink loop"
            raise ApiError(422, f"invalid path {raw[:200]!r}: {reason}") from None
        if len(str(path).encode("utf-8", "surrogatepass")) > MAX_RESOLVED_BYTES:
            raise invalid_path(f"over {MAX_RESOLVED_BYTES} bytes once resolved")
        if self.roots is not None and not any(path.is_relative_to(r) for r in self.roots):
            raise ApiError(
                403,
                f"path {raw[:200]!r} is outside the persistence folder (persist.allowed_root)",
                "path_not_allowed",
            )
        return path


# ----------------------------------------------------------------------------- overwrite guard


def refuse(shown: str, why: str) -> ApiError:
    return ApiError(409, f"refusing to overwrite {shown}: {why}", "not_a_backup")


def is_memory_database(path: Path) -> bool:
    """A SQLite file holding MIA's memory tables (read-only look, no journal touched)."""
    try:
        with path.open("rb") as f:
            if f.read(len(SQLITE_MAGIC)) != SQLITE_MAGIC:
                return False
        conn = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)
        try:
            conn.execute("PRAGMA trusted_schema=OFF")
            names = {
                r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")
            }
        finally:
            conn.close()
    except (OSError, sqlite3.Error):
        return False
    return names >= MEMORY_TABLES


def is_reference_json(path: Path) -> bool:
    """A JSON file in the reference layout ``{modality: {category: [entries]}}``."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return (
        isinstance(data, dict)
        and set(data) <= set(MODALITIES)
        and all(isinstance(v, dict) for v in data.values())
    )


def is_evaluation_file(path: Path, rule: str) -> bool:
    """A ``/batch_evaluate`` JSONL file of ``rule`` (or an empty file)."""
    try:
        with path.open("r", encoding="utf-8") as f:
            first = f.readline()
    except (OSError, UnicodeDecodeError):
        return False
    if not first.strip():
        return path.stat().st_size == 0
    try:
        row = json.loads(first)
    except ValueError:
        return False
    return isinstance(row, dict) and row.get("rule") == rule


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.exists() and b.exists() and a.samefile(b)
    except OSError:
        return False


def check_target(path: Path, kind: str, shown: str, live_db: Path) -> None:
    """409 unless writing ``kind`` (``sqlite`` or ``json``) to ``path`` replaces nothing but a
    memory backup of that kind. The live database (and its WAL files) is never a target."""
    live = [
        live_db,
        live_db.with_name(live_db.name + "-wal"),
        live_db.with_name(live_db.name + "-shm"),
    ]
    if any(path == p or _same_file(path, p) for p in live):
        raise refuse(shown, "it is the live memory database")
    with os_errors(shown):
        if not path.exists() and not path.is_symlink():
            return
        if not path.is_file():
            raise refuse(shown, "it exists and is not a file")
        ok = is_memory_database(path) if kind == "sqlite" else is_reference_json(path)
    if not ok:
        what = "a MIA memory database" if kind == "sqlite" else "a reference-layout memory file"
        raise refuse(shown, f"it exists and is not {what}")


def check_folder(path: Path, shown: str) -> None:
    with os_errors(shown):
        if path.exists() and not path.is_dir():
            raise refuse(shown, "it exists and is not a folder")


def check_evaluation_target(path: Path, rule: str, shown: str) -> None:
    with os_errors(shown):
        if not path.exists() and not path.is_symlink():
            return
        if not path.is_file() or not is_evaluation_file(path, rule):
            raise refuse(shown, f"it exists and is not an evaluated-{rule} file of /batch_evaluate")
