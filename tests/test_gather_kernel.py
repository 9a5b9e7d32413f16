"""The gather's kernel (`backend.kernels.gather_part`) on the CPU: compiled by NVRTC for the H200
at each word and index size, and compiled on the host (one block of one thread) it picks the rows
PyTorch's index_select picks, a row of NaN for an index outside the table (written by hand), in
f32, f16 and bf16 (its bits), moving the widest word a row allows. On the GPU:
tests/gpu/test_ops_gpu.py runs `gather` against the reference."""

from __future__ import annotations

import ctypes
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from dslc.backend import kernels, merge
from tests.helpers import nvrtc_compile, rng
from tests.test_fused_kernel import host_part


@pytest.mark.parametrize(("word", "item", "index"),
                         [(16, 2, "int64"), (4, 4, "int32"), (2, 2, "int64"), (8, 4, "int64")])
def test_the_gather_kernel_compiles_for_the_h200(word: int, item: int, index: str) -> None:
    source = merge.source([kernels.gather_kernel(word, item, index)], "dslc_gather")
    ok, log = nvrtc_compile(source)
    assert ok and "warning" not in log, log[:2000]


class _Device:
    """A host array as the part reads a CuPy one: its pointer at `.data.ptr`."""

    def __init__(self, a: np.ndarray) -> None:
        self.a = a
        self.data = SimpleNamespace(ptr=a.ctypes.data)
        self.flags, self.dtype, self.shape = a.flags, a.dtype, a.shape
        self.size, self.nbytes = a.size, a.nbytes


def _run_on_host(part: merge.Part, tmp_path: Path) -> None:
    fn = host_part(part.kernel, "dslc_gather", tmp_path)
    fn.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_longlong] * 6
    x, idx, y, *rest = part.args
    fn(x.data.ptr, idx.data.ptr, y.data.ptr, *(int(v) for v in rest), 1)  # one block


def _nan_rows(want: torch.Tensor, outside: np.ndarray, axis: int) -> torch.Tensor:
    mask = torch.from_numpy(outside.reshape(-1))
    index: list[Any] = [slice(None)] * want.ndim
    index[axis] = mask
    want[tuple(index)] = float("nan")
    return want


@pytest.mark.parametrize(("dtype", "shape", "axis", "index", "word"), [
    ("f16", (5, 8), 0, "int64", 16),      # an f16 row of 16 bytes: one word a row
    ("f32", (2, 6, 3), 1, "int32", 4),    # 12-byte rows along an inner axis
    ("bf16", (7, 3), 0, "int64", 2),      # 6-byte rows: element by element
    ("f32", (4, 6), 0, "int64", 8),       # 24-byte rows: 8-byte words
])
def test_the_gather_kernel_picks_the_rows_of_index_select(dtype: str, shape: tuple[int, ...],
                                                          axis: int, index: str, word: int,
                                                          tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # The blocks of a launch count the GPU's multiprocessors: none here, and the host runs one.
    monkeypatch.setattr(kernels, "grid_blocks", lambda n: 1)
    g = rng("gather kernel", dtype, axis)
    rows = shape[axis]
    idx = g.integers(-2, rows + 2, (2, 3)).astype(index)
    idx[0, 0], idx[1, 2] = rows, -1  # one past the end, one below: NaN rows
    table = torch.from_numpy(g.standard_normal(shape).astype(np.float32))
    torch_dtype = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}[dtype]
    table = table.to(torch_dtype)
    stored = table.view(torch.uint16) if dtype == "bf16" else table
    x = stored.numpy()
    out_shape = (*shape[:axis], *idx.shape, *shape[axis + 1:])
    y = np.zeros(out_shape, x.dtype)
    part = kernels.gather_part([_Device(x), _Device(idx)], _Device(y), {"axis": axis})
    assert part is not None and part.kernel.key[1] == word
    _run_on_host(part, tmp_path)
    inside = (idx >= 0) & (idx < rows)
    picked = torch.index_select(table, axis, torch.from_numpy(np.where(inside, idx, 0).reshape(-1)))
    want = _nan_rows(picked, ~inside, axis).reshape(out_shape)
    got = torch.from_numpy(y).view(torch.bfloat16) if dtype == "bf16" else torch.from_numpy(y)
    assert torch.equal(got.isnan(), want.isnan()) and got.isnan().any()
    assert torch.equal(torch.nan_to_num(got), torch.nan_to_num(want))


def test_a_strided_table_or_result_keeps_the_generic_route() -> None:
    x = np.zeros((4, 6), np.float32)
    idx = np.zeros(3, np.int64)
    assert kernels.gather_part([_Device(x[:, ::2]), _Device(idx)], _Device(np.zeros((3, 3), np.float32)),
                               {"axis": 0}) is None
    assert kernels.gather_part([_Device(x), _Device(idx)],
                               _Device(np.zeros((3, 12), np.float32)[:, ::2]), {"axis": 0}) is None
