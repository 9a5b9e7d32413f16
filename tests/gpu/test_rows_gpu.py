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


@pytest.mark.parametrize(("dtype", "widths"), [
    ("float16", (32, 32)), ("float16", (8, 16, 8)), ("float32", (3, 5, 1, 2)), ("uint8", (3, 4))])
def test_a_concat_s_copied_parts_in_one_launch_equal_numpy(dtype: str,
                                                           widths: tuple[int, ...]) -> None:
    """A UNet's skip concat copies its upsample and its skip (session 31): every part into its
    channel slice in one launch, each at its own pitch, the slices next to each other."""
    import cupy

    from dslc.backend import rows

    g = rng(f"parts {dtype} {widths}")
    xs = [(g.standard_normal((2, 5, 7, w)) * 50).astype(dtype) for w in widths]
    y = np.zeros((2, 5, 7, sum(widths) + 1), dtype)  # one channel past the parts, untouched
    want = y.copy()
    pairs, at = [], 0
    dy = cupy.asarray(y)
    for x, w in zip(xs, widths, strict=True):
        want[..., at:at + w] = x
        pairs.append((cupy.asarray(x).transpose(0, 3, 1, 2),
                      dy[..., at:at + w].transpose(0, 3, 1, 2)))
        at += w
    assert rows.copy_parts(pairs)
    np.testing.assert_array_equal(cupy.asnumpy(dy), want)


def test_parts_of_other_row_counts_are_not_copied_in_one_launch() -> None:
    import cupy

    from dslc.backend import rows

    y = cupy.zeros((4, 8), dtype=cupy.float32)
    a, b = cupy.ones((4, 4), dtype=cupy.float32), cupy.ones((2, 4), dtype=cupy.float32)
    assert not rows.copy_parts([(a, y[:, :4]), (b, y[:2, 4:])])
    assert int(y.sum()) == 0  # nothing written
