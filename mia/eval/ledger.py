"""The ledger of test-world runs (docs/ledger.md, docs/protocol.md "Looks"): a Markdown table
that a test-protocol run appends a row to when it starts and another when it ends, under one
run id. Rows are only ever appended: :func:`append_row` opens the file for appending and
checks that it is a ledger (its header line is there) first.

    row = LedgerRow(run_id, utc_now(), git_commit(root), "configs/efficacy/protocol.yaml v1",
                    "c69b1a99..., 8392a0ad...", "`python bench/efficacy_bench.py ...`",
                    "started", "-")
    append_row(Path("docs/ledger.md"), row)
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import astuple, dataclass
from pathlib import Path

from mia.errors import MiaError

COLUMNS = (
    "run",
    "date (UTC)",
    "commit",
    "protocol",
    "roles (executor, planner)",
    "command",
    "event",
    "result",
)
HEADER = "| " + " | ".join(COLUMNS) + " |"
EVENTS = ("started", "finished")


@dataclass(frozen=True)
class LedgerRow:
    """One row, its cells in :data:`COLUMNS` order."""

    run: str
    date: str
    commit: str
    protocol: str
    roles: str
    command: str
    event: str
    result: str

    def line(self) -> str:
        """The row as one Markdown table line (``|`` escaped, whitespace runs folded)."""
        cells = [" ".join(str(c).split()).replace("|", "\\|") or "-" for c in astuple(self)]
        return "| " + " | ".join(cells) + " |"


def append_row(path: Path, row: LedgerRow) -> None:
    """Append ``row`` to the ledger at ``path`` (synced to disk); nothing before it changes."""
    if row.event not in EVENTS:
        raise MiaError(f"ledger: event must be one of {EVENTS}")
    if not path.is_file():
        raise MiaError(f"ledger {path}: no such file")
    text = path.read_text(encoding="utf-8")
    if HEADER not in text.splitlines():
        raise MiaError(f"ledger {path}: not a ledger (no line {HEADER!r})")
    with path.open("a", encoding="utf-8") as f:
        if text and not text.endswith("\n"):
            f.write("\n")
        f.write(row.line() + "\n")
        f.flush()
        os.fsync(f.fileno())


def read_rows(path: Path) -> list[LedgerRow]:
    """The rows of the ledger at ``path``, in file order."""
    lines = path.read_text(encoding="utf-8").splitlines()
    if HEADER not in lines:
        raise MiaError(f"ledger {path}: not a ledger (no line {HEADER!r})")
    rows = []
    for line in lines[lines.index(HEADER) + 2 :]:
        if not line.startswith("|"):
            continue
        cells = [c.strip().replace("\\|", "|") for c in _split(line.strip()[1:-1])]
        if len(cells) == len(COLUMNS):
            rows.append(LedgerRow(*cells))
    return rows


def _split(text: str) -> list[str]:
    """Cells of a table line (an escaped ``\\|`` stays inside its cell)."""
    cells, cell, i = [], "", 0
    while i < len(text):
        if text[i] == "\\" and text[i + 1 : i + 2] == "|":
            cell += "\\|"
            i += 2
            continue
        if text[i] == "|":
            cells.append(cell)
            cell = ""
        else:
            cell += text[i]
        i += 1
    cells.append(cell)
    return cells


def earlier_looks(path: Path, protocol: str, roles: str, run_id: str) -> list[LedgerRow]:
    """The ``started`` rows of the ledger's earlier runs of ``protocol`` with these ``roles``
    (another run id than ``run_id``): the looks already taken, one row per run."""
    same: dict[str, LedgerRow] = {}
    for r in read_rows(path):
        if r.event == "started" and (r.protocol, r.roles) == (protocol, roles) and r.run != run_id:
            same.setdefault(r.run, r)
    return list(same.values())


def unchanged_since(root: Path, commit: str) -> bool:
    """True when ``commit`` was a clean checkout (no ``+dirty``) and nothing outside ``docs/``
    differs between it and the working tree of ``root``: the same code, configs and models, so
    a run now reproduces that run."""
    if not commit or commit == "unknown" or commit.endswith("+dirty"):
        return False
    try:
        diff = subprocess.run(
            ["git", "diff", "--quiet", commit, "--", ".", ":(exclude)docs"],
            cwd=root,
            capture_output=True,
            timeout=60,
        )
        untracked = subprocess.run(
            ["git", "ls-files", "--others", "--exclude-standard", "--", ".", ":(exclude)docs"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return diff.returncode == 0 and untracked.returncode == 0 and not untracked.stdout.strip()


def utc_now() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())


def git_commit(root: Path) -> str:
    """``git rev-parse --short HEAD`` of ``root``, with ``+dirty`` when ``git status`` shows
    any change (untracked files included); ``unknown`` outside a git checkout."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=root, capture_output=True, text=True, check=True, timeout=60
        ).stdout.strip()

    try:
        head = git("rev-parse", "--short", "HEAD")
        dirty = bool(git("status", "--porcelain"))
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{head}+dirty" if dirty else head
