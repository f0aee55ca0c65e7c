"""The policy's configuration: model, optimizer, LoRA and loss (``trainer.policy``; SFT's
``policy``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from mia.config import from_dict, option, plain, section


@dataclass
class OptimConfig:
    """AdamW with a warmup and an optional cosine decay."""

    lr: float = option(1e-6, "learning rate (the reference's veRL setting)")
    weight_decay: float = option(0.01, "AdamW weight decay")
    betas: tuple[float, float] = option((0.9, 0.999), "AdamW betas")
    eps: float = option(1e-8, "AdamW epsilon")
    grad_clip: float = option(
        1.0, "max global grad norm; <= 0 disables; a non-finite norm skips the step"
    )
    warmup_steps: int = option(0, "linear warmup: step s uses (s + 1) / warmup_steps of lr")
    schedule: str = option("constant", "constant | cosine")
    total_steps: int = option(0, "cosine only: the decay ends here")
    min_lr_ratio: float = option(0.0, "cosine floor, as a fraction of lr")
    fused: bool | None = option(
        None,
        "null = torch's fused AdamW kernel in a single process (the same update up to float "
        "rounding; SmolLM2-135M on one CPU thread: 0.10 s per step instead of 0.54; what "
        "transformers' Trainer uses) and the per-tensor loop under FSDP | true | false",
    )


@dataclass
class LoraConfig:
    """LoRA adapters (peft); rank 0 = full fine-tuning."""

    rank: int = option(0, "0 = full fine-tuning; > 0 = LoRA (peft) on target_modules")
    alpha: int = option(16, "LoRA alpha")
    dropout: float = option(0.0, "LoRA dropout")
    target_modules: list[str] = option(
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        "module names that get adapters",
    )


@dataclass
class LossConfig:
    """The clipped policy-gradient loss (veRL's defaults: clip 0.2, dual clip 3, token-mean,
    no KL, no entropy bonus)."""

    clip_low: float = option(0.2, "PPO ratio clip below 1")
    clip_high: float = option(0.2, "PPO ratio clip above 1 (0.28 = DAPO clip-higher)")
    clip_ratio_c: float | None = option(3.0, "dual clip for negative advantages; null = off")
    agg: str = option(
        "token-mean", "loss aggregation: token-mean | seq-mean-token-mean | seq-mean-token-sum"
    )
    kl_coef: float = option(
        0.0, "> 0 adds a KL loss to a frozen reference (loaded only then; LoRA: adapters off)"
    )
    kl_kind: str = option("k3", "KL estimator: k1 | k2 | k3 (= veRL low_var_kl)")
    entropy_coef: float = option(0.0, "entropy bonus")
    temperature: float = option(
        1.0,
        "logits / temperature; must equal the trainer's sampling.temperature (checked; greedy "
        "rollouts, temperature 0, take any)",
    )


@dataclass
class PolicyConfig:
    """The trainable policy (``trainer.policy``; SFT's ``policy``)."""

    model_path: str = option(
        "", "Hugging Face folder: a causal LM, or Qwen2.5-VL (image-text-to-text)"
    )
    trust_remote_code: bool = option(False, "let transformers run the folder's own code")
    attn_implementation: str | None = option(
        "auto",
        "auto = sdpa, on a CPU with mia.llm.decode_attention's grouped matmuls for short "
        "bf16 passes (<= 128 keys, ~2x faster than the CPU flash kernel there; text models) | "
        "sdpa | eager | flash_attention_2 (GPU)",
    )
    device: str = option("auto", "auto (cuda if visible, else cpu) | cpu | cuda")
    mixed_precision: str = option(
        "auto",
        "auto = bf16 autocast where the device computes it natively (GPU, or a CPU with "
        "AVX512-BF16/AMX), else fp32 | bf16 | none (mia.precision)",
    )
    gradient_checkpointing: bool = option(False, "recompute activations in the backward pass")
    offload: bool = option(
        False,
        "GPU only: FSDP2 CPUOffloadPolicy -- parameters, gradients and optimizer state live in "
        "host memory between uses (a 7B policy beside a vLLM engine); ignored on CPU",
    )
    trainable: list[str] = option(
        [],
        "regexes (re.search on parameter names) of the parameters that train, the others "
        "frozen (after LoRA's selection); [] = all. E.g. the top layers of a small model on CPU",
    )
    micro_batch_size: int = option(
        4, "samples per forward/backward on each rank (gradient accumulation)"
    )
    logprob_micro_batch_size: int = option(
        8, "samples per forward when computing old/ref log-probs"
    )
    logits_chunk_size: int = option(4096, "rows per float32 log-softmax chunk")
    seed: int = option(0, "torch seed of the policy")
    optim: OptimConfig = section(OptimConfig, "the optimizer")
    lora: LoraConfig = section(LoraConfig, "LoRA adapters")
    loss: LossConfig = section(LossConfig, "the policy-gradient loss")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | PolicyConfig) -> PolicyConfig:
        """Build from a plain/OmegaConf mapping (nested sections become dataclasses)."""
        return from_dict(cls, data, "policy")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# One loader for every config (mia.config); the names stay importable from here.
plain_config = plain
config_from_dict = from_dict
