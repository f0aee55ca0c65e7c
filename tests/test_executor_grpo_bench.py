"""bench/executor_grpo.py's read-outs on tiny models: the paired GRPO - SFT table (wins and
losses per type) and how far GRPO moved the Executor (KL and top-1 changes on its own tokens)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

from tests.role_fixtures import build_tiny_model

ROOT = Path(__file__).resolve().parents[1]


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "executor_grpo", ROOT / "bench" / "executor_grpo.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CHAT = [
    {"role": "system", "content": "You answer with search."},
    {"role": "user", "content": "Who founded the Vorlanic Institute?"},
    {"role": "assistant", "content": "<search>Vorlanic Institute founder</search>"},
    {"role": "user", "content": "<information>It was founded by Kaleth Morvaine.</information>"},
    {"role": "assistant", "content": "<answer>Kaleth Morvaine</answer>"},
]


def _write(folder: Path, rows: list[dict]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    folder.joinpath("results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    root = tmp_path_factory.mktemp("models")
    return (
        build_tiny_model(root / "a", seed=0),
        build_tiny_model(root / "a-again", seed=0),
        build_tiny_model(root / "b", seed=1),
    )


def test_drift_is_zero_between_identical_models_and_positive_between_others(
    models: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    bench = _bench()
    a, a_again, b = models
    _write(tmp_path / "evals" / "dev1" / "none", [{"id": "q1", "messages": CHAT}])
    same = bench.drift(a, a_again, tmp_path / "evals", ["dev1"])
    other = bench.drift(a, b, tmp_path / "evals", ["dev1"])
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(a)
    turns = [m["content"] for m in CHAT if m["role"] == "assistant"]
    own = sum(len(tok.encode(c, add_special_tokens=False)) + 1 for c in turns)  # + end of turn
    assert (same["transcripts"], same["refused"]) == (1, 0)
    assert same["tokens"] == own == other["tokens"]  # the Executor's tokens only
    assert same["kl_per_token"] == pytest.approx(0.0, abs=1e-6)
    assert same["top1_changed"] == 0.0
    assert other["kl_per_token"] > 1e-3 and other["top1_changed"] > 0.0


def test_paired_counts_wins_and_losses_per_type(tmp_path: Path) -> None:
    bench = _bench()
    data = tmp_path / "data" / "dev1"
    data.mkdir(parents=True)
    rows = [
        {"id": i, "extra_info": {"question_type": kind, "relation": f"r{i % 2}"}}
        for i, kind in enumerate(["bridge", "bridge", "comparison", "comparison"])
    ]
    data.joinpath("test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    golds = ["A", "B", "C", "D"]
    sft = ["A", "x", "C", "x"]  # right on 0 and 2
    grpo = ["A", "B", "x", "x"]  # wins question 1, loses question 2
    for name, preds in (("sft", sft), ("grpo", grpo)):
        _write(
            tmp_path / name / "dev1" / "none",
            [
                {"id": i, "prediction": p, "golds": [g]}
                for i, (p, g) in enumerate(zip(preds, golds, strict=True))
            ],
        )
    out = bench.paired(tmp_path / "sft", tmp_path / "grpo", {"dev1": data})
    assert (out["all"]["won"], out["all"]["lost"], out["all"]["n"]) == (1, 1, 4)
    assert (out["bridge"]["won"], out["bridge"]["lost"]) == (1, 0)
    assert (out["comparison"]["won"], out["comparison"]["lost"]) == (0, 1)
    assert out["all"]["sft"] == 0.5 and out["all"]["grpo"] == 0.5 and out["all"]["delta"] == 0.0
