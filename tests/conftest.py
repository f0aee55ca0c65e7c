"""Shared test fixtures: every test runs with its own $MIA_HOME unless it opts into the shared cache."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("WANDB_MODE", "offline")
# float32 on every CPU, so results do not depend on whether the CI machine has native bf16
# (tests/test_precision.py checks the choice itself with a reported CPU).
os.environ.setdefault("MIA_BF16", "0")


@pytest.fixture(scope="session")
def shared_mia_home() -> Path:
    """A MIA_HOME shared by the whole session (expensive builds such as the embedded model).

    Uses $MIA_TEST_HOME when set (CI caches it between steps), else a folder under the repo.
    """
    root = Path(
        os.environ.get("MIA_TEST_HOME")
        or Path(__file__).resolve().parents[1] / ".mia" / "test-home"
    )
    root.mkdir(parents=True, exist_ok=True)
    return root
