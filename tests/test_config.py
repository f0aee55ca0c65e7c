"""One config system (mia.config): every schema documents every key, every default lives in its
schema only (the shipped YAML files set nothing to its default), every entry point prints its
keys with --help-config, and bad input is one line."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from mia.config import (
    describe,
    from_dict,
    load_config,
    load_dict,
    option,
    section,
    to_dict,
    undocumented,
)
from mia.errors import MiaError

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"


def _schemas() -> dict[str, type]:
    from executor_train.config import ExecutorTrainConfig
    from local_search.config import LocalSearchConfig
    from memory_serve.config import MemoryServeConfig
    from mia.agent.config import AgentConfig
    from mia.apps.demo import DemoConfig
    from mia.apps.warm_start import WarmStartConfig
    from mia.data.world import WorldConfig
    from mia.eval.config import EvalConfig
    from mia.judge import JudgeConfig
    from mia.llm.config import LLMConfig
    from mia.planner.episode import PlannerEpisodeConfig
    from mia.rewards.config import ExecutorRewardConfig, NoGTRewardConfig, PlannerRewardConfig
    from mia.rl.__main__ import RunConfig
    from mia.rl.generators.base import GeneratorConfig
    from mia.rl.metrics import LoggingConfig
    from mia.rl.policy import PolicyConfig
    from mia.rl.sft import SftConfig
    from mia.rl.trainer import TrainerConfig
    from mia.rl.workers import WorkersConfig
    from planner_train.config import PlannerTrainConfig
    from serve.config import ServeConfig
    from ttrl.config import TTRLConfig
    from ttrl_streaming.config import StreamingServerConfig
    from web_tools.config import WebToolsConfig

    found = [
        # services
        MemoryServeConfig, ServeConfig, LocalSearchConfig, WebToolsConfig,
        # roles
        ExecutorTrainConfig, PlannerTrainConfig, TTRLConfig, StreamingServerConfig,
        # engine
        RunConfig, TrainerConfig, PolicyConfig, WorkersConfig, GeneratorConfig, LoggingConfig,
        SftConfig, WarmStartConfig, PlannerEpisodeConfig,
        # the rest
        EvalConfig, DemoConfig, AgentConfig, LLMConfig, WorldConfig, JudgeConfig,
        ExecutorRewardConfig, PlannerRewardConfig, NoGTRewardConfig,
    ]  # fmt: skip
    return {s.__name__: s for s in found}


@pytest.mark.parametrize("name", sorted(_schemas()))
def test_every_key_of_every_schema_has_a_help_text(name: str) -> None:
    schema = _schemas()[name]
    assert undocumented(schema) == []
    text = describe(schema)
    assert all("  " in line for line in text.splitlines()), text  # key (type) = default  help


# ----------------------------------------------------------------------------- one default


def repeated(raw: Any, default: Any, prefix: str = "") -> list[str]:
    """Dotted keys of a YAML mapping whose value equals ``default``'s at the same place (an
    empty mapping sets nothing)."""
    out: list[str] = []
    if not isinstance(raw, Mapping) or not isinstance(default, Mapping):
        return out
    for key, value in raw.items():
        if key == "defaults" or key not in default:
            continue
        base = default[key]
        if isinstance(value, Mapping) and isinstance(base, Mapping):
            out += repeated(value, base, f"{prefix}{key}.")
        elif isinstance(value, Mapping) and not value:
            continue
        elif value == base:
            out.append(f"{prefix}{key}")
    return out


def _raw(path: Path) -> dict[str, Any]:
    return OmegaConf.to_container(OmegaConf.load(path), resolve=False) or {}  # type: ignore[return-value]


def _defaults_of(schema: type) -> Callable[[Path], dict[str, Any]]:
    return lambda path: to_dict(schema())


def _role(module: str, schema: str) -> Callable[[Path], dict[str, Any]]:
    """A role file's baseline: the role's schema defaults; an experiment's: the role's composed
    default config (what the experiment changes)."""

    def baseline(path: Path) -> dict[str, Any]:
        import importlib

        config = importlib.import_module(module)
        if path.parent.name == "experiment":
            return to_dict(config.load_config())
        return to_dict(getattr(config, schema)())

    return baseline


def _warm_start(path: Path) -> dict[str, Any]:
    """A warm-start recipe's baseline: the SFT recipe it builds on, plus gold_world's defaults."""
    from mia.apps.warm_start import GoldWorldConfig
    from mia.rl.sft import compose

    return {**compose(path.stem, []), "gold_world": to_dict(GoldWorldConfig())}


def _baselines() -> dict[str, Callable[[Path], dict[str, Any]]]:
    s = _schemas()
    from mia.rewards.config import KINDS

    return {
        "agent/*.yaml": _defaults_of(s["AgentConfig"]),
        "demo/*.yaml": _defaults_of(s["DemoConfig"]),
        "eval/*.yaml": _defaults_of(s["EvalConfig"]),
        "judge/*.yaml": _defaults_of(s["JudgeConfig"]),
        "local_search/*.yaml": _defaults_of(s["LocalSearchConfig"]),
        "memory/*.yaml": _defaults_of(s["MemoryServeConfig"]),
        "reward/*.yaml": lambda path: to_dict(KINDS[path.stem]()),
        "rl/trainer.yaml": _defaults_of(s["RunConfig"]),
        "rl/policy.yaml": _defaults_of(s["PolicyConfig"]),
        "rl/workers.yaml": _defaults_of(s["WorkersConfig"]),
        # composed as the trainer's generator section: the trainer's generator defaults
        "rl/generator.yaml": lambda path: to_dict(s["TrainerConfig"]()).get("generator", {}),
        "serve/*.yaml": _defaults_of(s["ServeConfig"]),
        "web_tools/*.yaml": _defaults_of(s["WebToolsConfig"]),
        "sft/*.yaml": _defaults_of(s["SftConfig"]),
        "warm_start/*.yaml": _warm_start,
        "executor_train/**/*.yaml": _role("executor_train.config", "ExecutorTrainConfig"),
        "planner_train/**/*.yaml": _role("planner_train.config", "PlannerTrainConfig"),
        "ttrl/**/*.yaml": _role("ttrl.config", "TTRLConfig"),
        "ttrl_streaming/*.yaml": _role("ttrl_streaming.config", "StreamingServerConfig"),
    }


# Shipped files that state values equal to a schema default on purpose, with the reason.
EXCEPTIONS = {
    "world/*.yaml": "size presets, mirrored field by field from mia.data.world.PRESETS "
    "(test_world keeps them equal); `mia world --size` selects the preset, the files document it; "
    "and seeds.yaml, the seed ranges (tests/test_world_lexicon.py)",
    "efficacy/*.yaml": "pre-registered protocols (docs/protocol.md): every value is written out "
    "on purpose, so that no later change of a default can change a protocol",
}


def _llm_repeats(path: Path) -> list[str]:
    """An llm file: ``common`` against LLMConfig's defaults, each role against those + common."""
    from mia.llm.config import LLMConfig

    raw = _raw(path)
    base = to_dict(LLMConfig())
    common = raw.get("common") or {}
    out = [f"common.{k}" for k in repeated(common, base)]
    merged = {**base, **common, "sampling": {**base["sampling"], **common.get("sampling", {})}}
    for role, fields in (raw.get("roles") or {}).items():
        out += [f"roles.{role}.{k}" for k in repeated(fields or {}, merged)]
    return out


