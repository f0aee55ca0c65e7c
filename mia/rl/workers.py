"""Data-parallel policy workers: Ray actors holding FSDP2 shards, driven by a ``PolicyGroup``.

``PolicyGroup(cfg, world_size=N)`` reserves a Ray placement group of N bundles (one CPU or GPU
each; ``PACK`` fills a node before the next, ``SPREAD`` / ``STRICT_SPREAD`` across nodes), starts
one actor per bundle, asks rank 0 for its node's IP and a free port there, and the ranks form
the process group on that address (gloo on CPU, NCCL on GPU), so ranks on other nodes can reach
it. Each builds a :class:`~mia.rl.policy.PolicyModel` shard. The
driver splits every batch into N contiguous slices (rank r gets slice r), calls the same method
on all ranks at once and gathers the results. ``mode="single_process"`` runs the very same
worker class in the driver process at world size 1: a configuration for debugging and tests,
not a second implementation.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mia.config import option
from mia.errors import MiaError
from mia.heap import trim_heap
from mia.rl import dist as D
from mia.rl.policy import Batch, PolicyConfig, PolicyModel, batch_size, concat_batches, slice_batch


@dataclass
class WorkersConfig:
    """How the policy runs (``trainer.workers``)."""

    mode: str = option(
        "ray", "ray | single_process (world size 1 in the driver: debugging, tests, small CPUs)"
    )
    world_size: int = option(1, "data-parallel ranks; each is one Ray actor holding an FSDP2 shard")
    num_cpus_per_worker: float = option(1, "Ray CPUs per worker")
    num_gpus_per_worker: float | None = option(
        None, "Ray GPUs per worker; null = 1 when the Ray cluster has GPUs, else 0"
    )
    ray_num_cpus: int | None = option(None, "CPUs of the local Ray cluster; null = all")
    ray_address: str | None = option(
        None,
        "join a running Ray cluster: auto | HOST:6379 (after `ray start --head` / "
        "`ray start --address`); null = start a private single-node cluster",
    )
    placement_strategy: str = option(
        "PACK",
        "how the workers' placement-group bundles spread over nodes: PACK | SPREAD | "
        "STRICT_PACK | STRICT_SPREAD",
    )
    placement_timeout_s: float = option(
        600, "seconds to wait for the cluster to have room for all workers"
    )


class PolicyWorker:
    """One rank: joins the process group, then owns a PolicyModel. Methods are collectives."""

    def __init__(
        self,
        cfg: dict[str, Any],
        rank: int = 0,
        world_size: int = 1,
        master_port: int | None = None,
        master_addr: str = "127.0.0.1",
        torch_threads: int | None = None,
        defer: bool = False,
    ):
        """``defer`` (Ray): construct only; :meth:`setup` joins the group once rank 0's
        address is known."""
        if torch_threads:
            torch.set_num_threads(torch_threads)
        self._cfg = cfg
        self._rank, self._world_size = rank, world_size
        if not defer:
            self.setup(master_addr, master_port)

    def setup(self, master_addr: str, master_port: int | None) -> None:
        D.init_process_group(self._rank, self._world_size, master_addr, master_port)
        self.policy = PolicyModel(PolicyConfig.from_dict(self._cfg))

    def rendezvous_address(self) -> tuple[str, int]:
        """This node's IP and a port free on it (rank 0 hosts the TCP store there)."""
        ip = _node_ip()
        return ip, D.find_free_port("0.0.0.0" if ip != "127.0.0.1" else ip)

    def ready(self) -> dict[str, Any]:
        node_id = ""
        with contextlib.suppress(Exception):  # outside Ray (single_process) there is no node
            import ray

            if ray.is_initialized():
                node_id = ray.get_runtime_context().get_node_id()
        return {
            "rank": self.policy.dist.rank,
            "pid": os.getpid(),
            "device": str(self.policy.device),
            "backend": self.policy.dist.backend,
            "node_id": node_id,
            "node_ip": _node_ip(),
        }

    def train_step(self, batch: Batch) -> dict[str, float]:
        try:
            return self.policy.train_step(batch)
        finally:
            trim_heap()  # the update's activations and logits: mia/heap.py
            if torch.cuda.is_available():
                # ... and on a GPU the caching allocator's blocks, before a colocated vLLM
                # wakes its KV cache into the same memory (mia.rl.placement).
                torch.cuda.empty_cache()

    def sft_step(self, batch: Batch) -> dict[str, float]:
        try:
            return self.policy.sft_step(batch)
        finally:
            trim_heap()

    def compute_logprobs(self, batch: Batch, return_entropy: bool = False) -> Any:
        return self.policy.compute_logprobs(batch, return_entropy=return_entropy)

    def compute_ref_logprobs(self, batch: Batch) -> torch.Tensor:
        return self.policy.compute_ref_logprobs(batch)

    def save_checkpoint(
        self, root: str, step: int | None, data_state: dict | None, keep_last: int | None
    ) -> str:
        from mia.rl.checkpoint import save_checkpoint

        return str(save_checkpoint(self.policy, root, step, data_state, keep_last))

    def load_checkpoint(self, path: str) -> dict[str, Any]:
        from mia.rl.checkpoint import load_checkpoint

        return load_checkpoint(self.policy, path)

    def export_hf(self, out_dir: str, dtype: str = "auto") -> str | None:
        out = self.policy.export_hf(out_dir, dtype)
        return str(out) if out else None

    def state_dict_for_export(self) -> dict[str, torch.Tensor]:
        return self.policy.state_dict_for_export()

    def get_step(self) -> int:
        return self.policy.step

    def shutdown(self) -> None:
        D.destroy_process_group()


