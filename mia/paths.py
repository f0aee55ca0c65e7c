"""Where MIA keeps its caches, and atomic writes into them.

Everything that is built once (the embedded model, warm-started roles, the synthetic world's
indexes) lives under ``$MIA_HOME`` (default ``~/.cache/mia``). Builds go to a temporary sibling
folder that is renamed into place only when complete, so a crash never leaves a half cache.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

# The shipped configs/ folder (a sibling of the mia package in the source tree and in editable
# installs); every loader finds its YAML files under it.
CONFIG_ROOT = Path(__file__).resolve().parents[1] / "configs"


def config_dir(*parts: str) -> Path:
    """``configs/<parts...>`` of the shipped configs."""
    return CONFIG_ROOT.joinpath(*parts)


def home_path(environ: Mapping[str, str] = os.environ) -> Path:
    """The cache root that ``environ`` names (``MIA_HOME``, else ``~/.cache/mia``), not created."""
    return Path(environ.get("MIA_HOME") or Path.home() / ".cache" / "mia")


def mia_home() -> Path:
    """The cache root: ``$MIA_HOME`` or ``~/.cache/mia``, created if missing."""
    root = home_path()
    root.mkdir(parents=True, exist_ok=True)
    return root


def file_sha256(path: str | os.PathLike[str]) -> str:
    """The sha256 hex digest of a file's bytes (read in 1 MiB blocks)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def resolve_run_dir(configured: str | os.PathLike[str] | None, prefix: str) -> Path:
    """The run folder ``configured`` names, else a new ``$MIA_HOME/runs/<prefix>-<timestamp>``;
    created, and returned absolute."""
    if configured:
        path = Path(configured)
    else:
        path = mia_home() / "runs" / f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}"
    path.mkdir(parents=True, exist_ok=True)
    return path.resolve()


@contextlib.contextmanager
def atomic_dir(target: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary folder that replaces ``target`` only if the block succeeds.

    The temporary folder sits beside ``target`` (same filesystem, so the rename is atomic) and
    is removed on failure. An existing ``target`` is replaced.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        yield tmp
        if target.exists():
            old = target.with_name(f".{target.name}.old-{os.getpid()}")
            os.replace(target, old)
            os.replace(tmp, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` through a temp file + rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))