def _files(pattern: str) -> set[Path]:
    return set(CONFIGS.glob(pattern))


def test_every_shipped_yaml_is_checked() -> None:
    covered = set().union(*(_files(p) for p in [*_baselines(), *EXCEPTIONS, "llm/*.yaml"]))
    assert sorted(set(CONFIGS.rglob("*.yaml")) - covered) == []


@pytest.mark.parametrize("pattern", sorted(_baselines()))
def test_shipped_yaml_never_repeats_a_schema_default(pattern: str) -> None:
    baseline = _baselines()[pattern]
    files = sorted(_files(pattern))
    assert files, pattern
    found = {f.relative_to(CONFIGS).as_posix(): repeated(_raw(f), baseline(f)) for f in files}
    assert {k: v for k, v in found.items() if v} == {}


def test_llm_yaml_never_repeats_a_default() -> None:
    found = {f.name: _llm_repeats(f) for f in sorted(_files("llm/*.yaml"))}
    assert {k: v for k, v in found.items() if v} == {}


def test_a_repeated_default_is_caught() -> None:
    from mia.agent.config import AgentConfig

    raw = {"max_turns": 20, "sampling": {}, "tools": {"search": {"params": {"topk": 3}}}}
    assert repeated(raw, to_dict(AgentConfig())) == ["max_turns", "tools.search.params.topk"]


