"""An ONNX graph -> the imported graph (`translate`): each node in dependency order is computed at
import time when its inputs are known (constants, sizes), else made into `.cgraph` operations by
its op's handler. A node the language cannot express is an E0901 diagnostic naming it, its op
type and the model; every such node is reported, and what depends on it is left out silently."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import onnx

from dslc.core.dims import DimEnv, SymInfo, sym
from dslc.diag.diagnostic import Diagnostic, Sink
from dslc.diag.span import Span
from dslc.importer import ops_layout, ops_math, ops_nn
from dslc.importer.context import Context, Node, Unsupported, state_dict_name
from dslc.importer.fold import NotFoldable, as_sym, evaluate, shape_arithmetic
from dslc.importer.graph import Const, Op, Origin, Sym, Value, const_array
from dslc.importer.read import DEFAULT_DOMAINS, DTYPES, OnnxModel, TensorInfo, scope_of
from dslc.ir.interp import NUMPY_DTYPES

OPS = {**ops_math.OPS, **ops_nn.OPS, **ops_layout.OPS}
# Ops on sizes that are worked out on dims when an input is symbolic.
SIZE_OPS = frozenset({"Cast", "CastLike", "Identity", "Add", "Sub", "Mul", "Div", "Concat",
                      "Unsqueeze", "Squeeze", "Reshape", "Gather", "Slice"})
# Never computed at import time, even on constants: they draw random numbers.
RANDOM = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
                    "Multinomial", "Bernoulli"})


@dataclass
class Translated:
    """The model's inputs and outputs (by their `.cgraph` names) and its dims."""

    inputs: list[Op]
    outputs: list[tuple[str, Op]]
    env: DimEnv
    dims: dict[str, str]  # ONNX dim name -> `.cgraph` dim name


def translate(model: OnnxModel, dims: dict[str, str], static: dict[str, int],
              ranges: dict[str, tuple[int, int]], sink: Sink) -> Translated | None:
    """The imported graph of `model`; None once its errors are reported. `dims` names each
    symbolic ONNX dim in `.cgraph`, `static` gives those made static a size, `ranges` the
    others' ranges."""
    env = DimEnv()
    for name in dims.values():
        lo, hi = ranges[name]
        env.add(SymInfo(name, lo, hi))
    span = Span(model.source, 0, 0, 0, 0)
    values: dict[str, Value] = {}
    for name, array in model.initializers.items():
        values[name] = Const(array, name)
    inputs = [_input(info, dims, static) for info in model.inputs]
    for info, op in zip(model.inputs, inputs, strict=True):
        values[info.name] = op
    ctx = Context(env, model.opset or 0)
    failed: set[str] = set()
    for proto in ordered(model.graph.node, values.keys()):
        label = node_label(proto)
        origin = Origin(label, proto.op_type, scope_of(proto))
        if any(name in failed for name in proto.input if name):
            failed.update(proto.output)  # its cause is reported already
            continue
        try:
            outs = _node(ctx, model, proto, values, origin)
        except Unsupported as err:
            sink.report(_unsupported(model.source, span, proto, origin, err))
            failed.update(proto.output)
            continue
        for name, value in zip(proto.output, outs, strict=False):
            if name and value is not None:
                values[name] = value
    outputs = []
    for info in model.outputs:
        if info.name in failed:
            continue
        value = values.get(info.name)
        if value is None:
            sink.report(Diagnostic("E0902", f"the output `{info.name}` of `{model.source}` is "
                                   "not computed by any node", span))
            continue
        outputs.append((info.name, ctx.tensor(value)))
    for op in _stray_pads(op for _, op in outputs):
        sink.report(_unsupported(model.source, span, None, op.origin, Unsupported(
            "a padding that no convolution or pooling takes in",
            "the language pads only inside convolutions and pooling")))
    if sink.error_count:
        return None
    return Translated(inputs, outputs, env, dims)


def _input(info: TensorInfo, dims: dict[str, str], static: dict[str, int]) -> Op:
    assert info.dims is not None and info.elem_type in DTYPES  # checked by the caller
    shape = tuple(d if isinstance(d, int) else static[d] if d in static else sym(dims[d])
                  for d in info.dims if d is not None)
    return Op("input", [], {}, DTYPES[info.elem_type], shape, path=info.name,
              onnx_name=info.name)


def node_label(proto: onnx.NodeProto) -> str:
    """How diagnostics name a node: by its name, else by what it computes."""
    if proto.name:
        return proto.name
    return f"<{proto.output[0]}>" if proto.output else f"<{proto.op_type}>"


