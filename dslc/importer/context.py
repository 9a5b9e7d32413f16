"""What an ONNX op's translation works with: the node (its attributes and its inputs, resolved
to importer values) and the `Context` that makes `.cgraph` operations, turns constants into
params or numbers, and reads the sizes, axes and pads an op is given as tensors."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import helper

from dslc.core.dims import Dim, DimEnv
from dslc.core.types import FLOATS
from dslc.importer.fold import as_sym
from dslc.importer.graph import Arg, Const, Lit, Op, Origin, Seq, Value, const_array
from dslc.importer.shapes import Shape, dim_text
from dslc.ir.interp import NUMPY_DTYPES

# A state-dict key as PyTorch writes it (`layer1.0.conv1.weight`); names an exporter made up
# (`val_12`, `onnx::Conv_193`, `/conv1/Constant_output_0`) are not kept as param names.
STATE_DICT_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*")
GENERATED_NAME = re.compile(r"_?(val|v|c|const|Constant|initializer|tensor)_?\d+(_\d+)?|\d+")


class Unsupported(Exception):
    """A node the language cannot express; `reason` says why (the diagnostic's label)."""

    def __init__(self, reason: str, help: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.help = help


def state_dict_name(name: str | None) -> bool:
    """Whether `name` reads as a PyTorch parameter's name, worth keeping as the param's path."""
    return (name is not None and STATE_DICT_NAME.fullmatch(name) is not None
            and GENERATED_NAME.fullmatch(name.rsplit(".", 1)[-1]) is None)


def dtype_of(array: np.ndarray) -> str:
    for name, dt in NUMPY_DTYPES.items():
        if array.dtype == np.dtype(dt):
            return name
    raise Unsupported(f"a constant of type {array.dtype}, which the language has no dtype for")


@dataclass
class Node:
    """An ONNX node, its inputs resolved (None for an optional input left out)."""

    proto: onnx.NodeProto
    inputs: list[Value | None]
    origin: Origin
    opset: int

    @property
    def op_type(self) -> str:
        return self.proto.op_type

    def attr(self, name: str, default: Any = None) -> Any:
        for a in self.proto.attribute:
            if a.name == name:
                value = helper.get_attribute_value(a)
                return value.decode() if isinstance(value, bytes) else value
        return default

    def input(self, i: int) -> Value | None:
        return self.inputs[i] if i < len(self.inputs) else None

    def need(self, i: int) -> Value:
        v = self.input(i)
        if v is None:
            raise Unsupported(f"input {i + 1} is missing")
        return v


class Context:
    """Makes the operations of one model and keeps what they share: the dims' ranges (`env`),
    the opset, and one param per constant used as a tensor."""

    def __init__(self, env: DimEnv, opset: int) -> None:
        self.env = env
        self.opset = opset
        self.node: Node | None = None  # the node being translated
        self._params: dict[int, Op] = {}

    def writer_dim(self, d: Dim) -> str:
        """A dim as the written model spells it (for messages)."""
        return dim_text(d, self.env)

    def make(self, op: str, args: Sequence[Arg], attrs: dict[str, Any] | None = None,
             dtype: str | None = None, shape: Shape | None = None) -> Op:
        """An operation of the current node; dtype and shape default to the first operand's."""
        first = next((a for a in args if isinstance(a, Op)), None)
        if dtype is None or shape is None:
            assert first is not None, op
        node = self.node
        return Op(op, list(args), dict(attrs or {}), dtype or first.dtype,  # type: ignore[union-attr]
                  shape if shape is not None else first.shape,  # type: ignore[union-attr]
                  node.origin if node else None,
                  onnx_name=node.proto.output[0] if node and node.proto.output else None)

    def tensor(self, v: Value) -> Op:
        """`v` as a tensor operand: a constant becomes a param (one per constant)."""
        if isinstance(v, Op):
            return v
        if isinstance(v, Seq):
            raise Unsupported("a sequence used as a tensor")
        array = const_array(v)
        if array is None:
            raise Unsupported("a tensor of sizes that vary at run time, used as data",
                              "the language computes sizes at compile time only")
        key = id(v.array) if isinstance(v, Const) else id(v)
        if key not in self._params:
            name = v.name if isinstance(v, Const) and state_dict_name(v.name) else None
            self._params[key] = Op("param", [], {}, dtype_of(array), tuple(array.shape),
                                   self.node.origin if self.node else None,
                                   weights={"": array}, path=name,
                                   onnx_name=v.name if isinstance(v, Const) else None)
        return self._params[key]

    def operand(self, v: Value, like: Op | None = None) -> Arg:
        """`v` as an operand of a pointwise op next to `like`: a single number (that does not
        widen the result's rank) is written as a number, other constants are params."""
        array = const_array(v)
        floats = like is None or like.dtype in FLOATS  # a number is an f32 scalar (E0402)
        if array is not None and array.size == 1 and floats and \
                (like is None or array.ndim <= like.rank):
            value = array.reshape(()).item()
            if isinstance(value, float) and not math.isfinite(value):
                big = float(np.finfo(np.float32).max)
                value = big if value > 0 else -big  # the language's numbers are finite
            return Lit(float(value) if like is not None else value)
        return self.tensor(v)

    def ints(self, v: Value | None, what: str) -> list[int]:
        """A list of ints given as a constant tensor (axes, pads, repeats)."""
        array = const_array(v) if v is not None else None
        if array is None or array.dtype.kind not in "iu":
            raise Unsupported(f"{what} must be known when the model is imported")
        return [int(x) for x in array.ravel()]

    def sizes(self, v: Value | None, what: str) -> tuple[Dim, ...]:
        """A 1-D tensor of sizes (a `Reshape`'s or `Expand`'s shape), static or symbolic."""
        s = as_sym(v) if v is not None else None
        if s is None:
            raise Unsupported(f"{what} must be computed from sizes, not from data",
                              "the language computes sizes at compile time only")
        return s.values

    def scalar(self, v: Value | None, what: str, default: float | None = None) -> float | None:
        """A single number given as a constant tensor (Clip's bounds), or `default`."""
        if v is None:
            return default
        array = const_array(v)
        if array is None or array.size != 1:
            raise Unsupported(f"{what} must be a single constant number")
        return float(array.reshape(()))


def axis_of(axis: int, rank: int) -> int:
    """An ONNX axis (negative counts from the end) as an index."""
    if not -rank <= axis < rank:
        raise Unsupported(f"axis {axis} is outside a rank-{rank} tensor")
    return axis + rank if axis < 0 else axis


Handler = Callable[[Context, Node], list[Value | None]]
