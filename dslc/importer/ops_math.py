"""ONNX's elementwise, matrix and reduction ops as `.cgraph` operations."""

from __future__ import annotations

import numpy as np

from dslc.core import dims
from dslc.importer.context import (
    FLOATS,
    Context,
    Handler,
    Node,
    Unsupported,
    axis_of,
    state_dict_name,
)
from dslc.importer.graph import Arg, Const, Lit, Op, Value, const_array
from dslc.importer.read import DTYPES
from dslc.importer.shapes import ShapeError, broadcast

# ONNX op -> the language's op of the same meaning, one float operand.
UNARY = {
    "Relu": "relu", "Sigmoid": "sigmoid", "Tanh": "tanh", "Exp": "exp", "Log": "log",
    "Sqrt": "sqrt", "Reciprocal": "reciprocal", "Abs": "abs", "Neg": "neg", "Erf": "erf",
    "Sin": "sin", "Cos": "cos", "Floor": "floor", "Ceil": "ceil", "Softplus": "softplus",
    "HardSwish": "hardswish",
}
ARITHMETIC = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Pow": "pow",
              "Max": "max", "Min": "min"}
COMPARISONS = {"Equal": "cmp_eq", "Less": "cmp_lt", "LessOrEqual": "cmp_le",
               "Greater": "cmp_gt", "GreaterOrEqual": "cmp_ge"}
REDUCTIONS = {"ReduceMean": "reduce_mean", "ReduceSum": "reduce_sum", "ReduceMax": "reduce_max",
              "ReduceMin": "reduce_min", "ReduceProd": "reduce_prod", "ReduceL1": "reduce_l1",
              "ReduceL2": "reduce_l2", "ReduceSumSquare": "reduce_sum",
              "ReduceLogSumExp": "reduce_sum", "ReduceLogSum": "reduce_sum"}


def float_tensor(ctx: Context, v: Value, what: str = "") -> Op:
    x = ctx.tensor(v)
    if x.dtype not in FLOATS:
        raise Unsupported(f"{what or 'this op'} on {x.dtype} values",
                          "the language computes on f32, f16 and bf16 tensors")
    return x


def pointwise(ctx: Context, op: str, args: list[Arg], attrs: dict[str, object] | None = None,
              dtype: str | None = None) -> Op:
    """A pointwise op on broadcast operands (numbers broadcast everywhere)."""
    tensors = [a for a in args if isinstance(a, Op)]
    try:
        shape = broadcast(*(t.shape for t in tensors))
    except ShapeError as err:
        raise Unsupported(str(err)) from err
    return ctx.make(op, args, attrs, dtype or tensors[0].dtype, shape)


def _unary(op: str) -> Handler:
    def handler(ctx: Context, node: Node) -> list[Value | None]:
        return [pointwise(ctx, op, [float_tensor(ctx, node.need(0), node.op_type)])]
    return handler


def _operands(ctx: Context, node: Node, a: Value, b: Value) -> tuple[Arg, Arg]:
    """The two operands of a binary op: the tensor one first decides how numbers are written."""
    if isinstance(a, Op):
        x = ctx.tensor(a)
        return x, ctx.operand(b, x)
    y = ctx.tensor(b)
    return ctx.operand(a, y), y


def _arithmetic(op: str) -> Handler:
    def handler(ctx: Context, node: Node) -> list[Value | None]:
        values = [v for v in node.inputs if v is not None]
        if len(values) < 1 or (len(values) == 1 and op in ("sub", "div", "pow")):
            raise Unsupported("an operand is missing")
        out: Value = values[0]
        for v in values[1:]:
            a, b = _operands(ctx, node, out, v)
            tensor = a if isinstance(a, Op) else b
            assert isinstance(tensor, Op)
            if tensor.dtype not in FLOATS:
                raise Unsupported(f"`{node.op_type}` on {tensor.dtype} values at run time",
                                  "the language computes on floats: integers are indices")
            out = pointwise(ctx, op, [a, b])
        return [ctx.tensor(out)]
    return handler


