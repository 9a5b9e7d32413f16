"""Where a value's elements are in memory (shape, strides, base and offset), at one set of
dim values: what the runtime's memory plan gives each value and what measuring reads."""

from __future__ import annotations

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
        if not self.shape or 0 in self.shape:
            return 0 if 0 in self.shape else 1
        return 1 + sum((d - 1) * s for d, s in zip(self.shape, self.strides, strict=True))
