"""One pointwise kernel per fallback step (dslc/backend/fused.py), without a GPU: which steps it
takes and what it holds each value in, a pointwise group cuDNN rejects compiled as one kernel
step, such a step read back from a bundle (and a step one kernel cannot compute refused), and
run in the arena oracle against the reference; its fp8 conversions compiled on the host with
g++ against ml_dtypes (its numbers on the GPU: tests/gpu/test_fused_gpu.py)."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
import zlib
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from dslc.backend import fused, merge
from dslc.backend.target import load_target
from dslc.compile import stage
from dslc.emit import bundle as emit_bundle
from dslc.fuzz import arena
from dslc.fuzz.oracle import relative_error
from dslc.ir import interp
from dslc.pipeline import lower_and_fuse
from dslc.runtime.bundle import read
from dslc.runtime.fields import BundleError
from dslc.runtime.records import Bundle
from dslc.runtime.schedule import Schedule
from tests.helpers import check_source, model_snippet, rng

CHAIN = model_snippet("  input x: [4, 6, 5]\n  input s: [5]\n"
                      "  output y = sigmoid(relu(x * s) + 1.5)", precision="io=f16")


def _lowered(text: str, tmp_path: Path) -> tuple[object, object, object]:
    model = check_source(text, tmp_path).model
    lowered, plan = lower_and_fuse(model)
    return model, lowered, plan


def _pointwise_group(graph: object, plan: object) -> object:
    return next(g for g in plan.groups if len(g.nodes) > 1)  # type: ignore[attr-defined]


def _chain_plan(tmp_path: Path) -> tuple[object, object, fused.Plan]:
    """CHAIN lowered, its pointwise group, and that group's kernel."""
    _, lowered, plan = _lowered(CHAIN, tmp_path)
    group = _pointwise_group(lowered, plan)
    p = fused.plan_of(lowered.by_name(), group.nodes, group.inputs, group.outputs)  # type: ignore[attr-defined]
    assert isinstance(p, fused.Plan)
    return lowered, group, p


def test_a_pointwise_chain_is_one_plan_holding_inner_values_in_the_intermediate_dtype(
        tmp_path: Path) -> None:
    _, group, p = _chain_plan(tmp_path)
    last = len(group.nodes) - 1  # type: ignore[attr-defined]
    assert [m.dtype for m in p.members] == ["f32"] * last + ["f16"]
    # the scalar 1.5 is a constant of the source, not an argument
    assert [o.name for o in p.operands] == ["x", "s"] and "(1.5f)" in p.source()[2]
    assert p.stores == (last,) and p.output_dtypes == ("f16",)
    params, outs, body = p.source()
    assert params.startswith("float16 x0") and outs == "float16 y0"
    assert body.count("f16_round(") == 1  # only the stored value is rounded to f16


@pytest.mark.parametrize(("body", "why"), [
    ("  input x: [4, 6]\n  output y = (x * 2) + 1", None),
    ("  input x: [4, 6]\n  input i: i32[4, 6]\n  output y = x + cast(i, f32)", None),  # cast only
    ("  input x: [4, 6]\n  input i: i32[4, 6]\n  output y = cast(i * 2, f32) + x", "takes no i32"),
    ("  input x: [4, 6]\n  input i: i32[4, 6]\n  output y = cast(cast(x, i32) + i, f32)",
     "takes no i32"),
    ("  input x: [4, 6]\n  output y = reduce_sum(x, axes=[1])", "no expression"),
])
def test_what_one_kernel_computes_and_what_it_refuses(body: str, why: str | None,
                                                      tmp_path: Path) -> None:
    _, lowered, _ = _lowered(model_snippet(body), tmp_path)
    computed = [n for n in lowered.nodes if n.op not in ("input", "param", "scalar")]
    names = {n.name for n in computed}
    inputs = [n for n in lowered.nodes if n.name not in names
              and any(n.name in c.inputs for c in computed)]
    p = fused.plan(computed, inputs, [computed[-1].name], {n.name: n.attrs for n in computed})
    assert (isinstance(p, fused.Plan) if why is None else why in str(p)), p


@pytest.mark.parametrize(("b", "axis", "along"), [
    ("[6]", 1, (1, 3)), ("[6]", -2, (1, 3)),  # a vector along an axis, counted from either end
    ("[1, 6, 1]", 1, None), ("[]", 1, None)])  # any other b broadcasts as it is
