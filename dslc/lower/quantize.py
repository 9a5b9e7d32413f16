"""fp8: the matmuls, convolutions and attentions chosen to compute in fp8 read their operands
quantised, and their results are descaled (LANGUAGE.md 3.4, DESIGN.md "fp8").

An operand computed from params alone (a weight) is quantised at load time, with a scale per
output channel (or one, `weight_scales="per_tensor"`) from its own largest magnitudes. Any other
operand (an activation) is quantised where it is computed, with one scale from its calibrated
amax: an `amax` source node, whose value `dslc calibrate` records in the bundle. A value `x`
quantised to e4m3 becomes

    %x.amax       = amax {tensor="x"}                     (the calibration's; load time)
    %x.fp8_scale  = 448 / max(%x.amax, tiny)              (load time)
    %x.f8e4m3     = cast(%x * %x.fp8_scale, f8e4m3)       (fused into x's producer's epilogue)

and a matmul of quantised operands is followed by one multiply by the product of the operands'
descales (amax / 448: a vector per output channel for a weight, scaled per channel), so the
epilogue the op had (bias, activation, residual) continues on the unscaled value. An attention
takes its three descales as operands instead (cuDNN's fp8 attention applies them).

Which ops: those the source asks for (`precision matmul=f8e4m3`, a `precision=` keyword);
`--fp8 auto` keeps a subset, dropping the other requests before lowering (`only`). (`--fp8 off`
acts earlier: the checker applies no request.)
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace
from typing import Any

from dslc.core.types import FP8, FP8_MAX, WEIGHT_SCALES, Layout, PrecisionSpec, TensorType
from dslc.ir.graph import CALIBRATED, Attrs, Graph, Node
from dslc.lower.canonical import load_time
from dslc.lower.rewrite import Rewriter, rewrite

F32 = PrecisionSpec("f32", "f32", "f32")  # scales are computed in f32, at load time
TINY = 2.0 ** -24  # the smallest amax a scale is made from: an all-zero tensor stays zero
VIEW_OPS = ("reshape", "transpose", "slice")  # an activation read through these: its base
FP8_ATTRS = ("precision", "weight_scales")


def requested(graph: Graph) -> dict[str, str]:
    """The ops the source asks to compute in fp8, with the fp8 dtype of each."""
    return {n.name: str(n.attrs["precision"]) for n in graph.nodes
            if n.attrs.get("precision") in FP8}


def only(graph: Graph, chosen: Collection[str]) -> Graph:
    """The graph with the fp8 requests of the ops outside `chosen` dropped (`--fp8 auto`
    lowers a model with a subset of them)."""
    return replace(graph, nodes=tuple(_unrequested(n) if n.attrs.get("precision") in FP8 and
                                      n.name not in chosen else n for n in graph.nodes))


def _unrequested(node: Node) -> Node:
    """The node without its fp8 request: computed as it was written."""
    return Node(node.name, node.op, node.inputs,
                Attrs({k: v for k, v in node.attrs.items() if k not in FP8_ATTRS}),
                node.type, node.span, node.path, node.precision)


def quantize(graph: Graph) -> Graph:
    """The graph with the ops the source asks to compute in fp8 computing from quantised
    operands (`--fp8 auto` drops the requests it does not keep beforehand: `only`)."""
    chosen = requested(graph)
    constants = load_time(graph)

    def rule(rw: Rewriter, node: Node) -> str | None:
        if node.name in chosen:
            return _quantized(rw, node, chosen[node.name], constants)
        return None

    return rewrite(graph, rule)


# -- the rewrite ----------------------------------------------------------------------------------

def _quantized(rw: Rewriter, node: Node, dtype: str, constants: Collection[str]) -> str:
    attrs = {**dict(node.attrs), "precision": dtype}
    attrs.setdefault("weight_scales", WEIGHT_SCALES[0])
    per_channel = attrs["weight_scales"] == "per_channel"
    if node.op == "sdpa":
        return _attention(rw, node, dtype, attrs)
    descales = []
    inputs = []
    for index, name in enumerate(node.inputs):
        if name in constants:
            q, d = _weight(rw, node, name, index, dtype, per_channel)
        else:
            q, d = _activation(rw, node, name, dtype)
        inputs.append(q)
        descales.append(d)
    result = TensorType("f32", node.type.shape, node.type.layout)
    anchor = rw.new(node.op, tuple(inputs), attrs, result, node, node.name)
    return _descaled(rw, node, anchor, _product(rw, node, descales))


def _attention(rw: Rewriter, node: Node, dtype: str, attrs: dict[str, Any]) -> str:
    """q, k and v quantised (per tensor), their descales given to the attention."""
    operands = tuple(attrs.get("operands") or ("q", "k", "v"))
    named = dict(zip(operands, node.inputs, strict=True))
    quantised, descales = [], []
    for key in ("q", "k", "v"):
        q, d = _activation(rw, node, named[key], dtype)
        quantised.append(q)
        descales.append(d)
    attrs["operands"] = ("q", "k", "v", "descale_q", "descale_k", "descale_v")
    attrs.pop("weight_scales", None)  # attention has no weights
    return rw.new("sdpa", (*quantised, *descales), attrs, node.type, node, node.name)


def _activation(rw: Rewriter, node: Node, name: str, dtype: str) -> tuple[str, str]:
    """An activation quantised per tensor with its calibrated amax, made once for all its fp8
    readers; read through reshapes, transposes and slices, the value they view is quantised
    (its producer then writes fp8; one scale covers all of it: GPT's packed q, k and v) and
    the views are taken of the result."""
    chain: list[Node] = []
    base = rw.node(name)
    while base.op in VIEW_OPS:
        chain.append(base)
        base = rw.node(base.inputs[0])
    key = f"fp8:{base.name}:{dtype}"
    if key not in rw.memo:
        amax = rw.emit(Node(f"{base.name}.amax", CALIBRATED, (), Attrs({"tensor": base.name}),
                            TensorType("f32", (), Layout(())), base.span, base.path, F32))
        scale, descale = _scales(rw, node, amax, dtype)
        rw.memo[key] = _cast(rw, node, base.name, scale, dtype)
        rw.memo[key + ":descale"] = descale
    value = rw.memo[key]
    for view in reversed(chain):  # the same steps, now of the fp8 tensor
        value = rw.new(view.op, (value,), dict(view.attrs),
                       TensorType(dtype, view.type.shape), view, f"{view.name}.{dtype}")
    return value, rw.memo[key + ":descale"]


def _weight(rw: Rewriter, node: Node, name: str, index: int, dtype: str,
            per_channel: bool) -> tuple[str, str]:
    """A weight quantised at load time, scaled per output channel (or per tensor) from its own
    largest magnitudes."""
    t = rw.node(name).type
    axes = _reduced_axes(node.op, index, t.rank) if per_channel else tuple(range(t.rank))
    keep = per_channel and not (node.op == "matmul" and index == 1 and t.rank == 2)
    shape = tuple(1 if a in axes else d for a, d in enumerate(t.shape)) if keep else \
        tuple(d for a, d in enumerate(t.shape) if a not in axes)
    amax = rw.new("reduce_amax", (name,), {"axes": axes, "keepdims": keep},
                  TensorType("f32", shape), node, f"{name}.amax", F32)
    scale, descale = _scales(rw, node, amax, dtype)
    return _cast(rw, node, name, scale, dtype, F32), descale


def _reduced_axes(op: str, index: int, rank: int) -> tuple[int, ...]:
    """The axes a per-channel amax of a weight runs over: all but its output channel (a conv's
    axis 0; a matmul's N for its right operand, M for its left one) and a matmul's batch."""
    if op == "conv":
        return tuple(range(1, rank))
    return (rank - 2,) if index == 1 else (rank - 1,)


def _scales(rw: Rewriter, node: Node, amax: str, dtype: str) -> tuple[str, str]:
    """scale = FP8_MAX / max(amax, TINY) (multiplies the value into fp8's range) and its inverse,
    the descale, computed once at load time."""
    t = rw.node(amax).type
    top = FP8_MAX[dtype]
    tiny = _scalar(rw, node, TINY, f"{amax}.tiny")
    floor = rw.new("max", (amax, tiny), {}, t, node, f"{amax}.floor", F32)
    most = _scalar(rw, node, top, f"{amax}.fp8_max")
    stem = amax.removesuffix(".amax")
    scale = rw.new("div", (most, floor), {}, t, node, f"{stem}.fp8_scale", F32)
    descale = rw.new("div", (floor, most), {}, t, node, f"{stem}.fp8_descale", F32)
    return scale, descale


def _scalar(rw: Rewriter, node: Node, value: float, name: str) -> str:
    return rw.new("scalar", (), {"value": value}, TensorType("f32", ()), node, name, F32)


def _cast(rw: Rewriter, node: Node, name: str, scale: str, dtype: str,
          precision: PrecisionSpec | None = None) -> str:
    """cast(x * scale, dtype): the multiply in f32, then the rounding. e4m3 saturates, said
    in the IR (`min(max(x * scale, -448), 448)`): cuDNN's cast to e4m3 on the H200 wrote NaN
    for a value past 448 (a layer norm's output beyond its calibrated amax, the GPT blocks'
    NaN of 2026-12-03), where the reference, the fallback kernels and PyTorch saturate."""
    t = rw.node(name).type
    like = rw.node(name) if precision is None else node
    f32 = TensorType("f32", t.shape)
    value = rw.new("mul", (name, scale), {}, f32, like, f"{name}.scaled", precision)
    if dtype == "f8e4m3":
        top = FP8_MAX[dtype]
        low = _scalar(rw, node, -top, f"{name}.fp8_low")
        high = _scalar(rw, node, top, f"{name}.fp8_high")
        value = rw.new("max", (value, low), {}, f32, like, f"{name}.floored", precision)
        value = rw.new("min", (value, high), {}, f32, like, f"{name}.saturated", precision)
    return rw.new("cast", (value,), {"dtype": dtype}, TensorType(dtype, t.shape), like,
                  f"{name}.{dtype}", precision)


def _product(rw: Rewriter, node: Node, descales: list[str]) -> str:
    """The product of the operands' descales (one load-time value)."""
    out = descales[0]
    for d in descales[1:]:
        a, b = rw.node(out).type, rw.node(d).type
        shape = _broadcast(a.shape, b.shape)
        out = rw.new("mul", (out, d), {}, TensorType("f32", shape), node,
                     f"{node.name}.fp8_descale", F32)
    return out


def _broadcast(a: tuple[Any, ...], b: tuple[Any, ...]) -> tuple[Any, ...]:
    rank = max(len(a), len(b))
    a = (1,) * (rank - len(a)) + a
    b = (1,) * (rank - len(b)) + b
    return tuple(y if x == 1 else x for x, y in zip(a, b, strict=True))


def _descaled(rw: Rewriter, node: Node, anchor: str, descale: str) -> str:
    """The anchor's result times the descale, as the value the op had (its dtype, its layout):
    per output channel as the `scale_mul` conv and matmul epilogues take, else a multiply."""
    d = rw.node(descale).type
    rank = node.type.rank
    real = [a for a, n in enumerate(d.shape) if n != 1]
    if node.op == "conv" and d.rank == rank and real == [0]:  # a conv weight's [K, 1, 1, 1]
        vec = rw.new("reshape", (descale,), {"shape": (d.shape[0],)},
                     TensorType("f32", (d.shape[0],)), node, f"{descale}.vector", F32)
        return rw.new("scale_mul", (anchor, vec), {"axis": 1}, node.type, node,
                      f"{node.name}.descaled")
    if d.rank == 1 and node.op == "matmul":  # a weight's [N]: along the last axis
        return rw.new("scale_mul", (anchor, descale), {"axis": rank - 1}, node.type, node,
                      f"{node.name}.descaled")
    return rw.new("mul", (anchor, descale), {}, node.type, node, f"{node.name}.descaled")


__all__ = ["quantize", "requested"]
