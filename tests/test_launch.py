"""Early launches (`backend.launch`) on the CPU: the ctypes structures have cuda.h's layouts
(CUlaunchConfig, CUlaunchAttribute: offsets read from CUDA 13's header), arguments become the C
values their parameters take, `DSLC_EARLY_LAUNCH=0` turns early launches off, and the kernels
launched early read nothing another kernel writes before they wait (a read before the wait
would race with the kernel ahead). Launches themselves run on the H200
(tests/gpu/test_gemv_gpu.py, tests/gpu/test_decode_gpu.py)."""

from __future__ import annotations

import ctypes
from types import SimpleNamespace

import numpy as np
import pytest

from dslc.backend import attention, gemv, launch


def test_the_launch_structures_have_the_layouts_of_cuda_h() -> None:
    config = launch.Config
    assert [getattr(config, f).offset for f in
            ("grid", "block", "shared", "stream", "attrs", "count")] == [0, 12, 24, 32, 40, 48]
    assert ctypes.sizeof(config) == 56
    assert (launch.Attribute.value.offset, ctypes.sizeof(launch.Attribute)) == (8, 72)
    assert launch.PROGRAMMATIC_STREAM_SERIALIZATION == 6


def test_arguments_become_the_c_values_their_parameters_take() -> None:
    array = SimpleNamespace(data=SimpleNamespace(ptr=0xDEAD0000))
    got = [launch._value(a) for a in (array, np.int32(-3), np.int64(1 << 40),
                                      np.float32(0.5), np.uint64(7))]
    assert [type(v) for v in got] == [ctypes.c_void_p, ctypes.c_int32, ctypes.c_int64,
                                      ctypes.c_float, ctypes.c_uint64]
    assert [v.value for v in got] == [0xDEAD0000, -3, 1 << 40, 0.5, 7]
    with pytest.raises(KeyError):
        launch._value(3)  # a Python int has no C type of its own: say which


def test_early_launches_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DSLC_EARLY_LAUNCH", "0")
    launch._launcher.cache_clear()
    try:
        assert launch._launcher() is None  # decided before CuPy or the driver is asked
        calls = []
        launch.early(lambda *a: calls.append(a), (3,), (32,), (np.int32(1),))
        assert calls == [((3,), (32,), (np.int32(1),))]  # CuPy's own launch
    finally:
        launch._launcher.cache_clear()


def _body(source: str) -> str:
    return source[source.index("__global__"):]


def test_the_matmul_kernel_reads_only_weights_before_it_waits() -> None:
    g = gemv.alone("x", "w", "f16")
    body = _body(gemv._SOURCE.format(
        rows=1, columns=1, split=4, unroll=1, pair=0, norm=0, threads=256, warps=8,
        load="return 0.0f;", params="", strides="", w2="", wn2="", sibling="", g="", eps="",
        anchor=g.anchor, held="mine", loads="", outs="", body="", stores=""))
    wait = body.index("wait_for_previous();")
    assert body.index("let_next_start();") < wait
    assert body.index("prefetch.global.L2") < wait  # the weights, into the L2 only
    for read in ("x + m * xm", "g + k", "stream(rows[c] + k)", "q{", "p{"):
        assert read not in body[:wait], read


def test_the_attention_kernel_waits_before_anything_else() -> None:
    body = _body(attention.source("float16", 4, 64, 8))
    start = body.index("{") + 1
    assert body[start:].lstrip().startswith("// launched early")
    first = body.index("let_next_start();"), body.index("wait_for_previous();")
    assert first[0] < first[1] < body.index("__shared__")
