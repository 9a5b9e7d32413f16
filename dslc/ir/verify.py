"""The IR verifier: names unique, inputs (and the tensor an amax observes) defined before use,
ops known with the right operand count, outputs defined, and every node's type what its op's
type rule gives for its inputs.

Run after every pass in the tests; returns the problems found (empty when the graph is sound).
"""

from __future__ import annotations

from typing import Any

from dslc.core.dims import DimEnv
from dslc.core.types import TensorType, format_shape, format_type
from dslc.ir.graph import CALIBRATED, Graph, Node, compute_dtype
from dslc.ir.graph import SOURCES as GRAPH_SOURCES
from dslc.ir.views import view_layout, view_shape
from dslc.ops import OPS
from dslc.ops.opdef import Args, Kind, SilentCtx

SOURCES = set(GRAPH_SOURCES)  # nodes without operands
IR_ONLY = {"view"}  # ops that exist only after lowering (no type rule in `dslc.ops`)


def verify(graph: Graph, env: DimEnv | None = None) -> list[str]:
    env = env or DimEnv()
    problems: list[str] = []
    types: dict[str, TensorType] = {}
    ops: dict[str, str] = {}
    for node in graph.nodes:
        where = f"%{node.name} ({node.op})"
        if node.name in types:
            problems.append(f"{where}: defined twice")
        for i in node.inputs:
            if i not in types:
                problems.append(f"{where}: uses %{i} before it is defined")
        if node.op in SOURCES:
            if node.inputs:
                problems.append(f"{where}: a {node.op} takes no operands")
            # The calibration observes the tensor it names: it must be a value computed earlier.
            if node.op == CALIBRATED and str(node.attrs.get("tensor")) not in types:
                problems.append(f"{where}: the amax of %{node.attrs.get('tensor')}, "
                                "which is not computed before it")
        elif node.op not in OPS and node.op not in IR_ONLY:
            problems.append(f"{where}: unknown op")
        elif node.op in OPS and all(i in types for i in node.inputs):
            problems.extend(f"{where}: {p}" for p in retype_problems(node, types, ops, env))
        elif node.op == "view" and len(node.inputs) == 1 and node.inputs[0] in types:
            shape = view_shape(types[node.inputs[0]].shape, tuple(node.attrs["steps"]))
            if shape != node.type.shape:
                problems.append(f"{where}: its steps give {format_shape(shape)}")
        types[node.name] = effective_type(node, types)
        ops[node.name] = node.op
    for name, value in graph.outputs:
        if value not in types:
            problems.append(f"output {name}: %{value} is not defined")
    return problems


def effective_type(node: Node, types: dict[str, TensorType]) -> TensorType:
    """A node's type as the ops reading it see it: a view has the memory order of its axes in
    its base (so a layout rule, e.g. a layernorm's innermost axes, holds for views too)."""
    if node.op != "view" or node.inputs[0] not in types:
        return node.type
    base = types[node.inputs[0]]
    if base.layout is None:
        return node.type
    layout = view_layout(base.layout, base.shape, tuple(node.attrs["steps"]))
    return TensorType(node.type.dtype, node.type.shape, layout)


def retype_problems(node: Node, types: dict[str, TensorType], ops: dict[str, str], env: DimEnv,
                    ) -> list[str]:
    """Re-run the op's type rule on the operand types; the result must have the node's shape."""
    op = OPS[node.op]
    operands = node.attrs.get("operands") or tuple(p.name for p in op.tensor_params
                                                  if p.kind is Kind.TENSOR)
    if len(operands) != len(node.inputs):
        return [f"{len(node.inputs)} operands, expected {len(operands)}"]
    values: dict[str, Any] = {p.name: node.attrs.get(p.name, p.default) for p in op.params
                              if not p.is_tensor}
    producers: dict[str, str] = {}
    for pname, value in zip(operands, node.inputs, strict=True):
        base = pname.split(".")[0]
        if "." in pname:
            values.setdefault(base, []).append(types[value])
        else:
            values[pname] = types[value]
            producers[pname] = ops[value]
    for p in op.params:
        if p.kind is Kind.OPT_TENSOR:
            values.setdefault(p.name, None)
    # The graph was checked already: only its shapes are compared (no cuDNN limits).
    ctx = SilentCtx(env, node.precision, producers, node.span, compute_dtype(node))
    result = op.infer(ctx, Args(values))
    if ctx.errors:
        return ctx.errors[:1]
    if isinstance(result, tuple):
        result = result[int(node.attrs.get("output", 0))]
    if result is None:
        return ["the type rule rejects its operands"]
    # Shapes must agree; a dtype may differ, since an ascription fixes the storage dtype.
    if result.shape != node.type.shape:
        return [f"type {format_type(node.type)}, but its op gives {format_type(result)}"]
    return []
