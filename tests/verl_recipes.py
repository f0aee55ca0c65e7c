"""Helpers of the veRL tests (tests/test_verl_*.py; they run in .venv-peers): compose a
recipes/verl config the way veRL's ``main_ppo`` does, with a run script's own overrides."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG_DIR = ROOT / "recipes" / "verl" / "config"
SCRIPTS = {
    "executor_grpo": "run_executor_grpo.sh",
    "planner_grpo": "run_planner_grpo.sh",
    "ttrl": "run_ttrl.sh",
    "ttrl_nogt": "run_ttrl.sh",
}


def script_command(name: str, env: dict[str, str] | None = None) -> list[str]:
    """The command a recipe's run script would run (``DRY_RUN=1``)."""
    extra = {"MODE": "nogt"} if name == "ttrl_nogt" else {}
    out = subprocess.run(
        ["bash", str(ROOT / "recipes" / "verl" / SCRIPTS[name])],
        env={**os.environ, "DRY_RUN": "1", **extra, **(env or {})},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    return shlex.split(out)


def script_overrides(name: str, env: dict[str, str] | None = None) -> tuple[str, list[str]]:
    """``(config name, overrides)`` of a run script's command."""
    cmd = script_command(name, env)
    config = next(a.split("=", 1)[1] for a in cmd if a.startswith("--config-name="))
    path = next(a.split("=", 1)[1] for a in cmd if a.startswith("--config-path="))
    assert Path(path) == CONFIG_DIR, path
    return config, [a for a in cmd if "=" in a and not a.startswith("--")]


def compose(name: str, overrides: list[str] = ()):  # noqa: ANN201 - an OmegaConf DictConfig
    """veRL's composed config of ``recipes/verl/config/<name>.yaml`` with ``overrides``."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return hydra_compose(config_name=name, overrides=list(overrides))