def test_a_bias_is_given_along_its_axis_only_where_it_is_a_vector(
        b: str, axis: int, along: tuple[int, int] | None, tmp_path: Path) -> None:
    _, lowered, _ = _lowered(model_snippet(f"  input x: [4, 6, 5]\n  input b: {b}\n"
                                           f"  output y = relu(bias_add(x, b, axis={axis}))"),
                             tmp_path)
    computed = [n for n in lowered.nodes if n.op in ("bias_add", "relu")]
    inputs = [n for n in lowered.nodes if n.op == "input"]
    p = fused.plan(computed, inputs, [computed[-1].name], {n.name: n.attrs for n in computed})
    assert isinstance(p, fused.Plan)
    assert [o.along for o in p.operands] == [None, along]


def test_results_of_two_shapes_are_not_one_kernel(tmp_path: Path) -> None:
    _, lowered, _ = _lowered(model_snippet("  input x: [4, 6]\n  input v: [6]\n"
                                           "  let a = v * 2\n  output y = x + a\n  output z = a"),
                             tmp_path)
    computed = [n for n in lowered.nodes if n.op not in ("input", "param", "scalar")]
    inputs = [n for n in lowered.nodes if n.op in ("input", "scalar")]
    p = fused.plan(computed, inputs, [n.name for n in computed],
                   {n.name: n.attrs for n in computed})
    assert "differ in shape" in str(p)


def _compiled_with_a_rejected_group(tmp_path: Path) -> tuple[object, object]:
    """CHAIN compiled deviceless, its pointwise group then treated as cuDNN rejecting it."""
    model, lowered, plan = _lowered(CHAIN, tmp_path)
    compiled = stage.compile_model(model, lowered, plan, load_target("h200"))
    group = _pointwise_group(lowered, plan)
    for key in [k for k in compiled.specs if k[1] == group.signature]:  # as _compile drops them
        compiled.specs.pop(key)
        compiled.builds.pop(key)
    steps = stage._split(compiled, group, None, None, "No valid engine configs")
    return compiled, steps


def test_a_pointwise_group_cudnn_rejects_is_one_kernel_step(tmp_path: Path) -> None:
    _, steps = _compiled_with_a_rejected_group(tmp_path)
    assert [s.kind for s in steps] == ["kernel"]
    assert len(steps[0].group.nodes) == 4
    assert "No valid engine configs" in steps[0].reason and "its 4 ops" in steps[0].reason


def _bundle_of(compiled: object, steps: list[object], tmp_path: Path) -> Path:
    compiled.steps = [s for s in compiled.steps  # type: ignore[attr-defined]
                      if s.kind != "graph" or len(s.group.nodes) == 1] + steps
    order = {n.name: i for i, n in enumerate(compiled.graph.nodes)}  # type: ignore[attr-defined]
    compiled.steps.sort(key=lambda s: order[s.group.nodes[0]])  # type: ignore[attr-defined]
    path = tmp_path / "m.bundle"
    emit_bundle.write(path, emit_bundle.payload(compiled))
    return path


def test_a_fused_kernel_step_runs_in_the_arena_as_the_reference_computes(tmp_path: Path) -> None:
    compiled, steps = _compiled_with_a_rejected_group(tmp_path)
    program = Schedule(read(_bundle_of(compiled, steps, tmp_path)))
    kernel = next(s for s in program.steps if s.kind == "kernel")
    assert len(kernel.nodes) == 4 and program.pointwise_kernel(kernel) is not None
    assert set(kernel.nodes) - set(kernel.outputs) <= program.virtual()
    g = rng("fused arena")
    inputs = {"x": g.standard_normal((4, 6, 5)).astype(np.float32),
              "s": g.standard_normal(5).astype(np.float32)}
    want = interp.run(program.graph, inputs, {}, program.env, virtual=program.virtual())
    got = arena.run(program, {}, inputs, {})
    assert relative_error(got["y"], want["y"]) == 0.0
    # the inner values are f32, not f16: rounded there, sigmoid's input would move
    rounded = interp.run(program.graph, inputs, {}, program.env)
    assert relative_error(rounded["y"], want["y"]) > 0.0


def test_a_bundle_whose_kernel_step_one_kernel_cannot_compute_is_refused(tmp_path: Path) -> None:
    model, lowered, plan = _lowered(model_snippet(
        "  input x: [4, 6]\n  output y = reduce_sum(relu(x), axes=[1], keepdims=true)"), tmp_path)
    compiled = stage.compile_model(model, lowered, plan, load_target("h200"))
    data = emit_bundle.payload(compiled)
    nodes = [n for s in data["steps"] for n in s["nodes"]]
    inputs = data["steps"][0]["inputs"]
    merged = {**data["steps"][0], "kind": "kernel", "nodes": nodes, "inputs": inputs,
              "outputs": data["steps"][-1]["outputs"]}
    with pytest.raises(BundleError, match="not ops one fallback kernel computes"):
        Bundle.from_data({**data, "steps": [merged]})