class PolicyGroup:
    """The driver's handle on all policy ranks (Ray actors, or one in-process worker)."""

    def __init__(
        self,
        cfg: PolicyConfig | dict[str, Any],
        world_size: int = 1,
        mode: str = "ray",
        num_cpus_per_worker: float = 1,
        num_gpus_per_worker: float | None = None,
        placement_strategy: str = "PACK",
        placement_timeout_s: float = 600,
    ):
        self.cfg = PolicyConfig.from_dict(cfg)
        if mode not in ("ray", "single_process"):
            raise MiaError(f"unknown policy mode {mode!r} (ray | single_process)")
        if mode == "single_process" and world_size != 1:
            raise MiaError("single_process mode runs world size 1; use mode=ray for more ranks")
        if world_size < 1:
            raise MiaError("world_size must be >= 1")
        self.world_size = world_size
        self.mode = mode
        self._local: PolicyWorker | None = None
        self._actors: list[Any] = []
        self._pg: Any = None
        cfg_dict = self.cfg.to_dict()
        if mode == "single_process":
            self._local = PolicyWorker(cfg_dict)
            return
        import ray

        if not ray.is_initialized():
            raise MiaError("Ray is not running: wrap the run in mia.rl.ray_utils.init_ray(...)")
        if num_gpus_per_worker is None:
            num_gpus_per_worker = (
                1 if self.cfg.device in ("cuda", "auto") and _cluster_gpus() else 0
            )
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        if placement_strategy not in ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"):
            raise MiaError(f"unknown placement strategy {placement_strategy!r}")
        bundle = {"CPU": float(num_cpus_per_worker)}
        if num_gpus_per_worker:
            bundle["GPU"] = float(num_gpus_per_worker)
        self._pg = placement_group([dict(bundle) for _ in range(world_size)], placement_strategy)
        try:
            ray.get(self._pg.ready(), timeout=placement_timeout_s)
        except Exception:
            ray.util.remove_placement_group(self._pg)
            self._pg = None
            raise MiaError(
                f"Ray cannot place {world_size} policy workers of {bundle} "
                f"({placement_strategy}) within {placement_timeout_s:g} s; cluster has "
                f"{ray.cluster_resources()}"
            ) from None
        actor_cls = ray.remote(num_cpus=num_cpus_per_worker, num_gpus=num_gpus_per_worker)(
            PolicyWorker
        )
        threads = max(1, int(num_cpus_per_worker))
        self._actors = [
            actor_cls.options(
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=self._pg, placement_group_bundle_index=rank
                )
            ).remote(cfg_dict, rank, world_size, None, "", threads, True)
            for rank in range(world_size)
        ]
        # Rendezvous on rank 0's node: 127.0.0.1 would only reach ranks on the driver's node.
        addr, port = ray.get(self._actors[0].rendezvous_address.remote())
        self.master_addr = addr
        ray.get([a.setup.remote(addr, port) for a in self._actors])
        self.workers_info = self._run("ready")

    @classmethod
    def from_config(
        cls, policy: PolicyConfig | dict[str, Any], workers: WorkersConfig | dict[str, Any]
    ) -> PolicyGroup:
        w = workers if isinstance(workers, WorkersConfig) else WorkersConfig(**dict(workers))
        return cls(
            policy,
            w.world_size,
            w.mode,
            w.num_cpus_per_worker,
            w.num_gpus_per_worker,
            w.placement_strategy,
            w.placement_timeout_s,
        )

    # -- dispatch ---------------------------------------------------------------------------

    def _run(self, method: str, per_rank: list[tuple] | None = None, *args: Any) -> list[Any]:
        """Call ``method`` on every rank concurrently; rank r gets ``per_rank[r]`` or ``args``."""
        calls = per_rank or [args] * self.world_size
        if self._local is not None:
            return [getattr(self._local, method)(*calls[0])]
        import ray

        refs = [getattr(a, method).remote(*c) for a, c in zip(self._actors, calls, strict=True)]
        return ray.get(refs)

    def _scatter(self, batch: Batch, pad: bool) -> tuple[list[Batch], int]:
        """Contiguous equal slices, one per rank. With ``pad`` a ragged batch is padded by
        repeating its last sample (outputs for padding are dropped); otherwise it must divide."""
        n = batch_size(batch)
        ws = self.world_size
        if n == 0:
            raise MiaError("empty batch")
        if n % ws:
            if not pad:
                raise MiaError(
                    f"batch of {n} samples does not split evenly over {ws} policy workers"
                )
            extra = ws - n % ws
            batch = concat_batches([batch] + [slice_batch(batch, n - 1, n)] * extra)
        per = batch_size(batch) // ws
        return [slice_batch(batch, r * per, (r + 1) * per) for r in range(ws)], n

    # -- public API -------------------------------------------------------------------------

    def train_step(self, batch: Batch) -> dict[str, float]:
        """One optimizer step on the whole batch (data parallel); metrics are global."""
        slices, _ = self._scatter(batch, pad=False)
        return self._run("train_step", [(s,) for s in slices])[0]

    def sft_step(self, batch: Batch) -> dict[str, float]:
        """One supervised optimizer step (cross-entropy on ``response_mask`` tokens)."""
        slices, _ = self._scatter(batch, pad=False)
        return self._run("sft_step", [(s,) for s in slices])[0]

    def compute_logprobs(self, batch: Batch, return_entropy: bool = False) -> Any:
        """Log-probs [B, L]; with ``return_entropy`` a (log-probs, entropies) pair."""
        slices, n = self._scatter(batch, pad=True)
        outs = self._run("compute_logprobs", [(s, return_entropy) for s in slices])
        if return_entropy:
            return torch.cat([o[0] for o in outs])[:n], torch.cat([o[1] for o in outs])[:n]
        return torch.cat(outs)[:n]

    def compute_ref_logprobs(self, batch: Batch) -> torch.Tensor:
        slices, n = self._scatter(batch, pad=True)
        return torch.cat(self._run("compute_ref_logprobs", [(s,) for s in slices]))[:n]

    def save_checkpoint(
        self,
        root: str | Path,
        step: int | None = None,
        data_state: dict | None = None,
        keep_last: int | None = None,
    ) -> Path:
        return Path(self._run("save_checkpoint", None, str(root), step, data_state, keep_last)[0])

    def load_checkpoint(self, path: str | Path) -> dict[str, Any]:
        return self._run("load_checkpoint", None, str(path))[0]

    def export_hf(self, out_dir: str | Path, dtype: str = "auto") -> Path:
        """Write the current weights as a Hugging Face folder (for the generator or serving)."""
        return Path(self._run("export_hf", None, str(out_dir), dtype)[0])

    def state_dict_for_export(self) -> dict[str, torch.Tensor]:
        return self._run("state_dict_for_export")[0]

    @property
    def step(self) -> int:
        return self._run("get_step")[0]

    def shutdown(self) -> None:
        if self._local is not None:
            self._local = None
            return
        if self._actors:
            import ray

            try:
                ray.get([a.shutdown.remote() for a in self._actors], timeout=60)
            except Exception:  # a dead or hung rank: killing the actors below is all we can do
                pass
            finally:
                for a in self._actors:
                    ray.kill(a)
                self._actors = []
                if self._pg is not None:
                    ray.util.remove_placement_group(self._pg)
                    self._pg = None

    def __enter__(self) -> PolicyGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


def _node_ip() -> str:
    """This process's node IP as Ray sees it (127.0.0.1 outside Ray)."""
    try:
        import ray

        if ray.is_initialized():
            return str(ray.util.get_node_ip_address())
    except Exception:  # pragma: no cover - Ray not importable
        pass
    return "127.0.0.1"


def _cluster_gpus() -> float:
    import ray

    return float(ray.cluster_resources().get("GPU", 0))
