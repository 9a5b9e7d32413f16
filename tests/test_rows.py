"""`backend.rows.rows_of`: which strided arrays are rows at a pitch (the concat's one-kernel
copy), against hand-derived rows, widths and pitches (numpy arrays carry the same shape and
strides as CuPy's; the copy itself runs on the GPU: tests/gpu/test_rows_gpu.py)."""

from __future__ import annotations

import numpy as np

from dslc.backend.rows import rows_of


def _order(a: np.ndarray) -> list[int]:
    return sorted((i for i in range(a.ndim) if a.shape[i] != 1), key=lambda i: -a.strides[i])


def test_a_channel_slice_of_an_nhwc_buffer_is_rows_at_the_buffer_pitch() -> None:
    buffer = np.zeros((2, 6, 5, 64), np.float16)  # NHWC, 64 channels
    part = buffer[..., :32].transpose(0, 3, 1, 2)  # the first 32 channels, read as NCHW
    assert rows_of(part, _order(part)) == (2 * 6 * 5, 32, 64)
    dense = np.zeros((2, 6, 5, 32), np.float16).transpose(0, 3, 1, 2)
    assert rows_of(dense, _order(part)) == (60, 32, 32)


def test_a_transposed_or_gapped_array_is_not_rows() -> None:
    a = np.zeros((4, 6), np.float32)
    assert rows_of(a.T, [0, 1]) is None  # read in row-major order: the last axis is strided
    assert rows_of(a.T, [1, 0]) == (4, 6, 6)  # in its own memory order: rows
    gapped = np.zeros((4, 8, 6), np.float32)[:, :5, :]  # rows of 6, 8 apart, 5 of 8 per block
    assert rows_of(gapped, [0, 1, 2]) is None
    assert rows_of(np.zeros((4, 5, 6), np.float32)[:, :, :3], [0, 1, 2]) == (20, 3, 6)


def test_one_element_and_one_row() -> None:
    assert rows_of(np.zeros((1, 1), np.float32), []) == (1, 1, 1)
    assert rows_of(np.zeros((1, 7), np.float32), [1]) == (1, 7, 7)


def test_a_one_channel_slice_is_rows_of_one_element_at_the_buffer_pitch() -> None:
    """A concat's part of one channel (session 32: the GPU test's parts of widths 3, 5, 1, 2 were
    refused one launch): its channel axis is not among the read axes, so its last read axis is
    strided; as rows of one element each it is the buffer's rows."""
    buffer = np.zeros((2, 6, 5, 11), np.float32)
    part = buffer[..., 3:4].transpose(0, 3, 1, 2)
    order = _order(part)
    assert rows_of(part, order) is None
    assert rows_of(part, order, single=True) == (60, 1, 11)
    dense = np.zeros((2, 6, 5, 1), np.float32).transpose(0, 3, 1, 2)
    assert rows_of(dense, order, single=True) == (60, 1, 1)
    for gapped in (np.zeros((2, 8, 5, 11), np.float32)[:, :6, :, 3:4],  # a gap between N and H
                   np.zeros((2, 6, 7, 11), np.float32)[:, :, :5, 3:4]):  # between H and W
        part = gapped.transpose(0, 3, 1, 2)
        assert rows_of(part, _order(part), single=True) is None  # not one axis of rows
    column = np.zeros((7, 4), np.float32)[:, 1:2]  # one read axis: rows of one at its stride
    assert rows_of(column, [0], single=True) == (7, 1, 4)


def test_rows_overlapping_one_another_are_not_rows() -> None:
    base = np.zeros(64, np.float32)
    overlapping = np.lib.stride_tricks.as_strided(base, (4, 6), (12, 4))  # 6 wide, 3 apart
    assert rows_of(overlapping, [0, 1]) is None
    assert rows_of(np.lib.stride_tricks.as_strided(base, (4, 6), (24, 4)), [0, 1]) == (4, 6, 6)