# ----------------------------------------------------------------------------- the loader


@dataclass
class _Inner:
    k: int = option(1, "an int")
    pair: tuple[float, float] = option((0.9, 0.99), "a pair")


@dataclass
class _Outer:
    name: str = option("x", "a name")
    inner: _Inner = section(_Inner, "a section")
    extra: dict[str, Any] = option({}, "free-form")

    def validate(self) -> _Outer:
        if self.name == "bad":
            raise MiaError("outer: name must not be bad")
        return self


def test_from_dict_types_nested_sections_and_one_line_errors() -> None:
    cfg = from_dict(_Outer, {"inner": {"k": "3", "pair": [0.1, 0.2]}, "extra": {"a": [1]}})
    assert cfg == _Outer(inner=_Inner(k=3, pair=(0.1, 0.2)), extra={"a": [1]})
    assert isinstance(cfg.inner.pair, tuple)
    with pytest.raises(MiaError, match=r"^where: unknown key\(s\) \['inner.kk'\] \(known under "):
        from_dict(_Outer, {"inner": {"kk": 1}}, "where")
    with pytest.raises(MiaError, match=r"^_Outer: inner.k: 'abc' is not int") as err:
        from_dict(_Outer, {"inner": {"k": "abc"}})
    assert "\n" not in str(err.value)
    with pytest.raises(MiaError, match="name must not be bad"):
        from_dict(_Outer, {"name": "bad"})
    assert from_dict(_Outer, cfg) is cfg  # an instance is returned as is


def test_load_config_layers_and_describe(tmp_path: Path) -> None:
    yaml = tmp_path / "c.yaml"
    yaml.write_text("name: y\ninner: {k: 2}\n")
    cfg = load_config(_Outer, yaml, ["inner.k=5"])
    assert (cfg.name, cfg.inner.k) == ("y", 5)
    with pytest.raises(MiaError, match="overrides must look like key=value"):
        load_config(_Outer, yaml, ["inner.k"])
    text = describe(_Outer)
    assert "inner.k (int) = 1  an int" in text and "extra (dict[str, Any]) = {}  free-form" in text
    assert describe(_Outer(name="z")).splitlines()[0] == "name (str) = z  a name"


def test_role_configs_compose_over_the_schema(tmp_path: Path) -> None:
    from executor_train.config import ExecutorTrainConfig
    from executor_train.config import load_config as executor_config
    from ttrl.config import load_config as ttrl_config

    cfg = executor_config("default", ["data.train=f.jsonl", "judge=llm", "trainer.n=2"])
    assert (cfg.data.train, cfg.judge.type, cfg.trainer.n) == ("f.jsonl", "llm", 2)
    assert cfg.trainer.batch_size == 4 and cfg.agent.max_turns == 4  # the role's defaults
    paper = executor_config("default", ["experiment=paper"])
    assert (paper.trainer.batch_size, paper.agent.max_turns, paper.judge.type) == (128, 10, "llm")
    assert paper.agent.sampling == {
        "temperature": 1.0, "top_p": 1.0, "max_tokens": 4096, "logprobs": True
    }  # fmt: skip
    nogt = ttrl_config("default", ["experiment=paper_nogt"])
    assert (nogt.mode, nogt.panel.type, nogt.trainer.policy.optim.lr) == ("nogt", "panel", 2e-7)
    # a role file elsewhere still pulls the shipped groups
    mine = tmp_path / "mine.yaml"
    mine.write_text("defaults:\n  - /judge@judge: llm\n  - _self_\nreplan: false\n")
    other = executor_config(str(mine), [])
    assert isinstance(other, ExecutorTrainConfig)
    assert (other.replan, other.judge.type, other.trainer.n) == (False, "llm", 4)
    with pytest.raises(MiaError, match="unknown key 'trainer.bogus'"):
        executor_config("default", ["trainer.bogus=1"])
    with pytest.raises(MiaError, match=r"trainer.n: 'x' is not int"):
        executor_config("default", ["trainer.n=x"])


