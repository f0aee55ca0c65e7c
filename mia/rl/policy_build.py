"""Building the policy's module: the Hugging Face model in fp32 master weights, gradient
checkpointing, LoRA adapters (peft), the trainable subset, and FSDP2 sharding over the process
group when its world size is > 1."""

from __future__ import annotations

import re
from typing import Any

import torch

from mia.errors import MiaError
from mia.models.hf import load_hf_model
from mia.rl.policy_config import PolicyConfig


def restrict_trainable(module: torch.nn.Module, patterns: list[str]) -> int:
    """Freeze every trainable parameter whose name matches none of ``patterns`` (regexes,
    ``re.search``); returns how many parameter tensors still train."""
    compiled = [re.compile(p) for p in patterns]
    kept = 0
    for name, param in module.named_parameters():
        if param.requires_grad and not any(c.search(name) for c in compiled):
            param.requires_grad_(False)
        kept += int(param.requires_grad)
    if not kept:
        raise MiaError(f"policy.trainable {patterns} matches no trainable parameter")
    return kept


def build_module(
    cfg: PolicyConfig,
    device: torch.device,
    world_size: int,
    autocast_dtype: torch.dtype | None,
    trainable: bool,
) -> tuple[torch.nn.Module, Any]:
    """The module to run (the HF model, or its peft wrapper) and the HF model itself, on
    ``device``, sharded when ``world_size`` > 1; frozen unless ``trainable``."""
    kwargs: dict[str, Any] = {"dtype": torch.float32}  # fp32 master weights
    attn = cfg.attn_implementation
    if attn:
        kwargs["attn_implementation"] = "sdpa" if attn == "auto" else attn
    hf = load_hf_model(cfg.model_path, cfg.trust_remote_code, **kwargs)
    hf.config.use_cache = False
    if attn == "auto" and autocast_dtype is not None:
        from mia.llm.decode_attention import use_for_decode

        use_for_decode(hf, device.type)  # float32 passes stay sdpa's, bit for bit
    module: torch.nn.Module = hf
    if trainable:
        if cfg.gradient_checkpointing:
            hf.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if cfg.lora.rank > 0:
            module = add_lora(cfg, hf)
        if cfg.trainable:
            restrict_trainable(module, cfg.trainable)
    else:
        module.requires_grad_(False)
    module.to(device)
    if world_size > 1:
        shard_module(cfg, module, hf, device, world_size, autocast_dtype)
    module.train(trainable)
    return module, hf


def add_lora(cfg: PolicyConfig, hf: Any) -> torch.nn.Module:
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    lc = cfg.lora
    if cfg.gradient_checkpointing:
        hf.enable_input_require_grads()  # checkpointed blocks need a grad-carrying input
    peft_cfg = PeftLoraConfig(
        r=lc.rank,
        lora_alpha=lc.alpha,
        lora_dropout=lc.dropout,
        target_modules=list(lc.target_modules),
    )
    return get_peft_model(hf, peft_cfg)


def shard_module(
    cfg: PolicyConfig,
    module: torch.nn.Module,
    hf: Any,
    device: torch.device,
    world_size: int,
    autocast_dtype: torch.dtype | None,
) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(device.type, (world_size,))
    kwargs: dict[str, Any] = {"mesh": mesh}
    if autocast_dtype is not None:
        # Gather parameters in bf16 (half the traffic), reduce gradients in fp32.
        kwargs["mp_policy"] = MixedPrecisionPolicy(
            param_dtype=autocast_dtype, reduce_dtype=torch.float32
        )
    # The units HF itself refuses to split (decoder layers, vision blocks) shard as groups:
    # each is all-gathered just before its forward and freed right after.
    if cfg.offload and device.type == "cuda":
        from torch.distributed.fsdp import CPUOffloadPolicy

        # Shards stay in pinned host memory; each unit is copied in just for its compute,
        # and the optimizer steps on the host copies (its state lives there too).
        kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=True)
    units = set(getattr(hf, "_no_split_modules", None) or [])
    for sub in list(module.modules()):
        if type(sub).__name__ in units:
            fully_shard(sub, **kwargs)
    fully_shard(module, **kwargs)
