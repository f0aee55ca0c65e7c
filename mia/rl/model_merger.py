"""Turn a sharded training checkpoint into a Hugging Face folder (and compare with one).

    python -m mia.rl.model_merger merge --backend fsdp --local_dir CKPT/global_step_K --target_dir OUT
    python -m mia.rl.model_merger test  --backend fsdp --local_dir CKPT/global_step_K --test_hf_dir REF

The command line matches veRL's merger (``--tie-word-embedding``, ``--trust-remote-code`` and
the other flags are accepted), but the input is a checkpoint written by :mod:`mia.rl.checkpoint`:
``dcp/`` (torch.distributed.checkpoint shards, one ``__{rank}_{i}.distcp`` file per rank),
``huggingface/`` (config, tokenizer, processor) and ``meta.json``. Shards are resharded to
full tensors on CPU (any world size), LoRA adapters are merged into the base weights, and the
architecture is rebuilt from the saved config: Qwen2.5-VL as an image-text-to-text model
(``AutoModelForImageTextToText``), everything else as a causal LM. The output (safetensors,
config, tokenizer/processor, chat template) is what transformers and vLLM load.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from mia.errors import MiaError

MODEL_PREFIX = "model."  # checkpoint.py saves {"model": ..., "optim": ...}; DCP flattens with dots
_SHARD_FILE = re.compile(r"^__(\d+)_\d+\.distcp$")
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class CheckpointError(MiaError):
    """A checkpoint that is missing, incomplete or corrupt."""


# ----------------------------------------------------------------------------- reading shards


def _dcp_dir(local_dir: Path) -> Path:
    if not local_dir.is_dir():
        raise CheckpointError(f"checkpoint folder not found: {local_dir}")
    if (local_dir / "actor" / "dcp").is_dir() and not (local_dir / "dcp").is_dir():
        local_dir = local_dir / "actor"  # veRL-style layout global_step_K/actor
    dcp_dir = local_dir / "dcp"
    if not dcp_dir.is_dir():
        raise CheckpointError(f"{local_dir} is not a MIA checkpoint (no dcp/ folder)")
    return dcp_dir


def read_meta(local_dir: str | Path) -> dict[str, Any]:
    path = Path(local_dir) / "meta.json"
    if not path.is_file():
        raise CheckpointError(f"checkpoint {local_dir} is incomplete: meta.json missing")
    return json.loads(path.read_text())


def check_shards(dcp_dir: Path, world_size: int | None = None) -> Any:
    """Validate the shard files against DCP's metadata before reading a byte of them.

    Returns the metadata. Raises :class:`CheckpointError` naming the rank whose shard file is
    missing or shorter than the metadata says (a crash mid-write or a bad copy).
    """
    from torch.distributed.checkpoint import FileSystemReader

    if not (dcp_dir / ".metadata").is_file():
        raise CheckpointError(f"checkpoint {dcp_dir.parent} is incomplete: dcp/.metadata missing")
    try:
        md = FileSystemReader(str(dcp_dir)).read_metadata()
    except Exception as err:  # unpickling garbage raises anything
        raise CheckpointError(
            f"checkpoint metadata {dcp_dir / '.metadata'} is corrupt: {err}"
        ) from None
    need: dict[str, int] = {}  # file -> bytes it must hold
    for info in (md.storage_data or {}).values():
        end = int(info.offset) + int(info.length)
        need[info.relative_path] = max(need.get(info.relative_path, 0), end)
    ranks_seen = set()
    for name, size in sorted(need.items()):
        rank = _rank_of(name)
        ranks_seen.add(rank)
        path = dcp_dir / name
        if not path.is_file():
            raise CheckpointError(
                f"checkpoint {dcp_dir.parent} is incomplete: shard of rank {rank} missing ({name})"
            )
        if path.stat().st_size < size:
            raise CheckpointError(
                f"checkpoint {dcp_dir.parent} is corrupt: shard of rank {rank} is truncated "
                f"({name}: {path.stat().st_size} of {size} bytes)"
            )
    if world_size:
        absent = sorted(set(range(world_size)) - ranks_seen)
        if absent:
            raise CheckpointError(
                f"checkpoint {dcp_dir.parent} is incomplete: no shard of rank {absent[0]} "
                f"(world size {world_size})"
            )
    return md


@contextlib.contextmanager
def quiet_single_process_dcp() -> Iterator[None]:
    """DCP warns on every call without a process group; world size 1 is intended here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _rank_of(name: str) -> int | str:
    m = _SHARD_FILE.match(name)
    return int(m.group(1)) if m else name


