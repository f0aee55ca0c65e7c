"""mia.heap: freed heap memory goes back to the OS (glibc), as the Trainer relies on."""

from __future__ import annotations

import sys

import pytest
import torch

from mia.heap import peak_resident_bytes, resident_bytes, trim_heap

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="malloc_trim is glibc's (Linux)"
)


def test_trim_heap_returns_fragmented_free_memory() -> None:
    # Tensors of ~80 KB sit below glibc's mmap threshold, so they live in the heap; one in
    # fifty is kept alive, so the freed ones cannot be released by shrinking the heap's top.
    n, size = 3000, 20_000
    before = resident_bytes()
    tensors = [torch.ones(size + i) for i in range(n)]
    kept = [t.clone() for t in tensors[::50]]
    allocated = n * size * 4
    del tensors
    held = resident_bytes()
    assert held - before > allocated // 2  # still resident although freed: what trim is for
    assert trim_heap() is True
    after = resident_bytes()
    assert held - after > allocated // 2
    assert all(float(t[0]) == 1.0 for t in kept)  # what is live is untouched
    assert peak_resident_bytes() > before + allocated // 2  # the peak is remembered
