"""The cache write's kernel (`backend.kernels.cache_write`) on the CPU: compiled by NVRTC for the
H200 at every element size, and compiled on the host (one block of one thread) it writes the new
rows at the offset the device reads, strided as given, dropping the rows past the cache, against
numpy. On the H200: tests/gpu/test_decode_gpu.py."""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import pytest

from dslc.backend import kernels, merge
from tests.helpers import nvrtc_compile, rng
from tests.test_fused_kernel import host_part


@pytest.mark.parametrize("item", sorted(kernels._BYTES))
def test_the_cache_write_kernel_compiles_for_the_h200(item: int) -> None:
    source = merge.source([kernels.cache_write_kernel(item)], "dslc_cache_write")
    ok, log = nvrtc_compile(source)
    assert ok and "warning" not in log, log[:2000]


@pytest.mark.parametrize("at", [5, 0, -2])
def test_the_cache_write_kernel_writes_the_rows_at_the_offset(at: int, tmp_path: Path) -> None:
    fn = host_part(kernels.cache_write_kernel(2), "dslc_cache_write", tmp_path)
    fn.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_longlong] * 14
    g = rng("cache write", at)
    new = g.integers(1, 60000, (2, 3, 4, 8)).astype(np.uint16).transpose(0, 2, 1, 3)  # BSHD
    cache = np.zeros((2, 4, 7, 8), np.uint16)
    offset = np.array([at], np.int32)
    strides = [st // 2 for st in (*new.strides, *cache.strides)]
    fn(new.ctypes.data, offset.ctypes.data, cache.ctypes.data, new.size, 4, 3, 8, 7, *strides, 1)  # one block
    want = np.zeros_like(cache)
    for s in range(3):
        if 0 <= at + s < 7:
            want[:, :, at + s] = new[:, :, s]
    assert np.array_equal(cache, want) and cache.any()
