"""The numpy interpreter of the IR: the oracle every later stage is compared against.

Precision follows cuDNN: each op reads its operands in their dtype, computes in the `compute`
dtype, and rounds its result to the dtype it is stored in: the node's dtype for a materialised
value, the `intermediate` dtype for a value kept virtual inside a fused group (pass `virtual`),
except that a `cast` always rounds to the dtype it casts to (`graph.stored_dtype`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping
from fractions import Fraction
from typing import Any

import ml_dtypes
import numpy as np

from dslc.core import dims
from dslc.core.dims import DimEnv, Poly
from dslc.core.types import is_float
from dslc.ir.graph import CALIBRATED, IN_PLACE, Graph, Node, compute_dtype, stored_dtype

NUMPY_DTYPES: dict[str, Any] = {
    "f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16,
    "f8e4m3": ml_dtypes.float8_e4m3fn, "f8e5m2": ml_dtypes.float8_e5m2,
    "i8": np.int8, "u8": np.uint8, "i32": np.int32, "i64": np.int64, "bool": np.bool_,
}
ITEMSIZE = {name: int(np.dtype(dt).itemsize) for name, dt in NUMPY_DTYPES.items()}
# Math in bf16 or fp8 is emulated in f32 (numpy has no native arithmetic for them).
_MATH = {"f32": np.float32, "f16": np.float16, "bf16": np.float32, "i32": np.int32}


class InterpError(Exception):
    """The inputs do not fit the graph (missing, wrong shape, dims out of range)."""


class ViewError(AssertionError):
    """A planned view reads other memory than its steps mean: a bug in dslc's lowering."""


def bind_dims(graph: Graph, inputs: Mapping[str, np.ndarray], env: DimEnv | None = None,
              ) -> dict[str, int]:
    """Read each dynamic dim's value off the shapes of the inputs."""
    values: dict[str, int] = {}
    sizes: list[tuple[Any, int, str]] = []
    for node in graph.nodes:
        if node.op != "input":
            continue
        name = node.attrs["name"]
        if name not in inputs:
            raise InterpError(f"missing input `{name}`")
        actual = inputs[name].shape
        if len(actual) != node.type.rank:
            raise InterpError(f"input `{name}` has rank {len(actual)}, expected {node.type.rank}")
        sizes += [(want, int(got), name) for want, got in zip(node.type.shape, actual, strict=True)]
    # A size may name a dim that a later input binds (`b: [P + T]` before `a: [T]`): sizes are
    # read in rounds until every one is known or no round binds anything new.
    while sizes:
        left = [(w, g, n) for w, g, n in sizes if not _readable(w, values)]
        for want, got, name in [t for t in sizes if _readable(t[0], values)]:
            _bind(want, got, values, name)
        if len(left) == len(sizes):
            for want, got, name in left:
                _bind(want, got, values, name)  # raises: cannot read it off the input
        sizes = left
    return values


def _readable(want: Any, values: Mapping[str, int]) -> bool:
    """At most one of its dims unknown: it can be checked, or solved for that dim."""
    return isinstance(want, int) or len([s for s in want.symbols() if s not in values]) <= 1


def _bind(want: Any, got: int, values: dict[str, int], name: str) -> None:
    if isinstance(want, int):
        if want != got:
            raise InterpError(f"input `{name}` has a size {got} where {want} is declared")
        return
    syms = want.symbols()
    unknown = [s for s in syms if s not in values]
    if len(unknown) == 1:
        # c * S + (terms of known dims) = got, with S appearing once and linearly
        s = unknown[0]
        mine = [(mono, c) for mono, c in want.terms if any(v == s for v, _ in mono)]
        if len(mine) == 1 and mine[0][0] == ((s, 1),):
            known = sum((Fraction(c) * math.prod(Fraction(values[v]) ** p for v, p in mono)
                         for mono, c in want.terms if mono != mine[0][0]), Fraction(0))
            value = (got - known) / Fraction(mine[0][1])
            if value.denominator != 1:
                raise InterpError(f"input `{name}` has a size {got}, which no `{s}` gives "
                                  f"for {dims.format_dim(want)}")
            values[s] = int(value)
            return
    if unknown:
        raise InterpError(f"cannot read {dims.format_dim(want)} off input `{name}`")
    if dims.evaluate(want, values) != got:
        raise InterpError(f"input `{name}` has a size {got} where {dims.format_dim(want)} is "
                          f"{dims.evaluate(want, values)}")