def test_load_dict_names_and_mappings() -> None:
    assert load_dict("rules", group="judge") == {}
    assert load_dict({"a": {"b": 1}}, ["a.c=2"]) == {"a": {"b": 1, "c": 2}}
    with pytest.raises(MiaError, match=r"^judge config not found: nope \(also looked for"):
        load_dict("nope", group="judge")


# ----------------------------------------------------------------------------- entry points


def _in_process() -> dict[str, tuple[Callable[[list[str]], Any], str]]:
    """Entry points that print --help-config (and exit 0) and a key each must list."""
    from executor_train.train import main as executor_train
    from local_search.cli import main as local_search
    from memory_serve.__main__ import main as memory_serve
    from mia.apps.demo import main as demo
    from mia.apps.warm_start import main as warm_start
    from mia.eval.cli import main as eval_
    from mia.rl.__main__ import main as mia_rl
    from mia.rl.sft import main as sft
    from planner_train.train import main as planner_train
    from serve.cli import main as serve
    from ttrl.run import main as ttrl
    from ttrl_streaming.reward_server import main as reward_server
    from ttrl_streaming.server import main as streaming
    from web_tools.cli import main as web_tools

    return {
        "executor_train": (executor_train, "agent.max_turns (int) = 4"),
        "planner_train": (planner_train, "episode.plan_max_tokens (int) = 256"),
        "ttrl": (ttrl, "trainer.save_freq (int) = 1"),
        "ttrl_streaming.server": (streaming, "services.reward_url (str | None)"),
        "reward_server": (reward_server, "acc_final_weight (float) = 0.7"),
        "memory_serve": (memory_serve, "store.retrieval.top_k (int) = 2"),
        "serve": (serve, "llm.backend (str) = local"),
        "local_search serve": (lambda a: local_search(["serve", *a]), "serve.default_topk"),
        "local_search": (local_search, "build.bm25.k1 (float) = 0.9"),
        "web_tools serve": (lambda a: web_tools(["serve", *a]), "ttl_s (float) = 604800"),
        "web_tools": (web_tools, "rate_limit_qps (float) = 10.0"),
        "mia eval": (eval_, "memory.replan_top_k (int) = 0"),
        "mia demo": (demo, "world.seed (int) = 20999"),
        "mia.rl": (mia_rl, "generator.max_batch_size (int) = 64"),
        "mia.rl.sft": (sft, "data.max_length (int | None) = 2048"),
        "mia.apps.warm_start": (warm_start, "gold_world.plan (str) = both"),
    }


