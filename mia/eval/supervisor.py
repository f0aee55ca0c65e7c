"""Start local_search, memory_serve and serve as subprocesses on loopback, and always stop them.

Each service runs as ``python -m <module> ... --host 127.0.0.1 --port 0 --port-file F`` in its
own session (so a terminal's Ctrl-C reaches only the parent, which then stops them in order),
with its output in ``<work_dir>/logs/<name>.log``. They are stopped (SIGTERM to the service's
process group, SIGKILL after a grace period) when the :class:`ServiceGroup` block ends: normal
exit, an exception, Ctrl-C, or SIGTERM to the parent (turned into ``KeyboardInterrupt``). On
Linux each service also gets ``PR_SET_PDEATHSIG``: if the parent is killed outright
(SIGKILL), the kernel terminates the services too.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mia.errors import MiaError

Log = Callable[[str], None]
HOST = "127.0.0.1"


def _load_libc() -> Any:
    try:
        import ctypes

        return ctypes.CDLL("libc.so.6", use_errno=True)
    except (OSError, AttributeError):  # not glibc Linux: the parent's cleanup is all there is
        return None


# Loaded in the parent: after fork only the prctl call itself runs (no dlopen in the child).
_LIBC = _load_libc()


def _die_with_parent(parent: int) -> Callable[[], None]:
    def hook() -> None:
        if _LIBC is None:
            return
        _LIBC.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)

    return hook


@dataclass
class ServiceSpec:
    name: str
    module: str  # run as ``python -m module``
    args: list[str] = field(default_factory=list)  # before the port options
    overrides: list[str] = field(default_factory=list)  # trailing key=value arguments
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class RunningService:
    name: str
    proc: subprocess.Popen[bytes]
    port_file: Path
    log_path: Path
    url: str = ""

    @property
    def pid(self) -> int:
        return self.proc.pid


def last_error_line(log_path: Path) -> str:
    """The most telling line of a service log: its last line mentioning an error, else the
    last line."""
    try:
        lines = [ln.strip() for ln in log_path.read_text(errors="replace").splitlines()]
    except OSError:
        return ""
    lines = [ln for ln in lines if ln]
    for line in reversed(lines):
        if "error" in line.lower():
            return line
    return lines[-1] if lines else ""


class ServiceGroup:
    """``with ServiceGroup(work_dir) as group: urls = group.start([...])``."""

    def __init__(
        self, work_dir: str | Path, startup_timeout_s: float = 900.0, log_fn: Log | None = None
    ) -> None:
        self.work_dir = Path(work_dir)
        self.startup_timeout_s = startup_timeout_s
        self.say = log_fn or (lambda _m: None)
        self.services: list[RunningService] = []
        self._old_sigterm: Any = None

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> ServiceGroup:
        if threading.current_thread() is threading.main_thread():
            self._old_sigterm = signal.getsignal(signal.SIGTERM)
            signal.signal(signal.SIGTERM, _sigterm_to_interrupt)
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.stop()
        finally:
            if self._old_sigterm is not None:
                signal.signal(signal.SIGTERM, self._old_sigterm)
                self._old_sigterm = None

    def start(self, specs: list[ServiceSpec]) -> dict[str, str]:
        """Start ``specs`` together, wait until every one answers ``/health``; name -> URL."""
        logs = self.work_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        started = []
        for s in specs:
            port_file = self.work_dir / f".{s.name}.port"
            port_file.unlink(missing_ok=True)
            log_path = logs / f"{s.name}.log"
            argv = [
                sys.executable,
                "-m",
                s.module,
                *s.args,
                "--host",
                HOST,
                "--port",
                "0",
                "--port-file",
                str(port_file),
                *s.overrides,
            ]
            env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
            env.update(s.env)
            with log_path.open("ab") as logf:
                logf.write(f"$ {' '.join(argv)}\n".encode())
                logf.flush()
                proc = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=logf,
                    stderr=subprocess.STDOUT,
                    env=env,
                    start_new_session=True,
                    preexec_fn=_die_with_parent(os.getpid()),
                )
            svc = RunningService(s.name, proc, port_file, log_path)
            self.services.append(svc)
            started.append(svc)
            self.say(f"  starting {s.name} (pid {proc.pid}, log {log_path})")
        deadline = time.monotonic() + self.startup_timeout_s
        for svc in started:
            self._wait_ready(svc, deadline)
            self.say(f"  {svc.name} ready at {svc.url}")
        return {svc.name: svc.url for svc in started}

    def _wait_ready(self, svc: RunningService, deadline: float) -> None:
        import httpx

        while True:
            code = svc.proc.poll()
            if code is not None:
                raise MiaError(
                    f"{svc.name} exited with code {code} while starting: "
                    f"{last_error_line(svc.log_path) or 'no output'} (log: {svc.log_path})"
                )
            if not svc.url and svc.port_file.exists():
                text = svc.port_file.read_text().strip()
                if text:
                    svc.url = f"http://{HOST}:{int(text)}"
            if svc.url:
                with contextlib.suppress(httpx.HTTPError):
                    resp = httpx.get(f"{svc.url}/health", timeout=5.0, trust_env=False)
                    if resp.status_code == 200:
                        return
            if time.monotonic() > deadline:
                raise MiaError(
                    f"{svc.name} did not become ready within {self.startup_timeout_s:.0f}s "
                    f"(log: {svc.log_path})"
                )
            time.sleep(0.2)

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM every service's process group, then SIGKILL what is left after ``grace_s``."""
        alive = [s for s in self.services if s.proc.poll() is None]
        for svc in alive:
            _signal_group(svc.proc, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for svc in alive:
            try:
                svc.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(svc.proc, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    svc.proc.wait(timeout=5)
        for svc in self.services:
            svc.port_file.unlink(missing_ok=True)
        self.services = []

    def describe(self) -> dict[str, dict[str, Any]]:
        return {s.name: {"pid": s.pid, "url": s.url, "log": str(s.log_path)} for s in self.services}

    def write_manifest(self, path: Path) -> None:
        """``{name: {pid, url, log}}``: lets a caller (or a test) check everything stopped."""
        path.write_text(json.dumps(self.describe(), indent=2) + "\n")


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    # The service is its own session leader: its process group id is its pid. Only that
    # group (this service and anything it spawned) is signalled.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def _sigterm_to_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@contextlib.contextmanager
def service_group(
    work_dir: str | Path, startup_timeout_s: float = 900.0, log_fn: Log | None = None
) -> Iterator[ServiceGroup]:
    with ServiceGroup(work_dir, startup_timeout_s, log_fn) as group:
        yield group


# ----------------------------------------------------------------------------- the MIA stack


def default_threads() -> int:
    """Torch threads per LLM service: every core. The services mostly work in turn (the
    Planner plans, then the Executor runs), and their OpenMP threads wait passively
    (:func:`thread_env`), so a service alone gets the whole machine; spinning threads would
    starve the other services."""
    return max(1, os.cpu_count() or 1)


def thread_env(threads: int) -> dict[str, str]:
    """Thread settings for a service subprocess. OpenMP threads that wait passively (unless
    the user chose otherwise): measured on 2 cores with SmolLM2 decoding 8 rows, two busy
    processes of 2 spinning threads each made 0.3 steps/s each, passive 3.0, while a
    spinning 2-thread process beside a 1-thread one made 1.9 against 3.3 passive
    (docs/benchmarks.md, "Threads")."""
    n = str(threads)
    return {
        "OMP_NUM_THREADS": n,
        "MKL_NUM_THREADS": n,
        "OPENBLAS_NUM_THREADS": n,
        "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE"),
    }


def llm_config_data(
    base: str,
    *,
    model_path: str | None = None,
    roles: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Llm config ``base`` (``common`` + ``roles``) with ``common.model_path`` replaced (local
    roles on another model folder) and per-role field overrides merged (``sampling`` merged
    key-wise), as a plain dict."""
    from mia.llm.config import load_llm_config

    data = load_llm_config(base)
    data.setdefault("common", {})
    data.setdefault("roles", {})
    if model_path is not None:
        data["common"]["model_path"] = str(Path(model_path).expanduser().resolve())
    for role, fields in (roles or {}).items():
        entry = dict(data["roles"].get(role) or {})
        for key, value in fields.items():
            if key == "sampling" and isinstance(value, dict):
                entry["sampling"] = {**dict(entry.get("sampling") or {}), **value}
            else:
                entry[key] = value
        data["roles"][role] = entry
    return data


def write_llm_config(
    base: str,
    path: Path,
    *,
    model_path: str | None = None,
    roles: dict[str, dict[str, Any]] | None = None,
) -> Path:
    """:func:`llm_config_data` written to ``path``. Services read the copy, so what ran is on
    disk beside the results."""
    from omegaconf import OmegaConf

    data = llm_config_data(base, model_path=model_path, roles=roles)
    path.parent.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(OmegaConf.create(data), path)
    return path


@dataclass
class StackOptions:
    index: Path  # local_search index folder
    llm_config: Path  # from write_llm_config: executor, manager and planner roles
    work_dir: Path  # logs, port files, generated service configs
    # name -> SQLite file, one memory_serve each; "identity" = compress mode identity (no LLM),
    # any other name (e.g. "llm", "ttrl") = compression by ``compress_mode``
    memory_dbs: dict[str, Path]
    image_cache: list[str] = field(default_factory=list)
    threads: int | None = None
    agent: dict[str, Any] = field(default_factory=dict)  # serve's agent section overrides
    memory_overrides: list[str] = field(default_factory=list)
    serve_overrides: list[str] = field(default_factory=list)
    # compress.mode of every store but "identity": None = memory_serve's default (llm)
    compress_mode: str | None = None


@dataclass
class StackURLs:
    search: str
    serve: str
    memory: dict[str, str]  # memory_dbs name -> URL


def start_stack(group: ServiceGroup, opts: StackOptions) -> StackURLs:
    """local_search first (serve needs its URL), then serve and the memory_serve instances
    together."""
    from omegaconf import OmegaConf

    from mia.eval.harness import role_llm_dict

    threads = opts.threads or default_threads()
    env = thread_env(threads)
    search = group.start(
        [
            ServiceSpec(
                "local_search",
                "local_search",
                ["serve", "--index", str(opts.index)],
                env=thread_env(1),
            )
        ]
    )["local_search"]
    executor = role_llm_dict(str(opts.llm_config), "executor")
    agent = OmegaConf.merge(
        OmegaConf.create(
            {
                "tools": {
                    "search": {"params": {"url": search}},
                    "web_image_to_image_search": {
                        "params": {
                            "cache_roots": [str(Path(p).resolve()) for p in opts.image_cache]
                        }
                    },
                }
            }
        ),
        OmegaConf.create(opts.agent),
    )
    serve_cfg = opts.work_dir / "serve.yaml"
    OmegaConf.save(OmegaConf.create({"llm": executor, "agent": agent}), serve_cfg)
    specs = [
        ServiceSpec(
            "serve",
            "serve",
            ["--config", str(serve_cfg)],
            list(opts.serve_overrides),
            env=env,
        )
    ]
    for name, db in opts.memory_dbs.items():
        # Its persistence folder is the database's own (the demo's TTRL run saves there).
        overrides = [f"llm.config={opts.llm_config}", f"persist.allowed_root={db.parent}"]
        if name == "identity":
            overrides += ["compress.mode=identity", "llm.enabled=false"]
        elif opts.compress_mode is not None:
            overrides.append(f"compress.mode={opts.compress_mode}")
        db.parent.mkdir(parents=True, exist_ok=True)
        specs.append(
            ServiceSpec(
                f"memory_serve_{name}",
                "memory_serve",
                ["--db", str(db)],
                overrides + list(opts.memory_overrides),
                env=env if name != "identity" else thread_env(1),
            )
        )
    urls = group.start(specs)
    return StackURLs(
        search=search,
        serve=urls["serve"],
        memory={name: urls[f"memory_serve_{name}"] for name in opts.memory_dbs},
    )