def concrete(value: Any, values: Mapping[str, int], env: DimEnv | None = None) -> Any:
    if isinstance(value, Poly):
        return dims.evaluate(value, dict(values), env)
    if isinstance(value, tuple):
        return tuple(concrete(v, values, env) for v in value)
    return value


def concrete_attrs(node: Node, values: Mapping[str, int], env: DimEnv | None = None,
                   ) -> dict[str, Any]:
    return {k: concrete(v, values, env) for k, v in node.attrs.items()}


def apply_view(x: np.ndarray, steps: tuple[Any, ...]) -> np.ndarray:
    """The logical meaning of a `view` node: its chain of transpose / reshape / slice steps."""
    for step in steps:
        kind = step[0]
        if kind == "transpose":
            x = x.transpose(step[1])
        elif kind == "reshape":
            x = x.reshape(step[1])
        elif kind == "slice":
            x = x[tuple(slice(s, e) for s, e in zip(step[1], step[2], strict=True))]
        else:
            raise ValueError(f"unknown view step {kind}")
    return x


def strided_view(base: np.ndarray, order: tuple[int, ...], shape: tuple[int, ...],
                 strides: tuple[int, ...], offset: int, name: str) -> np.ndarray:
    """What a view reads in memory: the base's elements laid out in its memory `order`
    (outermost axis first), read at `offset` with element `strides`, as cuDNN reads them."""
    memory = np.ascontiguousarray(base.transpose(order)).reshape(-1)
    if any(d < 0 for d in shape) or any(s < 0 for s in strides) or offset < 0:
        raise ViewError(f"view `{name}`: negative size, stride or offset")
    last = offset + sum((d - 1) * s for d, s in zip(shape, strides, strict=True))
    if 0 in shape:
        last = offset - 1
    if last >= memory.size:
        raise ViewError(f"view `{name}` reads element {last} of a base of {memory.size}")
    item = memory.itemsize
    out = np.lib.stride_tricks.as_strided(memory[offset:] if memory.size else memory, shape,
                                          tuple(s * item for s in strides), writeable=False)
    return np.array(out)


def planned_view(node: Node, base: Node, x: np.ndarray, attrs: Mapping[str, Any],
                 shape: tuple[int, ...], check: bool = False) -> np.ndarray:
    """A lowered view: read through its planned strides when its base has a memory layout
    (and, with `check`, compared with the meaning of its steps); else its logical steps."""
    steps = attrs["steps"]
    if "strides" not in attrs or base.type.layout is None:
        return apply_view(x, steps)
    out = strided_view(x, base.type.layout.order, shape, tuple(int(s) for s in attrs["strides"]),
                       int(attrs["offset"]), node.name)
    if check:
        logical = np.ascontiguousarray(apply_view(x, steps))
        if logical.shape != out.shape or logical.tobytes() != out.tobytes():
            raise ViewError(f"view `{node.name}`: strides {list(attrs['strides'])} at offset "
                            f"{attrs['offset']} over `{base.name}` do not read {list(steps)}")
    return out


def evaluate_node(node: Node, operands: list[np.ndarray], attrs: Mapping[str, Any],
                  storage: str) -> np.ndarray:
    """One op: operands to the compute dtype, the numpy reference, the result to `storage`."""
    if node.op == "view":
        return apply_view(operands[0], attrs["steps"])
    math = _MATH.get(compute_dtype(node), np.float32)
    # Integers are widened (i8 x i8 accumulates in i32 on the GPU; int64 here is exact).
    xs = [x.astype(math, copy=False) if is_float(_dtype_name(x)) else
          x.astype(np.int64, copy=False) if np.issubdtype(x.dtype, np.integer) else x
          for x in operands]
    from dslc.ops import OPS  # here: the runtime imports this module, and rarely needs it

    reference = OPS[node.op].reference
    assert reference is not None, node.op
    with np.errstate(all="ignore"):
        out = np.asarray(reference(xs, attrs))
        if storage == "f8e4m3":  # e4m3 has no infinity: conversions saturate, as cuDNN's do
            out = np.clip(out, -448.0, 448.0)
        return out.astype(NUMPY_DTYPES[storage], copy=False)