def _comparison(op: str) -> Handler:
    def handler(ctx: Context, node: Node) -> list[Value | None]:
        a, b = _operands(ctx, node, node.need(0), node.need(1))
        return [pointwise(ctx, op, [a, b], dtype="bool")]
    return handler


def sum_mean(ctx: Context, node: Node) -> list[Value | None]:
    out = _arithmetic("add")(ctx, node)[0]
    assert isinstance(out, Op)
    n = len([v for v in node.inputs if v is not None])
    return [out if node.op_type == "Sum" or n == 1 else pointwise(ctx, "div", [out, Lit(float(n))])]


def where(ctx: Context, node: Node) -> list[Value | None]:
    cond = ctx.tensor(node.need(0))
    if cond.dtype != "bool":
        raise Unsupported("a condition that is not bool")
    a, b = node.need(1), node.need(2)
    like = a if isinstance(a, Op) else b if isinstance(b, Op) else None
    if like is None:
        x = ctx.tensor(a)
        return [pointwise(ctx, "select", [cond, x, ctx.operand(b, x)])]
    return [pointwise(ctx, "select", [cond, ctx.operand(a, like), ctx.operand(b, like)],
                      dtype=like.dtype)]


def clip(ctx: Context, node: Node) -> list[Value | None]:
    x = float_tensor(ctx, node.need(0), "Clip")
    lo = ctx.scalar(node.input(1), "Clip's minimum")
    hi = ctx.scalar(node.input(2), "Clip's maximum")
    if lo is None and hi is None:
        return [x]
    if lo == 0.0 and hi is None:
        return [pointwise(ctx, "relu", [x])]
    return [pointwise(ctx, "clamp", [x], {"lo": lo, "hi": hi})]


def elu(ctx: Context, node: Node) -> list[Value | None]:
    x = float_tensor(ctx, node.need(0), node.op_type)
    alpha = float(node.attr("alpha", 1.0 if node.op_type == "Elu" else 1.67326319217681884765625))
    y = pointwise(ctx, "elu", [x], {"alpha": alpha if alpha != 1.0 else None})
    if node.op_type == "Selu":  # selu = gamma * elu(x, alpha)
        y = pointwise(ctx, "mul", [y, Lit(float(node.attr("gamma", 1.05070102214813232421875)))])
    return [y]


def leaky_relu(ctx: Context, node: Node) -> list[Value | None]:
    x = float_tensor(ctx, node.need(0), "LeakyRelu")
    return [pointwise(ctx, "leaky_relu", [x], {"slope": float(node.attr("alpha", 0.01))})]


def hard_sigmoid(ctx: Context, node: Node) -> list[Value | None]:
    x = float_tensor(ctx, node.need(0), "HardSigmoid")
    alpha, beta = float(node.attr("alpha", 0.2)), float(node.attr("beta", 0.5))
    if np.float32(alpha) == np.float32(1 / 6) and beta == 0.5:  # PyTorch's, the language's
        return [pointwise(ctx, "hardsigmoid", [x])]
    scaled = pointwise(ctx, "add", [pointwise(ctx, "mul", [x, Lit(alpha)]), Lit(beta)])
    return [pointwise(ctx, "clamp", [scaled], {"lo": 0.0, "hi": 1.0})]


def gelu(ctx: Context, node: Node) -> list[Value | None]:
    x = float_tensor(ctx, node.need(0), "Gelu")
    approximate = node.attr("approximate", "none")
    if approximate not in ("none", "tanh"):
        raise Unsupported(f"approximate=\"{approximate}\"")
    return [pointwise(ctx, "gelu" if approximate == "none" else "gelu_tanh", [x])]


def softsign(ctx: Context, node: Node) -> list[Value | None]:
    x = float_tensor(ctx, node.need(0), "Softsign")
    below = pointwise(ctx, "add", [pointwise(ctx, "abs", [x]), Lit(1.0)])
    return [pointwise(ctx, "div", [x, below])]