# -- the kernels' C, compiled on the host ---------------------------------------------------------
# What CUDA and CuPy give a kernel, for g++: the bit casts, and CuPy's float16 (GCC's _Float16
# converts to and from float rounding to nearest even, as CuPy's does).
_SHIMS = r"""
#include <cmath>
#include <cstring>
#include <algorithm>
#define DSLC_HOST
#define __device__
#define __forceinline__ inline
#define NAN __builtin_nanf("")
typedef _Float16 float16;
static inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
static inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
static inline unsigned int __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
static inline unsigned __umulhi(unsigned a, unsigned b) {
  return (unsigned)(((unsigned long long)a * b) >> 32);
}
using std::max;
"""
_C_TYPES = {"float32": "float", "float16": "float16", "uint16": "unsigned short",
            "uint8": "unsigned char", "bool": "bool"}


def host_kernels(plans: list[fused.Plan], folder: Path) -> ctypes.CDLL:
    """The plans' kernels as host functions `run{i}` over arrays of one length (operands
    broadcast by the caller): CuPy's elementwise loop written out around the body the GPU
    compiles, all in one library (one g++ run)."""
    from dslc.backend.cuda import PREAMBLE

    functions = []
    for k, p in enumerate(plans):
        params, outs, body = p.source()
        decls = [d.split() for d in f"{params}, {outs}".split(", ")]
        n_in = len(p.operands)
        loads = "".join(f"{_C_TYPES[t]} {n} = ((const {_C_TYPES[t]}*)a[{i}])[i];\n"
                        for i, (t, n) in enumerate(decls[:n_in]))
        outs_c = "".join(f"{_C_TYPES[t]} {n};\n" for t, n in decls[n_in:])
        stores = "".join(f"(({_C_TYPES[t]}*)a[{n_in + i}])[i] = {n};\n"
                         for i, (t, n) in enumerate(decls[n_in:]))
        functions.append(f'extern "C" void run{k}(void** a, long count) {{\n'
                         f"for (long i = 0; i < count; ++i) {{\n{loads}{outs_c}{{\n{body}\n}}\n"
                         f"{stores}}}\n}}\n")
    source = _SHIMS + PREAMBLE + fused.CONVERSIONS + "".join(functions)
    name = f"kernels_{zlib.crc32(source.encode()):08x}"  # a loaded library is never rewritten
    (folder / f"{name}.cpp").write_text(source)
    subprocess.run(["g++", "-O1", "-shared", "-fPIC", "-o", str(folder / f"{name}.so"),
                    str(folder / f"{name}.cpp")], check=True)
    lib = ctypes.CDLL(str(folder / f"{name}.so"))
    for k in range(len(plans)):
        getattr(lib, f"run{k}").argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_long]
    return lib


def run_on_host(lib: ctypes.CDLL, k: int, arrays: list[np.ndarray]) -> None:
    ptrs = (ctypes.c_void_p * len(arrays))(*[a.ctypes.data for a in arrays])
    getattr(lib, f"run{k}")(ptrs, arrays[-1].size)
_ENTRY = r"""
extern "C" void encode(const float* x, unsigned char* y, int n, int e5) {
  for (int i = 0; i < n; ++i) y[i] = e5 ? f_e5m2(x[i]) : f_e4m3(x[i]);
}
extern "C" void decode(const unsigned char* x, float* y, int n, int e5) {
  for (int i = 0; i < n; ++i) y[i] = e5 ? e5m2_f(x[i]) : e4m3_f(x[i]);
}
"""
FORMATS = {"f8e4m3": (ml_dtypes.float8_e4m3fn, 448.0, 0), "f8e5m2": (ml_dtypes.float8_e5m2, 57344.0, 1)}