def load_model_state_dict(local_dir: str | Path) -> dict[str, torch.Tensor]:
    """Full model weights (parameter FQNs of the training module) from a checkpoint folder."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    local_dir = Path(local_dir)
    dcp_dir = _dcp_dir(local_dir)
    if not (dcp_dir.parent / "COMPLETE").is_file():
        raise CheckpointError(f"checkpoint {dcp_dir.parent} is incomplete: no COMPLETE marker")
    meta = read_meta(dcp_dir.parent)
    md = check_shards(dcp_dir, meta.get("world_size"))
    sd: dict[str, torch.Tensor] = {}
    for key, item in md.state_dict_metadata.items():
        if key.startswith(MODEL_PREFIX) and isinstance(item, TensorStorageMetadata):
            sd[key] = torch.empty(item.size, dtype=item.properties.dtype)
    if not sd:
        raise CheckpointError(f"checkpoint {dcp_dir.parent} holds no model weights")
    try:
        with quiet_single_process_dcp():
            dcp.load(sd, storage_reader=FileSystemReader(str(dcp_dir)), no_dist=True)
    except Exception as err:
        raise CheckpointError(
            f"cannot read checkpoint shards in {dcp_dir}: {_first_line(err)}"
        ) from None
    sd = {k[len(MODEL_PREFIX) :]: v for k, v in sd.items()}
    lora = meta.get("lora")
    if lora:
        sd = merge_lora_state_dict(sd, float(lora["alpha"]) / float(lora["rank"]))
    return sd


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0] if text else type(err).__name__


# ----------------------------------------------------------------------------- LoRA


def merge_lora_state_dict(sd: dict[str, torch.Tensor], scaling: float) -> dict[str, torch.Tensor]:
    """PEFT-named weights with LoRA adapters -> plain HF names with W += scaling * B @ A."""
    if any("lora_embedding" in k or "lora_magnitude" in k for k in sd):
        raise CheckpointError(
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
            raise CheckpointError(f"LoRA adapter {module} has no matching base weight or B matrix")
        w = base[wkey]
        base[wkey] = (w.float() + scaling * (b_mats[module].float() @ a.float())).to(w.dtype)
    prefix = "base_model.model."
    out = {}
    for key, value in base.items():
        key = key[len(prefix) :] if key.startswith(prefix) else key
        out[key.replace(".base_layer.", ".")] = value
    return out


# ----------------------------------------------------------------------------- writing HF folders


def _auto_class(config: Any) -> Any:
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    return (
        AutoModelForImageTextToText
        if getattr(config, "vision_config", None) is not None
        else AutoModelForCausalLM
    )


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
        model = _auto_class(config).from_config(config, trust_remote_code=trust_remote_code)
    result = model.load_state_dict(state_dict, strict=False, assign=True)
    tied = _tied_keys(model)
    missing = [k for k in result.missing_keys if k not in tied]
    if missing:
        raise CheckpointError(
            f"checkpoint lacks {len(missing)} weight(s) of the model, e.g. {missing[0]}"
        )
    if result.unexpected_keys:
        raise CheckpointError(
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
    from mia.paths import atomic_dir

    hf_src = Path(hf_src)
    model = build_model(state_dict, hf_src, dtype, trust_remote_code, tie_word_embedding)
    with atomic_dir(target_dir) as tmp:
        for f in hf_src.iterdir():  # tokenizer, processor, chat template, ...
            if f.is_file() and not f.name.endswith((".safetensors", ".bin", ".index.json", ".pt")):
                (tmp / f.name).write_bytes(f.read_bytes())
        model.save_pretrained(str(tmp))  # rewrites config.json / generation_config.json
    return Path(target_dir)


# ----------------------------------------------------------------------------- commands


def merge(local_dir: str | Path, target_dir: str | Path, **kwargs: Any) -> Path:
    local_dir = Path(local_dir)
    sd = load_model_state_dict(local_dir)
    hf_src = _dcp_dir(local_dir).parent / "huggingface"
    if not (hf_src / "config.json").is_file():
        raise CheckpointError(f"checkpoint {local_dir} lacks huggingface/config.json")
    return write_hf_folder(sd, hf_src, target_dir, **kwargs)


def compare(
    local_dir: str | Path, test_hf_dir: str | Path, atol: float = 1e-6, **kwargs: Any
) -> int:
    """Compare merged checkpoint weights with a reference HF folder; returns tensors compared."""
    from mia.rl.policy import load_hf_model

    local_dir = Path(local_dir)
    sd = load_model_state_dict(local_dir)
    hf_src = _dcp_dir(local_dir).parent / "huggingface"
    ours = build_model(sd, hf_src, **kwargs).state_dict()
    if not Path(test_hf_dir).is_dir():
        raise MiaError(f"reference folder not found: {test_hf_dir}")
    ref = load_hf_model(test_hf_dir, kwargs.get("trust_remote_code", False)).state_dict()
    if set(ours) != set(ref):
        diff = sorted(set(ours) ^ set(ref))
        raise MiaError(f"weight names differ from {test_hf_dir}: {len(diff)} e.g. {diff[0]}")
    for key in sorted(ref):
        a, b = ours[key], ref[key]
        if a.shape != b.shape:
            raise MiaError(f"{key}: shape {list(a.shape)} != reference {list(b.shape)}")
        if not torch.allclose(a.float(), b.float(), atol=atol, rtol=atol):
            err = (a.float() - b.float()).abs().max().item()
            raise MiaError(f"{key}: differs from the reference (max abs diff {err:.3g})")
    return len(ref)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m mia.rl.model_merger",
        description="Merge sharded MIA RL checkpoints into HF folders.",
    )
    sub = p.add_subparsers(dest="command", required=True)
    for name, help_ in (
        ("merge", "write a Hugging Face folder"),
        ("test", "compare with a reference HF folder"),
    ):
        s = sub.add_parser(name, help=help_)
        s.add_argument("--backend", default="fsdp", help="fsdp (the only one)")
        s.add_argument("--local_dir", "--local-dir", required=True, help="checkpoint step folder")
        s.add_argument(
            "--tie-word-embedding",
            "--tie_word_embedding",
            action="store_true",
            help="force tied embeddings",
        )
        s.add_argument("--trust-remote-code", "--trust_remote_code", action="store_true")
        s.add_argument(
            "--is-value-model", "--is_value_model", action="store_true", help="(unsupported)"
        )
        s.add_argument(
            "--use_cpu_initialization", action="store_true", help="(accepted; always CPU)"
        )
        s.add_argument(
            "--dtype",
            default="auto",
            help="auto (the saved config's) | float32 | bfloat16 | float16",
        )
        if name == "merge":
            s.add_argument("--target_dir", "--target-dir", required=True, help="output folder")
            s.add_argument("--hf_upload_path", default=None, help="(unsupported: no uploads)")
            s.add_argument("--private", action="store_true", help="(unsupported)")
        else:
            s.add_argument(
                "--test_hf_dir", "--test-hf-dir", required=True, help="reference HF folder"
            )
            s.add_argument("--atol", type=float, default=1e-6)
    return p


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a CLI that prints one line per outcome
    hf_logging.set_verbosity_error()
    if args.backend != "fsdp":
        raise MiaError(f"backend {args.backend!r} is not supported (only fsdp)")
    if args.is_value_model:
        raise MiaError("value models are not supported (GRPO trains no critic)")
    if getattr(args, "hf_upload_path", None):
        raise MiaError("uploading to the hub is not supported; upload the target folder yourself")
    kwargs = {
        "dtype": args.dtype,
        "trust_remote_code": args.trust_remote_code,
        "tie_word_embedding": True if args.tie_word_embedding else None,
    }
    if args.command == "merge":
        out = merge(args.local_dir, args.target_dir, **kwargs)
        print(f"merged {args.local_dir} -> {out}")
    else:
        n = compare(args.local_dir, args.test_hf_dir, atol=args.atol, **kwargs)
        print(f"ok: {n} tensors match {args.test_hf_dir}")


def cli(argv: list[str] | None = None) -> None:
    """Entry point with MIA's error contract: a MiaError is one line on stderr and exit 2."""
    try:
        main(argv)
    except MiaError as err:
        print(f"model_merger: error: {err}", file=sys.stderr)
        raise SystemExit(err.exit_code) from None


if __name__ == "__main__":
    cli()
