"""``python -m executor_train mode=sft`` / ``python -m planner_train mode=sft``: the role entry
points hand over to mia.rl.sft with the role's SFT recipe (configs/sft/<role>.yaml)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from role_fixtures import build_tiny_model

from executor_train.train import main as executor_main
from planner_train.train import main as planner_main


def test_mode_sft_composes_the_roles_sft_recipe(capsys: pytest.CaptureFixture[str]) -> None:
    executor_main(["mode=sft", "--cfg", "batch_size=2"])
    out = capsys.readouterr().out
    assert "fields:\n  - messages\n" in out and "batch_size: 2\n" in out
    assert "trainer:" not in out  # the SFT recipe, not the GRPO config
    planner_main(["--cfg", "mode=sft"])
    out = capsys.readouterr().out
    assert "fields:\n  - planner_messages\n" in out and "batch_size: 4\n" in out
    planner_main(["--cfg", "mode=grpo"])  # the default mode: the GRPO config
    assert "trainer:" in capsys.readouterr().out


def test_mode_errors_are_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        executor_main(["mode=rl"])
    assert exc.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        "python -m executor_train: error: mode must be grpo or sft, got 'rl'"
    ]
    # through the real `python -m` entry point: a bad key of the SFT recipe
    proc = subprocess.run(
        [sys.executable, "-m", "planner_train", "mode=sft", "nosuchkey=1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        "python -m planner_train: error: bad config planner.yaml: unknown key 'nosuchkey' "
        "(--help-config lists the keys)"
    ]


def test_mode_sft_trains_and_exports(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = build_tiny_model(tmp_path / "model")
    rows = [
        {
            "id": f"q{i}",
            "messages": [
                {"role": "user", "content": f"What is {i} plus {i}?"},
                {"role": "assistant", "content": f"<answer>{2 * i}</answer>"},
            ],
        }
        for i in range(2)
    ]
    data = tmp_path / "gold.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    executor_main(
        [
            "mode=sft",
            f"model_path={model}",
            f"data.train={data}",
            f"run_dir={tmp_path / 'run'}",
            "data.val_size=0",
            "batch_size=2",
            "total_steps=1",
            "train_top_layers=0",  # the recipe's 8 is for SmolLM2; the tiny model has 2
            "logging.console=false",
        ]
    )
    out = tmp_path / "run" / "hf"
    assert capsys.readouterr().out.strip() == f"done: {out}"
    summary = json.loads((out / "sft.json").read_text())
    assert summary["steps"] == 1 and summary["data"]["train"]["kept"] == 2
    assert summary["config"]["data"]["fields"] == ["messages"]  # the Executor's recipe
    assert summary["base_model"] == str(model)
    assert (out / "config.json").is_file()
