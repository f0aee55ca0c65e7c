"""Where the vLLM rollout engine may run beside the policy on one GPU node, checked at load.

On a GPU node ``mia.rl`` has two sound layouts for a vLLM generator:

- **colocated**: the engine shares the policy's GPUs (``generator.placement: driver`` puts it
  in the trainer's process on GPU 0, which policy rank 0 also uses; ``placement: ray`` with a
  fractional ``ray_num_gpus`` shares a GPU too). The engine must sleep while the policy trains
  (``generator.sleep_mode`` on, or auto on a GPU) and the policy's shards, gradients and
  optimizer state must live in host memory while the engine generates (``policy.offload:
  true``, FSDP2's CPU offload) -- veRL's hybrid engine does the same with its FSDP offload;
- **own GPUs**: ``placement: ray`` with ``ray_num_gpus`` (default: the tensor-parallel size)
  whole GPUs that the policy's workers leave free: ``world_size x num_gpus_per_worker +
  ray_num_gpus <= GPUs of the node``.

Any other layout would put vLLM's ``gpu_memory_utilization`` share of GPU 0 beside rank 0's
training state (or wait forever for GPUs Ray cannot give); :func:`check_placement` refuses it
with one line naming the fix, which the CLIs print with exit 2. It runs when the node is
known: a private single-node cluster (``workers.ray_address`` null: this machine's GPUs) at
load, and a cluster that turns out to have one node when the trainer starts.
"""

from __future__ import annotations

from typing import Any

from mia.errors import MiaError

COLOCATE_FIX = "generator.placement=driver generator.sleep_mode=on policy.offload=true"


def node_gpus() -> int:
    """GPUs visible on this machine (0 without CUDA)."""
    import torch

    return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0


def _policy_gpus(cfg: Any) -> int:
    if cfg.workers.mode != "ray":
        return 1  # single_process: the driver's GPU 0
    per = cfg.workers.num_gpus_per_worker
    return int(round(cfg.workers.world_size * (1.0 if per is None else float(per))))


def check_placement(cfg: Any, gpus: int) -> None:
    """Refuse a vLLM layout that can run out of memory on GPU 0 of a ``gpus``-GPU node (see
    the module docstring); ``cfg`` is a :class:`mia.rl.trainer.TrainerConfig`."""
    gen = cfg.generator
    if gpus <= 0 or gen.backend != "vllm" or cfg.policy.device == "cpu":
        return
    policy = _policy_gpus(cfg)
    if policy > gpus:
        raise MiaError(
            f"trainer: the policy asks for {policy} GPU(s) (workers.world_size x "
            f"num_gpus_per_worker) but the node has {gpus}"
        )
    tp = int((gen.engine_kwargs or {}).get("tensor_parallel_size", 1))
    own = gen.ray_num_gpus if gen.ray_num_gpus is not None else tp
    if gen.placement == "ray" and own >= 1:
        if policy + own > gpus:
            raise MiaError(
                f"trainer: vLLM asks for {own:g} GPU(s) of its own (generator.placement=ray) "
                f"beside the policy's {policy} on a {gpus}-GPU node: set workers.world_size <= "
                f"{gpus - int(own)}, or colocate ({COLOCATE_FIX})"
            )
        return
    # Colocated: the engine shares a GPU with policy rank 0.
    missing = []
    if gen.sleep_mode == "off":
        missing.append("generator.sleep_mode=on (vLLM frees its memory while the policy trains)")
    if not cfg.policy.offload:
        missing.append("policy.offload=true (the policy's state in host memory while vLLM runs)")
    if missing:
        raise MiaError(
            f"trainer: vLLM shares GPU 0 with policy rank 0 (generator.placement="
            f"{gen.placement}) without {' and '.join(missing)}; or give vLLM GPUs of its own: "
            f"generator.placement=ray generator.ray_num_gpus={tp} workers.world_size<="
            f"{max(gpus - tp, 0)}"
        )
