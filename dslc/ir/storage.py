"""Where a value's elements are in memory (shape, strides, base and offset), at one set of
dim values: what the runtime's memory plan gives each value and what measuring reads."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dslc.ir.interp import ITEMSIZE


@dataclass(frozen=True)
class Storage:
    """Where a value's elements are: shape and strides (elements), and its base."""

    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: str
    base: str  # the value that owns the memory (itself, unless a view)
    offset: int  # elements from the base's first element

    @property
    def nbytes(self) -> int:
        return self.span * ITEMSIZE[self.dtype]

    @property
    def span(self) -> int:
        """Elements from the first to one past the last that it reaches."""
        return span(self.shape, self.strides)


def span(shape: Sequence[int], strides: Sequence[int]) -> int:
    """Elements from a strided tensor's first to one past the last it reaches: 0 when it is
    empty, 1 for a scalar. The one formula the memory plan, the runtime's device arrays, the
    fallback kernels and the arena all size memory by."""
    if 0 in shape:
        return 0
    return 1 + sum((d - 1) * s for d, s in zip(shape, strides, strict=True))
