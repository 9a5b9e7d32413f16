"""The imported graph: what the importer knows of each ONNX value, and the `.cgraph` operations
the ONNX nodes become.

An ONNX value is one of three things here:
- `Const`: known at import time (an initializer, a `Constant`, or computed from them);
- `Sym`: an integer tensor of dims (shape arithmetic: `Shape`, `Gather`, `Concat` of sizes),
  whose entries may be symbolic (`N`, `S * 12`): it becomes part of a `.cgraph` shape;
- `Op`: a tensor computed when the model runs, by one `.cgraph` operation (a built-in op, a
  standard library def, an input or a param).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dslc.core.dims import Dim

Scalar = float | int | bool


@dataclass(frozen=True, slots=True)
class Origin:
    """The ONNX node an operation came from: its name, op type and module scope (the PyTorch
    module path the exporter recorded, `layer1.0.conv1`, or None)."""

    node: str
    op_type: str
    scope: str | None = None


@dataclass(frozen=True, slots=True)
class Lit:
    """A number written in an expression (`x * 0.5`)."""

    value: Scalar


@dataclass(eq=False)
class Op:
    """One `.cgraph` operation. `op` is a built-in op or a standard library def (`conv2d`), or
    `input` / `param`; `args` are its tensor operands, `attrs` its attributes in the order they
    are written. A def's weights are `weights` (by its param's name: `weight`, `bias`) and its
    instance path `path`; a `param` holds its array under "" and its path is its name."""

    op: str
    args: list[Op | Lit]
    attrs: dict[str, Any]
    dtype: str
    shape: tuple[Dim, ...]
    origin: Origin | None = None
    weights: dict[str, np.ndarray] = field(default_factory=dict)
    path: str | None = None
    onnx_name: str | None = None  # the ONNX value it computes (a hint for its `let` name)

    @property
    def rank(self) -> int:
        return len(self.shape)

    def operands(self) -> list[Op]:
        return [a for a in self.args if isinstance(a, Op)]


Arg = Op | Lit


@dataclass(frozen=True, slots=True)
class Const:
    """A value known at import time; `name` is the initializer's (or an `Identity`'s) name when
    it is one, which is what a param made of it is called."""

    array: np.ndarray
    name: str | None = None


@dataclass(frozen=True, slots=True)
class Sym:
    """A 0-d or 1-d integer tensor of dims (`values`, one per entry; `scalar` for 0-d)."""

    values: tuple[Dim, ...]
    scalar: bool = False


@dataclass(frozen=True, slots=True)
class Seq:
    """An ONNX sequence (`SplitToSequence`, `SequenceConstruct`): its values, in order."""

    items: tuple[Op | Const | Sym, ...]


Value = Op | Const | Sym | Seq


def const_array(v: Value) -> np.ndarray | None:
    """The array of a value known at import time (a `Sym` of static dims too), else None."""
    if isinstance(v, Const):
        return v.array
    if isinstance(v, Sym) and all(isinstance(d, int) for d in v.values):
        a = np.array(v.values, dtype=np.int64)
        return a.reshape(()) if v.scalar else a
    return None


def describe(op: Op) -> str:
    """`conv2d` / `param layer1.0.conv1.weight`: how the importer's own errors name an op."""
    return f"{op.op} {op.path}" if op.path else op.op


def attr_items(attrs: dict[str, Any]) -> list[tuple[str, Any]]:
    """The attributes to write: those set (None means "not given")."""
    return [(k, v) for k, v in attrs.items() if v is not None]
