"""The vLLM generator as a Ray actor: its own process and resources, weights sent in memory.

``RayVLLMGenerator`` (the driver's handle, ``generator.placement: ray``) reserves a Ray
placement group of one bundle (``ray_num_cpus`` CPUs and ``ray_num_gpus`` GPUs; on a
multi-node cluster it lands wherever those are free), starts a :class:`VLLMActor` in it
holding a :class:`~mia.rl.generators.vllm_gen.VLLMGenerator`, and speaks the same generator
protocol as the in-process engines (``generate`` / ``generate_ids`` / ``update_weights`` /
``sleep`` / ``wake_up`` / ``close``), so the trainer and the agent loop do not know the
difference.

Weight sync, ``update_weights(state_dict=...)``: the driver opens a weight channel
(:mod:`mia.rl.weight_sync`) on its node IP, the actor's vLLM workers join it and load the
tensors as they arrive (``reload_weights(weights_iterator=)``): gloo through host memory on
CPU, NCCL when the sender's tensors are on a GPU the engine does not use. No file is written.
If the in-memory transfer fails (or ``weight_transfer: disk``), the driver writes a Hugging
Face folder and the actor reloads it -- the folder must be visible on the actor's node (a
shared file system on a multi-node cluster). ``update_weights(path=...)`` always reloads a
folder.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

from mia.llm.base import ChatResult, SamplingParams
from mia.rl.generators.base import GeneratorError, check_update_args

log = logging.getLogger("mia.rl.generators.ray_vllm")


class VLLMActor:
    """Runs in its own Ray worker process. Async methods, so many ``generate`` calls are in
    flight at once (continuous batching in the engine); blocking calls run in a thread so the
    actor's event loop keeps serving requests."""

    def __init__(self, model_path: str, kwargs: dict[str, Any]) -> None:
        from mia.rl.generators.vllm_gen import VLLMGenerator

        self.gen = VLLMGenerator(model_path, **kwargs)

    async def generate(
        self,
        prompt_ids: list[int],
        params: SamplingParams | None = None,
        multimodal: dict[str, Any] | None = None,
    ) -> ChatResult:
        return await self.gen.generate(prompt_ids, params, multimodal=multimodal)

    async def info(self) -> dict[str, Any]:
        return {
            "name": self.gen.name,
            "weight_version": self.gen.weight_version,
            "max_context": self.gen.max_context,
            "sleep_enabled": self.gen.sleep_enabled,
            "node_ip": _node_ip(),
        }

    async def weight_channel_info(self) -> dict[str, Any]:
        return await asyncio.to_thread(self.gen.weight_channel_info)

    async def receive_weights(self, spec: dict[str, Any]) -> dict[str, Any]:
        stats = await asyncio.to_thread(self.gen.receive_weights, spec)
        return {**stats, "weight_version": self.gen.weight_version}

    async def update_weights(self, path: str) -> int:
        return await asyncio.to_thread(self.gen.update_weights, None, path)

    async def sleep(self, level: int = 1) -> bool:
        return await asyncio.to_thread(self.gen.sleep, level)

    async def wake_up(self, tags: list[str] | None = None) -> bool:
        return await asyncio.to_thread(self.gen.wake_up, tags)

    async def close(self) -> None:
        await asyncio.to_thread(self.gen.close)


