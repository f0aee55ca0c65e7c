"""Turn a sharded training checkpoint into a Hugging Face folder (and compare with one).

    python -m mia.rl.model_merger merge --backend fsdp --local_dir CKPT/global_step_K --target_dir OUT
    python -m mia.rl.model_merger test  --backend fsdp --local_dir CKPT/global_step_K --test_hf_dir REF

The command line matches veRL's merger (``--tie-word-embedding``, ``--trust-remote-code`` and
the other flags are accepted). Two inputs are read:

- a checkpoint written by :mod:`mia.rl.checkpoint`: ``dcp/`` (torch.distributed.checkpoint
  shards, one ``__{rank}_{i}.distcp`` file per rank), ``huggingface/`` and ``meta.json``;
- a veRL FSDP checkpoint (``global_step_K/actor``): ``model_world_size_W_rank_R.pt`` (each
  rank's ``state_dict()``, DTensors under FSDP2 / HSDP, plain row pieces under FSDP1) and
  ``huggingface/``. The files are unpickled with ``weights_only=True`` (DTensor types only),
  and transformers-4 Qwen-VL names (``visual.*``, ``model.layers.*``) are renamed.

Shards are resharded to
full tensors on CPU (any world size), LoRA adapters are merged into the base weights, and the
architecture is rebuilt from the saved config: Qwen2.5-VL as an image-text-to-text model
(``AutoModelForImageTextToText``), everything else as a causal LM. The output (safetensors,
config, tokenizer/processor, chat template) is what transformers and vLLM load.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import re
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from mia.errors import MiaError
from mia.models.hf import (
    ModelFolderError,
    build_model,
    load_hf_model,
    merge_lora_state_dict,
    write_hf_folder,
)

MODEL_PREFIX = "model."  # checkpoint.py saves {"model": ..., "optim": ...}; DCP flattens with dots
_SHARD_FILE = re.compile(r"^__(\d+)_\d+\.distcp$")


class CheckpointError(ModelFolderError):
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


# ----------------------------------------------------------------------------- veRL shards

_VERL_SHARD = re.compile(r"^model_world_size_(\d+)_rank_(\d+)\.pt$")
# transformers 4 named Qwen2(.5)-VL weights ``visual.*`` / ``model.*``; transformers 5 nests
# both under ``model.`` (veRL checkpoints written with transformers 4 use the old names).
_VL_RENAMES = (
    (re.compile(r"^visual\."), "model.visual."),
    (re.compile(r"^model\.(?!language_model\.|visual\.)"), "model.language_model."),
)


def verl_world_size(local_dir: Path) -> int | None:
    """The world size of veRL's ``model_world_size_W_rank_R.pt`` files in ``local_dir``, if any."""
    sizes = {int(m.group(1)) for p in local_dir.iterdir() if (m := _VERL_SHARD.match(p.name))}
    if len(sizes) > 1:
        raise CheckpointError(f"{local_dir} mixes veRL shards of world sizes {sorted(sizes)}")
    return sizes.pop() if sizes else None


def _verl_dir(local_dir: Path) -> Path | None:
    """``local_dir`` or its ``actor/`` (veRL's ``global_step_K/actor``) when it holds veRL shards."""
    if not local_dir.is_dir():
        raise CheckpointError(f"checkpoint folder not found: {local_dir}")
    for d in (local_dir, local_dir / "actor"):
        if d.is_dir() and verl_world_size(d) is not None:
            return d
    return None


def _load_shard(path: Path) -> dict[str, Any]:
    """One rank's state dict, unpickled with ``weights_only`` (tensors, DTensors and their
    placements only: a checkpoint file must not be able to run code)."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
    from torch.distributed.tensor.placement_types import Partial, Replicate, Shard

    safe = [DTensor, DTensorSpec, TensorMeta, DeviceMesh, Shard, Replicate, Partial]
    mesh_log = logging.getLogger("torch.distributed.device_mesh")
    level = mesh_log.level  # it warns that a mesh unpickled without process groups is unusable
    mesh_log.setLevel(logging.ERROR)  # for torch.compile; we only read its shape
    try:
        with torch.serialization.safe_globals(safe):
            sd = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as err:
        raise CheckpointError(f"cannot read veRL shard {path}: {_first_line(err)}") from None
    finally:
        mesh_log.setLevel(level)
    if not isinstance(sd, dict):
        raise CheckpointError(f"veRL shard {path} holds {type(sd).__name__}, not a state dict")
    return sd


def _shard_dims(tensor: Any) -> list[int | None]:
    """Per mesh dimension: the tensor dim it is sharded along, or None (replicated).

    A plain tensor is one rank's piece along dim 0 (veRL's FSDP1 flat layout); a DTensor
    says so itself (FSDP2 ``Shard(0)``; HSDP meshes ``(ddp, fsdp)`` replicate the first)."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.placement_types import Replicate, Shard

    if not isinstance(tensor, DTensor):
        return [0]
    dims: list[int | None] = []
    for p in tensor.placements:
        if isinstance(p, Shard):
            dims.append(int(p.dim))
        elif isinstance(p, Replicate):
            dims.append(None)
        else:
            raise CheckpointError(f"unsupported DTensor placement {p} (partial sums)")
    return dims


