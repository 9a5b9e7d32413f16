"""The numpy interpreter of the IR: the oracle every later stage is compared against.

Precision follows cuDNN: each op reads its operands in their dtype, computes in the `compute`
dtype, and rounds its result to the dtype it is stored in: the node's dtype for a materialised
value, the `intermediate` dtype for a value kept virtual inside a fused group (pass `virtual`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any

import ml_dtypes
import numpy as np

from dslc.check import dims
from dslc.check.dims import DimEnv, Poly
from dslc.check.types import is_float
from dslc.ir.graph import Graph, Node

NUMPY_DTYPES: dict[str, Any] = {
    "f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16,
    "f8e4m3": ml_dtypes.float8_e4m3fn, "f8e5m2": ml_dtypes.float8_e5m2,
    "i8": np.int8, "u8": np.uint8, "i32": np.int32, "i64": np.int64, "bool": np.bool_,
}
# Math in bf16 or fp8 is emulated in f32 (numpy has no native arithmetic for them).
_MATH = {"f32": np.float32, "f16": np.float16, "bf16": np.float32, "i32": np.int32}


class InterpError(Exception):
    """The inputs do not fit the graph (missing, wrong shape, dims out of range)."""


def bind_dims(graph: Graph, inputs: Mapping[str, np.ndarray], env: DimEnv | None = None,
              ) -> dict[str, int]:
    """Read each dynamic dim's value off the shapes of the inputs."""
    values: dict[str, int] = {}
    for node in graph.nodes:
        if node.op != "input":
            continue
        name = node.attrs["name"]
        if name not in inputs:
            raise InterpError(f"missing input `{name}`")
        actual = inputs[name].shape
        if len(actual) != node.type.rank:
            raise InterpError(f"input `{name}` has rank {len(actual)}, expected {node.type.rank}")
        for want, got in zip(node.type.shape, actual, strict=True):
            _bind(want, int(got), values, name)
    return values


def _bind(want: Any, got: int, values: dict[str, int], name: str) -> None:
    if isinstance(want, int):
        if want != got:
            raise InterpError(f"input `{name}` has a size {got} where {want} is declared")
        return
    syms = want.symbols()
    unknown = [s for s in syms if s not in values]
    if len(unknown) == 1 and len(want.terms) <= 2:
        # c * S + k = got
        (mono, c), *rest = [t for t in want.terms if t[0] != ()] + [t for t in want.terms
                                                                   if t[0] == ()]
        k = rest[0][1] if rest else 0
        if mono == ((unknown[0], 1),):
            values[unknown[0]] = int((got - k) / c)
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


def evaluate_node(node: Node, operands: list[np.ndarray], attrs: Mapping[str, Any],
                  storage: str) -> np.ndarray:
    """One op: operands to the compute dtype, the numpy reference, the result to `storage`."""
    if node.op == "view":
        return apply_view(operands[0], attrs["steps"])
    compute = str(attrs.get("compute", node.precision.compute))
    math = _MATH.get(compute, np.float32)
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


def _dtype_name(x: np.ndarray) -> str:
    for name, dt in NUMPY_DTYPES.items():
        if x.dtype == np.dtype(dt):
            return name
    return "f32" if np.issubdtype(x.dtype, np.floating) else "i64"


def run(graph: Graph, inputs: Mapping[str, np.ndarray], weights: Mapping[str, np.ndarray],
        env: DimEnv | None = None, virtual: Collection[str] = (),
        keep: Callable[[Node], bool] | None = None) -> dict[str, np.ndarray]:
    """Execute `graph`; returns the outputs by name (and every value `keep` selects, by node
    name). Values in `virtual` are rounded to their `intermediate` dtype."""
    values = bind_dims(graph, inputs, env)
    results: dict[str, np.ndarray] = {}
    kept: dict[str, np.ndarray] = {}
    users = graph.users()
    remaining = {name: len(us) for name, us in users.items()}
    outputs = {v for _, v in graph.outputs}
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
            out = np.asarray(attrs["value"], dtype=np.float32)
        else:
            storage = node.type.dtype
            if node.name in virtual and is_float(storage):
                storage = node.precision.intermediate
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