class RayVLLMGenerator:
    """The driver's handle on a :class:`VLLMActor` (see the module docstring)."""

    def __init__(
        self,
        model_path: str | Path,
        *,
        num_cpus: float = 1,
        num_gpus: float | None = None,
        weight_transfer: str = "memory",
        run_dir: str | Path | None = None,
        keep_weight_dirs: int = 1,
        placement_timeout_s: float = 600,
        **vllm_kwargs: Any,
    ) -> None:
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
        from transformers import AutoConfig, AutoTokenizer

        if not ray.is_initialized():
            raise GeneratorError("generator.placement=ray needs Ray running (workers.mode=ray)")
        path = Path(model_path).resolve()
        if not (path / "config.json").is_file():
            raise GeneratorError(f"vllm generator: {path} is not a model folder (no config.json)")
        if weight_transfer not in ("memory", "disk"):
            raise GeneratorError("weight_transfer must be memory | disk")
        if num_gpus is None:
            tp = int(dict(vllm_kwargs.get("engine_kwargs") or {}).get("tensor_parallel_size", 1))
            num_gpus = tp if ray.cluster_resources().get("GPU", 0) else 0
        self.model_path = str(path)
        self.name = f"vllm-ray:{path.name}"
        self.weight_transfer = weight_transfer
        self.run_dir = Path(run_dir) if run_dir else path.parent / "generator"
        self.keep_weight_dirs = max(1, keep_weight_dirs)
        self._written: deque[Path] = deque()
        self._tokenizer = AutoTokenizer.from_pretrained(str(path))
        self.tokenizer_lock = threading.Lock()
        self.hf_config = AutoConfig.from_pretrained(str(path))
        self.last_sync: dict[str, Any] = {}
        self.asleep = False
        self._closed = False
        bundle = {"CPU": float(num_cpus)}
        if num_gpus:
            bundle["GPU"] = float(num_gpus)
        self._pg = placement_group([bundle], strategy="PACK")
        try:
            ray.get(self._pg.ready(), timeout=placement_timeout_s)
        except Exception:
            ray.util.remove_placement_group(self._pg)
            raise GeneratorError(
                f"Ray cannot place the vLLM engine ({bundle}) within {placement_timeout_s:g} s; "
                f"cluster has {ray.cluster_resources()}"
            ) from None
        kwargs = {
            **vllm_kwargs,
            "weight_transfer": "memory",
            "run_dir": str(self.run_dir),
            "keep_weight_dirs": keep_weight_dirs,
        }
        actor_cls = ray.remote(num_cpus=num_cpus, num_gpus=num_gpus or 0)(VLLMActor)
        self._actor = actor_cls.options(
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                placement_group=self._pg, placement_group_bundle_index=0
            ),
            max_concurrency=1000,
        ).remote(self.model_path, kwargs)
        try:
            info = ray.get(self._actor.info.remote())
        except Exception as err:
            self._release()
            raise GeneratorError(f"{self.name}: the vLLM actor failed to start: {err}") from err
        self.weight_version = int(info["weight_version"])
        self.max_context = info["max_context"]
        self.sleep_enabled = bool(info["sleep_enabled"])
        self.node_ip = str(info["node_ip"])

    # ---- protocol
    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    async def generate(
        self,
        prompt_ids: list[int],
        params: SamplingParams | None = None,
        multimodal: dict[str, Any] | None = None,
    ) -> ChatResult:
        if self._closed:
            raise GeneratorError(f"{self.name}: generator is closed")
        return await self._actor.generate.remote(list(prompt_ids), params, multimodal)

    generate_ids = generate

    def update_weights(
        self, state_dict: dict[str, Any] | None = None, path: str | None = None
    ) -> int:
        """In memory over a weight channel (the default), or through a folder (``path``,
        ``weight_transfer: disk``, or when the in-memory transfer failed)."""
        import ray

        check_update_args(state_dict, path)
        if self._closed:
            raise GeneratorError(f"{self.name}: generator is closed")
        if state_dict is not None and self.weight_transfer == "memory":
            try:
                return self._send(state_dict)
            except GeneratorError as err:
                log.warning("%s: in-memory transfer failed (%s); via a folder", self.name, err)
        write_s = 0.0
        if state_dict is not None:
            from mia.models.hf import write_hf_folder

            folder = self.run_dir / "weights" / f"v{self.weight_version + 1:06d}"
            t0 = time.perf_counter()
            write_hf_folder(state_dict, self.model_path, folder)
            write_s = time.perf_counter() - t0
            self._written.append(folder)
        else:
            folder = Path(str(path)).resolve()
        t0 = time.perf_counter()
        try:
            self.weight_version = int(ray.get(self._actor.update_weights.remote(str(folder))))
        except Exception as err:
            raise GeneratorError(f"{self.name}: reloading {folder} failed: {err}") from err
        self.last_sync = {"mode": "disk", "write_s": write_s, "load_s": time.perf_counter() - t0}
        while len(self._written) > self.keep_weight_dirs:
            shutil.rmtree(self._written.popleft(), ignore_errors=True)
        return self.weight_version

    def _send(self, state_dict: dict[str, Any]) -> int:
        import ray

        from mia.rl.weight_sync import (
            ChannelSpec,
            device_id,
            free_port,
            node_ip,
            resolve_backend,
            send_state_dict,
        )

        info = ray.get(self._actor.weight_channel_info.remote())
        first = next(iter(state_dict.values()))
        sender_device = str(first.device)
        host = node_ip() if self.node_ip != "127.0.0.1" else "127.0.0.1"
        spec = ChannelSpec(
            host=host,
            port=free_port(host),
            world_size=1 + int(info["receivers"]),
            backend=resolve_backend("auto", device_id(first.device), info["devices"]),
            tag=f"ray-v{self.weight_version + 1}",
        )
        t0 = time.perf_counter()
        ref = self._actor.receive_weights.remote(spec.to_dict())
        try:
            sent = send_state_dict(spec, state_dict, device=sender_device)
            got = ray.get(ref, timeout=spec.timeout_s)
        except Exception as err:
            raise GeneratorError(f"{self.name}: weight channel failed: {err}") from err
        self.weight_version = int(got.pop("weight_version"))
        self.last_sync = {
            "mode": "memory",
            "backend": spec.backend,
            "seconds": time.perf_counter() - t0,
            **{f"send_{k}": v for k, v in sent.items()},
            **got,
        }
        return self.weight_version

    def sleep(self, level: int = 1) -> bool:
        import ray

        done = bool(ray.get(self._actor.sleep.remote(level)))
        self.asleep = self.asleep or done
        return done

    def wake_up(self, tags: list[str] | None = None) -> bool:
        import ray

        done = bool(ray.get(self._actor.wake_up.remote(tags)))
        if not tags or set(tags) >= {"weights", "kv_cache"}:
            self.asleep = False
        return done

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        import ray

        # a dead actor: killing it below is all that is left
        with contextlib.suppress(Exception):
            ray.get(self._actor.close.remote(), timeout=120)
        self._release()

    def _release(self) -> None:
        import ray

        ray.kill(self._actor)
        ray.util.remove_placement_group(self._pg)

    async def aclose(self) -> None:
        await asyncio.to_thread(self.close)


def _node_ip() -> str:
    from mia.rl.weight_sync import node_ip

    return node_ip()
