"""A matmul of a few rows (a decoder's projections at batch 1 to 8) with its pointwise epilogue
as one CUDA kernel. At one row a matmul reads its weight once and does two flops a weight: its
time is the weight's read. cuDNN's engines tile 16-64 rows, and on the H200 a decoder's
projections took about twice their weight-read time (docs/benchmarks.md, session 10). Here a
warp computes a few output columns for all rows (`Shape`: how many, and how many warps of a
block split K for them, their sums meeting in shared memory): its lanes walk the weight's row
of each column (the weight stored [N, K], as a PyTorch linear's, so K is contiguous) in 16-byte
loads, multiply by the input rows (read through the cache: every warp reads them) and sum by
shuffles; then one lane an output element applies the epilogue, a `fused.Plan` over the
matmul's value and the step's other operands, and stores. The tuner measures the kernel
against the step's cuDNN graph (`tune.fusion.kernel_steps`) and keeps the faster.

The matmul's value is held as the reference holds it inside the step (its intermediate dtype:
`ir.graph.stored_dtype`), and f32 accumulation as cuDNN's. Where `fits` refuses the arrays at
run time (strides the measured step did not have), the reference matmul on CuPy and the
epilogue's pointwise kernel compute the step instead: slower, the same values.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cache
from typing import Any, NamedTuple

import numpy as np

from dslc.backend import fused, launch
from dslc.backend.cuda import LOAD_STORE, PREAMBLE, ceil_div
from dslc.ir.graph import Node, stored_dtype

MOST_ROWS = 8
LEADS = ("matmul", "rmsnorm")  # the ops a step of this kernel starts with
DTYPES = ("f16", "bf16")


@dataclass(frozen=True)
class Sibling:
    """A second matmul of the same input in the step (a gated MLP's up projection beside its
    gate): its weight, the epilogue's operand its value is, and the dtype it is held in (as in
    any fused group, the intermediate: the reference rounds a step's inner values so)."""

    w: str
    operand: int
    held: str


@dataclass(frozen=True)
class Norm:
    """An RMS norm of the input ahead of the matmuls (a decoder's layer norm, joined with its
    readers by the tuner: `tune.joins.norms`): its value's name, its scale vector and epsilon.
    The kernel sums the input's squares as it reads it and scales each element by the norm's
    scale before the products, then the sums by the root: (x * s / r) @ w = ((x * s) @ w) / r,
    the norm's value never stored."""

    value: str
    scale: str
    eps: float


@dataclass(frozen=True)
class Gemv:
    """A step's matmul (its input and weight, by name) and epilogue (over `anchor`, the
    matmul's value, and the step's other operands); `held` is the dtype the matmul's value is
    held in before the epilogue. With a `sibling`, the kernel also computes that matmul's
    columns, which the epilogue reads in place of an operand; with a `norm`, `x` is the norm's
    input."""

    x: str
    w: str
    dtype: str
    held: str
    epilogue: fused.Plan
    anchor: int
    sibling: Sibling | None = None
    norm: Norm | None = None

    @property
    def computed(self) -> tuple[int, ...]:
        """The epilogue's operands the kernel computes rather than reads."""
        return (self.anchor,) if self.sibling is None else (self.anchor, self.sibling.operand)

    @property
    def weights(self) -> tuple[str, ...]:
        return (self.w,) if self.sibling is None else (self.w, self.sibling.w)

    @property
    def operands(self) -> tuple[str, ...]:
        """The arrays `run` takes, in order: input, the norm's scale, weights, the epilogue's
        other operands."""
        scale = [self.norm.scale] if self.norm else []
        return (self.x, *scale, *self.weights,
                *(o.name for i, o in enumerate(self.epilogue.operands) if i not in self.computed))


