"""Values known at import time: a node whose inputs are all constants is computed by ONNX's own
reference implementation (`onnx.reference`, at the model's opset), and shape arithmetic over
symbolic dims (`Shape`, `Gather`, `Concat`, `Unsqueeze`, `+ - * /` on sizes) is done on dims,
so that a `Reshape` computed from `Shape(x)` gets a `.cgraph` shape such as `[B, S, 12, 64]`."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import onnx
from onnx import helper
from onnx.reference import ReferenceEvaluator

from dslc.core import dims
from dslc.core.dims import Dim, DimEnv
from dslc.importer.graph import Const, Sym, Value, const_array


class NotFoldable(Exception):
    """A computation on sizes the importer cannot carry out on dims."""


def evaluate(node: onnx.NodeProto, inputs: Sequence[np.ndarray | None], opset: int,
             domains: dict[str, int]) -> list[np.ndarray]:
    """The outputs of `node` on constant inputs (None: an optional input left out)."""
    names = [f"in{i}" if a is not None else "" for i, a in enumerate(inputs)]
    one = helper.make_node(node.op_type, names, [f"out{i}" for i in range(len(node.output))],
                           domain=node.domain)
    one.attribute.extend(node.attribute)
    graph = helper.make_graph(
        [one], "fold", [helper.make_tensor_value_info(n, onnx.TensorProto.UNDEFINED, None)
                        for n in names if n],
        [helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None) for o in one.output])
    opsets = [helper.make_opsetid(d, v) for d, v in domains.items()]
    if not any(o.domain in ("", "ai.onnx") for o in opsets):
        opsets.append(helper.make_opsetid("", opset))
    model = helper.make_model(graph, opset_imports=opsets)
    feeds = {n: a for n, a in zip(names, inputs, strict=True) if n}
    outs = ReferenceEvaluator(model).run(None, feeds)
    return [np.asarray(o) for o in outs]


# ---- shape arithmetic on dims -----------------------------------------------------------------


def as_sym(v: Value) -> Sym | None:
    """`v` as a tensor of dims: a `Sym`, or an integer constant of rank 0 or 1."""
    if isinstance(v, Sym):
        return v
    if isinstance(v, Const) and v.array.dtype.kind in "iub" and v.array.ndim <= 1:
        return Sym(tuple(int(x) for x in v.array.ravel()), v.array.ndim == 0)
    return None


def sym_result(values: Sequence[Dim], scalar: bool = False) -> Value:
    """A tensor of dims, as a constant when every dim is static."""
    out = Sym(tuple(values), scalar)
    array = const_array(out)
    return Const(array) if array is not None else out


def _index(i: int, n: int) -> int:
    return i + n if i < 0 else i


def _clamp(i: int, n: int) -> int:
    return max(0, min(_index(i, n), n))


def sym_slice(values: tuple[Dim, ...], start: int, end: int) -> tuple[Dim, ...]:
    n = len(values)
    return values[_clamp(start, n):_clamp(end, n)]


def _binary(op: Callable[[Dim, Dim], Dim], a: Sym, b: Sym) -> Value:
    if len(a.values) != len(b.values) and 1 not in (len(a.values), len(b.values)):
        raise NotFoldable("sizes of different lengths")
    n = max(len(a.values), len(b.values))
    xs = a.values * n if len(a.values) == 1 else a.values
    ys = b.values * n if len(b.values) == 1 else b.values
    return sym_result([op(x, y) for x, y in zip(xs, ys, strict=True)], a.scalar and b.scalar)


def _divide(env: DimEnv) -> Callable[[Dim, Dim], Dim]:
    def divide(a: Dim, b: Dim) -> Dim:
        if isinstance(a, int) and isinstance(b, int):
            return int(np.trunc(a / b))  # ONNX divides integers as C does
        q = dims.div_exact(a, b, env)
        if q is None:
            if isinstance(b, int) and b > 0:
                return dims.floordiv(a, b, env)  # sizes are never negative: floor is trunc
            raise NotFoldable(f"{dims.format_dim(a)} / {dims.format_dim(b)}")
        return q
    return divide


def shape_arithmetic(op_type: str, xs: list[Value | None], attrs: dict[str, object],
                     env: DimEnv) -> Value:
    """The result of a node on sizes (`xs` as tensors of dims), or NotFoldable."""
    syms = [as_sym(x) if x is not None else None for x in xs]
    first = syms[0] if syms else None
    if first is None:
        raise NotFoldable(op_type)
    if op_type in ("Cast", "Identity", "CastLike"):
        return sym_result(first.values, first.scalar)
    if op_type in ("Add", "Sub", "Mul", "Div") and len(syms) == 2 and syms[1] is not None:
        fn = {"Add": dims.add, "Sub": dims.sub, "Mul": dims.mul, "Div": _divide(env)}[op_type]
        return _binary(fn, first, syms[1])
    if op_type == "Concat":
        out: list[Dim] = []
        for s in syms:
            if s is None or s.scalar:
                raise NotFoldable("Concat of a scalar")
            out.extend(s.values)
        return sym_result(out)
    if op_type == "Unsqueeze":
        if not first.scalar:
            raise NotFoldable("Unsqueeze of a vector of sizes")
        return sym_result(first.values)
    if op_type == "Squeeze":
        if len(first.values) != 1:
            raise NotFoldable("Squeeze of a vector of sizes")
        return sym_result(first.values, True)
    if op_type == "Reshape":
        target = syms[1]
        if target is None:
            raise NotFoldable("Reshape")
        if list(target.values) in ([], [1], [-1]) and len(first.values) == 1:
            return sym_result(first.values, target.values == ())
        raise NotFoldable("Reshape of sizes")
    if op_type == "Gather":
        return _gather(first, syms[1], int(attrs.get("axis", 0)))  # type: ignore[call-overload]
    if op_type == "Slice":
        return _slice(first, syms[1:])
    raise NotFoldable(op_type)


def _gather(data: Sym, index: Sym | None, axis: int) -> Value:
    if index is None or axis != 0 or data.scalar:
        raise NotFoldable("Gather")
    n = len(data.values)
    picked = []
    for i in index.values:
        if not isinstance(i, int) or not -n <= i < n:
            raise NotFoldable("Gather at a symbolic index")
        picked.append(data.values[_index(i, n)])
    return sym_result(picked, index.scalar)


def _slice(data: Sym, rest: list[Sym | None]) -> Value:
    starts, ends = rest[0], rest[1] if len(rest) > 1 else None
    axes = rest[2] if len(rest) > 2 else None
    steps = rest[3] if len(rest) > 3 else None
    if starts is None or ends is None or data.scalar:
        raise NotFoldable("Slice")
    if axes is not None and list(axes.values) not in ([0], [-1]):
        raise NotFoldable("Slice")
    if steps is not None and list(steps.values) != [1]:
        raise NotFoldable("Slice with a step")
    (start,), (end,) = starts.values, ends.values
    if not isinstance(start, int) or not isinstance(end, int):
        raise NotFoldable("Slice at a symbolic index")
    return sym_result(sym_slice(data.values, start, end))
