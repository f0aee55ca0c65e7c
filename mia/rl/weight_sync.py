"""In-memory weight transfer from the policy into a rollout engine (no disk).

A *weight channel* is a small process group of its own -- not the default one, so it never
touches the policy's FSDP group or vLLM's tensor-parallel group -- with the sender at rank 0
and the receivers (the vLLM workers, or the process holding a transformers generator) at ranks
1..N. It is built from a ``TCPStore`` hosted by the sender and a backend object constructed
directly (``ProcessGroupGloo`` on CPU, ``ProcessGroupNCCL`` between different GPUs), the way
vLLM's ``stateless_init_torch_distributed_process_group`` does it, so it works in any process,
whatever process groups it already belongs to.

Protocol, one transfer per channel:

1. the sender publishes the tensor list (name, dtype, shape, in order) in the store;
2. it packs consecutive tensors into buckets of ``bucket_bytes`` (a flat ``uint8`` buffer) and
   broadcasts bucket after bucket;
3. each receiver reads the list, receives the buckets and yields ``(name, tensor)`` views of
   them -- an iterator a model's ``load_weights`` (vLLM's ``reload_weights(weights_iterator=)``)
   consumes while the transfer is still running, so at most one bucket is in flight.

:class:`ChannelSpec` is a plain picklable record: it travels through Ray and vLLM's
``collective_rpc`` as a dict. The GPU path (NCCL) needs sender and receivers on *different*
GPUs (NCCL refuses two ranks on one device): ``backend="auto"`` picks NCCL only when the sender's
tensors are on a GPU that no receiver uses, otherwise gloo through host memory.
"""

from __future__ import annotations

import datetime
import json
import logging
import socket
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from mia.errors import MiaError

log = logging.getLogger("mia.rl.weight_sync")

DEFAULT_BUCKET_BYTES = 256 << 20
_META_KEY = "mia/weights/meta"
_DONE_KEY = "mia/weights/done"
BACKENDS = ("auto", "gloo", "nccl")


class WeightSyncError(MiaError):
    """A weight transfer that could not be set up or did not complete."""


@dataclass
class ChannelSpec:
    """Where and how one transfer meets: the sender's address, the group size (1 sender +
    receivers), the backend, and optionally the dtype the tensors travel in."""

    host: str
    port: int
    world_size: int
    backend: str = "gloo"  # gloo | nccl
    dtype: str | None = None  # e.g. "bfloat16": cast before sending (None = as they are)
    bucket_bytes: int = DEFAULT_BUCKET_BYTES
    timeout_s: float = 600.0
    tag: str = ""  # names the transfer in logs

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any] | ChannelSpec) -> ChannelSpec:
        return data if isinstance(data, cls) else cls(**dict(data))


@dataclass
class TransferStats:
    tensors: int = 0
    bytes: int = 0
    buckets: int = 0
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(out.pop("extra"))
        return out


def node_ip() -> str:
    """This machine's address as other Ray nodes see it (Ray's own choice when Ray runs)."""
    try:
        import ray

        if ray.is_initialized():
            return str(ray.util.get_node_ip_address())
    except Exception:  # noqa: BLE001 - fall back to the socket trick below
        pass
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1))  # no packet is sent: picks the outgoing interface
            return str(s.getsockname()[0])
    except OSError:
        return "127.0.0.1"


def free_port(host: str = "") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def resolve_backend(want: str, sender_device: str, receiver_devices: Iterable[str]) -> str:
    """``auto``: NCCL when the sender's tensors live on a GPU no receiver uses, else gloo.

    Devices are identified by strings (``cpu`` or a GPU UUID): NCCL refuses two ranks on the
    same GPU, and a CPU end cannot take part in an NCCL group.
    """
    if want not in BACKENDS:
        raise WeightSyncError(f"weight channel backend must be one of {BACKENDS}, got {want!r}")
    receivers = list(receiver_devices)
    gpu_ends = sender_device != "cpu" and all(d != "cpu" for d in receivers)
    if want == "nccl" and not gpu_ends:
        raise WeightSyncError("an NCCL weight channel needs GPU tensors on both ends")
    if want != "auto":
        return want
    return "nccl" if gpu_ends and sender_device not in receivers else "gloo"


