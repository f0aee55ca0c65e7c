"""Precision by capability: bf16 only where the hardware computes it natively.

The central test composes every shipped config with the CPU reported as AVX2-only (a user's
machine where bf16 is ~60x slower than float32) and checks that no bf16 compute is selected:
by the raw resolution of every precision key, and by the objects that consume them (the
trainable policy's autocast, the local LLM backend's weights, the rollout generator, the demo).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from mia import precision
from mia.precision import CpuReport

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
AVX2 = CpuReport("AVX2", frozenset({"sse4_2", "avx", "avx2", "fma"}), "x86_64")
AVX512_BF16 = CpuReport("AVX512", frozenset({"avx2", "avx512f", "avx512_bf16"}), "x86_64")
PRECISION_KEYS = ("mixed_precision", "dtype", "local_dtype")


@pytest.fixture
def avx2(monkeypatch: pytest.MonkeyPatch) -> CpuReport:
    monkeypatch.delenv(precision.ENV_OVERRIDE, raising=False)
    monkeypatch.setattr(precision, "cpu_report", lambda: AVX2)
    return AVX2


@pytest.fixture
def bf16_cpu(monkeypatch: pytest.MonkeyPatch) -> CpuReport:
    monkeypatch.delenv(precision.ENV_OVERRIDE, raising=False)
    monkeypatch.setattr(precision, "cpu_report", lambda: AVX512_BF16)
    return AVX512_BF16


# ----------------------------------------------------------------------------- the rule


def test_report_reads_capability_and_flags() -> None:
    assert not AVX2.native_bf16
    assert AVX512_BF16.native_bf16
    # flags alone do not make bf16 native when torch dispatches AVX2 kernels
    assert not CpuReport("AVX2", frozenset({"avx512_bf16"})).native_bf16
    assert CpuReport("AMX", frozenset({"amx_bf16"})).native_bf16
    assert "no native bf16" in AVX2.describe()


def test_auto_and_explicit_choices_on_avx2(avx2: CpuReport) -> None:
    assert precision.compute_dtype("auto") == "float32"
    assert precision.compute_dtype(None) == "float32"
    # an explicit bf16/fp16 on a CPU without it falls back to float32
    for choice in ("bf16", "bfloat16", "fp16", "float16"):
        assert precision.compute_dtype(choice, "cpu") == "float32"
    assert precision.compute_dtype("none") == "float32"
    assert precision.autocast_dtype("bf16", "cpu") is None
    assert precision.describe("cpu").startswith("float32 (CPU AVX2")


def test_native_cpu_gets_bf16(bf16_cpu: CpuReport) -> None:
    assert precision.compute_dtype("auto", "cpu") == "bfloat16"
    assert precision.autocast_dtype("auto", torch.device("cpu")) is torch.bfloat16
    assert precision.compute_dtype("none", "cpu") == "float32"


def test_env_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(precision, "cpu_report", lambda: AVX512_BF16)
    monkeypatch.setenv(precision.ENV_OVERRIDE, "0")
    assert precision.compute_dtype("auto") == "float32"
    monkeypatch.setattr(precision, "cpu_report", lambda: AVX2)
    monkeypatch.setenv(precision.ENV_OVERRIDE, "1")
    assert precision.compute_dtype("auto") == "bfloat16"


def test_unknown_spelling_is_an_error() -> None:
    from mia.errors import MiaError

    with pytest.raises(MiaError, match="unknown precision"):
        precision.compute_dtype("bf61")


# ----------------------------------------------------------------------------- every config


def _precision_values(node: object, where: str = "") -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    if isinstance(node, dict):
        for key, value in node.items():
            path = f"{where}.{key}" if where else str(key)
            if key in PRECISION_KEYS and isinstance(value, str):
                found.append((path, value))
            else:
                found.extend(_precision_values(value, path))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found.extend(_precision_values(value, f"{where}[{i}]"))
    return found


def _composed_configs() -> dict[str, dict]:
    """Every shipped config, composed the way its entry point composes it."""
    from executor_train.config import load_config as executor_train
    from mia.config import to_dict
    from mia.rl.sft import compose as compose_sft
    from planner_train.config import load_config as planner_train
    from ttrl.config import load_config as ttrl
    from ttrl_streaming.config import load_config as ttrl_streaming

    out: dict[str, dict] = {}
    roles = {
        executor_train: ["default", "default:experiment=paper"],
        planner_train: ["default", "default:experiment=paper"],
        ttrl: ["default", "default:experiment=paper", "default:experiment=paper_nogt"],
        ttrl_streaming: ["server"],
    }
    for load, names in roles.items():
        for spec in names:
            name, _, override = spec.partition(":")
            cfg = load(name, [override] if override else [])  # every key, defaults filled
            out[f"{load.__module__}/{spec}"] = to_dict(cfg)
    for name in ("executor", "planner"):
        out[f"sft/{name}"] = compose_sft(name, [])
    for path in sorted(CONFIGS.rglob("*.yaml")):
        rel = path.relative_to(CONFIGS).as_posix()
        out[f"raw:{rel}"] = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    return out


def test_no_shipped_config_selects_bf16_on_avx2(avx2: CpuReport) -> None:
    configs = _composed_configs()
    raw = {k for k in configs if k.startswith("raw:")}
    assert len(raw) == len(list(CONFIGS.rglob("*.yaml")))  # every file is looked at
    checked = 0
    for name, cfg in configs.items():
        for path, value in _precision_values(cfg):
            if path.endswith("export_dtype"):
                continue  # storage, not compute
            # A config never forces half precision: the machine decides (auto), or float32.
            assert precision.normalise(value) in ("auto", "float32"), f"{name}: {path}={value}"
            chosen = precision.compute_dtype(value, "cpu")
            assert chosen != "bfloat16", f"{name}: {path}={value} selects bf16 on AVX2"
            checked += 1
    assert checked >= 10  # the walk really found the precision keys


def test_consumers_choose_float32_on_avx2(avx2: CpuReport, tmp_path: Path) -> None:
    """The objects built from the shipped configs compute in float32 on an AVX2-only CPU."""
    from mia.llm.config import LLMConfig, load_llm_config
    from mia.llm.local_backend import LocalChat
    from mia.models.tiny import build_tokenizer, save_tiny, tiny_qwen2
    from mia.rl.generators import GeneratorConfig, make_generator
    from mia.rl.policy import PolicyModel
    from mia.rl.sft import compose as compose_sft

    tok = build_tokenizer()
    model = tiny_qwen2(tok, seed=0).to(torch.bfloat16)  # a bf16 folder, like the embedded cache
    folder = save_tiny(model, tok, tmp_path / "tiny")

    for role in ("executor", "planner"):
        section = dict(compose_sft(role, [])["policy"])
        section.update(model_path=str(folder), device="cpu")
        section["optim"] = {**section["optim"], "total_steps": 10}  # SFT sets it from the data
        policy = PolicyModel(section)
        assert policy.autocast_dtype is None
        assert next(policy.module.parameters()).dtype == torch.float32

    llm = load_llm_config("embedded")
    common = LLMConfig.from_mapping({**llm["common"], "model_path": str(folder)})
    chat = LocalChat(str(folder), dtype=common.dtype, device=common.device)
    assert next(chat._engine.model.parameters()).dtype == torch.float32

    gen_cfg = OmegaConf.to_container(OmegaConf.load(CONFIGS / "rl" / "generator.yaml"))
    gen_cfg = {**gen_cfg, "model_path": str(folder)}
    gen = make_generator(GeneratorConfig.from_dict(gen_cfg))
    assert next(gen.model.parameters()).dtype == torch.float32


def test_consumers_choose_bf16_where_native(bf16_cpu: CpuReport, tmp_path: Path) -> None:
    from mia.llm.local_backend import LocalChat
    from mia.models.tiny import build_tokenizer, save_tiny, tiny_qwen2

    tok = build_tokenizer()
    folder = save_tiny(tiny_qwen2(tok, seed=0), tok, tmp_path / "tiny")
    chat = LocalChat(str(folder), dtype="auto")
    assert next(chat._engine.model.parameters()).dtype == torch.bfloat16


def test_demo_prints_the_precision(avx2: CpuReport) -> None:
    import argparse

    from mia.apps.demo import DemoConfig, role_overrides

    args = argparse.Namespace(
        **{f"{r}_url": None for r in ("executor", "planner", "manager", "judge")},
        api_key_env=None,
    )
    roles = role_overrides(DemoConfig(), args)
    assert {r["dtype"] for r in roles.values()} == {"float32"}
