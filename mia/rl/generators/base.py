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

from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Protocol, runtime_checkable

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
    """Mirrors configs/rl/generator.yaml."""

    backend: str = "transformers"  # transformers | vllm
    model_path: str = ""  # HF folder; "" = the caller passes a model (transformers only)
    # auto: bfloat16 where the device computes it natively, else float32 (mia.precision); on a
    # GPU vLLM makes its own choice. Or float32 | bfloat16 | float16 (half precision on a
    # device without it falls back to float32).
    dtype: str = "auto"
    device: str = "cpu"  # transformers only; vLLM picks its platform itself
    # transformers
    max_batch_size: int = 8
    batch_wait_ms: float = 5.0
    # vllm
    gpu_memory_utilization: float = 0.2
    max_model_len: int | None = None
    max_num_seqs: int = 64
    enforce_eager: bool = True
    seed: int = 0
    run_dir: str = ""  # vLLM caches, temp files and weight folders; "" = under $MIA_HOME/runs
    keep_weight_dirs: int = 1  # saved weight folders to keep (the one loaded last included)
    engine_kwargs: dict[str, Any] = field(default_factory=dict)  # passed to vllm.LLM as is

    @classmethod
    def from_dict(cls, data: dict[str, Any] | GeneratorConfig) -> GeneratorConfig:
        if isinstance(data, cls):
            return data
        data = dict(data)
        unknown = sorted(set(data) - {f.name for f in fields(cls)})
        if unknown:
            raise GeneratorError(f"unknown generator option(s): {', '.join(unknown)}")
        if data.get("engine_kwargs") is not None:
            data["engine_kwargs"] = dict(data["engine_kwargs"])
        else:
            data.pop("engine_kwargs", None)
        cfg = cls(**data)
        if cfg.backend not in BACKENDS:
            raise GeneratorError(
                f"generator backend must be one of {BACKENDS}, got {cfg.backend!r}"
            )
        return cfg

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
