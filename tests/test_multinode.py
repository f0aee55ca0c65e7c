"""A GRPO step on a real two-node Ray cluster (two raylets on this machine, each with its own
resources): the trainer joins it by address, the two FSDP2 ranks are placed one per node by a
STRICT_SPREAD placement group and meet on rank 0's node IP; the update equals the
single-process one."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
import torch
from toy_tool_task import make_episode, make_samples, step_config

from mia.errors import MiaError
from mia.models.tiny import build_tokenizer, save_tiny, tiny_qwen2
from mia.rl.trainer import Trainer

pytestmark = pytest.mark.slow  # ~1 min: two raylets, two actors importing torch/transformers


def text_reward(sample: dict, traj) -> tuple[float, dict]:
    text = traj.final_text or ""
    return min(text.count("e"), 4) / 4.0, {}


@pytest.fixture(scope="module")
def two_nodes():
    """``ray start --head`` + ``ray start --address`` in-process (ray.cluster_utils): a head
    with 1 CPU and resource ``head_node``, a second node with 1 CPU and ``second_node``."""
    from ray.cluster_utils import Cluster

    os.environ["RAY_AUTH_MODE"] = "disabled"
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    temp = tempfile.mkdtemp(prefix="mia-ray2-", dir="/tmp")  # short: unix socket paths
    old_tmp = os.environ.get("RAY_TMPDIR")
    os.environ["RAY_TMPDIR"] = temp  # Ray writes the cluster's address file in <it>/ray
    session = os.path.join(temp, "ray")
    os.makedirs(session)
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 1,
            "resources": {"head_node": 1},
            "temp_dir": session,
            "include_dashboard": False,
        },
    )
    try:
        cluster.add_node(num_cpus=1, resources={"second_node": 1}, temp_dir=session)
        cluster.wait_for_nodes()
        yield cluster
    finally:
        cluster.shutdown()
        shutil.rmtree(temp, ignore_errors=True)
        if old_tmp is None:
            os.environ.pop("RAY_TMPDIR", None)
        else:
            os.environ["RAY_TMPDIR"] = old_tmp


def test_grpo_step_with_one_worker_on_each_of_two_nodes(two_nodes, tmp_path: Path) -> None:
    import ray

    torch.set_num_threads(1)
    tok = build_tokenizer()
    model_dir = save_tiny(tiny_qwen2(tok, seed=3), tok, tmp_path / "m")
    data = make_samples(2, seed=6)  # its rollouts' rewards differ: the update is not zero

    def episode():
        ep = make_episode(data)
        ep.cfg.max_turns = 1
        return ep

    one = step_config(model_dir, tmp_path / "one")
    # The per-tensor AdamW that FSDP runs, so the two updates are the same arithmetic.
    one["policy"]["optim"]["fused"] = False
    with Trainer(one, episode(), text_reward, data) as t:
        solo = t.fit()
        want = t.policy.state_dict_for_export()

    workers = {
        "mode": "ray",
        "world_size": 2,
        "ray_address": two_nodes.address,
        "placement_strategy": "STRICT_SPREAD",
        "placement_timeout_s": 120,
    }
    with Trainer(
        step_config(model_dir, tmp_path / "two", **workers), episode(), text_reward, data
    ) as t:
        assert len([n for n in ray.nodes() if n["Alive"]]) == 2
        info = t.policy.workers_info
        assert [w["rank"] for w in info] == [0, 1]
        assert len({w["node_id"] for w in info}) == 2  # one rank per node
        assert {w["backend"] for w in info} == {"gloo"}  # CPU: gloo (NCCL on GPU)
        assert t.policy.master_addr == info[0]["node_ip"]  # rendezvous on rank 0's node
        history = t.fit()
        got = t.policy.state_dict_for_export()
        assert t.generator.weight_version == 1
    assert not ray.is_initialized()  # the trainer disconnected; the cluster still runs
    assert len(two_nodes.list_all_nodes()) == 2
    assert history[0]["rollout/n"] == solo[0]["rollout/n"] == 4.0
    assert history[0]["reward/mean"] == solo[0]["reward/mean"]  # same seeded rollouts
    assert history[0]["actor/grad_norm"] > 0
    # The data-parallel update equals the single-process one. Adam moves a weight by up to lr
    # (1e-2) whatever its gradient's size, so the last bits that gloo's summation order changes
    # in a near-0 gradient can move that weight by a few 1e-5: 1e-4 is 1 % of a step.
    for key, value in want.items():
        assert torch.allclose(got[key], value, atol=1e-4), key


def test_cluster_without_room_names_the_bundles(two_nodes, tmp_path: Path) -> None:
    """Three workers STRICT_SPREAD over two nodes cannot be placed: a clear error, no hang."""
    import ray

    from mia.rl.workers import PolicyGroup

    tok = build_tokenizer()
    model_dir = save_tiny(tiny_qwen2(tok), tok, tmp_path / "m")
    ray.init(address=two_nodes.address, logging_level="ERROR")
    try:
        with pytest.raises(MiaError, match="cannot place 3 policy workers"):
            PolicyGroup(
                {"model_path": str(model_dir)},
                world_size=3,
                placement_strategy="STRICT_SPREAD",
                placement_timeout_s=5,
            )
    finally:
        ray.shutdown()