def ordered(nodes: Iterable[onnx.NodeProto], known: Iterable[str]) -> list[onnx.NodeProto]:
    """The nodes in dependency order (ONNX requires it, not every file has it); a node whose
    inputs nothing computes is kept where it is, and reported by its translation."""
    pending = list(nodes)
    have = set(known) | {""}
    out: list[onnx.NodeProto] = []
    while pending:
        ready = [n for n in pending if all(i in have for i in n.input)]
        if not ready:
            ready = pending[:1]
        chosen = {id(n) for n in ready}
        for n in ready:
            out.append(n)
            have.update(n.output)
        pending = [n for n in pending if id(n) not in chosen]
    return out


def _node(ctx: Context, model: OnnxModel, proto: onnx.NodeProto, values: dict[str, Value],
          origin: Origin) -> list[Value | None]:
    if proto.domain not in DEFAULT_DOMAINS:
        raise Unsupported(f"an operation of the domain `{proto.domain}`",
                          "only ONNX's own operations are imported")
    inputs: list[Value | None] = []
    for name in proto.input:
        if not name:
            inputs.append(None)
        elif name in values:
            inputs.append(values[name])
        else:
            raise Unsupported(f"it reads `{name}`, which no node or initializer computes here")
    node = Node(proto, inputs, origin, ctx.opset)
    ctx.node = node
    known = _at_import_time(ctx, model, node)
    if known is not None:
        return known
    handler = OPS.get(proto.op_type)
    if handler is None:
        raise Unsupported(f"`{proto.op_type}` has no counterpart in the language")
    return handler(ctx, node)


def _at_import_time(ctx: Context, model: OnnxModel, node: Node) -> list[Value | None] | None:
    """The node's outputs when they can be known without running the model, else None."""
    op_type, inputs = node.op_type, node.inputs
    present = [v for v in inputs if v is not None]
    if op_type == "Identity" and isinstance(inputs[0], Const):
        # TorchScript exports name a shared weight's second user by an Identity of it
        out_name = node.proto.output[0]
        keep = out_name if state_dict_name(out_name) else inputs[0].name
        return [Const(inputs[0].array, keep)]
    if op_type == "CastLike" and isinstance(inputs[0], Const) and isinstance(inputs[1], Op):
        # a constant made the type of a tensor (a zero bias of the input's type)
        return [Const(inputs[0].array.astype(NUMPY_DTYPES[inputs[1].dtype]))]
    if op_type == "Transpose" and isinstance(inputs[0], Const) and \
            state_dict_name(inputs[0].name):
        return None  # a named weight stays a param; the transpose is a view of it
    if op_type not in RANDOM and all(const_array(v) is not None for v in present):
        arrays = [const_array(v) if v is not None else None for v in inputs]
        try:
            outs = evaluate(node.proto, arrays, model.opset or 0, model.domains)
        except Exception:  # the reference has no kernel for it: translated as usual
            return None
        return [Const(a) for a in outs]
    if op_type in SIZE_OPS and any(isinstance(v, Sym) for v in present) and \
            all(as_sym(v) is not None for v in present):
        attrs = {"axis": node.attr("axis", 0)}
        try:
            return [shape_arithmetic(op_type, list(inputs), attrs, ctx.env)]
        except NotFoldable:
            return None
    return None


def _stray_pads(outputs: Iterable[Op]) -> list[Op]:
    """`Pad`s that the outputs read other than through a window op (which takes them into its
    padding): the language has nothing to write them with."""
    seen: set[int] = set()
    pads: list[Op] = []
    stack = list(outputs)
    while stack:
        op = stack.pop()
        if id(op) in seen:
            continue
        seen.add(id(op))
        if op.op == "pad":
            pads.append(op)
        stack.extend(op.operands())
    return pads


def _unsupported(source: str, span: Span, proto: onnx.NodeProto | None, origin: Origin | None,
                 err: Unsupported) -> Diagnostic:
    node = origin.node if origin else "?"
    op_type = origin.op_type if origin else "?"
    notes = []
    if origin is not None and origin.scope:
        notes.append(f"exported from the PyTorch module `{origin.scope}`")
    if proto is not None and proto.input:
        shown = ", ".join(f"`{i}`" for i in proto.input[:4] if i)
        notes.append(f"it reads {shown}" + (", ..." if len(proto.input) > 4 else ""))
    return Diagnostic("E0901", f"cannot import node `{node}` (`{op_type}`) of `{source}`",
                      span, err.reason, notes=(err.reason, *notes),
                      help=(err.help,) if err.help else ())
