"""`ir.storage.span`, the one formula every memory size is taken from, against numpy's own
view of the same strides (an independent count: the highest byte a strided view touches)."""

from __future__ import annotations

import numpy as np
import pytest
from numpy.lib.stride_tricks import as_strided

from dslc.ir.storage import Storage, span


@pytest.mark.parametrize(("shape", "strides"), [
    ((2, 3, 4), (12, 4, 1)),       # contiguous
    ((2, 4, 3), (12, 1, 4)),       # channels-last
    ((3, 5), (1, 7)),              # a transposed slice of a wider buffer
    ((4, 1, 6), (6, 999, 1)),      # a size-1 axis's stride is never stepped
    ((2, 3), (0, 1)),              # a broadcast axis
])
def test_span_is_one_past_the_last_element_numpy_reaches(shape: tuple[int, ...],
                                                        strides: tuple[int, ...]) -> None:
    base = np.arange(10_000, dtype=np.int64)
    view = as_strided(base, shape, tuple(s * base.itemsize for s in strides))
    assert span(shape, strides) == int(view.max()) + 1


def test_an_empty_tensor_spans_nothing_and_a_scalar_one_element() -> None:
    assert span((3, 0, 2), (0, 2, 1)) == 0
    assert span((), ()) == 1
    assert Storage((2, 0), (0, 1), "f16", "x", 0).nbytes == 0
    assert Storage((2, 3), (3, 1), "f16", "x", 0).nbytes == 12