def plan_of(nodes: Mapping[str, Node], members: Sequence[str], inputs: Sequence[str],
            outputs: Sequence[str]) -> Gemv | str:
    """The kernel of a step that is a 2-d weight's matmul and a pointwise epilogue over the
    matmul's shape (or two matmuls of one input, the first read by the second's epilogue alone:
    `tune.joins.pairs`; either after an RMS norm of their input: `tune.joins.norms`), or why
    there is none."""
    first = nodes[members[0]]
    norm: Norm | None = None
    if first.op == "rmsnorm" and len(members) > 1:
        found = _norm(first)
        if isinstance(found, str):
            return found
        norm = found
        if first.name in outputs:
            return "it stores the norm's value"
        members = members[1:]
        first = nodes[members[0]]
    if first.op != "matmul":
        return "it is no matmul"
    sibling = None
    if len(members) > 2 and nodes[members[1]].op == "matmul":
        sibling, first, members = first, nodes[members[1]], members[1:]
    x, w = (nodes[i] for i in first.inputs)
    if w.type.rank != 2 or x.type.dtype != w.type.dtype or x.type.dtype not in DTYPES:
        return "its matmul is no f16 or bf16 product with a 2-d weight"
    if sibling is not None and (sibling.inputs[0] != x.name or sibling.name in outputs
                                or nodes[sibling.inputs[1]].type != w.type):
        return "its two matmuls are not of one input by weights of one type, one value stored"
    if norm is not None and (x.name != norm.value or
                             nodes[nodes[norm.value].inputs[1]].type.dtype != x.type.dtype):
        return "its matmul does not read the norm's value, or the norm's scale is of another dtype"
    rest = [nodes[m] for m in members[1:]]
    if first.name in outputs and rest:
        return "it stores the matmul's value and the epilogue's"
    if any(nodes[o].type.shape != first.type.shape for o in outputs):
        return "its results are not of the matmul's shape"
    read = x.name if norm is None else nodes[norm.value].inputs[0]
    if not rest:
        return replace(alone(read, w.name, first.type.dtype, stored_dtype(first, virtual=False),
                             first.name), norm=norm)
    given = [first, *([sibling] if sibling else []), *(nodes[i] for i in inputs)]
    epilogue = fused.plan(rest, given, outputs, {n.name: n.attrs for n in rest})
    if isinstance(epilogue, str):
        return epilogue
    operands = list(epilogue.operands)
    names = [o.name for o in operands]
    if first.name not in names:
        return "its epilogue does not read its matmul's value"
    anchor = names.index(first.name)  # the accumulator, not a load
    operands[anchor] = replace(operands[anchor], dtype="f32", along=None)
    pair = None
    if sibling is not None:
        if sibling.name not in names:
            return "its epilogue does not read its first matmul's value"
        at = names.index(sibling.name)
        operands[at] = replace(operands[at], dtype="f32", along=None)
        pair = Sibling(sibling.inputs[1], at, stored_dtype(sibling, virtual=True))
    return Gemv(read, w.name, x.type.dtype, stored_dtype(first, virtual=bool(rest)),
                replace(epilogue, operands=tuple(operands)), anchor, pair, norm)


def _norm(node: Node) -> Norm | str:
    """The norm the kernel computes ahead of its matmuls: an RMS norm over the last axis, with
    no bias."""
    scale = node.inputs[1] if len(node.inputs) == 2 else None
    if scale is None or tuple(node.attrs["axes"]) != (node.type.rank - 1,):
        return "its norm has a bias or normalises more than the last axis"
    if stored_dtype(node, virtual=True) != "f32":  # the kernel never rounds the norm's value
        return "its norm's value would be held in a narrower intermediate dtype than f32"
    return Norm(node.name, scale, float(node.attrs["eps"]))


def norm_attrs(norm: Norm, rank: int) -> dict[str, Any]:
    """The attributes of the norm as the rmsnorm op's reference takes them (the fallback's)."""
    return {"operands": ("x", "scale"), "axes": (rank - 1,), "eps": norm.eps}


def alone(x: str, w: str, dtype: str, held: str | None = None, name: str = "y") -> Gemv:
    """The kernel of a matmul with no epilogue: its value stored in `dtype`."""
    epilogue = fused.Plan((fused.Operand(name, "f32"),), (fused.Member("a", ("x0",), dtype),),
                          (0,), (dtype,))
    return Gemv(x, w, dtype, held or dtype, epilogue, 0)


