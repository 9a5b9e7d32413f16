"""Small kernels of independent steps as one launch (dslc/backend/merge.py), without a GPU: the
merged kernel compiled by NVRTC for the H200, and compiled on the host (blocks of one thread,
each block called in turn) it computes what each part computes alone, every element of each
part once, whatever the split of blocks; the parts go into as few launches as their arguments
allow. On the H200: the decoder's rotary halves and cache writes (tests/gpu/test_decode_gpu.py)
and the generated programs (`scripts/fuzz_diff.py --backend cudnn`)."""

from __future__ import annotations

import ctypes
import subprocess
import zlib
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from dslc.backend import fused, kernels, merge
from dslc.backend.cuda import PREAMBLE
from tests.helpers import nvrtc_compile, rng
from tests.test_fused_kernel import _GRID, _SHIMS, MIXED, host_folder  # noqa: F401 (a fixture)

SET_BLOCK = 'extern "C" void set_block(unsigned b) { blockIdx.x = b; }\n'


def _library(source: str, folder: Path) -> ctypes.CDLL:
    name = f"merged_{zlib.crc32(source.encode()):08x}"
    (folder / f"{name}.cpp").write_text(source)
    subprocess.run(["g++", "-O1", "-shared", "-fPIC", "-o", str(folder / f"{name}.so"),
                    str(folder / f"{name}.cpp")], check=True)
    return ctypes.CDLL(str(folder / f"{name}.so"))


def test_the_merged_kernel_compiles_for_the_h200_without_a_warning() -> None:
    source = PREAMBLE + merge.source([MIXED.strided_kernel(3), kernels.cache_write_kernel(2),
                                      MIXED.strided_kernel(1)], "dslc_merged")
    ok, log = nvrtc_compile(source)
    assert ok and "warning" not in log, log[:2000]


