"""Crash-safe progress of a TTRL run, so a killed run resumes without writing a memory twice.

Per batch the run (1) rolls out and updates the Planner, (2) writes the batch's memory payload
to ``pending/batch_<b>.json``, (3) checkpoints the Planner, (4) commits the payload to
memory_serve in phases (``bank_saving`` -> ``bank_saved`` -> ``evaluated`` -> ``consolidating``
-> ``consolidated`` -> ``saved``), each phase appended to ``pending/batch_<b>.phases`` once done
(or, for the ``*ing`` markers, right before the request), and (5) records the batch as finished
in ``state.json`` (``next_batch``) and drops its pending files.

On resume the phases say what memory_serve already has; the two requests whose answer may have
been lost with the process (the rollout buffer write and the consolidation) are checked against
memory_serve's buffer instead of being repeated blindly.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from mia.errors import MiaError
from mia.paths import atomic_write_text

FORMAT = "mia-ttrl-state/1"


class Journal:
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.pending_dir = self.root / "pending"
        self.path = self.root / "state.json"

    # ---- run state
    def load(self) -> dict[str, Any]:
        if not self.path.is_file():
            return {}
        try:
            state = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as err:
            raise MiaError(f"TTRL state {self.path} is unreadable: {err}") from None
        if state.get("format") != FORMAT:
            raise MiaError(f"{self.path}: not a TTRL state file ({state.get('format')!r})")
        return state

    def save(self, **fields: Any) -> dict[str, Any]:
        state = {**self.load(), **fields, "format": FORMAT}
        self.root.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.path, json.dumps(state, indent=2) + "\n")
        return state

    @property
    def next_batch(self) -> int:
        return int(self.load().get("next_batch", 0))

    # ---- pending payloads
    def _payload(self, batch: int) -> Path:
        return self.pending_dir / f"batch_{batch:06d}.json"

    def _phases(self, batch: int) -> Path:
        return self.pending_dir / f"batch_{batch:06d}.phases"

    def write_pending(self, batch: int, payload: dict[str, Any]) -> None:
        self.pending_dir.mkdir(parents=True, exist_ok=True)
        self._phases(batch).unlink(missing_ok=True)  # a redone batch starts its commit afresh
        atomic_write_text(self._payload(batch), json.dumps(payload, ensure_ascii=False))

    def pending(self, batch: int) -> dict[str, Any] | None:
        path = self._payload(batch)
        if not path.is_file():
            return None
        return json.loads(path.read_text(encoding="utf-8"))

    def phase_data(self, batch: int) -> dict[str, Any]:
        """Phase name -> the data recorded with it (None when none), in order."""
        path = self._phases(batch)
        if not path.is_file():
            return {}
        out: dict[str, Any] = {}
        for line in path.read_text(encoding="utf-8").splitlines():
            name, _, data = line.partition("\t")
            if not name.strip():
                continue
            try:
                out[name.strip()] = json.loads(data) if data else None
            except json.JSONDecodeError:  # a line cut by the kill: the phase did not finish
                continue
        return out

    def phases(self, batch: int) -> set[str]:
        return set(self.phase_data(batch))

    def mark(self, batch: int, phase: str, data: Any = None) -> None:
        """Append a phase (and optional JSON data) durably (fsync): the next process must see
        it after a kill."""
        self.pending_dir.mkdir(parents=True, exist_ok=True)
        line = phase if data is None else f"{phase}\t{json.dumps(data, ensure_ascii=False)}"
        with self._phases(batch).open("a", encoding="utf-8") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())

    def finish(self, batch: int) -> None:
        self.save(next_batch=batch + 1)
        self._payload(batch).unlink(missing_ok=True)
        self._phases(batch).unlink(missing_ok=True)

    def drop(self, batch: int) -> None:
        self._payload(batch).unlink(missing_ok=True)
        self._phases(batch).unlink(missing_ok=True)