@pytest.fixture(scope="module")
def host_fp8(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    if shutil.which("g++") is None:
        pytest.skip("no g++ here to compile the kernels' fp8 conversions for the host")
    folder = tmp_path_factory.mktemp("fp8")
    (folder / "fp8.cpp").write_text(_SHIMS + fused.CONVERSIONS + _ENTRY)
    subprocess.run(["g++", "-O1", "-shared", "-fPIC", "-o", str(folder / "fp8.so"),
                    str(folder / "fp8.cpp")], check=True)
    lib = ctypes.CDLL(str(folder / "fp8.so"))
    for fn in (lib.encode, lib.decode):  # pointers as pointers (a bare int would be a C int)
        fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    return lib


@pytest.mark.parametrize("dtype", sorted(FORMATS))
def test_the_kernels_fp8_bytes_decode_as_ml_dtypes_does(dtype: str, host_fp8: ctypes.CDLL) -> None:
    kind, _, e5 = FORMATS[dtype]
    bits = np.arange(256, dtype=np.uint8)
    got = np.zeros(256, np.float32)
    host_fp8.decode(bits.ctypes.data, got.ctypes.data, 256, e5)
    want = bits.view(kind).astype(np.float32)
    assert np.array_equal(got, want, equal_nan=True)


@pytest.mark.parametrize("dtype", sorted(FORMATS))
def test_the_kernels_fp8_encoding_rounds_as_ml_dtypes_does(dtype: str,
                                                          host_fp8: ctypes.CDLL) -> None:
    """To nearest, ties to even, through the subnormals; e4m3 saturates at 448 (as the
    reference clips before converting: ml_dtypes alone would give NaN), e5m2 overflows to
    infinity from its first tie past 57344; NaN stays NaN with its sign."""
    kind, top, e5 = FORMATS[dtype]
    g = rng("host fp8", dtype)
    every_value = bits_of_all = np.arange(256, dtype=np.uint8).view(kind).astype(np.float32)
    finite = every_value[np.isfinite(every_value)]
    halfway = (np.sort(finite)[1:] + np.sort(finite)[:-1]) / 2  # every tie between neighbours
    edges = np.array([top * 29 / 28, top * 15 / 14, top * 1.2, 1e30, np.inf, 3.4e38, 1e-40,
                      np.nan], np.float32)
    x = np.concatenate([bits_of_all, halfway, np.nextafter(halfway, np.float32(np.inf)),
                        np.nextafter(halfway, np.float32(-np.inf)), edges, -edges,
                        (g.standard_normal(100_000) * np.exp2(g.uniform(-22, 18, 100_000)))
                        ]).astype(np.float32)
    got = np.zeros(x.shape, np.uint8)
    host_fp8.encode(x.ctypes.data, got.ctypes.data, x.size, e5)
    with np.errstate(invalid="ignore", over="ignore"):
        want = (np.clip(x, -top, top) if e5 == 0 else x).astype(kind).view(np.uint8)
    nan = np.isnan(x)
    assert np.array_equal(np.isnan(got.view(kind).astype(np.float32)), nan)
    assert np.array_equal(got[nan] & 0x80, np.signbit(x[nan]).astype(np.uint8) << 7)
    bad = np.flatnonzero((got != want) & ~nan)
    assert bad.size == 0, [(float(x[i]), int(got[i]), int(want[i])) for i in bad[:8]]


STORE = {"f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16}
KERNEL_STORE = {"f32": np.float32, "f16": np.float16, "bf16": np.uint16, "bool": np.bool_}


def _operands(op: str, arity: int, g: np.random.Generator) -> list[np.ndarray]:
    """Random operands, the second and third broadcast (as a GPU test's are), in the domain of
    the op (positive for log, sqrt, rsqrt and pow; 0/1 for select's mask)."""
    xs = [g.standard_normal(s).astype(np.float32) * 2 for s in [(6, 40), (1, 40), (6, 1)][:arity]]
    if op in ("log", "sqrt", "rsqrt", "pow"):
        xs[0] = np.abs(xs[0]) + np.float32(0.1)
    if op == "select":
        xs[0] = (xs[0] > 0).astype(np.float32)
    return xs


@pytest.fixture(scope="module")
def host_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("g++") is None:
        pytest.skip("no g++ here to compile the kernels for the host")
    return tmp_path_factory.mktemp("kernels")


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_every_pointwise_kernel_computes_its_ops_reference_on_the_host(dtype: str,
                                                                      host_folder: Path) -> None:
    """Each op's generated kernel (the C the GPU compiles, here for the host) on operands stored
    in `dtype` (bf16 as its bits) equals the op's numpy reference on the same stored values,
    rounded to `dtype` (a comparison's result exactly)."""
    from dslc.ops import OPS

    g = rng("host pointwise", dtype)
    plans, cases = [], []
    for op in fused.POINTWISE:
        opdef = OPS[op]
        assert opdef.reference is not None
        arity = len(opdef.tensor_params)
        attrs = {p.name: p.default for p in opdef.params if not p.is_tensor}
        attrs = {**attrs, "dtype": dtype} if op == "cast" else attrs
        ydtype = "bool" if op.startswith("cmp_") else dtype
        expr = fused.expression(op, ydtype, attrs)
        assert expr is not None, op
        operands = tuple(fused.Operand(f"x{i}", dtype) for i in range(arity))
        plans.append(fused.Plan(operands, (fused.Member(expr, tuple(f"x{i}" for i in range(arity)),
                                                        ydtype),), (0,), (ydtype,)))
        xs = [x.astype(STORE[dtype]) for x in _operands(op, arity, g)]
        want = np.asarray(opdef.reference([x.astype(np.float32) for x in xs], attrs))
        cases.append((op, xs, want, ydtype))
    lib = host_kernels(plans, host_folder)
    for k, (op, xs, want, ydtype) in enumerate(cases):
        full = [np.ascontiguousarray(np.broadcast_to(x, want.shape)) for x in xs]
        bits = [x.view(np.uint16) if dtype == "bf16" else x for x in full]
        y = np.zeros(want.shape, KERNEL_STORE[ydtype])
        run_on_host(lib, k, [*bits, y])
        if ydtype == "bool":
            assert np.array_equal(y, want), op
            continue
        got = (y.view(ml_dtypes.bfloat16) if dtype == "bf16" else y).astype(np.float32)
        rounded = want.astype(STORE[dtype]).astype(np.float32)
        err = relative_error(got, rounded)
        assert err <= {"f32": 1e-6, "f16": 1e-3, "bf16": 8e-3}[dtype], (op, err)


def test_a_fused_chain_computes_what_the_reference_computes_on_the_host(tmp_path: Path,
                                                                       host_folder: Path) -> None:
    """CHAIN's group (mul, relu, add, sigmoid into f16, inner values f32) as its kernel on the
    host, against the reference executor with the group's inner values virtual."""
    lowered, group, p = _chain_plan(tmp_path)
    g = rng("host chain")
    inputs = {"x": g.standard_normal((4, 6, 5)).astype(np.float32),
              "s": g.standard_normal(5).astype(np.float32)}
    virtual = set(group.nodes) - set(group.outputs)
    want = interp.run(lowered, inputs, {}, None, virtual=virtual,
                      keep=lambda n: n.name in group.inputs)
    lib = host_kernels([p], host_folder)
    operands = [np.ascontiguousarray(np.broadcast_to(want[o.name], (4, 6, 5)))
                if o.name in want else np.full((4, 6, 5), np.float32(
                    lowered.by_name()[o.name].attrs["value"]), np.float32) for o in p.operands]
    y = np.zeros((4, 6, 5), np.float16)
    run_on_host(lib, 0, [*operands, y])
    assert relative_error(y.astype(np.float32), want["y"].astype(np.float32)) <= 2.0 ** -11


def test_a_quantising_multiply_and_cast_give_the_references_bytes_on_the_host(
        host_folder: Path) -> None:
    g = rng("host quantise")
    x = (g.standard_normal(4096) * 3).astype(np.float16)
    scale = np.float32(448.0 / np.abs(x.astype(np.float32)).max() * 1.5)  # some saturate
    members = (fused.Member("a * b", ("x0", "x1"), "f32"), fused.Member("a", ("v0",), "f8e4m3"))
    p = fused.Plan((fused.Operand("x", "f16"), fused.Operand("s", "f32")), members, (1,),
                   ("f8e4m3",))
    lib = host_kernels([p], host_folder)
    y = np.zeros(x.shape, np.uint8)
    run_on_host(lib, 0, [x, np.full(x.shape, scale, np.float32), y])
    want = np.clip(x.astype(np.float32) * scale, -448, 448).astype(ml_dtypes.float8_e4m3fn)
    assert np.array_equal(y, want.view(np.uint8))


# -- the vector kernel (Plan.vector_source), compiled on the host ---------------------------------
_GRID = r"""
#define __global__
struct dim3_ { unsigned x; };
static dim3_ blockIdx = {0}, threadIdx = {0}, gridDim = {1}, blockDim = {1};
struct uint2 { unsigned x, y; };
struct uint4 { unsigned x, y, z, w; };
"""


def host_part(kernel: merge.Kernel, name: str, folder: Path) -> Any:
    """One part's kernel (`backend.merge`) compiled on the host by g++, as a C function `name`
    run by one block of one thread (its last argument, the part's blocks, 1), after the
    conversions every kernel may use (`cuda.PREAMBLE`)."""
    from dslc.backend.cuda import PREAMBLE

    source = _SHIMS + _GRID + PREAMBLE + merge.source([kernel], name)
    lib = f"{name}_{zlib.crc32(source.encode()):08x}"
    (folder / f"{lib}.cpp").write_text(source)
    subprocess.run(["g++", "-O1", "-shared", "-fPIC", "-o", str(folder / f"{lib}.so"),
                    str(folder / f"{lib}.cpp")], check=True)
    return getattr(ctypes.CDLL(str(folder / f"{lib}.so")), name)


# f16, bf16 and f32 operands into an f16 and a bool result (a SiLU between): the raw kernels'
# data movement checked against the elementwise loop
MIXED = fused.Plan(
    (fused.Operand("a", "f16"), fused.Operand("b", "bf16"), fused.Operand("c", "f32")),
    (fused.Member("a * b", ("x0", "x1"), "f32"),
     fused.Member("a / (1.0f + expf(-a))", ("v0",), "f32"),
     fused.Member("a + b", ("v1", "x2"), "f16"),
     fused.Member("(a > b)", ("v2", "x2"), "bool")),
    (2, 3), ("f16", "bool"))


def host_vector_kernels(plans: list[tuple[fused.Plan, tuple[bool, ...]]],
                        folder: Path) -> ctypes.CDLL:
    """The plans' vector kernels as host functions `vec{i}(pointers..., n)`: one block of one
    thread, which walks every vector and then the tail."""
    from dslc.backend.cuda import PREAMBLE

    source = _SHIMS + _GRID + PREAMBLE + fused.CONVERSIONS + "".join(
        p.vector_source(f"vec{k}", b) for k, (p, b) in enumerate(plans))
    name = f"vector_{zlib.crc32(source.encode()):08x}"
    (folder / f"{name}.cpp").write_text(source)
    subprocess.run(["g++", "-O1", "-shared", "-fPIC", "-o", str(folder / f"{name}.so"),
                    str(folder / f"{name}.cpp")], check=True)
    return ctypes.CDLL(str(folder / f"{name}.so"))


def run_vector_on_host(lib: ctypes.CDLL, k: int, arrays: list[np.ndarray], n: int) -> None:
    fn = getattr(lib, f"vec{k}")
    fn.argtypes = [ctypes.c_void_p] * len(arrays) + [ctypes.c_longlong]
    fn(*[a.ctypes.data for a in arrays], n)


@pytest.mark.parametrize("n", [4096, 4096 + 5, 3])  # whole vectors; a tail; only a tail
def test_the_vector_kernel_computes_what_the_elementwise_kernel_does(
        n: int, host_folder: Path) -> None:
    """A quantising multiply by a scale of one element (f16 in, e4m3 out), and a chain reading
    f16, bf16 and f32 operands into an f16 and a bool result: the vector kernel's bytes are the
    elementwise kernel's (whose ops are checked against their references above), with the
    one-element operand read once and the elements past the last whole vector computed too."""
    g = rng("host vector", n)
    quantise = fused.Plan(
        (fused.Operand("x", "f16"), fused.Operand("s", "f32")),
        (fused.Member("a * b", ("x0", "x1"), "f32"), fused.Member("a", ("v0",), "f8e4m3")),
        (1,), ("f8e4m3",))
    chain = MIXED
    lib = host_vector_kernels([(quantise, (False, True)), (chain, (False, False, False))],
                              host_folder)
    elementwise = host_kernels([quantise, chain], host_folder)
    x = (g.standard_normal(n) * 3).astype(np.float16)
    scale = np.array([40.0], np.float32)
    got = np.zeros(n, np.uint8)
    run_vector_on_host(lib, 0, [x, scale, got], n)
    want = np.zeros(n, np.uint8)
    run_on_host(elementwise, 0, [x, np.full(n, scale[0], np.float32), want])
    assert np.array_equal(got, want) and np.unique(got).size > min(n, 20) // 2
    a = g.standard_normal(n).astype(np.float16)
    b = g.standard_normal(n).astype(ml_dtypes.bfloat16).view(np.uint16)
    c = g.standard_normal(n).astype(np.float32)
    outs = [np.zeros(n, np.float16), np.zeros(n, np.uint8)]
    run_vector_on_host(lib, 1, [a, b, c, *outs], n)
    wants = [np.zeros(n, np.float16), np.zeros(n, np.bool_)]
    run_on_host(elementwise, 1, [a, b, c, *wants])
    assert np.array_equal(outs[0].view(np.uint16), wants[0].view(np.uint16))
    assert np.array_equal(outs[1].astype(bool), wants[1]) and 0 < outs[1].sum() < n


def test_the_vector_kernel_takes_dense_tensors_laid_out_alike() -> None:
    """Which steps the vector kernel runs (NumPy arrays stand in for CuPy's: shapes, strides
    and addresses are what is asked): dense operands and results of one memory order, row-major
    or not (an attention's BSHD output), an operand of one element read once; not a small
    step, a strided or a differently ordered operand, nor a misaligned one."""
    quantise = fused.Plan(
        (fused.Operand("x", "f16"), fused.Operand("s", "f32")),
        (fused.Member("a * b", ("x0", "x1"), "f32"), fused.Member("a", ("v0",), "f8e4m3")),
        (1,), ("f8e4m3",))
    s = np.ones(1, np.float32)
    x = np.zeros((8, 128, 12, 64), np.float16)
    y = np.zeros(x.shape, np.uint8)
    assert fused._vectorizable(quantise, [x, s], [y]) == [False, True]
    bshd = np.zeros((8, 12, 128, 64), np.float16).transpose(0, 2, 1, 3)  # [B, S, H, D] in BHSD
    y_bshd = np.zeros((8, 12, 128, 64), np.uint8).transpose(0, 2, 1, 3)
    assert fused._vectorizable(quantise, [bshd, s], [y_bshd]) == [False, True]
    assert fused._vectorizable(quantise, [bshd, s], [y]) is None  # orders differ
    assert fused._vectorizable(quantise, [x[:, :, :, :32], s],
                               [np.zeros((8, 128, 12, 32), np.uint8)]) is None  # gaps
    small = np.zeros((4, 64), np.float16)
    assert fused._vectorizable(quantise, [small, s], [np.zeros((4, 64), np.uint8)]) is None
    raw = np.zeros(x.size * 2 + 16, np.uint8)
    odd = raw[2:2 + x.size * 2].view(np.float16).reshape(x.shape)  # 2 bytes past 16
    assert fused._vectorizable(quantise, [odd, s], [y]) is None
    big_scale = np.ones(x.shape, np.float32)  # dense, not one element: read as a vector too
    assert fused._vectorizable(quantise, [x, big_scale], [y]) == [False, False]


# -- the strided kernel (Plan.strided_source), compiled on the host ------------------------------
@pytest.mark.parametrize("narrow", [False, True])
def test_the_strided_kernel_computes_what_the_elementwise_kernel_does(
        narrow: bool, host_folder: Path) -> None:
    """Operands of any strides (a transposed f16 view, a bf16 vector broadcast along an axis,
    an f32 of one element) into an f16 result written through a transposed view and a bool
    one: the strided kernel's bytes are the elementwise kernel's over the same values laid out
    densely (one block of one thread on the host: the loop visits every element once), with
    64-bit indices and with 32-bit ones."""
    g = rng("host strided")
    chain = MIXED
    fn = host_part(chain.strided_kernel(3, narrow=narrow), "strided0", host_folder)
    shape = (3, 4, 5)
    a = (g.standard_normal((5, 4, 3)) * 2).astype(np.float16).transpose(2, 1, 0)
    b = g.standard_normal(4).astype(ml_dtypes.bfloat16).view(np.uint16).reshape(1, 4, 1)
    c = np.array([[[0.25]]], np.float32)
    y_base = np.zeros((5, 4, 3), np.float16)
    y = y_base.transpose(2, 1, 0)  # written through a transposed view
    z = np.zeros(shape, np.uint8)
    arrays = [np.broadcast_to(t, shape) for t in (a, b, c)] + [y, z]
    magic = fused.magic_args(shape) if narrow else []
    fn.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_longlong] * (1 + 3 + 5 * 3 + len(magic) + 1)
    fn(*[t.ctypes.data for t in arrays], a.size, *shape,
       *[st // t.itemsize for t in arrays for st in t.strides], *magic, 1)  # one block
    elementwise = host_kernels([chain], host_folder)
    dense = [np.ascontiguousarray(np.broadcast_to(t, shape)).ravel() for t in (a, b, c)]
    wants = [np.zeros(a.size, np.float16), np.zeros(a.size, np.bool_)]
    run_on_host(elementwise, 0, [*dense, *wants])
    assert np.array_equal(np.ascontiguousarray(y).ravel().view(np.uint16),
                          wants[0].view(np.uint16))
    assert np.array_equal(z.ravel().astype(bool), wants[1]) and 0 < z.sum() < z.size
    assert np.unique(y).size > 30  # not a constant


def test_the_strided_kernel_compiles_for_the_h200_without_a_warning() -> None:
    from dslc.backend.cuda import PREAMBLE
    from tests.helpers import nvrtc_compile

    plan = fused.Plan((fused.Operand("a", "f16"), fused.Operand("m", "bool")),
                      (fused.Member("a * b", ("x0", "x1"), "bf16"),), (0,), ("bf16",))
    for rank, narrow in ((1, False), (4, False), (1, True), (4, True)):
        source = PREAMBLE + merge.source([plan.strided_kernel(rank, narrow=narrow)], "dslc_fused")
        ok, log = nvrtc_compile(source)
        assert ok and "warning" not in log, log[:2000]


def offsets(dims: list[int], strides: list[list[int]]) -> np.ndarray:
    """Each array's offset of every element, in row-major order of `dims` (numpy's index)."""
    index = np.indices(dims).reshape(len(dims), -1)
    return np.array([np.asarray(s) @ index for s in strides])


def test_coalesced_axes_give_every_element_the_same_offsets() -> None:
    """BERT's padding mask, [B, 1, 1, S] broadcast into a row-major [B, H, S, S], walks
    [B, H * S, S]; a transposed operand keeps its axes apart; axes of one element go; random
    shapes and strides (broadcast, transposed, sliced) visit the same offsets in the same
    order."""
    assert fused.coalesced([8, 12, 128, 128], [[128, 0, 0, 1], [196608, 16384, 128, 1]]) == \
        ([8, 1536, 128], [[128, 0, 1], [196608, 128, 1]])
    assert fused.coalesced([4, 6], [[1, 4], [6, 1]]) == ([4, 6], [[1, 4], [6, 1]])
    assert fused.coalesced([1, 5, 1], [[99, 1, 7]]) == ([5], [[1]])
    assert fused.coalesced([1, 1], [[3, 2]]) == ([1], [[2]])
    assert fused.coalesced([2, 3, 4], [[12, 4, 1]]) == ([24], [[1]])
    g = rng("coalesced")
    for _ in range(300):
        dims = [int(d) for d in g.integers(1, 4, size=int(g.integers(1, 5)))]
        strides = []
        for _ in range(3):  # dense in a random axis order, stepping by 1 or 2, broadcast axes
            stride, step = [0] * len(dims), 1
            for r in reversed(g.permutation(len(dims)).tolist()):
                stride[r] = step
                step *= dims[r] * int(g.integers(1, 3))
            strides.append([0 if g.random() < 0.3 else st for st in stride])
        new_dims, new = fused.coalesced(dims, strides)
        assert np.prod(new_dims) == np.prod(dims) and len(new_dims) <= len(dims)
        assert np.array_equal(offsets(new_dims, new), offsets(dims, strides)), (dims, strides)


MASK = """model m {
  input ids: i64[2, 5]
  let keep = reshape(cast(ids, f32), [2, 1, 1, 5])
  output y: [2, 3, 5, 5] = expand((1.0 - keep) * -65504.0, [2, 3, 5, 5])
}"""


def test_a_chain_ending_in_an_expand_writes_the_broadcast_result_on_the_host(
        tmp_path: Path, host_folder: Path) -> None:
    """BERT's padding mask: an i64 input reshaped, cast, `(1 - m) * -65504`, broadcast over
    heads and queries is one group (the reshape moved before the cast, a view of the input),
    and its one kernel, walking the coalesced result with the operand broadcast, writes what
    numpy computes: the integers rounded to f32 as `astype` rounds (2^40 + 1 included)."""
    _, lowered, plan = _lowered(MASK, tmp_path)
    groups = [g for g in plan.groups]  # type: ignore[attr-defined]
    assert [[lowered.by_name()[n].op for n in g.nodes] for g in groups] == \
        [["cast", "sub", "mul", "expand"]]  # type: ignore[attr-defined]
    group = groups[0]
    p = fused.plan_of(lowered.by_name(), group.nodes, group.inputs, group.outputs)
    assert isinstance(p, fused.Plan) and [o.dtype for o in p.operands] == ["i64"]
    ids = np.array([[1, 0, 1, 1, 0], [0, 2**40 + 1, 1, 0, 1]], np.int64)
    y = np.zeros((2, 3, 5, 5), np.float32)
    x = np.broadcast_to(ids.reshape(2, 1, 1, 5), y.shape)
    dims, strides = fused.coalesced(list(y.shape), [[st // 8 for st in x.strides],
                                                    [st // 4 for st in y.strides]])
    assert dims == [2, 15, 5]
    fn = host_part(p.strided_kernel(len(dims), narrow=True), "mask0", host_folder)
    magic = fused.magic_args(dims)
    fn.argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_longlong] * (1 + 3 * len(dims) + 4 + 1)
    fn(ids.ctypes.data, y.ctypes.data, y.size, *dims, *strides[0], *strides[1], *magic, 1)
    want = (np.float32(1.0) - ids.astype(np.float32)) * np.float32(-65504.0)
    assert np.array_equal(y, np.broadcast_to(want.reshape(2, 1, 1, 5), y.shape))
    assert len(np.unique(y)) == 3  # 0, -65504 and the huge id's product


def test_the_magic_numbers_divide_every_index_below_2_31_exactly() -> None:
    """(umulhi(n, m) + n) >> h in 32-bit unsigned arithmetic (a wrap would show) equals Python's
    n // d: every divisor to 3,000 and random ones to 2^30, at 0, around multiples of d, at the
    largest index and at random ones."""
    g = rng("magic numbers")
    divisors = [*range(1, 3001), *(int(d) for d in g.integers(3001, 2**30, 500)), 2**30]
    for d in divisors:
        m, h = fused.magic(d)
        assert 0 < m < 2**32 and h <= 30
        ns = {0, 1, d - 1, d, d + 1, 2 * d - 1, 2**31 - 1, 2**31 - 1 - (2**31 - 1) % d,
              *(int(n) for n in g.integers(0, 2**31, 20))}
        for n in ns:
            if n < 2**31:
                assert (((((n * m) >> 32) + n) & 0xFFFFFFFF) >> h) == n // d, (d, n)