def load_verl_state_dict(local_dir: str | Path) -> tuple[dict[str, torch.Tensor], Path]:
    """Full weights from veRL's ``model_world_size_W_rank_R.pt`` shards; returns (state dict,
    folder holding ``huggingface/``). Missing ranks are named before any shard is read."""
    from torch.distributed.tensor import DTensor

    vdir = _verl_dir(Path(local_dir))
    if vdir is None:
        raise CheckpointError(f"{local_dir} holds no veRL model shards")
    world = int(verl_world_size(vdir) or 0)
    paths = [vdir / f"model_world_size_{world}_rank_{r}.pt" for r in range(world)]
    for r, p in enumerate(paths):
        if not p.is_file():
            raise CheckpointError(
                f"checkpoint {vdir} is incomplete: shard of rank {r} missing ({p.name})"
            )
    shards = [_load_shard(p) for p in paths]
    keys = list(shards[0])
    for r, sd in enumerate(shards[1:], 1):
        if set(sd) != set(keys):
            raise CheckpointError(f"veRL shard of rank {r} holds other weights than rank 0")
    mesh_shape: tuple[int, ...] = (world,)
    for v in shards[0].values():
        if isinstance(v, DTensor):
            mesh_shape = tuple(v.device_mesh.mesh.shape)
            break
    full: dict[str, torch.Tensor] = {}
    for key in keys:
        dims = _shard_dims(shards[0][key])
        if len(dims) != len(mesh_shape):
            raise CheckpointError(f"{key}: placements {dims} do not fit the mesh {mesh_shape}")
        pieces = [sd[key].to_local() if isinstance(sd[key], DTensor) else sd[key] for sd in shards]
        full[key] = _merge_pieces(pieces, list(mesh_shape), dims)
    return full, vdir


def _merge_pieces(
    pieces: list[torch.Tensor], mesh_shape: list[int], dims: list[int | None]
) -> torch.Tensor:
    """Glue row-major rank pieces back along the mesh, last mesh dim first."""
    if not mesh_shape:
        return pieces[0].detach().clone()
    inner = 1
    for n in mesh_shape[1:]:
        inner *= n
    # merge the inner mesh dims of each outer index, then the outer dim
    outer = [
        _merge_pieces(pieces[i * inner : (i + 1) * inner], mesh_shape[1:], dims[1:])
        for i in range(mesh_shape[0])
    ]
    if dims[0] is None:
        return outer[0]
    return torch.cat(outer, dim=dims[0]).contiguous()


def rename_for_config(sd: dict[str, torch.Tensor], hf_src: Path) -> dict[str, torch.Tensor]:
    """Map transformers-4 Qwen-VL weight names to the nesting transformers 5 builds."""
    from transformers import AutoConfig

    from mia.models.hf import is_vision_config

    if not is_vision_config(AutoConfig.from_pretrained(str(hf_src))):
        return sd
    if any(k.startswith(("model.language_model.", "model.visual.")) for k in sd):
        return sd
    out = {}
    for key, value in sd.items():
        for pattern, repl in _VL_RENAMES:
            key = pattern.sub(repl, key, count=1) if pattern.match(key) else key
            if key.startswith(("model.visual.", "model.language_model.")):
                break
        out[key] = value
    return out


def load_any_state_dict(local_dir: str | Path) -> tuple[dict[str, torch.Tensor], Path]:
    """(full weights, ``huggingface/`` folder) of a MIA (DCP) or a veRL checkpoint."""
    local_dir = Path(local_dir)
    if _verl_dir(local_dir) is not None:
        sd, vdir = load_verl_state_dict(local_dir)
        hf_src = vdir / "huggingface"
        if not (hf_src / "config.json").is_file():
            raise CheckpointError(f"checkpoint {vdir} lacks huggingface/config.json")
        return rename_for_config(sd, hf_src), hf_src
    sd = load_model_state_dict(local_dir)
    hf_src = _dcp_dir(local_dir).parent / "huggingface"
    if not (hf_src / "config.json").is_file():
        raise CheckpointError(f"checkpoint {local_dir} lacks huggingface/config.json")
    return sd, hf_src


# ----------------------------------------------------------------------------- commands


def merge(local_dir: str | Path, target_dir: str | Path, **kwargs: Any) -> Path:
    sd, hf_src = load_any_state_dict(local_dir)
    return write_hf_folder(sd, hf_src, target_dir, **kwargs)


def compare(
    local_dir: str | Path, test_hf_dir: str | Path, atol: float = 1e-6, **kwargs: Any
) -> int:
    """Compare merged checkpoint weights with a reference HF folder; returns tensors compared."""
    sd, hf_src = load_any_state_dict(local_dir)
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
