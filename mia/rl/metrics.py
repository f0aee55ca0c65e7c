"""Training metrics: a progress bar and one line per step on the console, JSONL, optional wandb.

``metrics.jsonl`` gets one JSON object per step (``{"step": k, "time": unix, ...metrics}``),
appended, so a resumed run continues the same file. wandb is imported only when enabled and runs
offline unless ``wandb_mode`` says otherwise (``wandb sync`` uploads later).
"""

from __future__ import annotations

import json
import math
import os
import secrets
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mia.config import from_dict, option
from mia.errors import MiaError
from mia.paths import atomic_write_text

# Shown on the console line, in this order, when present: (key, label, format).
CONSOLE_KEYS: tuple[tuple[str, str, str], ...] = (
    ("reward/mean", "reward", "{:.3f}"),
    ("reward/std", "±", "{:.2f}"),
    ("val/reward_mean", "val", "{:.3f}"),
    ("response/policy_tokens_mean", "len", "{:.0f}"),
    ("actor/pg_clipfrac", "clip", "{:.3f}"),
    ("actor/approx_kl", "kl_old", "{:.2e}"),
    ("actor/kl_ref", "kl_ref", "{:.2e}"),
    ("actor/entropy", "ent", "{:.3f}"),
    ("actor/grad_norm", "gnorm", "{:.3f}"),
    ("perf/tokens_per_s", "tok/s", "{:.0f}"),
    ("time/step", "step_s", "{:.2f}"),
)


@dataclass
class LoggingConfig:
    """Where training metrics go (``trainer.logging``)."""

    console: bool = option(True, "progress bar + one line per step (stderr)")
    jsonl: bool = option(True, "<run_dir>/metrics.jsonl")
    wandb: bool = option(False, "log to Weights & Biases too")
    wandb_project: str = option("mia", "wandb project")
    wandb_mode: str = option(
        "offline", "offline (sync later with `wandb sync`) | online | disabled"
    )
    wandb_name: str | None = option(None, "wandb run name; null = wandb's")

    @classmethod
    def from_dict(cls, data: Any) -> LoggingConfig:
        return from_dict(cls, data, "logging")


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no NaN/inf
    if hasattr(value, "item"):
        return _jsonable(value.item())
    return value


def format_line(step: int, total: int | None, metrics: dict[str, Any]) -> str:
    head = f"step {step}/{total}" if total else f"step {step}"
    parts = [head]
    for key, label, fmt in CONSOLE_KEYS:
        value = metrics.get(key)
        if isinstance(value, int | float) and math.isfinite(value):
            text = fmt.format(value)
            parts.append(f"{label}{text}" if label == "±" else f"{label} {text}")
    line = " | ".join(parts)
    return line.replace(" | ±", " ±")


WANDB_ID_FILE = "wandb_run_id"


def wandb_run_id(run_dir: Path) -> str:
    """The run dir's wandb id: read from ``wandb_run_id``, or made and written there once."""
    path = run_dir / WANDB_ID_FILE
    if path.is_file():
        run_id = path.read_text(encoding="utf-8").strip()
        if run_id:
            return run_id
    run_id = secrets.token_hex(8)  # wandb ids: letters and digits, unique per project
    atomic_write_text(path, run_id + "\n")
    return run_id


class MetricsLogger:
    """``log(step, metrics)`` after every step; ``close()`` at the end."""

    def __init__(
        self,
        run_dir: str | Path,
        cfg: LoggingConfig | None = None,
        *,
        total_steps: int | None = None,
        start_step: int = 0,
        run_config: dict[str, Any] | None = None,
    ) -> None:
        self.cfg = cfg or LoggingConfig()
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.total = total_steps
        self.path = self.run_dir / "metrics.jsonl"
        self._file = self.path.open("a", encoding="utf-8") if self.cfg.jsonl else None
        self._bar = None
        if self.cfg.console:
            from tqdm import tqdm

            self._bar = tqdm(
                total=total_steps,
                initial=start_step,
                desc="grpo",
                unit="step",
                file=sys.stderr,
                dynamic_ncols=True,
                leave=True,
            )
        self._wandb = None
        if self.cfg.wandb and self.cfg.wandb_mode != "disabled":
            self._wandb = self._start_wandb(run_config or {})

    def _start_wandb(self, run_config: dict[str, Any]) -> Any:
        try:
            import wandb
        except ImportError:
            raise MiaError(
                "logging.wandb=true but wandb is not installed (pip install wandb), "
                "or set logging.wandb=false"
            ) from None
        os.environ.setdefault("WANDB_DIR", str(self.run_dir))
        # resume="allow" only resumes when the id is the same; without one every restart opened a
        # new wandb run. The id lives in the run dir, so a resumed run continues its own curve.
        return wandb.init(
            project=self.cfg.wandb_project,
            name=self.cfg.wandb_name,
            mode=self.cfg.wandb_mode,
            dir=str(self.run_dir),
            config=run_config,
            id=wandb_run_id(self.run_dir),
            resume="allow",
        )

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        clean = {k: _jsonable(v) for k, v in metrics.items()}
        if self._file is not None:
            record = {"step": step, "time": round(time.time(), 3), **clean}
            self._file.write(json.dumps(record) + "\n")
            self._file.flush()
        if self._bar is not None:
            self._bar.write(format_line(step, self.total, metrics), file=sys.stderr)
            self._bar.update(1)
        if self._wandb is not None:
            self._wandb.log({k: v for k, v in clean.items() if v is not None}, step=step)

    def note(self, text: str) -> None:
        """A free-form console line (resume, checkpoint, validation) that keeps the bar intact."""
        if self._bar is not None:
            self._bar.write(text, file=sys.stderr)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The records of a metrics.jsonl file, in order."""
    with Path(path).open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
