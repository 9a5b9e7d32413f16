"""Every variant of the fallback kernels that no other CPU test compiles (the depthwise conv,
group norm, the pitched row copy, the timing hold) compiles with NVRTC for the H200 without a
warning: a syntax or type error in one would otherwise show only on a GPU, where the kernel is
first launched. Their numbers are checked on the GPU (tests/gpu/)."""

from __future__ import annotations

import pytest

from dslc.backend import depthwise, groupnorm, rows, timing
from dslc.backend.cuda import LOAD_STORE
from tests.helpers import nvrtc_compile

STORAGE = sorted(LOAD_STORE)  # float32, float16, bfloat16


def _compiles(source: str) -> None:
    ok, log = nvrtc_compile(source)
    assert ok and "warning" not in log, log[:2000]


@pytest.mark.parametrize("wide", [False, True])
@pytest.mark.parametrize("storage", STORAGE)
def test_every_depthwise_conv_variant_compiles(storage: str, wide: bool) -> None:
    for vec in (1, 16 // (4 if storage == "float32" else 2)):  # scalar, and 16 bytes a thread
        _compiles(depthwise.source(storage, vec, wide))


@pytest.mark.parametrize("wide", [False, True])
@pytest.mark.parametrize("storage", STORAGE)
def test_every_groupnorm_variant_compiles(storage: str, wide: bool) -> None:
    for param in STORAGE:  # the scale and bias in any float dtype
        _compiles(groupnorm.source(storage, param, wide))


@pytest.mark.parametrize("word", sorted(rows._WORDS.values()))
def test_the_row_copy_compiles_for_every_word(word: str) -> None:
    _compiles(rows.source(word))


def test_the_timing_hold_compiles() -> None:
    _compiles(timing.HOLD)


def test_a_kernel_source_with_a_type_error_fails_this_check() -> None:
    """The check can fail: a source the kernels' own could become by a bad edit."""
    broken = rows.source("uint4").replace("y##k[r * yp##k + c] = x##k[r * xp##k + c];",
                                          "y##k[r * yp##k + c] = x##k;")
    assert broken != rows.source("uint4")
    ok, _ = nvrtc_compile(broken)
    assert not ok
