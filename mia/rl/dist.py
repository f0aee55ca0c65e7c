"""Process-group setup for data-parallel policy training (gloo on CPU, NCCL on GPU).

World size 1 needs no process group at all: every helper here answers sensibly without one,
so the policy code has a single path ("is there a group with more than one rank?").
"""

from __future__ import annotations

import datetime
import os
import socket
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1
    backend: str = ""


def find_free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the rendezvous binds it shortly after)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def default_device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def default_backend(device: torch.device | str) -> str:
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


def init_process_group(
    rank: int,
    world_size: int,
    master_addr: str = "127.0.0.1",
    master_port: int | None = None,
    backend: str | None = None,
    timeout_s: float = 600.0,
) -> DistInfo:
    """Join (or create) the default process group; a no-op for world size 1.

    Ray actors each call this with the same address/port chosen by the driver. On GPU each
    actor sees exactly one device (Ray sets CUDA_VISIBLE_DEVICES), so device 0 is ours.
    """
    if world_size <= 1:
        return DistInfo()
    if dist.is_initialized():
        return info()
    if master_port is None:
        raise ValueError("master_port is required for world_size > 1")
    if torch.cuda.is_available():
        torch.cuda.set_device(0)
    backend = backend or default_backend(default_device())
    os.environ.setdefault("MASTER_ADDR", master_addr)
    os.environ.setdefault("MASTER_PORT", str(master_port))
    dist.init_process_group(
        backend=backend,
        init_method=f"tcp://{master_addr}:{master_port}",
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
    )
    return info()


def info() -> DistInfo:
    if not is_distributed():
        return DistInfo()
    return DistInfo(dist.get_rank(), dist.get_world_size(), str(dist.get_backend()))


def is_distributed() -> bool:
    """True when a process group with more than one rank exists."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def get_rank() -> int:
    return dist.get_rank() if is_distributed() else 0


def get_world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


def barrier() -> None:
    if is_distributed():
        dist.barrier()


def all_reduce(t: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """In-place all-reduce that is the identity without a group. op: sum | max | min."""
    if is_distributed():
        ops = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}
        dist.all_reduce(t, op=ops[op])
    return t


def broadcast_object(obj: object, src: int = 0) -> object:
    if not is_distributed():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def destroy_process_group() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
