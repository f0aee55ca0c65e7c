"""Starting (or joining) the Ray cluster for training, with local files kept under the run folder.

``address=None`` starts a private single-node cluster; ``address="auto"`` or ``"HOST:6379"``
joins a cluster started with ``ray start --head`` / ``ray start --address=HOST:6379`` on each
node (multi-node training, docs/rl.md "Multi-node GPU"). A joined cluster is left running on
exit: the driver only disconnects.

Ray's defaults suit a shared cluster, not a training run: it writes an auth token, puts its
sockets and logs in ``/tmp/ray`` and starts a dashboard. :func:`init_ray` turns those off and
keeps Ray's session folder beside the run. Ray's unix sockets live at
``<temp_dir>/session_<date>_<pid>/sockets/plasma_store``, and a socket path may hold only
~107 bytes, so a long run folder gets a short ``/tmp/mia-ray-*`` folder instead; its path is
written to ``<run_dir>/ray_temp_dir.txt`` so the logs can still be found.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mia.errors import MiaError

# Longest temp dir that still leaves room for Ray's session folder and socket names.
MAX_TEMP_DIR_CHARS = 40
POINTER_FILE = "ray_temp_dir.txt"

log = logging.getLogger(__name__)


def ray_temp_dir(run_dir: str | Path) -> tuple[Path, bool]:
    """Where Ray should keep its session files; True when it is a short /tmp stand-in."""
    preferred = Path(run_dir).resolve() / "ray"
    if len(str(preferred)) <= MAX_TEMP_DIR_CHARS:
        preferred.mkdir(parents=True, exist_ok=True)
        return preferred, False
    return Path(tempfile.mkdtemp(prefix="mia-ray-", dir="/tmp")), True


@contextlib.contextmanager
def init_ray(
    run_dir: str | Path,
    num_cpus: int | None = None,
    num_gpus: int | None = None,
    log_to_driver: bool = False,
    keep_temp: bool = False,
    address: str | None = None,
) -> Iterator[dict]:
    """Start a private local Ray cluster for the block, or join ``address``; shut down /
    disconnect (and clean up) after.

    Yields ``{"temp_dir": Path, "init_seconds": float}``. ``log_to_driver=False`` keeps worker
    stdout/stderr in ``<temp_dir>/session_latest/logs`` instead of the console; exceptions in
    workers still surface in the driver. A short /tmp stand-in folder is removed on exit unless
    ``keep_temp``.
    """
    try:
        import ray
    except ImportError:  # pragma: no cover - ray is a core dependency
        raise MiaError("Ray is not installed; use single_process mode or install ray") from None
    if ray.is_initialized():
        raise MiaError("Ray is already initialised in this process")
    if address:
        with _joined(ray, address, log_to_driver) as info:
            yield info
        return
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    temp_dir, is_standin = ray_temp_dir(run_dir)
    if is_standin:
        (run_dir / POINTER_FILE).write_text(f"{temp_dir}\n")
    os.environ["RAY_AUTH_MODE"] = "disabled"
    os.environ["RAY_TMPDIR"] = str(temp_dir)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_DEDUP_LOGS", "1")
    start = time.perf_counter()
    try:
        ray.init(
            num_cpus=num_cpus,
            num_gpus=num_gpus,
            include_dashboard=False,
            log_to_driver=log_to_driver,
            logging_level=logging.WARNING,
            _temp_dir=str(temp_dir),
        )
    except Exception as err:
        if is_standin and not keep_temp:
            shutil.rmtree(temp_dir, ignore_errors=True)
        raise MiaError(f"cannot start Ray (temp dir {temp_dir}): {err}") from err
    info = {"temp_dir": temp_dir, "init_seconds": time.perf_counter() - start}
    log.info("ray started in %.1f s, files in %s", info["init_seconds"], temp_dir)
    try:
        yield info
    finally:
        ray.shutdown()
        if is_standin and not keep_temp:
            shutil.rmtree(temp_dir, ignore_errors=True)


@contextlib.contextmanager
def _joined(ray: Any, address: str, log_to_driver: bool) -> Iterator[dict]:
    """Connect to a running cluster (its head holds the session files); disconnect after."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    start = time.perf_counter()
    try:
        ray.init(address=address, log_to_driver=log_to_driver, logging_level=logging.WARNING)
    except (Exception, SystemExit) as err:  # Ray exits when the GCS never answers
        raise MiaError(f"cannot join the Ray cluster at {address}: {_first_line(err)}") from err
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    info = {
        "temp_dir": None,
        "init_seconds": time.perf_counter() - start,
        "address": address,
        "nodes": len(nodes),
    }
    log.info("joined Ray at %s: %d nodes, %s", address, len(nodes), ray.cluster_resources())
    try:
        yield info
    finally:
        ray.shutdown()


def _first_line(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    return lines[0] if lines else type(err).__name__


def start_private_ray(
    run_dir: str | Path, num_cpus: int | None = None, address: str | None = None
) -> contextlib.AbstractContextManager | None:
    """Enter :func:`init_ray` unless Ray already runs in this process (a caller's cluster);
    returns the entered context to ``__exit__`` on close, or None. ``address`` joins a running
    cluster instead of starting one."""
    import ray

    if ray.is_initialized():
        return None
    ctx = init_ray(run_dir, num_cpus=num_cpus, address=address)
    ctx.__enter__()
    return ctx
