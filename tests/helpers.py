"""Small helpers shared by the test modules: finished command-line runs, child processes,
SQLite files."""

from __future__ import annotations

import sqlite3
import subprocess
from pathlib import Path


def sole_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    """The one line a command that failed on its input wrote to stderr; asserts that it exited
    2 and wrote exactly one line."""
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


def stop_process(proc: subprocess.Popen, timeout: float) -> None:
    """Terminate ``proc``; kill it if it has not exited ``timeout`` seconds later."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def run_sql(db: Path, *statements: str) -> None:
    """Run ``statements`` on the SQLite file ``db`` as one script and commit."""
    conn = sqlite3.connect(str(db))
    try:
        conn.executescript(";\n".join(statements))
        conn.commit()
    finally:
        conn.close()