def device_id(device: torch.device | str | None = None) -> str:
    """``cpu``, or the UUID of the GPU this process uses (comparable across processes)."""
    dev = torch.device(device) if device is not None else None
    if dev is None:
        dev = (
            torch.device("cuda", torch.cuda.current_device())
            if torch.cuda.is_available()
            else torch.device("cpu")
        )
    if dev.type != "cuda":
        return "cpu"
    props = torch.cuda.get_device_properties(dev)
    return str(getattr(props, "uuid", f"cuda:{dev.index}"))


# ----------------------------------------------------------------------------- the group


def _open(spec: ChannelSpec, rank: int) -> tuple[Any, Any]:
    """(store, backend object) for ``rank``; rank 0 hosts the store. Blocks until every rank
    has joined (the backend's rendezvous)."""
    from torch.distributed import PrefixStore, TCPStore

    timeout = datetime.timedelta(seconds=spec.timeout_s)
    store = TCPStore(
        spec.host,
        spec.port,
        spec.world_size,
        is_master=rank == 0,
        timeout=timeout,
        wait_for_workers=False,
        use_libuv=True,
    )
    prefix = PrefixStore(f"mia-weights-{spec.tag}", store)
    if spec.backend == "gloo":
        from torch.distributed import ProcessGroupGloo

        group = ProcessGroupGloo(prefix, rank, spec.world_size, timeout)
    elif spec.backend == "nccl":
        from torch.distributed import ProcessGroupNCCL  # type: ignore[attr-defined]

        opts = ProcessGroupNCCL.Options()
        opts._timeout = timeout
        group = ProcessGroupNCCL(prefix, rank, spec.world_size, opts)
    else:
        raise WeightSyncError(f"unknown weight channel backend {spec.backend!r}")
    return prefix, group


def _broadcast(group: Any, tensor: torch.Tensor) -> None:
    from torch.distributed import BroadcastOptions

    opts = BroadcastOptions()
    opts.rootRank = 0
    opts.rootTensor = 0
    group.broadcast([tensor], opts).wait()


def _dtype(name: str) -> torch.dtype:
    value = getattr(torch, name.replace("torch.", ""), None)
    if not isinstance(value, torch.dtype):
        raise WeightSyncError(f"unknown dtype {name!r}")
    return value


_ALIGN = 64  # bytes: every tensor starts at an aligned offset of its bucket (views need it)


