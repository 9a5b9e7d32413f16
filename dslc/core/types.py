"""Tensor types: dtype x logical shape x layout, printed in source syntax (`f16[N, 64] @NHWC`).

A layout is the memory order of the logical axes, outermost first; `None` means the layout is
free (dslc chooses it when the value is materialised). Dtype classes and the precision triple
(io, intermediate, compute) live here too.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dslc.core.dims import Dim, format_dim
from dslc.diag.records import quick_init

FLOATS = ("f32", "f16", "bf16")
FP8 = ("f8e4m3", "f8e5m2")
INTS = ("i8", "u8", "i32", "i64")
DTYPES = FLOATS + FP8 + INTS + ("bool",)
# The largest finite value of each fp8 dtype: a tensor quantised to it is scaled so that its
# calibrated amax lands there (e4m3 saturates above it; e5m2 has infinities).
FP8_MAX = {"f8e4m3": 448.0, "f8e5m2": 57344.0}
# How a weight (an operand computed from params alone) quantised to fp8 is scaled: one scale per
# output channel (the default: it folds into the epilogue as a per-channel vector), or one.
WEIGHT_SCALES = ("per_channel", "per_tensor")
BITS = {"f32": 32, "f16": 16, "bf16": 16, "f8e4m3": 8, "f8e5m2": 8, "i8": 8, "u8": 8, "i32": 32,
        "i64": 64, "bool": 8}


def is_float(dtype: str) -> bool:
    return dtype in FLOATS or dtype in FP8


def is_int(dtype: str) -> bool:
    return dtype in INTS


def widest_float(dtypes: list[str]) -> str | None:
    floats = [d for d in dtypes if is_float(d)]
    if not floats:
        return None
    return max(floats, key=lambda d: (BITS[d], d == "f16"))


# Layout families: tag letters -> the canonical (logical) axis letters of that family.
FAMILIES = {
    "NCW": "NCW", "NWC": "NCW",
    "NCHW": "NCHW", "NHWC": "NCHW",
    "NCDHW": "NCDHW", "NDHWC": "NCDHW",
    "KCRS": "KCRS", "KRSC": "KCRS",
    "KCS": "KCS", "KSC": "KCS",
    "KCTRS": "KCTRS", "KTRSC": "KCTRS",
    "BHSD": "BHSD", "BSHD": "BHSD",
}


@quick_init
@dataclass(frozen=True, slots=True)
class Layout:
    """Memory order of the logical axes, outermost first. `tag` is only for printing."""

    order: tuple[int, ...]
    tag: str | None = field(default=None, compare=False)

    @staticmethod
    def row_major(rank: int) -> Layout:
        return Layout(tuple(range(rank)))

    @staticmethod
    def from_tag(tag: str) -> Layout | None:
        canon = FAMILIES.get(tag)
        if canon is None:
            return None
        return Layout(tuple(canon.index(ch) for ch in tag), tag)

    @property
    def is_row_major(self) -> bool:
        return self.order == tuple(range(len(self.order)))

    def innermost(self) -> int:
        return self.order[-1]

    def __str__(self) -> str:
        tag = self.tag or _COMMON_TAGS.get(self.order)
        if tag:
            return f"@{tag}"
        return "@[" + ", ".join(str(a) for a in self.order) + "]"


# How a layout without a written tag prints: the usual name of its order.
_COMMON_TAGS = {(0, 2, 1): "NWC", (0, 2, 3, 1): "NHWC", (0, 2, 3, 4, 1): "NDHWC"}


@quick_init
@dataclass(frozen=True, slots=True)
class TensorType:
    dtype: str
    shape: tuple[Dim, ...]
    layout: Layout | None = None

    @property
    def rank(self) -> int:
        return len(self.shape)

    def with_shape(self, shape: tuple[Dim, ...]) -> TensorType:
        return TensorType(self.dtype, shape, None)

    def __str__(self) -> str:
        return format_type(self)


def format_shape(shape: tuple[Dim, ...]) -> str:
    return "[" + ", ".join(format_dim(d) for d in shape) + "]"


def format_type(t: TensorType) -> str:
    text = f"{t.dtype}{format_shape(t.shape)}"
    if t.layout is not None and not (t.layout.is_row_major and t.layout.tag is None):
        text += f" {t.layout}"
    return text


@quick_init
@dataclass(frozen=True, slots=True)
class PrecisionSpec:
    """cuDNN's precision triple: `io` for materialised tensors, `intermediate` for virtual ones
    inside a fused graph, `compute` for the math."""

    io: str = "f32"
    intermediate: str = "f32"
    compute: str = "f32"

    def __str__(self) -> str:
        return f"io={self.io}, intermediate={self.intermediate}, compute={self.compute}"