@pytest.mark.parametrize("blocks", [(1, 1), (3, 2), (7, 5)])
def test_each_part_of_a_merged_kernel_computes_what_it_computes_alone(
        blocks: tuple[int, int], host_folder: Path) -> None:  # noqa: F811
    """A strided pointwise part (f16, bf16 and f32 operands, one transposed, into an f16 and a
    bool result) and a cache write (bf16 bits, rows at a device offset) in one kernel, each part
    over its own range of blocks: the pointwise results equal the part's kernel alone, the cache
    rows equal numpy's, and no element is left at its poison."""
    g = rng("merged kernel", *blocks)
    merged = _library(_SHIMS + _GRID + PREAMBLE + SET_BLOCK + merge.source(
        [MIXED.strided_kernel(3), kernels.cache_write_kernel(2)], "merged"), host_folder)
    alone = _library(_SHIMS + _GRID + PREAMBLE + MIXED.strided_source("alone", 3), host_folder)
    shape = (3, 4, 5)
    a = (g.standard_normal((5, 4, 3)) * 2).astype(np.float16).transpose(2, 1, 0)
    b = np.broadcast_to(g.standard_normal(4).astype(ml_dtypes.bfloat16).view(np.uint16)
                        .reshape(1, 4, 1), shape)
    c = np.broadcast_to(np.array([[[0.25]]], np.float32), shape)
    ys = [[np.full(shape, np.nan, np.float16), np.full(shape, 7, np.uint8)] for _ in range(2)]
    new = g.integers(1, 60000, (2, 3, 4, 8)).astype(np.uint16).transpose(0, 2, 1, 3)
    cache = np.zeros((2, 4, 7, 8), np.uint16)
    at = np.array([2], np.int32)

    def pointwise(y: list[np.ndarray]) -> list[int]:
        arrays = [a, b, c, *y]
        return [*(t.ctypes.data for t in arrays), a.size, *shape,
                *(st // t.itemsize for t in arrays for st in t.strides)]

    cache_args = [new.ctypes.data, at.ctypes.data, cache.ctypes.data, new.size, 4, 3, 8, 7,
                  *(st // 2 for st in (*new.strides, *cache.strides))]
    ends = [blocks[0], blocks[0] + blocks[1]]
    fn = merged.merged
    args = pointwise(ys[0]) + cache_args + ends
    pointers = {0, 1, 2, 3, 4, 24, 25, 26}
    fn.argtypes = [ctypes.c_void_p if i in pointers else ctypes.c_longlong
                   for i in range(len(args))]
    for block in range(ends[-1]):
        merged.set_block(block)
        fn(*args)
    one = alone.alone
    one.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_longlong] * 20
    one(*pointwise(ys[1]), 1)
    assert not np.isnan(ys[0][0].astype(np.float32)).any() and set(np.unique(ys[0][1])) <= {0, 1}
    assert np.array_equal(ys[0][0].view(np.uint16), ys[1][0].view(np.uint16))
    assert np.array_equal(ys[0][1], ys[1][1]) and 0 < ys[0][1].sum() < ys[0][1].size
    want = np.zeros_like(cache)
    want[:, :, 2:5] = new
    assert np.array_equal(cache, want)


def test_parts_go_into_as_few_launches_as_their_arguments_fit() -> None:
    """Each part's arguments and its block end take 8 bytes each; a launch takes 4,096."""
    small = merge.Part(kernels.cache_write_kernel(2), tuple(range(16)), 1)  # 136 bytes
    big = merge.Part(MIXED.strided_kernel(4), tuple(range(400)), 1)  # 3,208 bytes
    assert merge.argument_bytes([small, big]) == 8 * (17 + 401)
    assert [len(b) for b in merge.launches([small] * 30)] == [30]
    assert [len(b) for b in merge.launches([small] * 31)] == [30, 1]
    launches = merge.launches([small, big, small, small, big])
    assert [[p is big for p in b] for b in launches] == [[False, True, False, False], [True]]
    assert merge.launches([]) == []


@pytest.mark.parametrize(("at", "narrow"), [(0, False), (2, False), (-1, False), (5, False),
                                           (2, True), (-1, True)])
def test_a_shifted_kernel_stores_its_results_at_the_rows_the_device_reads(
        at: int, narrow: bool, host_folder: Path) -> None:  # noqa: F811
    """The strided kernel with its results moved `at[0]` rows along axis 1 of a larger buffer
    (a cache's rows), rows past the buffer dropped: equal to the kernel's results unshifted,
    placed by numpy; every other element left as it was (64- and 32-bit index math)."""
    g = rng("shifted kernel", at)
    plan = MIXED
    shifted = _library(_SHIMS + _GRID + PREAMBLE + merge.source(
        [plan.strided_kernel(3, 1, narrow)], "shifted"), host_folder)
    alone = _library(_SHIMS + _GRID + PREAMBLE + plan.strided_source("alone", 3), host_folder)
    shape, rows = (3, 4, 5), 6
    a = (g.standard_normal(shape) * 2).astype(np.float16)
    b = g.standard_normal(shape).astype(ml_dtypes.bfloat16).view(np.uint16)
    c = np.full(shape, 0.25, np.float32)
    want = [np.zeros(shape, np.float16), np.zeros(shape, np.uint8)]
    got = [np.full((3, rows, 5), 7, np.float16), np.full((3, rows, 5), 9, np.uint8)]
    base = [a.ctypes.data, b.ctypes.data, c.ctypes.data]

    def strides(arrays: list[np.ndarray]) -> list[int]:
        return [st // t.itemsize for t in arrays for st in t.strides]

    one = alone.alone
    one.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_longlong] * 20
    one(*base, *(t.ctypes.data for t in want), a.size, *shape, *strides([a, b, c, *want]), 1)
    offset = np.array([at], np.int32)
    fn = shifted.shifted
    magic = fused.magic_args(shape) if narrow else []
    fn.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_longlong] * (19 + len(magic)) + \
        [ctypes.c_void_p] + [ctypes.c_longlong] * 2
    fn(*base, *(t.ctypes.data for t in got), a.size, *shape,
       *strides([a, b, c]), *strides(got), *magic, offset.ctypes.data, rows, 1)
    expect = [np.full((3, rows, 5), 7, np.float16), np.full((3, rows, 5), 9, np.uint8)]
    for s in range(shape[1]):
        if 0 <= at + s < rows:
            for e, w in zip(expect, want, strict=True):
                e[:, at + s] = w[:, s]
    assert np.array_equal(got[0].view(np.uint16), expect[0].view(np.uint16))
    assert np.array_equal(got[1], expect[1]) and (got[1] != 9).any()
