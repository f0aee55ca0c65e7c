"""Give the heap memory a phase freed back to the operating system (glibc's ``malloc_trim``).

On a CPU, torch allocates tensors with ``malloc``. glibc keeps what is freed in its arenas for
reuse instead of returning it, and a GRPO step frees tensors of many sizes: the rollouts'
KV caches, then the update's activations and logits. Chunks of one phase's sizes serve the
next phase's badly, so the process's resident memory climbs step after step although what is
live stays the same (docs/rl.md, "Memory", has the measurements).

:func:`trim_heap` is called where a phase ends: by the Trainer after each rollout phase and by
the policy worker after each update. ``malloc_trim`` walks every arena and releases whole free
pages (tens of milliseconds on a multi-GB heap). Where the C library is not glibc (musl,
macOS, Windows) it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys


@functools.cache
def _malloc_trim() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    """glibc's ``malloc_trim``, or None where the C library has none."""
    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        fn = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return fn


def resident_bytes() -> int:
    """This process's resident memory now, in bytes."""
    import psutil

    return int(psutil.Process().memory_info().rss)


def peak_resident_bytes() -> int | None:
    """The most this process has held resident so far, in bytes (``getrusage``); None on
    Windows, which has no ``getrusage``."""
    try:
        import resource
    except ImportError:
        return None
    peak = int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    return peak if sys.platform == "darwin" else peak * 1024  # macOS reports bytes, Linux KiB


def trim_heap() -> bool:
    """Return freed heap memory to the OS; True when glibc's ``malloc_trim`` released some.

    Safe to call at any time from any thread: it only gives back pages no allocation uses.
    """
    fn = _malloc_trim()
    return bool(fn(0)) if fn is not None else False
