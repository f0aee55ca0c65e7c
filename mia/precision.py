"""Compute precision chosen from what the machine reports.

bfloat16 halves memory traffic and is ~1.6x faster than float32 where the hardware computes it
natively: GPUs with bf16 units, and CPUs with AVX512-BF16 or AMX. Everywhere else it is
emulated, and on an AVX2-only CPU a bf16 matmul is ~60x *slower* than float32 (a 512x576 @
576x1536 matmul: 19 ms in float32, 1,226 ms in bf16, 1,713 ms under bf16 autocast). So every
compute-precision setting in MIA (``policy.mixed_precision``, generator and local-LLM ``dtype``,
the demo's ``local_dtype``) goes through :func:`compute_dtype`, which picks bf16 only where it is
native and float32 otherwise, even when a config asks for bf16 explicitly (with a warning).
Storage dtypes (an exported folder's ``export_dtype``, the embedded model's cache) are not compute
and are left alone: a bf16 folder loads into float32 on a CPU without bf16.

``MIA_BF16=1`` / ``MIA_BF16=0`` overrides the CPU detection (e.g. to test the bf16 code path on
an AVX2 machine, or to rule bf16 out on a CPU whose flags overclaim).
"""

from __future__ import annotations

import functools
import logging
import os
import platform
from dataclasses import dataclass
from pathlib import Path

from mia.errors import MiaError

log = logging.getLogger(__name__)

ENV_OVERRIDE = "MIA_BF16"
BF16 = "bfloat16"
FP16 = "float16"
FP32 = "float32"
_ALIASES = {
    "auto": "auto",
    "bf16": BF16,
    "bfloat16": BF16,
    "fp16": FP16,
    "float16": FP16,
    "half": FP16,
    "fp32": FP32,
    "float32": FP32,
    "none": FP32,
    "no": FP32,
    "float": FP32,
}
# CPU flags (Linux /proc/cpuinfo: x86 "flags", Arm "Features") that mean native half-precision.
_CPU_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})
_CPU_FP16_FLAGS = frozenset({"avx512_fp16", "amx_fp16", "fphp"})
# torch.backends.cpu.get_cpu_capability() values that can carry native bf16 at all.
_CAPABLE = ("AVX512", "AMX", "SVE", "DEFAULT")


@dataclass(frozen=True)
class CpuReport:
    """What the CPU says about itself: torch's dispatch capability and the kernel's flags."""

    capability: str
    flags: frozenset[str]
    machine: str = ""

    @property
    def native_bf16(self) -> bool:
        if not self.capability.upper().startswith(_CAPABLE):
            return False  # e.g. "AVX2": torch dispatches no bf16 kernels here
        return bool(self.flags & _CPU_BF16_FLAGS)

    @property
    def native_fp16(self) -> bool:
        if not self.capability.upper().startswith(_CAPABLE):
            return False
        return bool(self.flags & _CPU_FP16_FLAGS)

    def describe(self) -> str:
        bf16 = "native bf16" if self.native_bf16 else "no native bf16"
        return f"CPU {self.capability} ({bf16})"


def _read_flags() -> frozenset[str]:
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() in ("flags", "features"):
            return frozenset(value.split())
    return frozenset()


@functools.lru_cache(maxsize=1)
def _detected() -> CpuReport:
    import torch

    try:
        capability = str(torch.backends.cpu.get_cpu_capability())
    except Exception:  # very old or exotic builds
        capability = "DEFAULT"
    return CpuReport(capability=capability, flags=_read_flags(), machine=platform.machine())


def cpu_report() -> CpuReport:
    """This machine's CPU report (cached; tests monkeypatch this function)."""
    return _detected()


def _env_override() -> bool | None:
    raw = os.environ.get(ENV_OVERRIDE, "").strip().lower()
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    return None


def _is_cuda(device: object) -> bool:
    return str(getattr(device, "type", device)).startswith("cuda")


def native_half(dtype: str, device: object = "cpu") -> bool:
    """Whether ``device`` computes ``dtype`` (bfloat16 | float16) natively."""
    if _is_cuda(device):
        import torch

        if dtype == BF16:
            return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
        return bool(torch.cuda.is_available())
    forced = _env_override()
    if forced is not None:
        return forced
    report = cpu_report()
    return report.native_bf16 if dtype == BF16 else report.native_fp16


def normalise(choice: str | None) -> str:
    """``auto`` | ``bfloat16`` | ``float16`` | ``float32`` from any accepted spelling."""
    key = "auto" if choice is None else str(choice).strip().lower()
    if key not in _ALIASES:
        raise MiaError(
            f"unknown precision {choice!r} (auto | bf16/bfloat16 | fp16/float16 | none/float32)"
        )
    return _ALIASES[key]


@functools.lru_cache(maxsize=32)
def _warn_once(message: str) -> None:
    log.warning(message)


def compute_dtype(choice: str | None, device: object = "cpu") -> str:
    """The dtype to compute in on ``device`` for a configured ``choice``.

    ``auto`` -> bfloat16 where native (GPU with bf16, CPU with AVX512-BF16/AMX), else float32.
    An explicit bfloat16/float16 on hardware without it -> float32, with a warning: emulated
    half precision is tens of times slower and never what a config meant.
    """
    want = normalise(choice)
    if want == "auto":
        return BF16 if native_half(BF16, device) else FP32
    if want == FP32 or native_half(want, device):
        return want
    where = "GPU" if _is_cuda(device) else cpu_report().describe()
    _warn_once(f"{want} requested but {where} does not compute it natively: using float32")
    return FP32


def torch_dtype(name: str):  # -> torch.dtype
    import torch

    return getattr(torch, name)


def autocast_dtype(mixed_precision: str | None, device: object = "cpu"):  # -> torch.dtype|None
    """The autocast dtype of a trainable policy (fp32 master weights): None = plain float32."""
    chosen = compute_dtype(mixed_precision, device)
    return None if chosen == FP32 else torch_dtype(chosen)


def describe(device: object = "cpu") -> str:
    """One line for logs and the demo: what was chosen and why."""
    chosen = compute_dtype("auto", device)
    if _is_cuda(device):
        return f"{chosen} (GPU)"
    why = cpu_report().describe()
    if _env_override() is not None:
        why += f", {ENV_OVERRIDE}={os.environ[ENV_OVERRIDE]}"
    return f"{chosen} ({why})"
