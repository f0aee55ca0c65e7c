"""Hugging Face model folders: load one (causal LM, or image-text-to-text for vision configs),
merge PEFT LoRA weights into plain ones, and write a complete folder from a state dict.

The engine (policy export, the model merger, the vLLM generator's weight reload) and the model
tools share these, so there is one way to read and write a model folder.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from mia.errors import MiaError
from mia.paths import atomic_dir

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ModelFolderError(MiaError):
    """A state dict that does not fit its model folder (or a LoRA that cannot be merged)."""


def is_vision_config(config: Any) -> bool:
    return getattr(config, "vision_config", None) is not None


def load_hf_model(path: str | Path, trust_remote_code: bool = False, **kwargs: Any) -> Any:
    """An HF model from a folder: image-text-to-text for VL configs, else a causal LM."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    config = AutoConfig.from_pretrained(str(path), trust_remote_code=trust_remote_code)
    auto = AutoModelForImageTextToText if is_vision_config(config) else AutoModelForCausalLM
    return auto.from_pretrained(str(path), trust_remote_code=trust_remote_code, **kwargs)


# ----------------------------------------------------------------------------- LoRA


def merge_lora_state_dict(sd: dict[str, torch.Tensor], scaling: float) -> dict[str, torch.Tensor]:
    """PEFT-named weights with LoRA adapters -> plain HF names with W += scaling * B @ A."""
    if any("lora_embedding" in k or "lora_magnitude" in k for k in sd):
        raise ModelFolderError(
            "only LoRA on linear layers can be merged (no embedding LoRA or DoRA)"
        )
    base: dict[str, torch.Tensor] = {}
    a_mats: dict[str, torch.Tensor] = {}
    b_mats: dict[str, torch.Tensor] = {}
    for key, value in sd.items():
        if ".lora_A." in key:
            a_mats[key.split(".lora_A.")[0]] = value
        elif ".lora_B." in key:
            b_mats[key.split(".lora_B.")[0]] = value
        else:
            base[key] = value
    for module, a in a_mats.items():
        wkey = f"{module}.base_layer.weight"
        if wkey not in base or module not in b_mats:
            raise ModelFolderError(f"LoRA adapter {module} has no matching base weight or B matrix")
        w = base[wkey]
        base[wkey] = (w.float() + scaling * (b_mats[module].float() @ a.float())).to(w.dtype)
    prefix = "base_model.model."
    out = {}
    for key, value in base.items():
        key = key[len(prefix) :] if key.startswith(prefix) else key
        out[key.replace(".base_layer.", ".")] = value
    return out


# ----------------------------------------------------------------------------- writing HF folders


def auto_class(config: Any) -> Any:
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    return AutoModelForImageTextToText if is_vision_config(config) else AutoModelForCausalLM


def _target_dtype(config: Any, dtype: str) -> torch.dtype:
    if dtype == "auto":
        name = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None) or "float32"
        name = str(name).replace("torch.", "")
        return _DTYPES.get(name, torch.float32)
    if dtype not in _DTYPES:
        raise MiaError(f"unknown dtype {dtype!r} (auto, {', '.join(_DTYPES)})")
    return _DTYPES[dtype]


def build_model(
    state_dict: dict[str, torch.Tensor],
    hf_src: str | Path,
    dtype: str = "auto",
    trust_remote_code: bool = False,
    tie_word_embedding: bool | None = None,
) -> Any:
    """Instantiate the saved architecture and fill it with ``state_dict`` (no random init)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(hf_src), trust_remote_code=trust_remote_code)
    if tie_word_embedding is not None:
        config.tie_word_embeddings = tie_word_embedding
        if hasattr(config, "get_text_config"):
            config.get_text_config().tie_word_embeddings = tie_word_embedding
    target = _target_dtype(config, dtype)
    from accelerate import init_empty_weights

    # Parameters on the meta device (no random init, no memory); buffers such as rotary
    # frequencies are still computed for real since no state dict holds them.
    with init_empty_weights(include_buffers=False):
        model = auto_class(config).from_config(config, trust_remote_code=trust_remote_code)
    result = model.load_state_dict(state_dict, strict=False, assign=True)
    tied = _tied_keys(model)
    missing = [k for k in result.missing_keys if k not in tied]
    if missing:
        raise ModelFolderError(
            f"checkpoint lacks {len(missing)} weight(s) of the model, e.g. {missing[0]}"
        )
    if result.unexpected_keys:
        raise ModelFolderError(
            f"checkpoint has {len(result.unexpected_keys)} weight(s) the model does not, "
            f"e.g. {result.unexpected_keys[0]}"
        )
    model.tie_weights()
    return model.to(target).eval()


def _tied_keys(model: Any) -> set[str]:
    if not getattr(model.config.get_text_config(), "tie_word_embeddings", False) and not getattr(
        model.config, "tie_word_embeddings", False
    ):
        return set()
    tied = getattr(model, "_tied_weights_keys", None) or {}
    return set(tied) if isinstance(tied, dict | list | set | tuple) else set()


def write_hf_folder(
    state_dict: dict[str, torch.Tensor],
    hf_src: str | Path,
    target_dir: str | Path,
    dtype: str = "auto",
    trust_remote_code: bool = False,
    tie_word_embedding: bool | None = None,
) -> Path:
    """Write a complete HF folder (weights + config + tokenizer/processor) atomically."""
    hf_src = Path(hf_src)
    model = build_model(state_dict, hf_src, dtype, trust_remote_code, tie_word_embedding)
    with atomic_dir(target_dir) as tmp:
        for f in hf_src.iterdir():  # tokenizer, processor, chat template, ...
            if f.is_file() and not f.name.endswith((".safetensors", ".bin", ".index.json", ".pt")):
                (tmp / f.name).write_bytes(f.read_bytes())
        model.save_pretrained(str(tmp))  # rewrites config.json / generation_config.json
    return Path(target_dir)
