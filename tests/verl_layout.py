"""Write a checkpoint in veRL's FSDP layout, as veRL's checkpoint manager does.

veRL saves, per rank, ``torch.save(model.state_dict(), f"model_world_size_{W}_rank_{r}.pt")``
of the FSDP-wrapped model (DTensors under FSDP2) next to a ``huggingface/`` folder holding the
config and tokenizer. Run as ``python tests/verl_layout.py RANK WORLD PORT MODEL_DIR OUT_DIR``
(one process per rank, gloo): it wraps the HF model at MODEL_DIR with ``fully_shard`` and
writes the shards; rank 0 also writes ``huggingface/``.

:func:`write_plain_shards` writes the FSDP1-era layout (plain tensors, each rank's rows along
dim 0) in-process.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import torch


def copy_hf_config(model_dir: Path, out_dir: Path) -> None:
    """veRL's ``huggingface/`` folder: config, tokenizer, processor files, no weights."""
    hf = out_dir / "huggingface"
    hf.mkdir(parents=True, exist_ok=True)
    for f in model_dir.iterdir():
        if f.is_file() and not f.name.endswith((".safetensors", ".bin")):
            shutil.copy(f, hf / f.name)


def write_plain_shards(state_dict: dict[str, torch.Tensor], world: int, out_dir: Path) -> None:
    """Each rank's ``torch.chunk`` piece of every tensor along dim 0 (FSDP1 sharded layout)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for r in range(world):
        piece = {k: v.chunk(world, dim=0)[r].clone() for k, v in state_dict.items()}
        torch.save(piece, out_dir / f"model_world_size_{world}_rank_{r}.pt")


def main(rank: int, world: int, port: int, model_dir: Path, out_dir: Path) -> None:
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoModelForCausalLM

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    torch.save(model.state_dict(), out_dir / f"model_world_size_{world}_rank_{rank}.pt")
    if rank == 0:
        copy_hf_config(model_dir, out_dir)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    r, w, p = (int(x) for x in sys.argv[1:4])
    main(r, w, p, Path(sys.argv[4]), Path(sys.argv[5]))