def _buckets(
    meta: list[dict[str, Any]], bucket_bytes: int
) -> list[tuple[list[int], list[int], int]]:
    """Consecutive tensors grouped into buckets of <= ``bucket_bytes`` (a larger tensor travels
    alone): (tensor indices, their byte offsets in the bucket, bucket size) per bucket."""
    out: list[tuple[list[int], list[int], int]] = []
    for i, m in enumerate(meta):
        if out:
            idx, offsets, size = out[-1]
            start = -(-size // _ALIGN) * _ALIGN
            if start + m["nbytes"] <= bucket_bytes:
                idx.append(i)
                offsets.append(start)
                out[-1] = (idx, offsets, start + m["nbytes"])
                continue
        out.append(([i], [0], m["nbytes"]))
    return out


# ----------------------------------------------------------------------------- sender


class WeightSender:
    """Rank 0 of a channel. ``send(names_and_shapes, tensors)`` broadcasts every tensor.

    ``tensors`` may be a lazy iterable (e.g. FSDP parameters gathered one at a time); it must
    yield exactly the tensors announced in ``meta`` (name, dtype, shape), in order.
    """

    def __init__(self, spec: ChannelSpec | dict[str, Any], device: torch.device | str = "cpu"):
        self.spec = ChannelSpec.from_dict(spec)
        self.device = torch.device(device)
        self._store: Any = None
        self._group: Any = None

    def send(self, named: Iterable[tuple[str, torch.Tensor]], meta: list[dict[str, Any]]) -> dict:
        """Broadcast ``named`` (whose description is ``meta``, see :func:`describe`)."""
        spec = self.spec
        t0 = time.perf_counter()
        self._store, self._group = _open(spec, 0)
        self._store.set(_META_KEY, json.dumps(meta))
        stats = TransferStats()
        it = iter(named)
        for idx, offsets, total in _buckets(meta, spec.bucket_bytes):
            flat = torch.empty(total, dtype=torch.uint8, device=self.device)
            for i, offset in zip(idx, offsets, strict=True):
                name, tensor = next(it)
                want = meta[i]
                if name != want["name"] or list(tensor.shape) != want["shape"]:
                    raise WeightSyncError(
                        f"weight stream out of order: got {name} {list(tensor.shape)}, "
                        f"announced {want['name']} {want['shape']}"
                    )
                t = tensor.detach().to(self.device, _dtype(want["dtype"])).contiguous()
                flat[offset : offset + want["nbytes"]] = t.reshape(-1).view(torch.uint8)
            if total:  # empty tensors carry nothing (gloo refuses empty broadcasts)
                _broadcast(self._group, flat)
            stats.buckets += 1
            stats.tensors += len(idx)
            stats.bytes += total
        # Receivers report when they have loaded everything (errors surface on their side).
        self._store.wait([_DONE_KEY + f"/{r}" for r in range(1, spec.world_size)])
        stats.seconds = time.perf_counter() - t0
        self.close()
        return stats.to_dict()

    def close(self) -> None:
        self._group = None
        self._store = None


def describe(
    shapes: Iterable[tuple[str, Any, Any]], dtype: str | None = None
) -> list[dict[str, Any]]:
    """The announcement for :meth:`WeightSender.send`: (name, shape, dtype) per tensor, with
    the travelling dtype (``dtype`` overrides floating-point tensors' own)."""
    meta = []
    for name, shape, own in shapes:
        travel = own
        if dtype and own.is_floating_point:
            travel = _dtype(dtype)
        numel = 1
        for d in shape:
            numel *= int(d)
        meta.append(
            {
                "name": name,
                "shape": [int(d) for d in shape],
                "dtype": str(travel).replace("torch.", ""),
                "nbytes": numel * torch.empty((), dtype=travel).element_size(),
            }
        )
    return meta


def send_state_dict(
    spec: ChannelSpec | dict[str, Any],
    state_dict: dict[str, torch.Tensor],
    device: torch.device | str = "cpu",
) -> dict[str, Any]:
    """Rank 0: broadcast a whole state dict (the driver's path for ``update_weights``)."""
    spec = ChannelSpec.from_dict(spec)
    items = list(state_dict.items())
    meta = describe(((k, v.shape, v.dtype) for k, v in items), spec.dtype)
    return WeightSender(spec, device).send(items, meta)


# ----------------------------------------------------------------------------- receiver


def receive(
    spec: ChannelSpec | dict[str, Any], rank: int, device: torch.device | str = "cpu"
) -> Iterator[tuple[str, torch.Tensor]]:
    """Rank ``rank`` >= 1: yields ``(name, tensor)`` as buckets arrive (views into the
    bucket; consume each before asking for the next). Tells the sender when it is done."""
    spec = ChannelSpec.from_dict(spec)
    store, group = _open(spec, rank)
    raw = store.get(_META_KEY)
    meta = json.loads(raw.decode() if isinstance(raw, bytes) else raw)
    dev = torch.device(device) if spec.backend == "nccl" else torch.device("cpu")
    for idx, offsets, total in _buckets(meta, spec.bucket_bytes):
        flat = torch.empty(total, dtype=torch.uint8, device=dev)
        if total:
            _broadcast(group, flat)
        for i, offset in zip(idx, offsets, strict=True):
            m = meta[i]
            chunk = flat[offset : offset + m["nbytes"]]
            yield m["name"], chunk.view(_dtype(m["dtype"])).reshape(m["shape"])
    store.set(_DONE_KEY + f"/{rank}", "1")