def mish(ctx: Context, node: Node) -> list[Value | None]:
    x = float_tensor(ctx, node.need(0), "Mish")
    return [pointwise(ctx, "mul", [x, pointwise(ctx, "tanh", [pointwise(ctx, "softplus", [x])])])]


def prelu(ctx: Context, node: Node) -> list[Value | None]:
    """relu(x) - slope * relu(-x): x where positive, slope * x elsewhere."""
    x = float_tensor(ctx, node.need(0), "PRelu")
    slope = ctx.operand(node.need(1), x)
    negative = pointwise(ctx, "relu", [pointwise(ctx, "neg", [x])])
    return [pointwise(ctx, "sub", [pointwise(ctx, "relu", [x]),
                                   pointwise(ctx, "mul", [slope, negative])])]


def cast(ctx: Context, node: Node) -> list[Value | None]:
    x = ctx.tensor(node.need(0))
    if node.op_type == "CastLike":
        dtype = ctx.tensor(node.need(1)).dtype
    else:
        to = int(node.attr("to"))
        if to not in DTYPES:
            raise Unsupported(f"a cast to an ONNX type the language does not have ({to})")
        dtype = DTYPES[to]
    return [x if dtype == x.dtype else ctx.make("cast", [x], {"dtype": dtype}, dtype=dtype)]


def matmul_of(ctx: Context, a: Op, b: Op) -> Op:
    """numpy's matmul: batch axes broadcast, a vector operand made a matrix and dropped again."""
    if a.dtype not in FLOATS or b.dtype not in FLOATS:
        raise Unsupported("a matrix product of integers")
    left = reshape_to(ctx, a, (1, a.shape[0])) if a.rank == 1 else a
    right = reshape_to(ctx, b, (b.shape[0], 1)) if b.rank == 1 else b
    if left.shape[-1] != right.shape[-2]:
        raise Unsupported("the inner sizes of the matrix product differ")
    try:
        batch = broadcast(left.shape[:-2], right.shape[:-2])
    except ShapeError as err:
        raise Unsupported(str(err)) from err
    out = ctx.make("matmul", [left, right], dtype=a.dtype,
                   shape=(*batch, left.shape[-2], right.shape[-1]))
    if a.rank == 1 or b.rank == 1:
        shape = out.shape[:-2] + ((out.shape[-1],) if a.rank == 1 else (out.shape[-2],))
        if a.rank == 1 and b.rank == 1:
            shape = ()
        out = reshape_to(ctx, out, shape)
    return out


def reshape_to(ctx: Context, x: Op, shape: tuple[dims.Dim, ...]) -> Op:
    """`x` in a new shape: a reshape of a reshape is one reshape of the first's input."""
    while x.op == "reshape":
        x = x.args[0]  # type: ignore[assignment]
    return x if x.shape == shape else ctx.make("reshape", [x], {"shape": list(shape)},
                                                 shape=tuple(shape))


def transpose_of(ctx: Context, x: Op, perm: list[int]) -> Op:
    """`x` with its axes permuted: a transpose of a transpose is one transpose."""
    if x.op == "transpose":
        perm = [x.attrs["perm"][p] for p in perm]
        x = x.args[0]  # type: ignore[assignment]
    if perm == list(range(x.rank)):
        return x
    return ctx.make("transpose", [x], {"perm": perm}, shape=tuple(x.shape[p] for p in perm))


def matmul(ctx: Context, node: Node) -> list[Value | None]:
    return [matmul_of(ctx, ctx.tensor(node.need(0)), ctx.tensor(node.need(1)))]


