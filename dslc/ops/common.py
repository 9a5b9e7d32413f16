"""Checks shared by the type rules of several op families: broadcasting, dtype classes, compute
precision, per-axis attributes, axes lists and output sizes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dslc.core import dims
from dslc.core.dims import Dim
from dslc.core.types import BITS, FLOATS, FP8, TensorType, format_type, is_float, is_int
from dslc.diag.diagnostic import Label
from dslc.ops.opdef import InferCtx, LowerCtx


def fmt(t: TensorType) -> str:
    return format_type(t)


def broadcast(ctx: InferCtx, a: TensorType, b: TensorType, aname: str, bname: str,
              what: str) -> tuple[Dim, ...] | None:
    """Right-aligned broadcasting: each axis pair equal, or one side the literal 1 (a dynamic dim
    never broadcasts). Reports E0301 and returns None on a mismatch."""
    ra, rb = a.rank, b.rank
    out: list[Dim] = []
    for i in range(1, max(ra, rb) + 1):
        da = a.shape[ra - i] if i <= ra else 1
        db = b.shape[rb - i] if i <= rb else 1
        if da == db or db == 1:
            out.append(da)
        elif da == 1:
            out.append(db)
        else:
            axis = max(ra, rb) - i
            ctx.error(
                "E0301", f"the operands of `{what}` have incompatible shapes", at=aname,
                label=fmt(a), labels=(ctx.label(bname, fmt(b)),),
                notes=(f"axis {axis} differs: {dims.format_dim(da)} vs {dims.format_dim(db)}; "
                       "each axis must be equal or 1 to broadcast",),
            )
            return None
    return tuple(reversed(out))


def broadcast_all(ctx: InferCtx, named: list[tuple[str, TensorType]], what: str,
                  ) -> tuple[Dim, ...] | None:
    shape_t = named[0][1]
    name0 = named[0][0]
    for name, t in named[1:]:
        shape = broadcast(ctx, shape_t, t, name0, name, what)
        if shape is None:
            return None
        shape_t = TensorType(shape_t.dtype, shape)
    return shape_t.shape


def require_float(ctx: InferCtx, op: str, arg: str, t: TensorType) -> bool:
    """f32, f16 or bf16 (fp8 is taken only by conv, matmul and cast: LANGUAGE 3.4)."""
    if t.dtype in FP8:
        return no_fp8(ctx, op, arg, t)
    if is_float(t.dtype):
        return True
    ctx.error("E0401", f"`{op}` does not support {t.dtype} inputs", at=arg,
              label=f"{t.dtype} here",
              notes=(f"`{op}` takes floating-point tensors (f32, f16, bf16)",),
              help=(f"convert first: `cast({ctx.text(arg)}, f32)`",))
    return False


def no_fp8(ctx: InferCtx, op: str, arg: str, t: TensorType) -> bool:
    if t.dtype not in FP8:
        return True
    ctx.error("E0401", f"`{op}` does not take {t.dtype} inputs", at=arg, label=f"{t.dtype} here",
              notes=("fp8 tensors are taken only by `conv`, `matmul` and `cast`",),
              help=(f"widen it first: `cast({ctx.text(arg)}, f16)`",))
    return False


def no_bool_arithmetic(ctx: InferCtx, op: str, arg: str, t: TensorType) -> bool:
    """Masks are for `select` and comparisons: arithmetic on bools has no single meaning (numpy
    reads `+` as `or` and refuses `-`), so it is refused rather than given one silently."""
    if t.dtype != "bool":
        return True
    ctx.error("E0401", f"`{op}` does not take bool inputs", at=arg, label="bool here",
              notes=("a comparison's result is a mask, for `select`",),
              help=(f"for 0/1 values, cast it first: `cast({ctx.text(arg)}, f32)`",))
    return False


def require_same_dtype(ctx: InferCtx, op: str, a: str, ta: TensorType, b: str,
                       tb: TensorType) -> bool:
    if ta.dtype == tb.dtype:
        return True
    ctx.error("E0401", f"the operands of `{op}` have different dtypes", at=b,
              label=tb.dtype, labels=(ctx.label(a, ta.dtype),),
              help=(f"cast one of them: `cast({ctx.text(b)}, {ta.dtype})`",))
    return False


def refuse_fp8_mix(ctx: InferCtx, op: str, a: str, ta: TensorType, b: str,
                   tb: TensorType) -> bool:
    """One fp8 operand beside one of another dtype (`conv`, `matmul`), said once. Beside a
    wider float or i8, which these also take in pairs, the mix is the fault, not fp8: said at
    the fp8 operand, whose cast is the usual fix. Beside a dtype they never take (i32, bool),
    that operand is the fault. True when it was said."""
    for (n8, t8), (n, t) in (((a, ta), (b, tb)), ((b, tb), (a, ta))):
        if t8.dtype in FP8 and t.dtype not in FP8:
            if t.dtype in FLOATS or t.dtype == "i8":
                require_same_dtype(ctx, op, n, t, n8, t8)
            else:
                require_float(ctx, op, n, t)
            return True
    return False


def check_mixed_numeric(ctx: InferCtx, op: str, named: list[tuple[str, TensorType]]) -> bool:
    """Mixing float and integer (or bool) tensors needs an explicit cast (E0402)."""
    floats = [(n, t) for n, t in named if is_float(t.dtype)]
    others = [(n, t) for n, t in named if not is_float(t.dtype)]
    if floats and others:
        (fn, ft), (on, ot) = floats[0], others[0]
        if ctx.producer(fn) == "scalar":
            # A float number next to an integer tensor (`ids + 0.5`), or any number in an op
            # with no integer form (`ids / 2`), is an f32 scalar: say so, rather than call the
            # number a float tensor the user never wrote.
            article = "an" if ot.dtype.startswith("i") else "a"
            back = (f" (and back with `cast(..., {ot.dtype})` where integers are needed)"
                    if ot.dtype != "bool" else "")
            ctx.error("E0402", f"`{op}` mixes {article} {ot.dtype} tensor with the number "
                      f"`{ctx.text(fn)}`", at=on, label=f"{ot.dtype}",
                      labels=(ctx.label(fn, "a number: an f32 scalar"),),
                      notes=("an integer number beside integer tensors is one of theirs in "
                             "`+ - *`, `max`, `min` and comparisons; any other number is an f32 "
                             "scalar, and integer and bool tensors are never converted "
                             "implicitly",),
                      help=(f"compute in floats: `cast({ctx.text(on)}, f32)`{back}",))
            return False
        ctx.error("E0402", f"`{op}` mixes {ft.dtype} and {ot.dtype} operands", at=on,
                  label=f"{ot.dtype}", labels=(ctx.label(fn, ft.dtype),),
                  notes=("integer and float tensors are never converted implicitly",),
                  help=(f"convert explicitly: `cast({ctx.text(on)}, {ft.dtype})`",))
        return False
    return True


def result_dtype(ctx: InferCtx, types: list[TensorType]) -> str:
    """Equal dtypes keep theirs; mixed floats are stored in the `io` dtype in effect."""
    kinds = {t.dtype for t in types}
    if len(kinds) == 1:
        return types[0].dtype
    return ctx.precision.io


def check_compute(ctx: InferCtx, op: str, types: list[TensorType], need_f32: bool = False) -> bool:
    """E0403: compute narrower than the widest float input, or not f32 where the op needs it."""
    compute = ctx.compute
    widest = max((BITS[t.dtype] for t in types if is_float(t.dtype)), default=0)
    if is_int(compute) or compute == "bool":
        if any(is_float(t.dtype) for t in types):
            ctx.error("E0403", f"`{op}` cannot compute in {compute} on float inputs",
                      help=("use `compute=f32`",))
            return False
        return True
    origin = ctx.precision_origin("compute")
    labels = (Label(origin, f"compute={compute} set here"),) if origin is not None else ()
    if need_f32 and compute != "f32":
        ctx.error("E0403", f"`{op}` needs compute=f32, but compute is {compute} here",
                  label=f"computed in {compute}", labels=labels,
                  notes=(f"cuDNN runs `{op}` with f32 math",),
                  help=("set `precision compute=f32` in the model, or in the def that holds "
                        "this op",))
        return False
    if BITS.get(compute, 32) < widest:
        ctx.error("E0403", f"compute {compute} is narrower than the inputs of `{op}`",
                  label=f"inputs of {widest} bits", labels=labels,
                  help=("use `compute=f32`",))
        return False
    return True


def per_axis(ctx: InferCtx, op: str, arg: str, value: Any, n: int, minimum: int) -> tuple[int, ...] | None:
    """An int or a list of `n` ints, each at least `minimum` (E0305 otherwise)."""
    values = (value,) * n if isinstance(value, int) else tuple(value)
    if len(values) != n:
        ctx.error("E0305", f"`{arg}` of `{op}` needs {n} values, one per spatial axis", at=arg,
                  label=f"{len(values)} given")
        return None
    for v in values:
        if not isinstance(v, int) or v < minimum:
            ctx.error("E0305", f"`{arg}` of `{op}` must be at least {minimum}", at=arg,
                      label=f"{v} here")
            return None
    return values


def at_least_one(ctx: InferCtx, op: str, size: Dim, axis: int, arg: str) -> bool:
    """E0603 when an output size can be below 1 for an admissible input size."""
    lo, _ = dims.interval(size, ctx.env)
    if lo >= 1:
        return True
    if isinstance(size, int):
        text = f"is {size}"
    else:
        text = f"can be as small as {lo} ({dims.format_dim(size)})"  # a Fraction: 0, or -1/2
    ctx.error("E0603", f"the output of `{op}` has size below 1 on axis {axis}", at=arg,
              label=f"output size {text}",
              notes=("every output size must be at least 1 for every admissible input size",),
              help=(_GROW.get(op, "use a smaller kernel or stride, more padding, or raise the "
                                  "dim's lower bound"),))
    return False


# A transposed convolution grows its input: what makes its output larger is the opposite.
_GROW = {"conv_transpose": "use less padding, a larger kernel, stride or output_pad, or raise "
                           "the dim's lower bound"}


def norm_axes(ctx: InferCtx, op: str, arg: str, axes: Any, rank: int) -> tuple[int, ...] | None:
    """Axes as non-negative, unique, in-range ints (negative counts from the end); E0304."""
    values = (axes,) if isinstance(axes, int) else tuple(axes)
    out: list[int] = []
    for a in values:
        if not isinstance(a, int) or not -rank <= a < rank:
            ctx.error("E0304", f"axis {a} is out of range for a rank-{rank} tensor", at=arg,
                      label=f"valid axes are 0..{rank - 1} (or -{rank}..-1)")
            return None
        a = a % rank
        if a in out:
            ctx.error("E0304", f"axis {a} is given twice", at=arg, label="repeated axis")
            return None
        out.append(a)
    return tuple(out)


def lower_identity(ctx: LowerCtx, xs: list[Any], a: Mapping[str, Any]) -> Any:  # pragma: no mutate block
    """cuDNN's identity: a cast or a copy (the new dtype and strides are set on the result), or
    an `expand` (cuDNN broadcasts the operand over the size-1 axes it reads)."""
    return ctx.g.identity(input=xs[0])


# ---- fp8: the checks shared by the ops that compute from quantised operands ---------------------

def asked(ctx: InferCtx, dtype: str) -> tuple[Label, ...]:
    """Where the fp8 precision was asked for (the op's `precision=`, or a `precision` statement),
    as a secondary label of an E0404."""
    origin = ctx.precision_origin("precision")
    return (Label(origin, f"{dtype} asked for here"),) if origin is not None else ()


def fp8_operand(ctx: InferCtx, op: str, arg: str, t: TensorType, dtype: str,
                floats: tuple[str, ...] = ("f32", "f16", "bf16")) -> bool:
    """An operand `precision=<fp8>` may quantise: a float tensor of one of `floats` (an fp8
    operand is quantised already; an integer one has no scale to take)."""
    if t.dtype in floats:
        return True
    ctx.error("E0404", f"`{op}` cannot quantise {t.dtype} operands to {dtype}", at=arg,
              label=f"{t.dtype} here", labels=asked(ctx, dtype),
              notes=(f"`precision={dtype}` quantises {', '.join(floats)} operands",),
              help=(f"drop the fp8 request, or cast first: `cast({ctx.text(arg)}, f16)`",))
    return False


def fp8_multiple(ctx: InferCtx, op: str, arg: str, size: Dim, what: str, dtype: str,
                 step: int = 16) -> bool:
    """cuDNN's fp8 kernels (Hopper's fp8 tensor cores) read 16-byte rows: the axes an fp8 op
    contracts or writes come in multiples of 16 elements, for every admissible value."""
    if dims.div_exact(size, step, ctx.env) is not None:
        return True
    ctx.error("E0404", f"`{op}` cannot compute in {dtype} with {what} {dims.format_dim(size)}",
              at=arg, label=f"{what} {dims.format_dim(size)}", labels=asked(ctx, dtype),
              notes=(f"cuDNN's fp8 kernels need the {what} to be a multiple of {step}"
                     + ("" if isinstance(size, int) else " for every value of its dims"),),
              help=("pad the tensor to a multiple of 16, or leave this op unquantised",))
    return False
