"""Rollout generators behind one protocol: ``transformers`` (in-process) and ``vllm``.

``make_generator(cfg)`` builds one from a :class:`GeneratorConfig` (configs/rl/generator.yaml).
Backends are imported lazily: importing this package never imports vLLM.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from mia import precision
from mia.rl.generators.base import (
    BACKENDS,
    Generator,
    GeneratorConfig,
    GeneratorError,
)

if TYPE_CHECKING:
    from mia.rl.generators.transformers_gen import TransformersGenerator
    from mia.rl.generators.vllm_gen import VLLMGenerator

__all__ = [
    "BACKENDS",
    "Generator",
    "GeneratorConfig",
    "GeneratorError",
    "TransformersGenerator",
    "VLLMGenerator",
    "make_generator",
    "vllm_available",
]


def __getattr__(name: str) -> Any:
    if name == "TransformersGenerator":
        from mia.rl.generators.transformers_gen import TransformersGenerator

        return TransformersGenerator
    if name == "VLLMGenerator":
        from mia.rl.generators.vllm_gen import VLLMGenerator

        return VLLMGenerator
    raise AttributeError(name)


def vllm_available() -> bool:
    """Whether ``import vllm`` works here (the vllm backend is usable)."""
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def make_generator(
    cfg: GeneratorConfig | dict[str, Any],
    *,
    model: Any = None,
    tokenizer: Any = None,
    engine_kwargs: dict[str, Any] | None = None,
) -> Generator:
    """Build the configured generator.

    transformers: from ``cfg.model_path``, or from ``model`` + ``tokenizer`` (e.g. the policy's
    own module in a single-process run). vllm: always from ``cfg.model_path`` (a folder).
    """
    cfg = GeneratorConfig.from_dict(cfg)
    if cfg.backend == "transformers":
        from mia.rl.generators.transformers_gen import TransformersGenerator

        if (model is None) == (not cfg.model_path):
            raise GeneratorError("transformers generator: set model_path OR pass a model")
        dtype = precision.compute_dtype(cfg.dtype, cfg.device)
        return TransformersGenerator(
            cfg.model_path or None,
            model=model,
            tokenizer=tokenizer,
            device=cfg.device,
            dtype=dtype,
            max_batch_size=cfg.max_batch_size,
            batch_wait_ms=cfg.batch_wait_ms,
        )
    if not cfg.model_path or model is not None:
        raise GeneratorError("vllm generator: set model_path (a Hugging Face folder)")
    if cfg.placement not in ("driver", "ray"):
        raise GeneratorError(f"generator.placement must be driver | ray, not {cfg.placement!r}")
    common = dict(
        dtype=vllm_dtype(cfg.dtype),
        gpu_memory_utilization=cfg.gpu_memory_utilization,
        max_model_len=cfg.max_model_len,
        max_num_seqs=cfg.max_num_seqs,
        enforce_eager=cfg.enforce_eager,
        seed=cfg.seed,
        run_dir=cfg.run_dir or None,
        keep_weight_dirs=cfg.keep_weight_dirs,
        engine_kwargs={**cfg.engine_kwargs, **(engine_kwargs or {})},
        weight_transfer=cfg.weight_transfer,
        sleep_mode=cfg.sleep_mode,
    )
    if cfg.placement == "ray":
        from mia.rl.generators.ray_vllm import RayVLLMGenerator

        return RayVLLMGenerator(
            Path(cfg.model_path), num_cpus=cfg.ray_num_cpus, num_gpus=cfg.ray_num_gpus, **common
        )
    from mia.rl.generators.vllm_gen import VLLMGenerator

    return VLLMGenerator(Path(cfg.model_path), **common)


def vllm_dtype(choice: str) -> str:
    """vLLM's ``dtype``: its own choice on a GPU for ``auto``; on CPU, bf16 only where native."""
    import torch

    if torch.cuda.is_available():
        return choice if choice == "auto" else precision.compute_dtype(choice, "cuda")
    return precision.compute_dtype(choice, "cpu")
