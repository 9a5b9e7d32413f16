"""The concat's one-kernel copy of rows at a pitch (`backend.rows`) equals numpy's assignment,
for every word width it picks (16 bytes down to 1) and where it declines (CuPy copies)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers import rng

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize(("dtype", "channels", "of"), [
    ("float16", 32, 64), ("float32", 3, 7), ("float16", 5, 9), ("uint8", 3, 5),
    ("float32", 16, 48)])
def test_rows_copy_into_a_channel_slice_equals_numpy(dtype: str, channels: int, of: int) -> None:
    import cupy

    from dslc.backend import rows

    g = rng(f"rows {dtype} {channels} {of}")
    x = (g.standard_normal((2, 7, 9, channels)) * 50).astype(dtype)
    y = g.standard_normal((2, 7, 9, of)).astype(dtype)
    want = y.copy()
    want[..., 1:1 + channels] = x
    dx, dy = cupy.asarray(x), cupy.asarray(y)
    part = dy[..., 1:1 + channels].transpose(0, 3, 1, 2)
    assert rows.copy(dx.transpose(0, 3, 1, 2), part)
    np.testing.assert_array_equal(cupy.asnumpy(dy), want)  # neighbours untouched


def test_rows_copy_declines_a_transposed_source() -> None:
    import cupy

    from dslc.backend import rows

    x = cupy.arange(24, dtype=cupy.float32).reshape(4, 6)
    y = cupy.zeros((6, 4), dtype=cupy.float32)
    assert not rows.copy(x.T, y)