def gemm(ctx: Context, node: Node) -> list[Value | None]:
    """alpha * A' B' + beta * C, A' and B' transposed where asked."""
    a, b = ctx.tensor(node.need(0)), ctx.tensor(node.need(1))
    if node.attr("transA", 0):
        a = transpose_of(ctx, a, [1, 0])
    if node.attr("transB", 0):
        b = transpose_of(ctx, b, [1, 0])
    y = matmul_of(ctx, a, b)
    alpha, beta = float(node.attr("alpha", 1.0)), float(node.attr("beta", 1.0))
    if alpha != 1.0:
        y = pointwise(ctx, "mul", [y, Lit(alpha)])
    c = node.input(2)
    if c is not None and beta != 0.0:
        if zero_bias(c):
            return [y]
        term = ctx.operand(c, y)
        if beta != 1.0:
            term = Lit(term.value * beta) if isinstance(term, Lit) else \
                pointwise(ctx, "mul", [term, Lit(beta)])
        y = pointwise(ctx, "add", [y, term])
    return [y]


def zero_bias(b: Value) -> bool:
    """A bias of zeros that the exporter made up (none in the PyTorch module): left out. A
    named one is kept, zeros or not: it is a param of the model."""
    array = const_array(b)
    return array is not None and not array.any() and not \
        (isinstance(b, Const) and state_dict_name(b.name))


def reduce_axes(ctx: Context, node: Node, rank: int) -> list[int] | None:
    """The axes a reduction runs over (None: none, the op is the identity)."""
    from_input = node.opset >= 18 or node.op_type == "ReduceSum"
    given = node.input(1) if from_input else None
    axes = ctx.ints(given, "the axes") if given is not None else node.attr("axes")
    if not axes:
        return None if node.attr("noop_with_empty_axes", 0) else list(range(rank))
    return sorted({axis_of(int(a), rank) for a in axes})


def reduction(ctx: Context, node: Node) -> list[Value | None]:
    x = float_tensor(ctx, node.need(0), node.op_type)
    axes = reduce_axes(ctx, node, x.rank)
    if axes is None:
        return [x]
    keep = bool(node.attr("keepdims", 1))
    shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape) if keep or i not in axes)
    kind = node.op_type
    if kind == "ReduceSumSquare":
        x = pointwise(ctx, "mul", [x, x])
    elif kind == "ReduceLogSumExp":
        x = pointwise(ctx, "exp", [x])
    y = ctx.make(REDUCTIONS[kind], [x], {"axes": axes, "keepdims": True if keep else None},
                 shape=shape)
    if kind in ("ReduceLogSumExp", "ReduceLogSum"):
        y = pointwise(ctx, "log", [y])
    return [y]


def softmax(ctx: Context, node: Node) -> list[Value | None]:
    """The standard library's softmax (over the last axis), the axis moved there if need be."""
    x = float_tensor(ctx, node.need(0), node.op_type)
    axis = axis_of(int(node.attr("axis", -1)), x.rank)
    perm = list(range(x.rank))
    perm[axis], perm[-1] = perm[-1], perm[axis]
    y = ctx.make("softmax", [transpose_of(ctx, x, perm)])
    y = transpose_of(ctx, y, perm)
    return [pointwise(ctx, "log", [y]) if node.op_type == "LogSoftmax" else y]


OPS: dict[str, Handler] = {
    **{k: _unary(v) for k, v in UNARY.items()},
    **{k: _arithmetic(v) for k, v in ARITHMETIC.items()},
    **{k: _comparison(v) for k, v in COMPARISONS.items()},
    **dict.fromkeys(REDUCTIONS, reduction),
    "Sum": sum_mean, "Mean": sum_mean, "Where": where, "Clip": clip, "Elu": elu, "Selu": elu,
    "LeakyRelu": leaky_relu, "HardSigmoid": hard_sigmoid, "Gelu": gelu, "Softsign": softsign,
    "Mish": mish, "PRelu": prelu, "Cast": cast, "CastLike": cast, "MatMul": matmul,
    "Gemm": gemm, "Softmax": softmax, "LogSoftmax": softmax,
}