@pytest.mark.parametrize("name", sorted(_in_process()))
def test_help_config_lists_every_key(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    main, key = _in_process()[name]
    with pytest.raises(SystemExit) as exc:
        main(["--help-config"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert key in out, out[:2000]
    assert all(" = " in line or line.endswith(":") or ":  " in line or line.startswith("#")
               for line in out.splitlines() if line), out  # fmt: skip


def test_help_config_through_python_m() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "memory_serve", "--help-config"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "compress.on_empty (str) = error" in proc.stdout


def test_role_cfg_prints_every_key(capsys: pytest.CaptureFixture[str]) -> None:
    import yaml

    from planner_train.train import main

    main(["--cfg", "trainer.n=2"])
    cfg = yaml.safe_load(capsys.readouterr().out)
    assert cfg["trainer"]["n"] == 2 and cfg["trainer"]["policy"]["loss"]["clip_ratio_c"] == 3.0
    assert cfg["episode"]["max_context"] == 8192 and cfg["judge"]["type"] == "rules"


def test_bad_role_input_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    from ttrl.run import main

    for argv, message in (
        (["trainer.n=abc"], "python -m ttrl: error: ttrl config: trainer.n: 'abc' is not int"),
        (["nosuch=1"], "python -m ttrl: error: bad config default.yaml: unknown key 'nosuch'"),
        (["mode=sometimes"], "python -m ttrl: error: mode must be one of"),
    ):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1 and err[0].startswith(message), err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["-m", "memory_serve", "store.retrieval.top_k=abc"], "memory_serve: error: memory config"),
        (["-m", "serve", "agent.max_turns=0"], "serve: error: agent config: max_turns"),
    ],
)
def test_service_startup_config_errors_exit_2(argv: list[str], message: str) -> None:
    proc = subprocess.run(
        [sys.executable, *argv], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[-1].startswith(message), proc.stderr


def test_schema_defaults_are_what_the_yaml_files_said() -> None:
    """Values that lived in YAML and moved into the schemas (the YAML won where they differed)."""
    from mia.apps.demo import DemoConfig, load_demo_config
    from mia.rl.trainer import TrainerConfig

    assert TrainerConfig().generator.max_batch_size == 64
    demo = DemoConfig()
    assert demo.world.seed == 20999
    assert demo.warm_start.sampling["executor"] == {"max_tokens": 192, "presence_penalty": 0.0}
    # The demo's values of mia eval's keys live in configs/demo/default.yaml.
    shipped = load_demo_config(None, [])
    assert shipped.eval.services.memory_overrides == ["compress.on_empty=trace"]
    assert dataclasses.asdict(shipped.eval.judge)["mode"] == "em"


def test_demo_keeps_a_local_manager_out_of_the_memory_loop() -> None:
    """memory_compress / cold_start ``auto``: rule summaries and Planner-only plans when the
    Manager is the local embedded model; the Manager's summaries and cold-start plans (the
    reference) when it is an endpoint; explicit values win either way."""
    from mia.apps.demo import DemoConfig, manager_choices

    cfg = DemoConfig()
    assert (cfg.memory_compress, cfg.cold_start) == ("auto", "auto")
    assert manager_choices(cfg, local_manager=True) == ("rules", "false")
    assert manager_choices(cfg, local_manager=False) == ("llm", "true")
    cfg.memory_compress, cfg.cold_start = "llm", True  # type: ignore[assignment]
    assert manager_choices(cfg, local_manager=True) == ("llm", "true")
    cfg.cold_start = "sometimes"
    with pytest.raises(MiaError, match="cold_start must be auto, true or false"):
        cfg.validate()


def test_demo_ttrl_passes_plan_where_mia_does() -> None:
    """The demo's TTRL passes take mia's gate (plan_without_failure: false); the no-GT pass
    with the vote answers an unplanned question by a vote of ttrl.nogt_alone_samples Executor
    runs (a lone answer always wins its own vote, and the load refuses fewer than 2)."""
    from mia.apps.demo import load_demo_config, ttrl_overrides

    cfg = load_demo_config("efficacy", [])
    sup, nogt = ttrl_overrides(cfg, "supervised"), ttrl_overrides(cfg, "nogt")
    assert (
        "memory.plan_without_failure=false" in sup and "memory.plan_without_failure=false" in nogt
    )
    assert not any(o.startswith("memory.alone_samples") for o in sup)
    assert "memory.alone_samples=3" in nogt
    panel = load_demo_config("efficacy", ["ttrl.nogt_method=panel"])
    assert not any(o.startswith("memory.alone_samples") for o in ttrl_overrides(panel, "nogt"))
    with pytest.raises(MiaError, match="needs memory.alone_samples >= 2"):
        load_demo_config("efficacy", ["ttrl.nogt_alone_samples=1"]).validate()
