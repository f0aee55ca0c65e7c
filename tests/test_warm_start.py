"""Warm-started roles (mia.apps.warm_start): the cache is atomic and keyed by the recipe.

A tiny Qwen2 stands in for SmolLM2 (the base model is injectable); the recipe is the real
``configs/sft/executor.yaml`` shrunk to a few steps on a small world, so a build takes seconds.
"""

from __future__ import annotations

import json
import math
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from mia.apps import warm_start
from mia.errors import MiaError
from mia.rl import sft

OVERRIDES = [
    "gold_world.seed=0",
    "gold_world.size=small",
    "gold_world.limit=5",
    "gold_world.plan=with",
    "data.val_size=1",
    "data.max_length=1024",
    "batch_size=2",
    "total_steps=3",
    "train_top_layers=1",
    "eval_at_start=true",
    "logging.console=false",
]


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("warm-home")


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from mia.models.tiny import build_tokenizer, save_tiny, tiny_qwen2

    tok = build_tokenizer()
    return save_tiny(tiny_qwen2(tok, seed=0), tok, tmp_path_factory.mktemp("base") / "m")


def _leftovers(home: Path) -> list[str]:
    models = home / "models"
    names = [p.name for p in models.iterdir()] if models.is_dir() else []
    runs = models / ".warm-runs"
    names += [f".warm-runs/{p.name}" for p in runs.iterdir()] if runs.is_dir() else []
    return sorted(n for n in names if not n.endswith(".lock") and n != ".warm-runs")


