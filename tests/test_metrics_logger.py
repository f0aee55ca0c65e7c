"""MetricsLogger: JSONL appends across a resume, and a resumed run keeps its wandb run id.

wandb is not a dependency of the test environment; a stand-in module with ``wandb.init``'s
keyword signature records the calls (it is the only wandb API the logger touches besides
``log``/``finish`` on the returned run).
"""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

import pytest

from mia.rl.metrics import WANDB_ID_FILE, LoggingConfig, MetricsLogger, read_metrics


class _Run:
    def __init__(self, calls: list[dict[str, Any]]) -> None:
        self.calls = calls
        self.logged: list[tuple[dict[str, Any], int]] = []

    def log(self, data: dict[str, Any], step: int) -> None:
        self.logged.append((data, step))

    def finish(self) -> None:
        pass


@pytest.fixture
def fake_wandb(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = []
    mod = types.ModuleType("wandb")

    def init(  # wandb.init's keywords used by the logger; anything else would be a TypeError
        *,
        project: str | None = None,
        name: str | None = None,
        mode: str | None = None,
        dir: str | None = None,
        config: dict[str, Any] | None = None,
        id: str | None = None,
        resume: bool | str | None = None,
    ) -> _Run:
        calls.append({"project": project, "mode": mode, "dir": dir, "id": id, "resume": resume})
        return _Run(calls)

    mod.init = init  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "wandb", mod)
    return calls


def test_resumed_run_reuses_its_wandb_id(tmp_path: Path, fake_wandb: list[dict[str, Any]]) -> None:
    cfg = LoggingConfig(wandb=True, console=False)
    first = MetricsLogger(tmp_path / "run", cfg)
    first.log(1, {"reward/mean": 0.5})
    first.close()
    # The process dies; a new one resumes in the same run dir.
    second = MetricsLogger(tmp_path / "run", cfg, start_step=1)
    second.log(2, {"reward/mean": 0.75})
    second.close()
    ids = [c["id"] for c in fake_wandb]
    assert len(ids) == 2 and ids[0] == ids[1]
    assert ids[0] and ids[0].isalnum()
    assert [c["resume"] for c in fake_wandb] == ["allow", "allow"]
    assert (tmp_path / "run" / WANDB_ID_FILE).read_text().strip() == ids[0]
    assert [r["step"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl")] == [1, 2]
    # Another run dir is another wandb run.
    MetricsLogger(tmp_path / "other", cfg).close()
    assert fake_wandb[-1]["id"] != ids[0]


def test_wandb_disabled_writes_no_id(tmp_path: Path, fake_wandb: list[dict[str, Any]]) -> None:
    MetricsLogger(tmp_path, LoggingConfig(wandb=True, wandb_mode="disabled", console=False)).close()
    assert fake_wandb == [] and not (tmp_path / WANDB_ID_FILE).exists()
