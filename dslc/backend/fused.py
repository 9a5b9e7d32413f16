"""Pointwise ops cuDNN has no engine for, as one CUDA kernel per step: a single op, or a chain
of them (a group cuDNN rejected whole), each op a C expression over f32 values, the group's
operands loaded once per element in their stored dtypes and its results stored in theirs.

A value inside the group is rounded to the dtype the reference holds it in
(`ir.graph.stored_dtype`: the `intermediate` dtype, or a cast's own dtype), so the kernel
computes what the reference executor computes. Split into one kernel per op, a quantising
`x * scale` then `cast` to e4m3 wrote and read the product as f32 in between: three passes
over the tensor where one does.

fp8 values travel as their bytes (uint8: CuPy has no fp8 dtype) and bf16 as its uint16 bits;
both are converted by the functions of `CONVERSIONS` and `cuda.PREAMBLE`, round to nearest
even, e4m3 saturating at +-448 and e5m2 overflowing to infinity, as `ops.fp8` rounds (e4m3 by
the GPU's own conversion instruction where it has one, sm_89 and later). The
runtime knows each tensor's dslc dtype from the IR, so a uint8 array is never guessed at.
`takes` decides which steps run here; compile and runtime both ask it. Large dense tensors run
the vector kernel (`Plan.vector_source`), the others the strided one (`Plan.strided_kernel`,
launched early, alone or as a part of one launch with other small steps: `backend.merge`).
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np

from dslc.backend import merge
from dslc.backend.cuda import PREAMBLE, ceil_div, grid_blocks
from dslc.ir.graph import Node, stored_dtype
from dslc.ir.interp import ITEMSIZE

# Each op's numpy reference (ops/pointwise.py) as a C expression over f32 operands a, b, c;
# attributes as {name}.
POINTWISE: dict[str, str] = {
    "relu": "(a < 0.0f ? 0.0f : a)",
    "leaky_relu": "(a > 0.0f ? a : a * {slope})",
    "gelu": "0.5f * a * (1.0f + erff(a * 0.70710678118654752f))",
    "gelu_tanh": "0.5f * a * (1.0f + tanhf(0.79788456080286536f * (a + 0.044715f * a * a * a)))",
    "silu": "a / (1.0f + expf(-a))",
    "swish": "a / (1.0f + expf(-a * {beta}))",
    "sigmoid": "1.0f / (1.0f + expf(-a))",
    "tanh": "tanhf(a)",
    "elu": "(a > 0.0f ? a : {alpha} * expm1f(nan_min(a, 0.0f)))",
    "softplus": "(nan_max(a, 0.0f) + log1pf(expf(-fabsf(a))))",
    "hardsigmoid": "clip(a * (1.0f / 6.0f) + 0.5f, 0.0f, 1.0f)",
    "hardswish": "a * clip(a * (1.0f / 6.0f) + 0.5f, 0.0f, 1.0f)",
    "exp": "expf(a)", "log": "logf(a)", "sqrt": "sqrtf(a)", "rsqrt": "1.0f / sqrtf(a)",
    "reciprocal": "1.0f / a", "erf": "erff(a)", "sin": "sinf(a)", "cos": "cosf(a)",
    "floor": "floorf(a)", "ceil": "ceilf(a)", "abs": "fabsf(a)", "neg": "-a",
    "add": "a + b", "sub": "a - b", "mul": "a * b", "div": "a / b",
    "max": "nan_max(a, b)", "min": "nan_min(a, b)", "pow": "powf(a, b)",
    "cmp_lt": "(a < b)", "cmp_le": "(a <= b)", "cmp_gt": "(a > b)", "cmp_ge": "(a >= b)",
    "cmp_eq": "(a == b)", "cmp_ne": "(a != b)",
    "select": "(a != 0.0f ? b : c)",
    "cast": "a",
}
# x op b with b a vector along `axis` of x: the vector is given to the kernel as a view of that
# rank, so CuPy's broadcasting lines it up.
ALONG_AXIS: dict[str, str] = {"scale_mul": "a * b", "bias_add": "a + b"}
# x broadcast to a larger shape: the kernel walks the result, its operands broadcast to it, so
# the value is x's (the last op of a chain the fusion ends with it, or a copy alone).
BROADCASTS: dict[str, str] = {"expand": "a"}

# e4m3 (fn: no infinity, S.1111.111 is NaN, largest 448) and e5m2 (IEEE-like, largest 57344)
# from and to f32, by arithmetic: ldexpf and frexpf are exact, rintf rounds ties to even; and
# an f32 value rounded to f16.
CONVERSIONS = r"""
__device__ __forceinline__ float fp8_f(unsigned char b, int man, int bias, bool fn) {
  const int e = (b & 0x7f) >> man, m = b & ((1 << man) - 1), top = (1 << (7 - man)) - 1;
  float v;
  if (fn ? (e == top && m == (1 << man) - 1) : (e == top && m != 0)) v = __int_as_float(0x7fc00000);
  else if (!fn && e == top) v = __int_as_float(0x7f800000);
  else if (e == 0) v = ldexpf((float)m, 1 - bias - man);
  else v = ldexpf((float)((1 << man) + m), e - bias - man);
  return (b & 0x80) ? -v : v;
}
__device__ __forceinline__ unsigned char f_fp8(float f, int man, int bias, bool fn, float top) {
  const unsigned char sign = (__float_as_uint(f) >> 24) & 0x80;
  const float a = fabsf(f);
  if (a != a) return sign | 0x7f;
  if (fn && a >= top) return sign | 0x7e;                      // e4m3 saturates
  if (a == __int_as_float(0x7f800000)) return fn ? (sign | 0x7e) : (sign | 0x7c);
  int e;
  frexpf(a, &e);
  const int exponent = max(e - 1, 1 - bias);                   // subnormals share the smallest
  const float ulp = ldexpf(1.0f, exponent - man);
  const float r = rintf(a / ulp) * ulp;
  if (r == 0.0f) return sign;
  if (r > top) return fn ? (sign | 0x7e) : (sign | 0x7c);
  frexpf(r, &e);
  const int ex = e - 1;
  if (ex < 1 - bias) return sign | (unsigned char)(r / ldexpf(1.0f, 1 - bias - man));
  const int m = (int)(r / ldexpf(1.0f, ex - man)) - (1 << man);
  return sign | (unsigned char)(((ex + bias) << man) | m);
}
// f32 rounded to f16 and back (PTX cvt: no header; CuPy includes its float16 only where a
// kernel's arguments are f16). DSLC_HOST: the tests compile these for the host with g++.
#ifdef DSLC_HOST
inline float f16_round(float f) { return (float)(_Float16)f; }
inline float h_f(unsigned short h) { _Float16 v; std::memcpy(&v, &h, 2); return (float)v; }
inline unsigned short f_h(float f) {
  _Float16 v = (_Float16)f; unsigned short h; std::memcpy(&h, &v, 2); return h;
}
#else
__device__ __forceinline__ float h_f(unsigned short h) {
  float r; asm("cvt.f32.f16 %0, %1;" : "=f"(r) : "h"(h)); return r;
}
__device__ __forceinline__ unsigned short f_h(float f) {
  unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h;
}
__device__ __forceinline__ float f16_round(float f) {
  unsigned short h; float r;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  asm("cvt.f32.f16 %0, %1;" : "=f"(r) : "h"(h));
  return r;
}
#endif
// On sm_89 and later the GPU converts e4m3 itself (PTX cvt with satfinite: round to nearest
// even, saturating at +-448, as above; a NaN keeps its sign here, as ops.fp8 writes it): the
// arithmetic above made a quantising cast's kernel compute-bound.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
__device__ __forceinline__ float e4m3_f(unsigned char b) {
  unsigned int h2; float r;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"((unsigned short)b));
  asm("cvt.f32.f16 %0, %1;" : "=f"(r) : "h"((unsigned short)(h2 & 0xffff)));
  return r;
}
__device__ __forceinline__ unsigned char f_e4m3(float f) {
  if (f != f) return ((__float_as_uint(f) >> 24) & 0x80) | 0x7f;
  unsigned short h;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(h) : "f"(0.0f), "f"(f));
  return (unsigned char)(h & 0xff);
}
#else
__device__ __forceinline__ float e4m3_f(unsigned char b) { return fp8_f(b, 3, 7, true); }
__device__ __forceinline__ unsigned char f_e4m3(float f) { return f_fp8(f, 3, 7, true, 448.0f); }
#endif
__device__ __forceinline__ float e5m2_f(unsigned char b) { return fp8_f(b, 2, 15, false); }
__device__ __forceinline__ unsigned char f_e5m2(float f) { return f_fp8(f, 2, 15, false, 57344.0f); }
"""

# Per dslc dtype: the CuPy type of its storage, a load to f32, a store from f32, and the f32
# value rounded to the dtype.
_CTYPE = {"f32": "float32", "f16": "float16", "bf16": "uint16", "f8e4m3": "uint8",
          "f8e5m2": "uint8", "bool": "bool"}
_LOAD = {"f32": "{}", "f16": "(float){}", "bf16": "to_f({})", "f8e4m3": "e4m3_f({})",
         "f8e5m2": "e5m2_f({})", "bool": "({} ? 1.0f : 0.0f)"}
_STORE = {"f32": "{}", "f16": "(float16)({})", "bf16": "from_f<unsigned short>({})",
          "f8e4m3": "f_e4m3({})", "f8e5m2": "f_e5m2({})", "bool": "({} != 0.0f)"}
_ROUND = {"f32": "{}", "f16": "f16_round({})", "bf16": "to_f(from_f<unsigned short>({}))",
          "f8e4m3": "e4m3_f(f_e4m3({}))", "f8e5m2": "e5m2_f(f_e5m2({}))", "bool": "({} != 0.0f)"}
DTYPES = tuple(_CTYPE)
# Integers only as a cast's operand (converted to f32 as numpy's astype rounds: to nearest;
# arithmetic on them stays exact elsewhere): a mask of token ids cast to f32 joins its group.
INTEGERS = {"i64": ("int64", "long long"), "i32": ("int32", "int")}
_CTYPE.update({k: c for k, (c, _) in INTEGERS.items()})
_LOAD.update({k: "(float){}" for k in INTEGERS})
# The same in a raw kernel (`Plan.vector_source`): f16 as its bits, converted by PTX.
_RAW_CTYPE = {"f32": "float", "f16": "unsigned short", "bf16": "unsigned short",
              "f8e4m3": "unsigned char", "f8e5m2": "unsigned char", "bool": "unsigned char",
              **{k: raw for k, (_, raw) in INTEGERS.items()}}
_RAW_LOAD = {**_LOAD, "f16": "h_f({})", "bool": "({} != 0 ? 1.0f : 0.0f)"}
_RAW_STORE = {**_STORE, "f16": "f_h({})", "bool": "(unsigned char)({} != 0.0f)"}
VECTOR = 8  # elements a thread of the vector kernel computes
MOST_OPERANDS = 16  # CuPy builds a kernel's argument list per launch: keep it short


@dataclass(frozen=True)
class Member:
    """One op of the kernel: its expression, where its operands come from ("x3": the kernel's
    fourth operand, "v1": the second member's value), and the dtype its value is held in."""

    expr: str
    operands: tuple[str, ...]
    dtype: str


@dataclass(frozen=True)
class Operand:
    """A value the kernel reads: its name, its dslc dtype, and for a vector an op reads along
    an axis, (axis, rank) of the view it is given as."""

    name: str
    dtype: str
    along: tuple[int, int] | None = None


@dataclass(frozen=True)
class Plan:
    """What one kernel computes: its operands, its members in order, and which members it
    stores, in the order of its outputs."""

    operands: tuple[Operand, ...]
    members: tuple[Member, ...]
    stores: tuple[int, ...]
    output_dtypes: tuple[str, ...]

    def source(self) -> tuple[str, str, str]:
        """The kernel as an elementwise loop's input parameters, output parameters and body
        (`x{i}` and `y{i}` one element each, f16 as a float16 type): no longer what runs on the
        GPU (the strided and vector kernels do), the host tests compile it as the plain loop
        those kernels must equal."""
        params = ", ".join(f"{_CTYPE[o.dtype]} x{i}" for i, o in enumerate(self.operands))
        outs = ", ".join(f"{_CTYPE[d]} y{i}" for i, d in enumerate(self.output_dtypes))
        return params, outs, self._body(_LOAD, _STORE)

    def _body(self, load: Mapping[str, str], store: Mapping[str, str]) -> str:
        lines = [f"const float x{i}f = {load[o.dtype].format(f'x{i}')};"
                 for i, o in enumerate(self.operands)]
        for j, m in enumerate(self.members):
            names = {"a": "", "b": "", "c": ""}
            for k, src in enumerate(m.operands):
                names["abc"[k]] = f"{src}f" if src.startswith("x") else src
            bind = " ".join(f"const float {k} = {v};" for k, v in names.items() if v)
            lines.append(f"float v{j}; {{ {bind} v{j} = {_ROUND[m.dtype].format(m.expr)}; }}")
        for i, (j, d) in enumerate(zip(self.stores, self.output_dtypes, strict=True)):
            lines.append(f"y{i} = {store[d].format(f'v{j}')};")
        return "\n".join(lines)

    def vector_source(self, name: str, broadcast: Sequence[bool]) -> str:
        """The kernel over dense tensors of one shape, `VECTOR` elements a thread: each dense
        operand and result moved in 16-byte words (8 for one-byte dtypes), an operand of one
        element (`broadcast`) read once. One element a thread, as CuPy's elementwise kernels
        run, a quantising cast moved 2 bytes in and 1 out per thread: too little in flight to
        fill the memory bus (0.56 TB/s on the H200's 4.8). A tail short of a vector runs an
        element a thread. `n` counts the elements."""
        types = [_RAW_CTYPE[o.dtype] for o in self.operands]
        outs = [_RAW_CTYPE[d] for d in self.output_dtypes]
        params = [f"const {t}* __restrict__ p{i}" for i, t in enumerate(types)]
        params += [f"{t}* __restrict__ q{i}" for i, t in enumerate(outs)]
        body = self._body(_RAW_LOAD, _RAW_STORE)
        head: list[str] = []
        loads: list[str] = []
        elem: list[str] = []
        stores: list[str] = []
        tail: list[str] = []
        for i, t in enumerate(types):
            if broadcast[i]:
                head.append(f"const {t} x{i} = p{i}[0];")
                continue
            word, n = _word(self.operands[i].dtype)
            loads.append(f"union {{ {t} e[{VECTOR}]; {word} w[{n}]; }} c{i};")
            loads.extend(f"c{i}.w[{q}] = ((const {word}*)p{i})[v * {n} + {q}];" for q in range(n))
            elem.append(f"const {t} x{i} = c{i}.e[k];")
            tail.append(f"const {t} x{i} = p{i}[i];")
        for i, t in enumerate(outs):
            word, n = _word(self.output_dtypes[i])
            loads.append(f"union {{ {t} e[{VECTOR}]; {word} w[{n}]; }} d{i};")
            elem.append(f"{t} y{i};")
            stores.extend(f"(({word}*)q{i})[v * {n} + {q}] = d{i}.w[{q}];" for q in range(n))
            tail.append(f"{t} y{i};")
        put = " ".join(f"d{i}.e[k] = y{i};" for i in range(len(outs)))
        put_tail = " ".join(f"q{i}[i] = y{i};" for i in range(len(outs)))
        nl = "\n"
        return (f'extern "C" __global__ void {name}({", ".join(params)}, long long n) {{\n'
                f"const long long step = (long long)gridDim.x * blockDim.x;\n"
                f"const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n"
                f"{nl.join(head)}\n"
                f"for (long long v = first; v < n / {VECTOR}; v += step) {{\n"
                f"{nl.join(loads)}\n"
                f"#pragma unroll\nfor (int k = 0; k < {VECTOR}; ++k) {{\n"
                f"{nl.join(elem)}\n{{\n{body}\n}}\n{put}\n}}\n"
                f"{nl.join(stores)}\n}}\n"
                f"for (long long i = n / {VECTOR} * {VECTOR} + first; i < n; i += step) {{\n"
                f"{nl.join(tail)}\n{{\n{body}\n}}\n{put_tail}\n}}\n}}\n")

    def strided_source(self, name: str, rank: int) -> str:
        """`strided_kernel` as a kernel of its own (`backend.merge.source`)."""
        return merge.source([self.strided_kernel(rank)], name)

    def strided_kernel(self, rank: int, shift: int | None = None,
                       narrow: bool = False) -> merge.Kernel:
        """The kernel over arrays of one shape of `rank` axes and any strides (an operand
        broadcast along an axis: stride 0), an element a thread: the shape `d{r}`, each array's
        strides in elements (`p{i}s{r}`, `q{j}s{r}`) and the count `n` are arguments, so one
        compiled kernel serves every size. Launched early, alone or merged with other small
        steps' kernels (`backend.merge`): between a decoder's projections (launched so too) its
        launch then costs no gap. With `shift`, the results are stored `at[0]` further along
        that axis (an offset read on the device, as a cache write's), those past [0, rows)
        dropped. `narrow`: the indices and offsets in 32 bits (every one fits), each division
        by an axis's size a multiply-high and a shift by its magic numbers (`magic`, arguments
        `m{r}` and `h{r}` after the strides): an element's offsets cost a division per axis,
        a 64-bit one several times a 32-bit one, and that one about twenty instructions. The
        strided kernel of BERT's padding mask (1.5M elements) was bound by them: 5.9 us on an
        H100 against 1.9 for its bytes."""
        types = [_RAW_CTYPE[o.dtype] for o in self.operands]
        outs = [_RAW_CTYPE[d] for d in self.output_dtypes]
        ins = [f"p{i}" for i in range(len(types))]
        results = [f"q{j}" for j in range(len(outs))]
        index = "int" if narrow else "long long"
        params = [f"const {t}* __restrict__ p{i}" for i, t in enumerate(types)]
        params += [f"{t}* __restrict__ q{j}" for j, t in enumerate(outs)]
        params += ["const long long n", *(f"const long long d{r}" for r in range(rank))]
        params += [f"const long long {a}s{r}" for a in ins + results for r in range(rank)]
        if narrow:
            params += [f"const long long {k}{r}" for r in range(1, rank) for k in "mh"]
        if shift is not None:
            params += ["const int* __restrict__ at", "const long long rows"]

        def step(r: int) -> str:
            moved = " ".join(f"o{a} += c * ({index}){a}s{r};" for a in ins)
            if r != shift:
                return moved + " " + " ".join(f"o{a} += c * ({index}){a}s{r};" for a in results)
            return (moved + f" const {index} row = c + first; keep = row >= 0 && row < rows; "
                    + " ".join(f"o{a} += row * ({index}){a}s{r};" for a in results))

        def divide(r: int) -> str:
            if not narrow:
                return f"const long long c = rest % d{r}; rest /= d{r};"
            # rest < 2^31, so the sum is below 2^32 (the multiply-high is at most rest)
            return (f"const int q = (int)((__umulhi((unsigned)rest, (unsigned)m{r}) + "
                    f"(unsigned)rest) >> (unsigned)h{r}); const int c = rest - q * (int)d{r}; "
                    "rest = q;")

        # the outermost axis's index is what the inner axes leave (i < n): no division
        walk = [f"{{ {divide(r)} {step(r)} }}" if r else f"{{ const {index} c = rest; {step(r)} }}"
                for r in reversed(range(rank))]
        nl = "\n"
        store = "if (keep) " if shift is not None else ""
        body = (("const long long first = at[0];\n" if shift is not None else "")
                + f"const {index} step = BLOCKS * blockDim.x;\n"
                f"for ({index} i = BLOCK * blockDim.x + threadIdx.x; i < ({index})n; i += step) {{\n"
                f"{index} rest = i;\n"
                + ("bool keep = true;\n" if shift is not None else "")
                + "".join(f"{index} o{a} = 0;\n" for a in ins + results)
                + nl.join(walk) + "\n"
                + "".join(f"const {t} x{i} = p{i}[op{i}];\n" for i, t in enumerate(types))
                + "".join(f"{t} y{j};\n" for j, t in enumerate(outs))
                + f"{{\n{self._body(_RAW_LOAD, _RAW_STORE)}\n}}\n"
                + "".join(f"{store}q{j}[oq{j}] = y{j};\n" for j in range(len(outs)))
                + "}")
        return merge.Kernel(("strided", self, rank, shift, narrow), tuple(params), body,
                            CONVERSIONS)


def _word(dtype: str) -> tuple[str, int]:
    """The word a vector of `VECTOR` elements of `dtype` moves in, and how many of them."""
    size = ITEMSIZE[dtype] * VECTOR
    return ("uint2", 1) if size == 8 else ("uint4", size // 16)


def expression(op: str, dtype: str, attrs: Mapping[str, Any]) -> str | None:
    """`op`'s C expression with its attributes filled in (its result of dslc dtype `dtype`),
    or None where no kernel of this module computes it."""
    expr = POINTWISE.get(op) or ALONG_AXIS.get(op) or BROADCASTS.get(op)
    if expr is None or (op == "cast" and dtype == "bool"):
        return None
    values = {k: _literal(v) for k, v in attrs.items()
              if isinstance(v, float | int) and not isinstance(v, bool)}
    try:
        return expr.format(**values)
    except KeyError:  # an attribute that is no number
        return None


def plan_of(nodes: Mapping[str, Node], members: Sequence[str], inputs: Sequence[str],
            outputs: Sequence[str]) -> Plan | str:
    """`plan` for a step or group given by the names of its members, inputs and outputs, with
    the attributes its nodes hold (a pointwise op's attributes depend on no dim)."""
    nodes_of = [nodes[n] for n in members]
    return plan(nodes_of, [nodes[i] for i in inputs], outputs, {n.name: n.attrs for n in nodes_of})


def plan(members: Sequence[Node], inputs: Sequence[Node], outputs: Sequence[str],
         attrs: Mapping[str, Mapping[str, Any]]) -> Plan | str:
    """The kernel of a step whose ops are `members` (in order), reading `inputs` and storing
    `outputs`, with each member's attributes at the sizes run (`attrs`, by member name); or
    why one kernel cannot compute it."""
    given = {n.name: n for n in inputs}
    index = {n.name: j for j, n in enumerate(members)}
    outs = [members[index[o]] for o in outputs if o in index]
    if len(outs) != len(outputs) or not outs:
        return "it stores a value none of its ops computes"
    if any(o.type.shape != outs[0].type.shape for o in outs):
        return "its results differ in shape (one kernel walks one shape)"
    operands: list[Operand] = []
    sources: dict[tuple[str, tuple[int, int] | None], str] = {}
    built: list[Member] = []
    for node in members:
        expr = expression(node.op, node.type.dtype, attrs[node.name])
        if expr is None:
            return f"`{node.op}` has no expression in one pointwise kernel"
        read = {given[i].type.dtype for i in node.inputs if i in given}
        if node.op == "cast":  # an integer operand read through a cast only
            read -= set(INTEGERS)
        dtypes = {node.type.dtype, *read}
        if not dtypes <= set(DTYPES):  # (DTYPES has no integer)
            return f"the kernel takes no {'/'.join(sorted(dtypes - set(DTYPES)))} (integers stay exact)"
        refs = []
        for k, name in enumerate(node.inputs):
            if name in index:
                refs.append(f"v{index[name]}")
                continue
            if given[name].op == "scalar":  # a constant: in the source, not an argument
                refs.append(_scalar(given[name]))
                continue
            along = None
            if node.op in ALONG_AXIS and k == 1 and given[name].type.rank == 1:
                rank = node.type.rank  # a vector along `axis` of x (any other b broadcasts)
                along = (int(attrs[node.name]["axis"]) % rank, rank)
            key = (name, along)
            if key not in sources:
                sources[key] = f"x{len(operands)}"
                operands.append(Operand(name, given[name].type.dtype, along))
            refs.append(sources[key])
        virtual = node.name not in outputs
        built.append(Member(expr, tuple(refs), stored_dtype(node, virtual)))
    if len(operands) + len(outs) > MOST_OPERANDS:
        return f"it reads {len(operands)} operands (one kernel takes {MOST_OPERANDS - len(outs)})"
    return Plan(tuple(operands), tuple(built), tuple(index[o] for o in outputs),
                tuple(o.type.dtype for o in outs))


def run(p: Plan, xs: Sequence[Any], ys: Sequence[Any]) -> None:
    """The kernel over its operands (CuPy arrays in the order of `p.operands`; a step's scalars
    are constants of the source) into its results (arrays of one shape, any strides)."""
    views = [operand_view(x, o) for x, o in zip(xs, p.operands, strict=True)]
    views = [x.copy() if any(overlaps(x, y) for y in ys) else x for x in views]
    broadcast = _vectorizable(p, views, ys)
    if broadcast is None:
        _strided(p, views, ys)
        return
    n = ys[0].size
    blocks = grid_blocks(ceil_div(n, VECTOR))
    kernel = _vector_kernel(p, tuple(broadcast))
    kernel((blocks,), (256,), (*views, *ys, np.int64(n)))


def _strided(p: Plan, xs: Sequence[Any], ys: Sequence[Any]) -> None:
    """The kernel of `Plan.strided_kernel` over the operands broadcast to the results' shape."""
    part = strided_part(p, xs, ys)
    if part is not None:
        merge.run([part])


def strided_part(p: Plan, xs: Sequence[Any], ys: Sequence[Any],
                 shift: tuple[Any, int, int] | None = None) -> merge.Part | None:
    """The strided kernel over these operands (views as `operand_view` gives them) into these
    results, as a part of a merged launch; None where it has nothing to compute. `shift`
    (at, axis, rows): the results stored `at[0]` further along `axis`, rows past [0, rows)
    dropped (`Plan.strided_kernel`)."""
    import cupy

    n = ys[0].size
    if n == 0:
        return None
    arrays = [cupy.broadcast_to(x, ys[0].shape) for x in xs] + list(ys)
    dims = list(ys[0].shape) or [1]
    strides = [[st // a.itemsize for st in (a.strides or (0,))] for a in arrays]
    if shift is None:  # the shifted axis keeps its place
        dims, strides = coalesced(dims, strides)
    # 32-bit indices where no index, offset or index plus the grid's stride passes 2^31
    narrow = n < 2**30 and all(sum((d - 1) * abs(st) for d, st in zip(dims, s, strict=True))
                               < 2**31 for s in strides)
    at, axis, rows = shift if shift is not None else (None, None, 0)
    return merge.Part(_strided_kernel(p, len(dims), axis, narrow),
                      (*arrays, np.int64(n), *(np.int64(d) for d in dims),
                       *(np.int64(st) for s in strides for st in s),
                       *(np.int64(v) for v in (magic_args(dims) if narrow else ())),
                       *((at, np.int64(rows)) if shift is not None else ())), grid_blocks(n))


def magic(d: int) -> tuple[int, int]:
    """(m, h) such that n // d == (umulhi(n, m) + n) >> h for every 0 <= n < 2^31 (the
    round-up method of division by an invariant integer: h = ceil(log2 d), m = floor(2^32 *
    (2^h - d) / d) + 1, below 2^32 as 2^h - d < d)."""
    h = (d - 1).bit_length()
    return ((1 << 32) * ((1 << h) - d) // d + 1, h)


def magic_args(dims: Sequence[int]) -> list[int]:
    """The narrow strided kernel's magic numbers: m and h of each axis but the outermost."""
    return [v for d in dims[1:] for v in magic(d)]


def coalesced(dims: Sequence[int], strides: Sequence[Sequence[int]]) -> tuple[list[int], list[list[int]]]:
    """The shape with its axes of one element dropped and each axis merged into the one outside
    it where every array steps over the pair as over one axis (stride outside = stride inside *
    size inside): fewer divisions per element. BERT's padding mask broadcast to [B, H, S, S]
    from [B, 1, 1, S] walks [B, H * S, S]. The same elements at the same offsets."""
    kept = [r for r, d in enumerate(dims) if d != 1] or [len(dims) - 1]
    out_dims = [dims[kept[0]]]
    out = [[s[kept[0]]] for s in strides]
    for r in kept[1:]:
        if all(o[-1] == s[r] * dims[r] for o, s in zip(out, strides, strict=True)):
            out_dims[-1] *= dims[r]
            for o, s in zip(out, strides, strict=True):
                o[-1] = s[r]
        else:
            out_dims.append(dims[r])
            for o, s in zip(out, strides, strict=True):
                o.append(s[r])
    return out_dims, out


def part(p: Plan, xs: Sequence[Any], ys: Sequence[Any]) -> merge.Part | None:
    """`run` as a part of a merged launch where it runs the strided kernel on these arrays
    (small results; no operand overlapping a result), else None: then `run` it alone."""
    views = [operand_view(x, o) for x, o in zip(xs, p.operands, strict=True)]
    if any(overlaps(x, y) for x in views for y in ys) or \
            _vectorizable(p, views, ys) is not None or ys[0].size == 0:
        return None
    return strided_part(p, views, ys)


def operand_view(x: Any, o: Operand) -> Any:
    """An operand's array as the kernel reads it: a vector an op reads along an axis, [C], as
    [1, .., C, .., 1] at the op's rank (broadcasting lines it up); any other as it is."""
    if o.along is None:
        return x
    axis, rank = o.along
    return x.reshape((1,) * axis + (x.shape[0],) + (1,) * (rank - axis - 1))


VECTOR_AT_LEAST = 1 << 16  # elements: below, the strided kernel (launch costs alike)


def _vectorizable(p: Plan, xs: Sequence[Any], ys: Sequence[Any]) -> list[bool] | None:
    """Which operands the vector kernel reads as one element (None: it cannot run this step):
    results of one shape, of `VECTOR_AT_LEAST` elements or more, each operand of that shape
    or of one element; every array not of one element dense and laid out alike (any memory
    order: the attention's output is stored BSHD, read as [B, H, S, D]), and aligned to its
    words. (NumPy arrays too: the host tests ask.)"""
    shape = ys[0].shape
    if ys[0].size < VECTOR_AT_LEAST or any(y.shape != shape for y in ys):
        return None
    broadcast = [x.size == 1 for x in xs]
    dense = [x for x, b in zip(xs, broadcast, strict=True) if not b] + list(ys)
    dtypes = [o.dtype for o, b in zip(p.operands, broadcast, strict=True) if not b]
    dtypes += list(p.output_dtypes)
    order = _dense_order(ys[0])
    for a, dtype in zip(dense, dtypes, strict=True):
        word = 8 if ITEMSIZE[dtype] == 1 else 16
        address = a.data.ptr if hasattr(a.data, "ptr") else a.ctypes.data
        if a.shape != shape or order is None or _dense_order(a) != order or address % word:
            return None
    return broadcast


def _dense_order(a: Any) -> tuple[int, ...] | None:
    """The array's strides in elements where its elements fill their span without gaps or
    overlaps (so element i of the memory order is element i of every array laid out alike),
    else None."""
    strides = tuple(st // a.itemsize for st in a.strides)
    expect = 1
    for d, st in sorted(((d, st) for d, st in zip(a.shape, strides, strict=True) if d != 1),
                        key=lambda t: t[1]):
        if st != expect:
            return None
        expect *= d
    return tuple(st if d != 1 else 0 for d, st in zip(a.shape, strides, strict=True))


@cache
def _vector_kernel(p: Plan, broadcast: tuple[bool, ...]) -> Any:
    import cupy

    source = p.vector_source("dslc_vector", broadcast)
    name = f"dslc_vector_{zlib.crc32(source.encode()):08x}"
    return cupy.RawKernel(PREAMBLE + CONVERSIONS + source.replace("dslc_vector(", f"{name}(", 1),
                          name)


def overlaps(x: Any, y: Any) -> bool:
    """Whether x's bytes meet y's without being the same elements in the same order (an
    elementwise kernel may read and write one buffer only element for element)."""
    if not x.size or not y.size:
        return False
    if (x.data.ptr, x.shape, x.strides) == (y.data.ptr, y.shape, y.strides):
        return False

    def span(t: Any) -> tuple[int, int]:
        lo = t.data.ptr + sum((n - 1) * s for n, s in zip(t.shape, t.strides, strict=True)
                              if s < 0)
        hi = t.data.ptr + sum((n - 1) * s for n, s in zip(t.shape, t.strides, strict=True)
                              if s > 0) + t.itemsize
        return lo, hi

    (xl, xh), (yl, yh) = span(x), span(y)
    return xl < yh and yl < xh


def _literal(v: float) -> str:
    """An f32 value as C source: the shortest digits that round to it, or the bits of NaN and
    the infinities (NVRTC compiles without the headers that name them)."""
    f = float(v)
    if f != f:
        return "__int_as_float(0x7fc00000)"
    if abs(f) == float("inf"):
        return "__uint_as_float(0x7f800000u)" if f > 0 else "__uint_as_float(0xff800000u)"
    return f"{f!r}f"


def _scalar(node: Node) -> str:
    """A scalar operand's value as the reference holds it (rounded to its dtype), in C."""
    import numpy as np

    from dslc.ir.interp import NUMPY_DTYPES

    value = float(np.asarray(node.attrs["value"], dtype=NUMPY_DTYPES[node.type.dtype]))
    return f"({_literal(value)})"


@cache
def _strided_kernel(p: Plan, rank: int, shift: int | None = None,
                    narrow: bool = False) -> merge.Kernel:
    return p.strided_kernel(rank, shift, narrow)