def test_interrupted_build_leaves_no_cache_and_the_next_call_resumes(
    home: Path, base: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recipe = warm_start.warm_recipe("executor", OVERRIDES)
    key = warm_start.recipe_key(recipe, warm_start.base_fingerprint(base))
    monkeypatch.setattr(warm_start, "RESUME_EVERY", 1)
    real_step = sft.SftRun.train_step
    calls = {"n": 0}

    def crash_on_second(self: sft.SftRun) -> dict[str, Any]:
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("killed mid-way")
        return real_step(self)

    monkeypatch.setattr(sft.SftRun, "train_step", crash_on_second)
    with pytest.raises(RuntimeError, match="killed mid-way"):
        warm_start.warm_role_dir(
            "executor", home=home, base_model_dir=base, recipe=recipe, log=None
        )
    assert calls["n"] == 2
    # No half cache and no temporary folder; the run folder keeps step 1's checkpoint.
    assert _leftovers(home) == [f".warm-runs/executor-{key}"]
    assert len(list((home / "data" / "gold").glob("*.jsonl"))) == 1  # the gold data is kept

    monkeypatch.setattr(sft.SftRun, "train_step", real_step)
    lines: list[str] = []
    path = warm_start.warm_role_dir(
        "executor", home=home, base_model_dir=base, recipe=recipe, log=lines.append
    )
    assert path == home / "models" / f"warm-executor-{key}"
    assert _leftovers(home) == [path.name]  # built: the run folder is gone
    assert any(
        line.startswith("sft: resumed from ") and line.endswith("at step 1") for line in lines
    )
    marker = json.loads((path / "mia-model.json").read_text())
    assert (marker["recipe"], marker["role"], marker["key"], marker["steps"]) == (
        "warm-start-sft",
        "executor",
        key,
        3,
    )
    # A resumed run has no start loss (eval_at_start ran in the first process).
    assert marker["val_loss_start"] is None and math.isfinite(marker["val_loss_end"])
    assert any(line.startswith("warm start [executor]: done") for line in lines)
    assert not any(line.startswith("gold:") for line in lines)  # reused from the failed run

    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(str(path))  # a complete, loadable folder

    def no_rebuild(*_a: Any, **_k: Any) -> None:
        raise AssertionError("a valid cache must not be rebuilt")

    monkeypatch.setattr(sft, "train_sft", no_rebuild)
    again = warm_start.warm_role_dir(
        "executor", home=home, base_model_dir=base, recipe=recipe, log=None
    )
    assert again == path


def test_a_folder_without_its_marker_is_rebuilt(
    home: Path, base: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recipe = warm_start.warm_recipe("executor", [*OVERRIDES, "total_steps=1"])
    path = warm_start.warm_role_dir(
        "executor", home=home, base_model_dir=base, recipe=recipe, log=None
    )
    (path / "mia-model.json").unlink()
    built: list[int] = []
    real = sft.train_sft
    monkeypatch.setattr(sft, "train_sft", lambda cfg, **kw: built.append(1) or real(cfg, **kw))
    assert (
        warm_start.warm_role_dir(
            "executor", home=home, base_model_dir=base, recipe=recipe, log=None
        )
        == path
    )
    assert built == [1] and (path / "mia-model.json").is_file()


def test_a_build_of_one_recipe_does_not_hold_up_another(
    tmp_path: Path, base: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A user trains a variant recipe while the demo uses the shipped one: the two do not wait
    # for each other (the same recipe still builds once, behind its own lock).
    first = warm_start.warm_recipe("executor", OVERRIDES)
    second = warm_start.warm_recipe("executor", [*OVERRIDES, "total_steps=2"])
    first_running, release = threading.Event(), threading.Event()
    built: list[str] = []

    def fake_build(role: str, cfg: dict[str, Any], b: Path, key: str, *_rest: Any) -> None:
        if cfg["total_steps"] == 3:
            first_running.set()
            assert release.wait(timeout=60)
        built.append(key)

    monkeypatch.setattr(warm_start, "_build", fake_build)

    def build(recipe: dict[str, Any]) -> threading.Thread:
        kwargs = {"home": tmp_path, "base_model_dir": base, "recipe": recipe, "log": None}
        thread = threading.Thread(
            target=warm_start.warm_role_dir, args=("executor",), kwargs=kwargs
        )
        thread.start()
        return thread

    slow = build(first)
    assert first_running.wait(timeout=60)
    fast = build(second)
    fast.join(timeout=60)
    finished_while_the_first_ran = not fast.is_alive()
    release.set()
    slow.join(timeout=60)
    fast.join(timeout=60)
    assert finished_while_the_first_ran
    fingerprint = warm_start.base_fingerprint(base)
    keys = [warm_start.recipe_key(r, fingerprint) for r in (second, first)]
    assert built == keys


def test_the_key_follows_the_recipe_the_data_and_the_base(base: Path, tmp_path: Path) -> None:
    from mia.models.tiny import build_tokenizer, save_tiny, tiny_qwen2

    fp = warm_start.base_fingerprint(base)
    recipe = warm_start.warm_recipe("executor", OVERRIDES)
    key = warm_start.recipe_key(recipe, fp)
    assert warm_start.recipe_key(warm_start.warm_recipe("executor", OVERRIDES), fp) == key
    # where it runs and how it logs is not the recipe
    same = warm_start.warm_recipe(
        "executor", [*OVERRIDES, "run_dir=/elsewhere", "logging.jsonl=false"]
    )
    assert warm_start.recipe_key(same, fp) == key
    # anything that changes the weights is
    for change in ("policy.optim.lr=0.5", "total_steps=4", "gold_world.seed=3"):
        changed = warm_start.warm_recipe("executor", [*OVERRIDES, change])
        assert warm_start.recipe_key(changed, fp) != key, change
    assert warm_start.recipe_key(warm_start.warm_recipe("planner", OVERRIDES), fp) != key
    tok = build_tokenizer()
    other = save_tiny(tiny_qwen2(tok, seed=1), tok, tmp_path / "other")
    assert warm_start.recipe_key(recipe, warm_start.base_fingerprint(other)) != key
    bumped = {
        **warm_start.data_fingerprint(),
        "warm_data_version": warm_start.WARM_DATA_VERSION + 1,
    }
    assert warm_start._sha(bumped) != warm_start._sha(warm_start.data_fingerprint())


def test_the_shipped_recipes_are_valid() -> None:
    for role in warm_start.ROLES:
        cfg = warm_start.WarmStartConfig.from_dict(warm_start.warm_recipe(role))
        assert cfg.model_path == "embedded" and cfg.train_top_layers > 0
        assert cfg.data.train == [] and 1 not in cfg.gold_world.seeds  # 1: a development world
    assert warm_start.WarmStartConfig.from_dict(warm_start.warm_recipe("planner")).data.fields == [
        "planner_messages"
    ]
    with pytest.raises(MiaError, match="unknown warm-start role"):
        warm_start.warm_recipe("judge")


def test_the_shipped_roles_train_on_train_worlds_only() -> None:
    """Both shipped recipes train on train-range worlds, so no test world's convention (a
    wording and its meaning) is in their gold data: the legacy lexicon shares two with world
    20000 (configs/world/seeds.yaml)."""
    from mia.data.world_lexicon import draw_lexicon, lexicon_for, seed_ranges

    ranges = seed_ranges()
    first, last = ranges.ranges["test"]
    test_pairs = set().union(*(draw_lexicon(s, "test").pairs() for s in range(first, last + 1)))
    for role in warm_start.ROLES:
        seeds = warm_start.WarmStartConfig.from_dict(warm_start.warm_recipe(role)).gold_world.seeds
        assert len(seeds) >= 8 and {ranges.of(s) for s in seeds} == {"train"}, role
        seen = set().union(*(lexicon_for(s).pairs() for s in seeds))
        assert not seen & test_pairs, role


def test_cache_key_is_the_same_in_every_process() -> None:
    """The key hashes phrase tables that hold functions: their ``str`` has a memory address,
    and sets iterate in a per-process order, so a naive hash rebuilt the model on every run."""
    import subprocess
    import sys

    code = (
        "from mia.apps.warm_start import data_fingerprint, recipe_key, warm_recipe;"
        "print(data_fingerprint()['gold'], recipe_key(warm_recipe('executor'), {'m': 1}))"
    )
    outs = {
        subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in ("1", "2")
    }
    assert len(outs) == 1, outs


def test_gold_of_several_worlds_with_alternate_plans_and_a_style(tmp_path: Path) -> None:
    g = {"seed": [0, 2], "size": "small", "limit": 4, "plan": "alternate", "style": "concise"}
    path = warm_start.gold_world_file(g, tmp_path, say=None)
    assert path.name.startswith("w0+2-small-train-")
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["id"].split("_")[0] for r in rows] == ["w0"] * 4 + ["w2"] * 4
    for r in rows:
        planned = "guide for your reference" in r["messages"][1]["content"]
        assert r["variant"] == ("plan" if planned else "no_plan")
        assert r["messages"][2]["content"].startswith("<think>\nI need ")
    assert {r["variant"] for r in rows} == {"plan", "no_plan"}
    assert warm_start.gold_world_file(g, tmp_path, say=None) == path  # cached
    other = warm_start.gold_world_file({**g, "style": "terse"}, tmp_path, say=None)
    assert other != path


def test_gold_world_config_checks_seeds_plan_and_style() -> None:
    assert warm_start.GoldWorldConfig(seed=[3, 4]).validate().seeds == [3, 4]
    assert warm_start.GoldWorldConfig(seed=5).seeds == [5]
    for bad in ({"seed": [1, 1]}, {"seed": -1}, {"seed": []}, {"plan": "often"},
                {"style": "chatty"}):  # fmt: skip
        with pytest.raises(MiaError, match="gold_world"):
            warm_start.GoldWorldConfig(**bad).validate()
    cfg = warm_start.WarmStartConfig.from_dict(
        warm_start.warm_recipe("executor", ["gold_world.seed=[2,3]"])
    )
    assert cfg.gold_world.seeds == [2, 3]


def test_a_shipped_adapter_stands_in_for_the_training(
    base: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--ship`` writes the trained folder's adapter under the recipe key; a fresh home then
    gets the same model from base + adapter without training; another recipe does not."""
    import torch
    from transformers import AutoModelForCausalLM

    monkeypatch.setattr(warm_start, "shipped_dir", lambda: tmp_path / "assets")
    overrides = [*OVERRIDES, "total_steps=2", "policy.lora.rank=4", "policy.lora.alpha=8"]
    out = warm_start.ship("executor", home=tmp_path / "a", base_model_dir=base, overrides=overrides,
                 log=None)  # fmt: skip
    recipe = warm_start.warm_recipe("executor", overrides)
    key = warm_start.recipe_key(recipe, warm_start.base_fingerprint(base))
    assert out == tmp_path / "assets" / f"warm-executor-{key}.safetensors"
    assert warm_start.shipped_adapters() == {"executor": (key, out)}
    trained = warm_start.warm_cache_dir("executor", key, tmp_path / "a")

    def no_training(*_a: Any, **_k: Any) -> None:
        raise AssertionError("the shipped adapter must stand in for the training")

    monkeypatch.setattr(sft, "train_sft", no_training)
    lines: list[str] = []
    got = warm_start.warm_role_dir(
        "executor", home=tmp_path / "b", base_model_dir=base, recipe=recipe, log=lines.append
    )
    marker = json.loads((got / "mia-model.json").read_text())
    assert marker["source"] == f"shipped adapter {out.name}" and marker["key"] == key
    assert marker["steps"] == "2"
    ids = torch.tensor([[1, 5, 9, 14, 3, 7]])
    with torch.no_grad():
        want = AutoModelForCausalLM.from_pretrained(str(trained)).float()(ids).logits
        have = AutoModelForCausalLM.from_pretrained(str(got)).float()(ids).logits
    base_logits = AutoModelForCausalLM.from_pretrained(str(base)).float()(ids).logits.detach()
    assert not torch.allclose(want, base_logits, atol=1e-4)  # the training changed the model
    torch.testing.assert_close(have, want, atol=2e-3, rtol=0)  # float16 factors
    assert warm_start.shipped_adapter("executor", "0" * 16) is None  # another recipe trains
    # --ship of the same recipe reuses the trained folder and replaces nothing else
    monkeypatch.setattr(sft, "train_sft", no_training)
    assert warm_start.ship("executor", home=tmp_path / "a", base_model_dir=base, overrides=overrides,
                  log=None) == out  # fmt: skip


def test_the_shipped_adapters_are_those_of_the_recipes() -> None:
    """CI fails when a recipe, the gold data or the base model changed and the shipped adapter
    was not rebuilt (python -m mia.apps.warm_start ROLE --ship)."""
    from mia.models.adapter import read_adapter

    shipped = warm_start.shipped_adapters()
    assert sorted(shipped) == sorted(warm_start.SHIPPED_ROLES)
    fp = warm_start.embedded_fingerprint()
    for role, (key, path) in shipped.items():
        want = warm_start.recipe_key(warm_start.warm_recipe(role), fp)
        assert key == want, f"rebuild it: python -m mia.apps.warm_start {role} --ship"
        _, meta = read_adapter(path)
        assert (meta["role"], meta["key"]) == (role, key)
        assert path.stat().st_size < 5_000_000


def test_planner_gold_changes_retrain_only_the_recipes_that_use_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A constant of mia.apps.planner_gold is part of the key of recipes with
    gold_world.planner_memory (the Planner's) and of no other (the Executor's adapter stays)."""
    from mia.apps import planner_gold

    fp = warm_start.embedded_fingerprint()
    before = {
        role: warm_start.recipe_key(warm_start.warm_recipe(role), fp)
        for role in ("executor", "planner")
    }
    readings = {**planner_gold.READINGS, "person.from": ("birth_city",)}
    monkeypatch.setattr(planner_gold, "READINGS", readings)
    after = {
        role: warm_start.recipe_key(warm_start.warm_recipe(role), fp)
        for role in ("executor", "planner")
    }
    assert after["executor"] == before["executor"]
    assert after["planner"] != before["planner"]


def test_the_gold_data_is_pinned(tmp_path: Path) -> None:
    """The gold transcripts of a small world, byte for byte: a change in how gold is made that
    the data fingerprint cannot see still changes this digest (then bump WARM_DATA_VERSION,
    rebuild the shipped adapters and update the digest)."""
    import hashlib

    g = {"seed": 0, "size": "small", "limit": 6, "plan": "alternate", "style": "concise"}
    data = warm_start.gold_world_file(g, tmp_path, say=None).read_bytes()
    assert hashlib.sha256(data).hexdigest()[:16] == GOLD_DIGEST


GOLD_DIGEST = "bf83da5c98bc9f06"