def _amax(tensor: str, results: Mapping[str, np.ndarray], amax: Mapping[str, float] | None,
          observe: dict[str, float] | None) -> float:
    if observe is not None:
        if tensor not in results:
            raise InterpError(f"the amax of `{tensor}` is read before `{tensor}` is computed")
        x = np.abs(results[tensor].astype(np.float32))
        seen = float(np.max(x, initial=0.0, where=np.isfinite(x)))  # what a scale can cover
        observe[tensor] = max(observe.get(tensor, 0.0), seen)
        return seen
    if amax is None or tensor not in amax:
        raise InterpError(f"no calibrated amax for `{tensor}`, which is quantised to fp8 "
                          "(calibrate the bundle: `dslc calibrate`)")
    return float(amax[tensor])


def _dtype_name(x: np.ndarray) -> str:
    for name, dt in NUMPY_DTYPES.items():
        if x.dtype == np.dtype(dt):
            return name
    return "f32" if np.issubdtype(x.dtype, np.floating) else "i64"


def run(graph: Graph, inputs: Mapping[str, np.ndarray], weights: Mapping[str, np.ndarray],
        env: DimEnv | None = None, virtual: Collection[str] = (),
        keep: Callable[[Node], bool] | None = None, check_views: bool = False,
        amax: Mapping[str, float] | None = None, observe: dict[str, float] | None = None,
        ) -> dict[str, np.ndarray]:
    """Execute `graph`; returns the outputs by name (and every value `keep` selects, by node
    name). Values in `virtual` are rounded to their `intermediate` dtype. A lowered view reads
    its base's memory through its planned strides; `check_views` also applies its logical
    steps and raises ViewError where the two differ.

    fp8: each quantised tensor's calibrated amax is read from `amax` (by tensor name). With
    `observe`, a calibration run: each is the tensor's own amax in this run (computed before
    anything reads its quantisation), and `observe` keeps the largest seen per tensor."""
    values = bind_dims(graph, inputs, env)
    results: dict[str, np.ndarray] = {}
    kept: dict[str, np.ndarray] = {}
    users = graph.users()
    remaining = {name: len(us) for name, us in users.items()}
    outputs = {v for _, v in graph.outputs}
    nodes = graph.by_name()
    for node in graph.nodes:
        attrs = concrete_attrs(node, values, env)
        if node.op == "input":
            out = np.asarray(inputs[attrs["name"]]).astype(NUMPY_DTYPES[node.type.dtype])
        elif node.op == "param":
            path = attrs["path"]
            if path not in weights:
                raise InterpError(f"missing weight `{path}`")
            out = np.asarray(weights[path]).astype(NUMPY_DTYPES[node.type.dtype])
        elif node.op == "scalar":
            out = np.asarray(attrs["value"], dtype=NUMPY_DTYPES[node.type.dtype])
        elif node.op == CALIBRATED:
            out = np.asarray(_amax(attrs["tensor"], results, amax, observe), dtype=np.float32)
        elif node.op == "view":
            shape = tuple(int(d) for d in concrete(node.type.shape, values, env))
            out = planned_view(node, nodes[node.inputs[0]], results[node.inputs[0]], attrs, shape,
                               check_views)
        else:
            storage = stored_dtype(node, node.name in virtual)
            out = evaluate_node(node, [results[i] for i in node.inputs], attrs, storage)
        results[node.name] = out
        if keep is not None and keep(node):
            kept[node.name] = out
        for i in node.inputs:  # free what no later node reads
            remaining[i] -= 1
            if remaining[i] == 0 and i not in outputs:
                del results[i]
    kept.update({name: results[value] for name, value in graph.outputs})
    return kept


def run_in_place(graph: Graph, inputs: Mapping[str, np.ndarray],
                 weights: Mapping[str, np.ndarray], env: DimEnv | None = None,
                 ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """`run`, and what the inputs written in place (`cache_write`) hold afterwards, by input
    name: the reference of a decode step, whose caches the runtime updates in the caller's
    buffers while the interpreter stays pure."""
    nodes = graph.by_name()
    writes = {n.name: nodes[n.inputs[0]].attrs["name"] for n in graph.nodes
              if n.op in IN_PLACE and nodes[n.inputs[0]].op == "input"}
    kept = run(graph, inputs, weights, env, keep=lambda n: n.name in writes)
    outputs = {name: kept[name] for name, _ in graph.outputs}
    return outputs, {writes[n]: kept[n] for n in writes}