def fits(x: Any, w: Any) -> bool:
    """Whether the kernel reads these arrays: an input of at most MOST_ROWS rows (one batch
    axis of more than one) whose K is contiguous, a weight [K, N] whose K is contiguous, each
    row starting on 16 bytes."""
    rows = [d for d in x.shape[:-1] if d != 1]
    k = x.shape[-1]
    item = x.dtype.itemsize
    return (math.prod(x.shape[:-1]) <= MOST_ROWS and len(rows) <= 1 and k % 8 == 0
            and x.strides[-1] == item and w.strides[0] == item and k == w.shape[0]
            and all(s % 16 == 0 for s in (*x.strides[:-1], w.strides[1]))
            and x.data.ptr % 16 == 0 and w.data.ptr % 16 == 0)


def run(g: Gemv, xs: Sequence[Any], ys: Sequence[Any], shape: Shape | None = None) -> None:
    """y = epilogue(x @ w, others) for the arrays of `g.operands` into the step's outputs, cut
    as `shape` says (None: `shape_for` the arrays)."""
    import cupy

    x, scale, ws, others = _split(g, xs)
    if not all(fits(x, w) for w in ws) or (scale is not None and not (
            scale.strides[-1] == scale.dtype.itemsize and scale.data.ptr % 16 == 0)):
        _fallback(g, xs, ys)
        return
    out = ys[0].shape
    rows, n, k = math.prod(out[:-1]), out[-1], x.shape[-1]
    read = [o for i, o in enumerate(g.epilogue.operands) if i not in g.computed]
    arrays = [fused.operand_view(a, o) for a, o in zip(others, read, strict=True)]
    strides = [_row_column(cupy.broadcast_to(a, out)) for a in arrays]
    strides += [_row_column(y) for y in ys]
    x_row = _row_column(x)[0]  # elements
    shape = shape or shape_for(rows, n, k, len(ws))
    # a lane a (row, column) of each weight's sums; a block's warps in whole column sets
    assert rows * shape.columns * len(ws) <= 32 and shape.warps % shape.split == 0, shape
    norm = [] if scale is None else [scale]
    bits = [a.view(cupy.uint16) if a.dtype == cupy.float16 else a
            for a in (x, *norm, *ws, *arrays, *ys)]
    kernel = _kernel(g, rows, shape)
    launch.early(kernel, (shape.blocks(n),), (32 * shape.warps,),
                 (*bits, np.int32(n), np.int32(k), np.int64(x_row),
                  *(np.int64(w.strides[1] // w.dtype.itemsize) for w in ws),
                  *([] if g.norm is None else [np.float32(g.norm.eps)]),
                  *(np.int64(s) for pair in strides for s in pair)))


def _split(g: Gemv, xs: Sequence[Any]) -> tuple[Any, Any, list[Any], list[Any]]:
    """`g.operands`' arrays as the input, the norm's scale (None: no norm), the weights, and
    the epilogue's other operands."""
    x, *rest = xs
    scale = rest.pop(0) if g.norm is not None else None
    count = len(g.weights)
    return x, scale, list(rest[:count]), list(rest[count:])


def _row_column(a: Any) -> tuple[int, int]:
    """Element strides of a row and a column of `a` seen as [rows, N]: the row stride is its
    one batch axis of more than one element's (0 where there is none)."""
    item = a.dtype.itemsize
    batch = [s for d, s in zip(a.shape[:-1], a.strides[:-1], strict=True) if d != 1]
    return (batch[0] // item if batch else 0), a.strides[-1] // item


def _fallback(g: Gemv, xs: Sequence[Any], ys: Sequence[Any]) -> None:
    import cupy

    from dslc.backend.device import KERNEL_DTYPES
    from dslc.backend.kernels import _math, reference_kernel

    x, scale, ws, operands = _split(g, xs)
    if _many_rows(g, x, ws, operands, ys):
        return
    if g.norm is not None:  # held as any fused group's inner value: the intermediate, f32
        normed = cupy.empty(x.shape, cupy.float32)
        reference_kernel("rmsnorm", [x, scale], normed, norm_attrs(g.norm, x.ndim))
        x = normed
    for at, w, held in sorted(zip(g.computed, ws, _held(g), strict=True)):
        value = cupy.empty(ys[0].shape, KERNEL_DTYPES[held])  # rounded as the kernel holds it
        reference_kernel("matmul", [x, w], value, {})
        operands.insert(at, _math(cupy, value).astype(cupy.float32, copy=False))
    fused.run(g.epilogue, operands, ys)


def backend_of(g: Gemv, rows: int) -> str:
    """Where `run` computes the step at this many rows, as `dslc inspect` says it (arrays `fits`
    or cuBLASLt refuses at run time aside)."""
    if rows <= MOST_ROWS:
        return "the few-row matmul kernel"
    if on_cublaslt(g):
        return "cuBLASLt (with the epilogue's leading additions), the rest one pointwise kernel"
    return "the reference matmul on CuPy, then a pointwise kernel"


def on_cublaslt(g: Gemv) -> bool:
    """Whether a step of many rows can run on cuBLASLt (`_many_rows`), its arrays aside: no pair
    or norm joined, and an epilogue whose rest may read the stored result (`epilogue_cut`)."""
    return g.sibling is None and g.norm is None and epilogue_cut(
        g.epilogue, g, len(leading_adds(g.epilogue, g.anchor)), lambda i: False) is not None


def _many_rows(g: Gemv, x: Any, ws: Sequence[Any], others: Sequence[Any],
               ys: Sequence[Any]) -> bool:
    """The step on cuBLASLt (`backend.blas`): the product with the epilogue's leading additions
    it takes (one bias along the columns, one addend of the result's shape; each of the result's
    dtype) and a ReLU or tanh-GELU right after them, stored in the result, then the rest of the
    epilogue as one pointwise kernel over the result in place. These are computed in f32 and
    rounded once, where the reference rounds each value to its intermediate dtype. The rest
    reads the stored result, so it runs so only where the value it reads is held in the
    result's dtype, or the result is bf16 (f32's range: a rounding, never an overflow to inf as
    f16's could be; `rest_reads_exactly`). False where it cannot run so (a pair or norm joined,
    several results, arrays cuBLASLt does not take or that share the result's memory): the
    caller computes the step another way."""
    import cupy

    from dslc.backend import blas

    if g.sibling is not None or g.norm is not None or len(ys) != 1:
        return False
    y, p = ys[0], g.epilogue
    if _meets(x, y) or _meets(ws[0], y):
        return False
    arrays: dict[int, Any] = dict(zip((i for i in range(len(p.operands)) if i != g.anchor),
                                      others, strict=True))
    addends: list[tuple[str, Any]] = []  # the leading additions cuBLASLt takes, in order
    for i in leading_adds(p, g.anchor):
        a = cupy.broadcast_to(fused.operand_view(arrays[i], p.operands[i]), y.shape)
        kind = _addend(a, y)
        if kind is None or kind in dict(addends):
            break
        addends.append((kind, a[(0,) * (y.ndim - 1)] if kind == "bias" else a))
    cut = epilogue_cut(p, g, len(addends), lambda i: _meets(arrays[i], y))
    if cut is None:
        return False
    found = dict(addends[:cut.adds])
    if not blas.matmul(g.dtype, x, ws[0], y, found.get("addend"), found.get("bias"),
                       cut.activation):
        return False
    if cut.rest is not None and needs_rest(cut.rest):
        fused.run(cut.rest, [y, *(arrays[i] for i in _rest_operands(p, g.anchor, cut.taken))], ys)
    return True


class Cut(NamedTuple):
    """What cuBLASLt computes of an epilogue: its first `adds` members (additions), then with
    `activation` the next (a ReLU or tanh-GELU of their sum); `rest` the members after."""

    adds: int
    activation: str
    rest: fused.Plan | None

    @property
    def taken(self) -> int:
        return self.adds + bool(self.activation)


# The activations cuBLASLt applies in its epilogue (`blas.ACTIVATIONS`), by their expression.
ACTIVATED = {fused.expression(op, "f32", {}): op for op in ("relu", "gelu_tanh")}


def epilogue_cut(p: fused.Plan, g: Gemv, most: int, meets: Callable[[int], bool],
                 ) -> Cut | None:
    """How much of the epilogue cuBLASLt computes: at most `most` leading additions (those it
    takes), then the activation right after them if there is one, and the rest's kernel; the
    most for which the rest can read the stored result (`rest_after`, `rest_reads_exactly`) and
    reads no operand whose memory the result's meets (`meets(i)`: cuBLASLt has written it by
    then); None where even none can."""
    for adds in range(most, -1, -1):
        act = activation_after(p, g.anchor, adds)
        for activation in ((act, "") if act else ("",)):
            taken = adds + bool(activation)
            rest = rest_after(p, g.anchor, taken)
            if not isinstance(rest, str) and rest_reads_exactly(p, g, taken) and \
                    not any(meets(i) for i in _rest_operands(p, g.anchor, taken)):
                return Cut(adds, activation, rest)
    return None


def activation_after(p: fused.Plan, anchor: int, taken: int) -> str:
    """The activation cuBLASLt may apply after the epilogue's first `taken` members: the next
    member a ReLU or tanh-GELU of their value alone (`ACTIVATED`), else ""."""
    if taken >= len(p.members):
        return ""
    m = p.members[taken]
    before = f"v{taken - 1}" if taken else f"x{anchor}"
    return ACTIVATED.get(m.expr, "") if m.operands == (before,) else ""


def rest_reads_exactly(p: fused.Plan, g: Gemv, taken: int) -> bool:
    """Whether the rest of the epilogue after `taken` members may read the value before it from
    the stored result: nothing is left, the reference holds that value in the result's dtype,
    or the result is bf16 (its range is f32's: the reading differs by a rounding)."""
    if taken == len(p.members):
        return True
    held = p.members[taken - 1].dtype if taken else g.held
    return held == p.output_dtypes[0] or p.output_dtypes[0] == "bf16"


def needs_rest(rest: fused.Plan) -> bool:
    """Whether the rest changes the stored result: not where each member is the value before it
    held in a dtype the result's values keep (f32, or the result's own)."""
    return any(m.expr != "a" or m.dtype not in ("f32", rest.output_dtypes[0])
               for m in rest.members)


def _meets(a: Any, y: Any) -> bool:
    """Whether `a`'s bytes meet y's at all (the same view included: written by cuBLASLt before
    the rest reads it)."""
    same = (a.data.ptr, a.shape, a.strides) == (y.data.ptr, y.shape, y.strides)
    return a.size > 0 and y.size > 0 and (same or fused.overlaps(a, y))


def _addend(a: Any, y: Any) -> str | None:
    """What cuBLASLt may add of `a` (broadcast to y's shape) into y: a "bias" (one value a column,
    contiguous) or an "addend" (y's shape, not meeting y but as y itself, C = D), or None."""
    if a.dtype != y.dtype:
        return None
    if all(s == 0 or d == 1 for d, s in zip(a.shape[:-1], a.strides[:-1], strict=True)) and \
            a.strides[-1] == a.itemsize and any(s == 0 for s in a.strides[:-1]):
        return "bias"
    if all(s != 0 or d == 1 for d, s in zip(a.shape, a.strides, strict=True)) and \
            not fused.overlaps(a, y):
        return "addend"
    return None


def leading_adds(p: fused.Plan, anchor: int) -> list[int]:
    """The operands (indices) the epilogue's first members add, one each, to the value before
    it, from the matmul's value on: the additions cuBLASLt may take."""
    current, out = f"x{anchor}", []
    for j, m in enumerate(p.members):
        if m.expr != "a + b" or sorted(m.operands).count(current) != 1:
            break
        other = _ref(m.operands[1 - m.operands.index(current)], "x")
        if other is None or other == anchor:
            break
        out.append(other)
        current = f"v{j}"
    return out


def _ref(ref: str, kind: str) -> int | None:
    """The index a member's operand names: `x3`, the fourth operand (kind "x"), `v1`, the second
    member's value (kind "v"); None where it names another kind or is a constant."""
    return int(ref[1:]) if ref.startswith(kind) and ref[1:].isdigit() else None


def _rest_operands(p: fused.Plan, anchor: int, taken: int) -> list[int]:
    """The epilogue's operands (indices) its members after the first `taken` read, in order."""
    seen: list[int] = []
    for m in p.members[taken:]:
        for ref in m.operands:
            i = _ref(ref, "x")
            if i is not None and i != anchor and i not in seen:
                seen.append(i)
    return seen


def rest_after(p: fused.Plan, anchor: int, taken: int) -> fused.Plan | str | None:
    """The epilogue's members after its first `taken` as a kernel over the stored result (its
    operand 0: the value of member `taken - 1`, or the matmul's with none taken) and the other
    operands they read (`_rest_operands`), storing what the epilogue stores; None where nothing
    is left, or why it cannot be (a later member reads a value the result no longer holds)."""
    members = p.members[taken:]
    if not members:
        return None if p.stores == (len(p.members) - 1,) or not p.members else \
            "it stores a value before its last"
    if any(j < taken for j in p.stores):
        return "it stores a value cuBLASLt computes inside"
    held = f"v{taken - 1}" if taken else f"x{anchor}"
    kept = _rest_operands(p, anchor, taken)
    names = {held: "x0", **{f"x{i}": f"x{k + 1}" for k, i in enumerate(kept)}}
    built = []
    for m in members:
        refs = []
        for ref in m.operands:
            value = _ref(ref, "v")
            if ref in names:
                refs.append(names[ref])
            elif value is not None:
                if value < taken:
                    return "a later op reads a value before the stored one"
                refs.append(f"v{value - taken}")
            elif _ref(ref, "x") is not None:
                return "a later op reads the matmul's value"
            else:
                refs.append(ref)  # a constant
        built.append(fused.Member(m.expr, tuple(refs), m.dtype))
    result = fused.Operand("result", p.output_dtypes[0])
    return fused.Plan((result, *(p.operands[i] for i in kept)), tuple(built),
                      tuple(j - taken for j in p.stores), p.output_dtypes)


def _held(g: Gemv) -> tuple[str, ...]:
    """The dtypes the computed operands are held in, as `computed` lists them."""
    return (g.held,) if g.sibling is None else (g.held, g.sibling.held)


_SOURCE = r"""
typedef unsigned short S;
#define M {rows}
#define C {columns}
#define SPLIT {split}
#define UNROLL {unroll}
#define PAIR {pair}
#define CC (C * (1 + PAIR))  // the columns a warp sums: C of w, and with a pair C of w2
#define NORM {norm}  // an RMS norm of x ahead: squares summed as read, x scaled by g
struct __align__(16) Pack {{ S v[8]; }};
__device__ __forceinline__ float load(S v) {{ {load} }}
__device__ __forceinline__ Pack stream(const S* p) {{  // read once: kept out of L1
  const uint4 t = __ldcs(reinterpret_cast<const uint4*>(p));
  return *reinterpret_cast<const Pack*>(&t);
}}

extern "C" __global__ void __launch_bounds__({threads}) dslc_gemv(
    const S* __restrict__ x, {g}const S* __restrict__ w, {w2}{params}
    const int N, const int K, const long long xm, const long long wn, {wn2}{eps}{strides}) {{
  let_next_start();  // the next kernel may launch (it waits for this one before it reads)
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int part = warp % SPLIT;  // the warps of a column set split K: chunks part, part+SPLIT..
  const int n0 = (blockIdx.x * ({warps} / SPLIT) + warp / SPLIT) * C;
  float acc[M][CC];
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int c = 0; c < CC; ++c) acc[m][c] = 0.0f;
#if NORM
  float squares[M];
#pragma unroll
  for (int m = 0; m < M; ++m) squares[m] = 0.0f;
#endif
  const S* rows[CC];  // a column past N rereads the first: computed, never stored
#pragma unroll
  for (int c = 0; c < C; ++c) rows[c] = w + (long long)(n0 + c < N ? n0 + c : 0) * wn;
#if PAIR
#pragma unroll
  for (int c = 0; c < C; ++c) rows[C + c] = w2 + (long long)(n0 + c < N ? n0 + c : 0) * wn2;
#endif
  // Launched early (backend.launch), the kernel reads nothing before the kernels ahead of it
  // have finished; meanwhile it asks the L2 for its weight rows (a prefetch is safe whoever
  // writes them: the L2 is where writes land), which the loop then reads from there.
  for (int k = (part * 256) + lane * 8; k < K; k += 256 * SPLIT)
    if (lane % 8 == 0)  // a 128-byte line each
#pragma unroll
      for (int c = 0; c < CC; ++c) asm volatile("prefetch.global.L2 [%0];" :: "l"(rows[c] + k));
  wait_for_previous();
  // chunks of 256 elements of K, each lane 16 bytes of one, UNROLL chunks loaded at once
  for (int k0 = (part * 256) + lane * 8; k0 < K; k0 += 256 * SPLIT * UNROLL) {{
    Pack wv[UNROLL][CC], xv[UNROLL][M];
#if NORM
    Pack gv[UNROLL];
#endif
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {{
      const int k = k0 + u * 256 * SPLIT;
      if (k < K) {{
#pragma unroll
        for (int c = 0; c < CC; ++c) wv[u][c] = stream(rows[c] + k);
#pragma unroll
        for (int m = 0; m < M; ++m) {{
          const uint4 t = __ldg(reinterpret_cast<const uint4*>(x + m * xm + k));
          xv[u][m] = *reinterpret_cast<const Pack*>(&t);
        }}
#if NORM
        const uint4 t = __ldg(reinterpret_cast<const uint4*>(g + k));
        gv[u] = *reinterpret_cast<const Pack*>(&t);
#endif
      }}
    }}
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {{
      if (k0 + u * 256 * SPLIT >= K) break;
#pragma unroll
      for (int e = 0; e < 8; ++e) {{
        float xf[M];
#pragma unroll
        for (int m = 0; m < M; ++m) {{
          xf[m] = load(xv[u][m].v[e]);
#if NORM
          squares[m] += xf[m] * xf[m];
          xf[m] *= load(gv[u].v[e]);
#endif
        }}
#pragma unroll
        for (int c = 0; c < CC; ++c) {{
          const float wf = load(wv[u][c].v[e]);
#pragma unroll
          for (int m = 0; m < M; ++m) acc[m][c] += xf[m] * wf;
        }}
      }}
    }}
  }}
#if NORM
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int off = 16; off > 0; off >>= 1)
      squares[m] += __shfl_xor_sync(0xffffffffu, squares[m], off);  // every lane: the warp's
#endif
  float mine = 0.0f;  // lane m * CC + c keeps the warp's sum of (m, c)
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int c = 0; c < CC; ++c) {{
      float a = acc[m][c];
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) a += __shfl_xor_sync(0xffffffffu, a, off);
      if (lane == m * CC + c) mine = a;
    }}
#if SPLIT > 1
  __shared__ float partial[{warps}][M * CC + NORM * M];
  if (lane < M * CC) partial[warp][lane] = mine;
#if NORM
  if (lane < M) {{
#pragma unroll
    for (int m = 0; m < M; ++m) if (m == lane) partial[warp][M * CC + m] = squares[m];
  }}
#endif
  __syncthreads();
  if (part != 0) return;
  if (lane < M * CC)
#pragma unroll
    for (int p = 1; p < SPLIT; ++p) mine += partial[warp + p][lane];
#if NORM
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int p = 1; p < SPLIT; ++p) squares[m] += partial[warp + p][M * CC + m];
#endif
#endif
#if NORM
  {{  // the norm's root for this lane's row, on the sums of its scaled inputs
    float root = 0.0f;
#pragma unroll
    for (int m = 0; m < M; ++m) if (m == lane / CC) root = rsqrtf(squares[m] / K + eps);
    mine *= root;
  }}
#endif
#if PAIR
  const float other = __shfl_down_sync(0xffffffffu, mine, C);  // w2's sum of the same (m, n)
#endif
  const int m = lane / CC, n = n0 + lane % CC;
  if (lane >= M * CC || lane % CC >= C || n >= N) return;
  const float x{anchor} = {held};
{sibling}
{loads}
{outs}
  {{
{body}
  }}
{stores}
}}
"""


@dataclass(frozen=True)
class Shape:
    """How the kernel cuts a matmul: `columns` output columns a warp, `warps` a block, `split`
    warps of a block summing parts of K for the same columns (their sums meet in shared
    memory), `unroll` chunks of 256 elements of K a warp loads before it multiplies."""

    columns: int
    warps: int
    split: int
    unroll: int

    def blocks(self, n: int) -> int:
        return ceil_div(n, self.warps // self.split * self.columns)


def shape_for(rows: int, n: int, k: int, weights: int = 1) -> Shape:
    """The cut for `rows` rows of an [N, K] weight. A matmul of a row reads its weight once: its
    time is that read's and a fixed cost (launch, the first loads' latency, the last block's
    tail: about 5 us on the H200, where a 23 MB weight reads in 5). Measured at a 1B decoder's
    sizes (scripts/probe_gpu.py --only gemv, docs/benchmarks.md, session 14): one row is
    fastest with a column a warp and four warps splitting K, whatever N and K (many small
    blocks fill the GPU evenly); more rows share each weight load over four columns a warp, K
    split as far as keeps the blocks within about 6 a multiprocessor (N 2,048-3,072: split 4;
    5,632: 2; 11,264 and more: 1)."""
    if rows == 1:
        return Shape(1, 8, 4, 1)
    columns = min(4, 32 // (rows * weights))  # a warp's lanes hold its (row, column) sums
    split = next((s for s in (4, 2) if Shape(columns, 4, s, 1).blocks(n) <= 768), 1)
    return Shape(columns, 4, split, 1)


@cache
def _kernel(g: Gemv, rows: int, shape: Shape) -> Any:
    import cupy

    from dslc.backend.fused import _RAW_CTYPE, _RAW_LOAD, _RAW_STORE, _ROUND, CONVERSIONS

    p = g.epilogue
    others = [(i, o) for i, o in enumerate(p.operands) if i not in g.computed]
    pair = g.sibling is not None
    sibling = (f"  const float x{g.sibling.operand} = {_ROUND[g.sibling.held].format('other')};"
               if g.sibling is not None else "")
    params = "".join(f"const {_RAW_CTYPE[o.dtype]}* __restrict__ p{i}, " for i, o in others)
    params += "".join(f"{_RAW_CTYPE[d]}* __restrict__ q{j}, "
                      for j, d in enumerate(p.output_dtypes))
    strides = ", ".join([f"const long long s{i}m, const long long s{i}n" for i, _ in others] +
                        [f"const long long t{j}m, const long long t{j}n"
                         for j in range(len(p.output_dtypes))])
    loads = "\n".join(f"  const {_RAW_CTYPE[o.dtype]} x{i} = p{i}[m * s{i}m + n * s{i}n];"
                      for i, o in others)
    outs = "\n".join(f"  {_RAW_CTYPE[d]} y{j};" for j, d in enumerate(p.output_dtypes))
    stores = "\n".join(f"  q{j}[m * t{j}m + n * t{j}n] = y{j};"
                       for j in range(len(p.output_dtypes)))
    load = LOAD_STORE["bfloat16" if g.dtype == "bf16" else "float16"][1]
    source = _SOURCE.format(rows=rows, columns=shape.columns, split=shape.split,
                            unroll=shape.unroll, pair=int(pair), threads=32 * shape.warps,
                            warps=shape.warps, load=load, params=params, strides=strides,
                            w2="const S* __restrict__ w2, " if pair else "",
                            wn2="const long long wn2, " if pair else "", sibling=sibling,
                            norm=int(g.norm is not None),
                            g="const S* __restrict__ g, " if g.norm is not None else "",
                            eps="const float eps, " if g.norm is not None else "",
                            anchor=g.anchor, held=_ROUND[g.held].format("mine"), loads=loads,
                            outs=outs, body=p._body(_RAW_LOAD, _RAW_STORE), stores=stores)
    name = f"dslc_gemv_{zlib.crc32(source.encode()):08x}"
    return cupy.RawKernel(PREAMBLE + CONVERSIONS + launch.DEVICE
                          + source.replace("dslc_gemv(", f"{name}(", 1), name)
