"""Every op's numpy reference (`OpDef.reference`) checked against PyTorch on the CPU, an independent
implementation, over small grids of shapes, attributes and dtypes, plus hypothesis cases for the
pointwise and reduction families.

The references are called as the interpreter calls them: tensor operands in parameter order (absent
optional tensors left out, `attrs["operands"]` naming the given ones) and the attributes in the
normalised form the op's type rule records (per-axis tuples, sorted non-negative axes, ...).
Precision: `evaluate_node` converts the operands to the compute dtype, runs the reference and
rounds to the storage dtype; the f16 / bf16 / fp8 / int cases go through it and are compared with
PyTorch after the same rounding.

Tolerances (float32):
- pointwise and layout ops: rtol=1e-5, atol=1e-5 (numpy/scipy and PyTorch's vectorised libm may
  differ by a few ulps on transcendental functions; exact ops are compared exactly);
- ops that sum K terms (reductions, matmul, conv, norms, pools, sdpa): rtol=1e-5,
  atol=1e-5 + 1e-6 * K (`tol(K)`); reduce_prod: rtol=1e-5 * max(1, K / 16);
- after rounding to f16 / bf16: at most `ulps` units in the last place of the storage dtype
  (1 for pointwise ops, 2 for accumulating ops), plus the float32 tolerance.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from dslc.core.types import PrecisionSpec, TensorType
from dslc.diag.span import Span
from dslc.ir.graph import Attrs, Node
from dslc.ir.interp import NUMPY_DTYPES, evaluate_node
from dslc.ops import OPS
from dslc.ops.pointwise import BINARY, COMPARE, UNARY
from tests import helpers

torch = pytest.importorskip("torch")
F = torch.nn.functional

RTOL = 1e-5
ATOL = 1e-5


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread() -> Any:
    """The tensors are tiny: one thread avoids the pool's overhead (restored afterwards)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)

# Every op name this file exercises; `ref` refuses a name that is not declared here, and the last
# test checks that the set is all of OPS.
COVERED: set[str] = set()
EXERCISED: set[str] = set()


def covers(*names: str) -> None:
    COVERED.update(names)


def tol(k: int) -> dict[str, float]:
    """The float32 tolerance of a result that sums `k` terms."""
    return {"rtol": RTOL, "atol": ATOL + 1e-6 * k}


def ref(op: str, xs: Sequence[Any], **attrs: Any) -> np.ndarray:
    """The numpy reference of `op` on float32 (or as-given integer/bool) operands."""
    assert op in COVERED, f"declare {op} with covers() first"
    EXERCISED.add(op)
    operands = [np.asarray(x) for x in xs]
    with np.errstate(all="ignore"):
        return np.asarray(OPS[op].reference(operands, attrs))


_SPAN = Span("test.cgraph", 1, 1, 1, 2)


def run_node(op: str, xs: Sequence[np.ndarray], attrs: dict[str, Any], storage: str,
             compute: str = "f32") -> np.ndarray:
    """`op` through the interpreter's precision semantics (operands to `compute`, the reference,
    the result rounded to `storage`)."""
    assert op in COVERED, f"declare {op} with covers() first"
    EXERCISED.add(op)
    node = Node("n", op, tuple(f"x{i}" for i in range(len(xs))), Attrs({}),
                TensorType(storage, ()), _SPAN, "",
                PrecisionSpec(io=storage, intermediate=storage, compute=compute))
    with np.errstate(over="ignore"):  # f32 -> f16 overflow to inf is intended
        return evaluate_node(node, list(xs), attrs, storage)


def T(x: np.ndarray) -> Any:
    x = np.asarray(x)
    return torch.from_numpy(x if x.flags.c_contiguous else x.copy())  # keeps 0-d arrays 0-d


def close(actual: np.ndarray, expected: Any, rtol: float = RTOL, atol: float = ATOL) -> None:
    if isinstance(expected, torch.Tensor):
        expected = expected.detach().numpy()
    expected = np.asarray(expected)
    actual = np.asarray(actual)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    np.testing.assert_allclose(actual.astype(np.float64), expected.astype(np.float64),
                               rtol=rtol, atol=atol, equal_nan=True)


def exact(actual: np.ndarray, expected: Any) -> None:
    if isinstance(expected, torch.Tensor):
        expected = expected.numpy()
    expected = np.asarray(expected)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    np.testing.assert_array_equal(actual, expected)


TORCH_FLOAT = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}
NP_FLOAT = {"f16": np.float16, "bf16": ml_dtypes.bfloat16, "f32": np.float32}


def close_rounded(actual: np.ndarray, expected: Any, storage: str, ulps: int = 1,
                  atol: float = ATOL) -> None:
    """Both already rounded to `storage`: within `ulps` of its spacing (plus a float32 atol for
    values near zero, where a tiny float32 difference can flip a rounding)."""
    if isinstance(expected, torch.Tensor):
        expected = expected.float().numpy()
    assert actual.dtype == np.dtype(NP_FLOAT[storage]), actual.dtype
    a = actual.astype(np.float64)
    e = np.asarray(expected, dtype=np.float64)
    assert a.shape == e.shape, (a.shape, e.shape)
    step = 2.0 ** np.floor(np.log2(np.maximum(np.abs(e), 1e-30)))  # power of two below |e|
    mant = {"f16": 10, "bf16": 7, "f32": 23}[storage]
    bound = ulps * step * 2.0 ** -mant + atol
    with np.errstate(invalid="ignore"):  # inf - inf
        bad = ~(np.abs(a - e) <= bound) & ~(np.isnan(a) & np.isnan(e)) & ~(a == e)
    assert not bad.any(), f"{bad.sum()} mismatches, e.g. {a[bad][:5]} vs {e[bad][:5]}"


RNG_SEED = 1234


def rng(*key: Any) -> np.random.Generator:
    """The inputs of one case, seeded from the case's key (the same seed in every process; a
    failure prints it)."""
    return helpers.rng(RNG_SEED, *key)


def randn(g: np.random.Generator, *shape: int, scale: float = 1.0) -> np.ndarray:
    return (g.standard_normal(shape) * scale).astype(np.float32)


def uniform(g: np.random.Generator, lo: float, hi: float, *shape: int) -> np.ndarray:
    return g.uniform(lo, hi, shape).astype(np.float32)


# ----------------------------------------------------------------------------------------------
# Pointwise: unary ops.

# name -> (torch implementation, grid of attrs, input domain (lo, hi)).
UNARY_TORCH: dict[str, tuple[Callable[[Any, dict[str, Any]], Any], list[dict[str, Any]],
                             tuple[float, float]]] = {
    "relu": (lambda x, a: F.relu(x), [{}], (-4, 4)),
    "leaky_relu": (lambda x, a: F.leaky_relu(x, a["slope"]),
                   [{"slope": 0.01}, {"slope": 0.2}, {"slope": -0.5}, {"slope": 0.0}], (-4, 4)),
    "clamp": (lambda x, a: x if a["lo"] is None and a["hi"] is None
              else torch.clamp(x, min=a["lo"], max=a["hi"]),
              [{"lo": None, "hi": None}, {"lo": -0.5, "hi": None}, {"lo": None, "hi": 0.7},
               {"lo": -1.0, "hi": 1.5}, {"lo": 0.25, "hi": 0.25}], (-4, 4)),
    "gelu": (lambda x, a: F.gelu(x), [{}], (-6, 6)),
    "gelu_tanh": (lambda x, a: F.gelu(x, approximate="tanh"), [{}], (-6, 6)),
    "silu": (lambda x, a: F.silu(x), [{}], (-10, 10)),
    "swish": (lambda x, a: x * torch.sigmoid(a["beta"] * x),
              [{"beta": 1.0}, {"beta": 1.702}, {"beta": 0.5}, {"beta": -2.0}], (-10, 10)),
    "sigmoid": (lambda x, a: torch.sigmoid(x), [{}], (-20, 20)),
    "tanh": (lambda x, a: torch.tanh(x), [{}], (-10, 10)),
    "elu": (lambda x, a: F.elu(x, a["alpha"]), [{"alpha": 1.0}, {"alpha": 0.5}, {"alpha": 2.0}],
            (-10, 10)),
    "softplus": (lambda x, a: F.softplus(x), [{}], (-30, 30)),
    "hardsigmoid": (lambda x, a: F.hardsigmoid(x), [{}], (-6, 6)),
    "hardswish": (lambda x, a: F.hardswish(x), [{}], (-6, 6)),
    "exp": (lambda x, a: torch.exp(x), [{}], (-20, 20)),
    "log": (lambda x, a: torch.log(x), [{}], (1e-3, 100)),
    "sqrt": (lambda x, a: torch.sqrt(x), [{}], (0, 100)),
    "rsqrt": (lambda x, a: torch.rsqrt(x), [{}], (1e-2, 100)),
    "reciprocal": (lambda x, a: torch.reciprocal(x), [{}], (0.05, 20)),  # sign flipped below
    "erf": (lambda x, a: torch.erf(x), [{}], (-4, 4)),
    "sin": (lambda x, a: torch.sin(x), [{}], (-10, 10)),
    "cos": (lambda x, a: torch.cos(x), [{}], (-10, 10)),
    "floor": (lambda x, a: torch.floor(x), [{}], (-10, 10)),
    "ceil": (lambda x, a: torch.ceil(x), [{}], (-10, 10)),
    "abs": (lambda x, a: torch.abs(x), [{}], (-10, 10)),
    "neg": (lambda x, a: torch.neg(x), [{}], (-10, 10)),
}
covers(*UNARY)
COMPOSED_UNARY = {"swish"}
EXACT_UNARY = {"relu", "clamp", "floor", "ceil", "abs", "neg", "leaky_relu"}


def unary_input(name: str, g: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    lo, hi = UNARY_TORCH[name][2]
    x = uniform(g, lo, hi, *shape)
    if name == "reciprocal":
        x = x * np.where(g.random(shape) < 0.5, -1, 1).astype(np.float32)
    if name in ("floor", "ceil", "relu", "abs", "clamp", "leaky_relu") and x.size > 4:
        flat = x.reshape(-1)
        flat[:4] = [0.0, -0.0, 2.0, -3.0]  # integers and signed zeros
    return x


def test_unary_table_is_covered() -> None:
    assert set(UNARY) == set(UNARY_TORCH)


UNARY_CASES = [(name, attrs) for name, (_, grid, _) in UNARY_TORCH.items() for attrs in grid]


@pytest.mark.parametrize("shape", [(7,), (2, 3, 5), (1, 4, 2, 3)])
@pytest.mark.parametrize(("name", "attrs"), UNARY_CASES,
                         ids=[f"{n}-{a}" if a else n for n, a in UNARY_CASES])
def test_unary_f32(name: str, attrs: dict[str, Any], shape: tuple[int, ...]) -> None:
    x = unary_input(name, rng(name, shape), shape)
    got = ref(name, [x], **attrs)
    want = UNARY_TORCH[name][0](T(x), attrs)
    assert got.shape == tuple(want.shape)
    if name in EXACT_UNARY:
        exact(got.astype(np.float32), want.numpy())
    else:
        close(got, want)


@pytest.mark.parametrize("storage", ["f16", "bf16"])
@pytest.mark.parametrize(("name", "attrs"), UNARY_CASES,
                         ids=[f"{n}-{a}" if a else n for n, a in UNARY_CASES])
def test_unary_rounded(name: str, attrs: dict[str, Any], storage: str) -> None:
    """f16 / bf16 operands, compute f32, the result rounded to the storage dtype, against PyTorch's
    native half-precision op (which computes in f32 on the CPU and rounds once); an op PyTorch
    spells as several ops (swish) is computed in f32 and rounded once."""
    x = unary_input(name, rng(name, storage), (3, 17)).astype(NP_FLOAT[storage])
    got = run_node(name, [x], attrs, storage)
    tx = T(x.astype(np.float32))
    if name in COMPOSED_UNARY:  # several torch ops: in f32, rounded once at the end
        want = UNARY_TORCH[name][0](tx, attrs).to(TORCH_FLOAT[storage])
    else:
        want = UNARY_TORCH[name][0](tx.to(TORCH_FLOAT[storage]), attrs)
    assert want.dtype == TORCH_FLOAT[storage]
    close_rounded(got, want, storage, ulps=1)


@pytest.mark.parametrize("name", ["abs", "neg"])
@pytest.mark.parametrize("dtype", ["i8", "i32", "i64"])
def test_unary_integer(name: str, dtype: str) -> None:
    x = rng(name, dtype).integers(-100, 100, (4, 5)).astype(NUMPY_DTYPES[dtype])
    got = run_node(name, [x], {}, dtype)
    exact(got, UNARY_TORCH[name][0](T(x), {}).numpy())


# ----------------------------------------------------------------------------------------------
# Pointwise: binary ops, comparisons, select.

BINARY_TORCH: dict[str, Callable[[Any, Any], Any]] = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div,
    "max": torch.maximum, "min": torch.minimum, "pow": torch.pow,
}
COMPARE_TORCH: dict[str, Callable[[Any, Any], Any]] = {
    "cmp_lt": torch.lt, "cmp_le": torch.le, "cmp_gt": torch.gt, "cmp_ge": torch.ge,
    "cmp_eq": torch.eq, "cmp_ne": torch.ne,
}
covers(*BINARY_TORCH, *COMPARE_TORCH)

BROADCASTS = [
    ((3, 4), (3, 4)),
    ((2, 3, 4), (4,)),
    ((4,), (2, 3, 4)),
    ((2, 1, 4), (3, 1)),
    ((1, 3, 1, 5), (2, 1, 4, 1)),
    ((2, 3), ()),  # a scalar operand (a compile-time number becomes a 0-d tensor)
    ((), (2, 3)),
]


def binary_inputs(name: str, g: np.random.Generator, sa: tuple[int, ...], sb: tuple[int, ...],
                  ) -> tuple[np.ndarray, np.ndarray]:
    if name == "pow":
        a = uniform(g, 0.1, 3.0, *sa)
        b = uniform(g, -2.5, 2.5, *sb)
        return a, b
    a, b = randn(g, *sa, scale=3), randn(g, *sb, scale=3)
    if name == "div":
        b = np.where(np.abs(b) < 0.1, np.float32(0.5), b).astype(np.float32)
    return a, b


def test_binary_tables_are_covered() -> None:
    assert set(BINARY) == set(BINARY_TORCH)
    assert set(COMPARE) == set(COMPARE_TORCH)


@pytest.mark.parametrize(("sa", "sb"), BROADCASTS, ids=[f"{a}x{b}" for a, b in BROADCASTS])
@pytest.mark.parametrize("name", list(BINARY_TORCH))
def test_binary_f32(name: str, sa: tuple[int, ...], sb: tuple[int, ...]) -> None:
    a, b = binary_inputs(name, rng(name, sa, sb), sa, sb)
    got = ref(name, [a, b])
    want = BINARY_TORCH[name](T(a), T(b))
    if name in ("add", "sub", "mul", "div", "max", "min"):  # correctly rounded in both
        exact(got.astype(np.float32), want.numpy())
    else:
        close(got, want)


def test_pow_negative_base_integer_exponent() -> None:
    a = np.array([-2.0, -1.5, -0.5, 0.0, 0.0, 3.0, -3.0], np.float32)
    b = np.array([2.0, 3.0, -1.0, 2.0, 0.0, -2.0, 0.5], np.float32)  # (-3) ** 0.5 is nan
    close(ref("pow", [a, b]), torch.pow(T(a), T(b)))


@pytest.mark.parametrize("name", ["max", "min"])
def test_max_min_propagate_nan(name: str) -> None:
    a = np.array([np.nan, 1.0, np.nan, -np.inf], np.float32)
    b = np.array([0.0, np.nan, np.nan, 2.0], np.float32)
    close(ref(name, [a, b]), BINARY_TORCH[name](T(a), T(b)))


@pytest.mark.parametrize("name", ["add", "sub", "mul", "div"])
def test_binary_f16_compute(name: str) -> None:
    """compute=f16 (numpy math in f16): + - * / are correctly rounded, as PyTorch's f16 ops."""
    g = rng(name, "f16c")
    a, b = binary_inputs(name, g, (5, 7), (7,))
    a, b = a.astype(np.float16), b.astype(np.float16)
    got = run_node(name, [a, b], {}, "f16", compute="f16")
    exact(got, BINARY_TORCH[name](T(a), T(b)).numpy())


@pytest.mark.parametrize("storage", ["f16", "bf16"])
@pytest.mark.parametrize("name", list(BINARY_TORCH))
def test_binary_rounded(name: str, storage: str) -> None:
    a, b = binary_inputs(name, rng(name, storage), (3, 1, 6), (4, 1))
    a, b = a.astype(NP_FLOAT[storage]), b.astype(NP_FLOAT[storage])
    got = run_node(name, [a, b], {}, storage)
    ta, tb = (T(v.astype(np.float32)).to(TORCH_FLOAT[storage]) for v in (a, b))
    close_rounded(got, BINARY_TORCH[name](ta, tb), storage, ulps=1)


@pytest.mark.parametrize(("sa", "sb"), BROADCASTS, ids=[f"{a}x{b}" for a, b in BROADCASTS])
@pytest.mark.parametrize("name", list(COMPARE_TORCH))
def test_compare(name: str, sa: tuple[int, ...], sb: tuple[int, ...]) -> None:
    g = rng(name, sa, sb)
    # Few distinct values, so ties (where < and <= differ) are common.
    a = g.integers(-2, 3, sa).astype(np.float32)
    b = g.integers(-2, 3, sb).astype(np.float32)
    got = ref(name, [a, b])
    exact(got, COMPARE_TORCH[name](T(a), T(b)).numpy())


@pytest.mark.parametrize("name", list(COMPARE_TORCH))
def test_compare_nan_and_int(name: str) -> None:
    a = np.array([np.nan, 1.0, np.nan, -np.inf, 0.0], np.float32)
    b = np.array([0.0, np.nan, np.nan, -np.inf, -0.0], np.float32)
    exact(ref(name, [a, b]), COMPARE_TORCH[name](T(a), T(b)).numpy())
    ia = np.array([[1, 2, 3]], np.int32)
    ib = np.array([[2], [3]], np.int32)
    got = run_node(name, [ia, ib], {}, "bool")
    exact(got, COMPARE_TORCH[name](T(ia), T(ib)).numpy())


@pytest.mark.parametrize("name", ["add", "sub", "mul", "max", "min"])
@pytest.mark.parametrize("dtype", ["i8", "i32", "i64"])
def test_binary_integer(name: str, dtype: str) -> None:
    g = rng(name, dtype)
    a = g.integers(-10, 10, (3, 4)).astype(NUMPY_DTYPES[dtype])
    b = g.integers(-10, 10, (4,)).astype(NUMPY_DTYPES[dtype])
    got = run_node(name, [a, b], {}, dtype)
    exact(got, BINARY_TORCH[name](T(a), T(b)).numpy())


def test_div_integer_truncates() -> None:
    """Integer `/` stored as an integer rounds toward zero (as C and PyTorch's trunc mode)."""
    a = np.array([7, -7, 7, -7, 6, 0], np.int32)
    b = np.array([2, 2, -2, -2, 3, 5], np.int32)
    got = run_node("div", [a, b], {}, "i32")
    exact(got, torch.div(T(a), T(b), rounding_mode="trunc").numpy())


covers("select")
SELECT_SHAPES = [((2, 3), (2, 3), (2, 3)), ((2, 1), (1, 3), (3,)), ((4,), (2, 3, 4), ()),
                 ((), (2, 2), (2, 1)), ((2, 1, 3), (1, 4, 1), (2, 4, 3))]


@pytest.mark.parametrize(("sm", "sa", "sb"), SELECT_SHAPES)
def test_select(sm: tuple[int, ...], sa: tuple[int, ...], sb: tuple[int, ...]) -> None:
    g = rng("select", sm, sa, sb)
    mask = g.random(sm) < 0.5
    a, b = randn(g, *sa), randn(g, *sb)
    got = ref("select", [mask, a, b])
    exact(got, torch.where(T(np.asarray(mask)), T(a), T(b)).numpy())


# ----------------------------------------------------------------------------------------------
# Pointwise: bias_add / scale_mul along an axis, cast, contiguous.

covers("bias_add", "scale_mul")
ALONG_CASES = [
    ((2, 3, 4, 5), 0, (2,)), ((2, 3, 4, 5), 1, (3,)), ((2, 3, 4, 5), 2, (4,)),
    ((2, 3, 4, 5), 3, (5,)), ((2, 3, 4, 5), 1, (1,)), ((6, 7), 1, (7,)), ((6, 7), 0, (6,)),
    ((2, 3, 4), 1, (3, 1)),  # a rank-2 operand broadcasts as it is
    ((2, 3, 4, 5), 1, (1, 3, 1, 1)), ((8,), 0, (8,)),
]


@pytest.mark.parametrize(("xshape", "axis", "bshape"), ALONG_CASES)
@pytest.mark.parametrize("name", ["bias_add", "scale_mul"])
def test_along_axis(name: str, xshape: tuple[int, ...], axis: int, bshape: tuple[int, ...]) -> None:
    g = rng(name, xshape, axis, bshape)
    x, b = randn(g, *xshape), randn(g, *bshape)
    got = ref(name, [x, b], axis=axis)
    tb = T(b)
    if len(bshape) == 1:
        shape = [1] * len(xshape)
        shape[axis] = bshape[0]
        tb = tb.reshape(shape)
    want = T(x) + tb if name == "bias_add" else T(x) * tb
    exact(got.astype(np.float32), want.numpy())


@pytest.mark.parametrize("storage", ["f16", "bf16"])
@pytest.mark.parametrize("name", ["bias_add", "scale_mul"])
def test_along_axis_rounded(name: str, storage: str) -> None:
    g = rng(name, storage)
    x = randn(g, 2, 3, 4).astype(NP_FLOAT[storage])
    b = randn(g, 3).astype(NP_FLOAT[storage])
    got = run_node(name, [x, b], {"axis": 1}, storage)
    tx, tb = (T(v.astype(np.float32)).to(TORCH_FLOAT[storage]) for v in (x, b))
    want = tx + tb[:, None] if name == "bias_add" else tx * tb[:, None]
    close_rounded(got, want, storage, ulps=0, atol=0)


covers("cast", "contiguous")
CAST_TORCH = {
    "f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16,
    "f8e4m3": torch.float8_e4m3fn, "f8e5m2": torch.float8_e5m2, "i8": torch.int8,
    "u8": torch.uint8, "i32": torch.int32, "i64": torch.int64, "bool": torch.bool,
}


def _cast_values(dtype: str) -> np.ndarray:
    g = rng("cast", dtype)
    if dtype in ("i8", "u8", "i32", "i64", "bool"):
        lo = 0 if dtype == "u8" else -100
        x = uniform(g, lo, 100, 40)
        x[:6] = [0.5, 2.5, 99.9, 0.0, 1.0, -0.0]  # fractions truncate toward zero
        if dtype != "u8":
            x[6:9] = [-0.5, -2.5, -99.9]
        if dtype == "bool":
            x[9:11] = [np.nan, np.inf]
        return x
    if dtype == "f8e4m3":
        return np.concatenate([randn(g, 40, scale=30), np.array([448, -448, 1e-3, 0.0], np.float32)])
    if dtype == "f8e5m2":
        return np.concatenate([randn(g, 40, scale=1000), np.array([57344, -57344, 1e-5], np.float32)])
    special = [65504, 65519, 65520, 1e5, -1e5, 1e-6, 1e-8, 0.0, np.inf, -np.inf, np.nan]
    return np.concatenate([randn(g, 40, scale=100), np.array(special, np.float32)])


@pytest.mark.parametrize("dtype", list(CAST_TORCH))
def test_cast(dtype: str) -> None:
    x = _cast_values(dtype)
    got = run_node("cast", [x], {"dtype": dtype}, dtype)
    want = T(x).to(CAST_TORCH[dtype])
    if dtype.startswith("f8") or dtype == "bf16":
        want = want.float().numpy()
        assert got.dtype == np.dtype(NUMPY_DTYPES[dtype])
        exact(got.astype(np.float32), want)
    else:
        exact(got, want.numpy())


@pytest.mark.parametrize("dtype", ["f16", "f32", "i32"])
def test_cast_from_narrow(dtype: str) -> None:
    """bf16 / f16 / i8 operands widen exactly."""
    g = rng("cast_from", dtype)
    for src in ("bf16", "f16", "i8"):
        if src == "i8":
            x = g.integers(-128, 128, 30).astype(np.int8)
        else:
            x = randn(g, 30, scale=50).astype(NP_FLOAT[src])
        got = run_node("cast", [x], {"dtype": dtype}, dtype)
        tx = T(x.astype(np.float32)).to({"bf16": torch.bfloat16, "f16": torch.float16}[src]) \
            if src != "i8" else T(x)
        want = tx.to(CAST_TORCH[dtype])
        exact(got, want.numpy())


def test_cast_f8e4m3_saturates() -> None:
    """Past e4m3's largest finite value, 448, a cast gives +-448 (as cuDNN's and CI's PyTorch
    do; other PyTorch versions give NaN, so the expected values are written out); 465 rounds
    down to 448 too (the next step would be 480)."""
    x = np.array([500.0, 1000.0, -1e5, 465.0, 3e38], np.float32)
    got = run_node("cast", [x], {"dtype": "f8e4m3"}, "f8e4m3")
    exact(got.astype(np.float32), np.array([448.0, 448.0, -448.0, 448.0, 448.0], np.float32))


@pytest.mark.parametrize("storage", ["f32", "f16", "bf16"])
def test_contiguous(storage: str) -> None:
    x = randn(rng("contiguous"), 3, 4, 5).transpose(2, 0, 1).astype(NP_FLOAT[storage])
    got = run_node("contiguous", [x], {}, storage)
    want = T(x.astype(np.float32)).to(TORCH_FLOAT[storage]).contiguous()
    exact(got.astype(np.float32), want.float().numpy())


# ----------------------------------------------------------------------------------------------
# Conv and transposed conv.

covers("conv", "conv_transpose")
_TCONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
_TCONVT = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}

# (x shape, w shape, stride, pre_pad, post_pad, dilation, groups)
CONV_CASES = [
    ((2, 4, 9), (6, 4, 3), (1,), (0,), (0,), (1,), 1),
    ((2, 4, 9), (6, 2, 3), (2,), (1,), (2,), (2,), 2),
    ((1, 3, 10), (3, 1, 4), (3,), (0,), (3,), (1,), 3),  # depthwise, asymmetric pad
    ((2, 3, 7, 8), (5, 3, 3, 3), (1, 1), (1, 1), (1, 1), (1, 1), 1),
    ((2, 3, 7, 8), (5, 3, 3, 2), (2, 1), (1, 0), (0, 2), (1, 2), 1),
    ((1, 4, 6, 6), (4, 1, 3, 3), (1, 1), (1, 1), (1, 1), (1, 1), 4),  # depthwise
    ((1, 4, 6, 6), (8, 1, 3, 3), (2, 2), (0, 1), (1, 0), (1, 1), 4),  # depthwise, multiplier 2
    ((2, 6, 5, 7), (4, 3, 1, 1), (1, 2), (0, 0), (0, 0), (1, 1), 2),
    ((1, 2, 9, 9), (3, 2, 3, 3), (2, 3), (2, 0), (1, 3), (2, 1), 1),
    ((1, 2, 5, 6, 4), (4, 2, 3, 2, 1), (1, 2, 1), (1, 0, 0), (1, 1, 0), (1, 1, 1), 1),
    ((2, 4, 4, 5, 6), (4, 2, 2, 3, 3), (2, 1, 2), (0, 1, 1), (1, 1, 2), (1, 2, 1), 2),
]


def _conv_case_id(c: tuple[Any, ...]) -> str:
    x, w, s, pre, post, d, g = c
    return f"{len(x) - 2}d-x{x}-w{w}-s{s}-pre{pre}-post{post}-d{d}-g{g}".replace(" ", "")


def torch_conv(x: Any, w: Any, stride: Sequence[int], pre: Sequence[int], post: Sequence[int],
               dilation: Sequence[int], groups: int) -> Any:
    pads = [p for pair in zip(reversed(pre), reversed(post)) for p in pair]  # last axis first
    return _TCONV[x.dim() - 2](F.pad(x, pads), w, stride=tuple(stride), dilation=tuple(dilation),
                               groups=groups)


@pytest.mark.parametrize("case", CONV_CASES, ids=[_conv_case_id(c) for c in CONV_CASES])
def test_conv_f32(case: tuple[Any, ...]) -> None:
    xs, ws, stride, pre, post, dilation, groups = case
    g = rng("conv", case)
    x, w = randn(g, *xs), randn(g, *ws)
    got = ref("conv", [x, w], stride=stride, pre_pad=pre, post_pad=post, dilation=dilation,
              groups=groups, pad=None)
    want = torch_conv(T(x), T(w), stride, pre, post, dilation, groups)
    close(got, want, **tol(math.prod(ws[1:])))


def test_conv_symmetric_pad_matches_torch_padding() -> None:
    g = rng("conv-sym")
    x, w = randn(g, 2, 3, 6, 7), randn(g, 4, 3, 3, 3)
    got = ref("conv", [x, w], stride=(1, 2), pre_pad=(1, 2), post_pad=(1, 2), dilation=(1, 1),
              groups=1, pad=None)
    close(got, F.conv2d(T(x), T(w), stride=(1, 2), padding=(1, 2)), **tol(27))


@pytest.mark.parametrize("storage", ["f16", "bf16"])
def test_conv_rounded(storage: str) -> None:
    xs, ws, stride, pre, post, dilation, groups = CONV_CASES[4]
    g = rng("conv", storage)
    x = randn(g, *xs).astype(NP_FLOAT[storage])
    w = randn(g, *ws).astype(NP_FLOAT[storage])
    attrs = dict(stride=stride, pre_pad=pre, post_pad=post, dilation=dilation, groups=groups,
                 pad=None)
    got = run_node("conv", [x, w], attrs, storage)
    want = torch_conv(T(x.astype(np.float32)), T(w.astype(np.float32)), stride, pre, post,
                      dilation, groups).to(TORCH_FLOAT[storage])
    close_rounded(got, want, storage, ulps=1, atol=tol(math.prod(ws[1:]))["atol"])


def test_conv_int8() -> None:
    g = rng("conv-i8")
    x = g.integers(-128, 128, (1, 4, 5, 5)).astype(np.int8)
    w = g.integers(-128, 128, (2, 4, 3, 3)).astype(np.int8)
    attrs = dict(stride=(1, 1), pre_pad=(1, 1), post_pad=(1, 1), dilation=(1, 1), groups=1, pad=None)
    got = run_node("conv", [x, w], attrs, "i32")
    want = F.conv2d(T(x.astype(np.float64)), T(w.astype(np.float64)), padding=1)  # exact in f64
    exact(got, want.numpy().astype(np.int32))


# (x shape, w shape [C_in, C_out, *R], stride, pad, dilation, output_pad)
CONVT_CASES = [
    ((2, 3, 5), (3, 4, 3), (1,), (0,), (1,), (0,)),
    ((2, 3, 5), (3, 4, 3), (2,), (1,), (1,), (1,)),
    ((1, 2, 4), (2, 3, 2), (3,), (2,), (2,), (1,)),
    ((1, 2, 6), (2, 2, 3), (2,), (4,), (2,), (1,)),  # pad = d * (R - 1): pads nothing
    ((1, 2, 6), (2, 2, 3), (2,), (3,), (1,), (1,)),  # pad past d * (R - 1): crops the start
    ((1, 2, 5, 6), (2, 3, 2, 3), (2, 3), (2, 3), (1, 1), (0, 1)),  # crops both ends, one end
    ((1, 2, 3), (2, 2, 3), (1,), (2,), (1,), (0,)),
    ((2, 3, 4, 5), (3, 2, 3, 3), (2, 2), (1, 1), (1, 1), (1, 0)),
    ((1, 2, 3, 4), (2, 3, 2, 3), (1, 3), (0, 1), (2, 1), (1, 2)),
    ((1, 4, 5, 5), (4, 1, 1, 1), (2, 2), (0, 0), (1, 1), (1, 1)),
    ((1, 2, 3, 4, 3), (2, 2, 3, 2, 2), (2, 1, 2), (1, 0, 0), (1, 2, 1), (1, 0, 1)),
]


@pytest.mark.parametrize("case", CONVT_CASES, ids=[str(i) for i in range(len(CONVT_CASES))])
def test_conv_transpose_f32(case: tuple[Any, ...]) -> None:
    xs, ws, stride, pad, dilation, opad = case
    g = rng("convt", case)
    x, w = randn(g, *xs), randn(g, *ws)
    got = ref("conv_transpose", [x, w], stride=stride, pad=pad, dilation=dilation, output_pad=opad)
    want = _TCONVT[len(xs) - 2](T(x), T(w), stride=stride, padding=pad, output_padding=opad,
                                dilation=dilation)
    close(got, want, **tol(ws[0] * math.prod(ws[2:])))


@pytest.mark.parametrize("storage", ["f16", "bf16"])
def test_conv_transpose_rounded(storage: str) -> None:
    xs, ws, stride, pad, dilation, opad = CONVT_CASES[5]
    g = rng("convt", storage)
    x = randn(g, *xs).astype(NP_FLOAT[storage])
    w = randn(g, *ws).astype(NP_FLOAT[storage])
    got = run_node("conv_transpose", [x, w],
                   dict(stride=stride, pad=pad, dilation=dilation, output_pad=opad), storage)
    want = F.conv_transpose2d(T(x.astype(np.float32)), T(w.astype(np.float32)), stride=stride,
                              padding=pad, output_padding=opad, dilation=dilation)
    close_rounded(got, want.to(TORCH_FLOAT[storage]), storage, ulps=1,
                  atol=tol(ws[0] * math.prod(ws[2:]))["atol"])


# ----------------------------------------------------------------------------------------------
# Matmul.

covers("matmul")
MATMUL_CASES = [
    ((3, 4), (4, 5)),
    ((1, 7), (7, 1)),
    ((2, 3, 4), (4, 5)),
    ((3, 4), (2, 4, 5)),
    ((2, 1, 3, 4), (5, 4, 6)),
    ((2, 3, 16), (2, 16, 8)),
    ((1, 2, 1, 3, 5), (2, 1, 4, 5, 2)),
    ((4, 64), (64, 3)),
]


@pytest.mark.parametrize(("sa", "sb"), MATMUL_CASES, ids=[f"{a}@{b}" for a, b in MATMUL_CASES])
def test_matmul_f32(sa: tuple[int, ...], sb: tuple[int, ...]) -> None:
    g = rng("matmul", sa, sb)
    a, b = randn(g, *sa), randn(g, *sb)
    close(ref("matmul", [a, b]), torch.matmul(T(a), T(b)), **tol(sa[-1]))


@pytest.mark.parametrize("storage", ["f16", "bf16"])
def test_matmul_rounded(storage: str) -> None:
    g = rng("matmul", storage)
    a = randn(g, 2, 5, 32).astype(NP_FLOAT[storage])
    b = randn(g, 32, 6).astype(NP_FLOAT[storage])
    got = run_node("matmul", [a, b], {}, storage)
    want = torch.matmul(T(a.astype(np.float32)), T(b.astype(np.float32))).to(TORCH_FLOAT[storage])
    close_rounded(got, want, storage, ulps=1, atol=tol(32)["atol"])


def test_matmul_int8() -> None:
    g = rng("matmul-i8")
    a = g.integers(-128, 128, (3, 40)).astype(np.int8)
    b = g.integers(-128, 128, (40, 5)).astype(np.int8)
    got = run_node("matmul", [a, b], {}, "i32")
    want = torch.matmul(T(a.astype(np.int32)), T(b.astype(np.int32)))
    exact(got, want.numpy())


def test_matmul_int8_small_values() -> None:
    """Where no partial sum leaves int8 (|sum| < 128) the i8 matmul is exact."""
    g = rng("matmul-i8-small")
    a = g.integers(-2, 3, (3, 6)).astype(np.int8)
    b = g.integers(-2, 3, (6, 5)).astype(np.int8)
    got = run_node("matmul", [a, b], {}, "i32")
    exact(got, torch.matmul(T(a.astype(np.int32)), T(b.astype(np.int32))).numpy())


@pytest.mark.parametrize("io", ["f8e4m3", "f8e5m2"])
def test_matmul_fp8(io: str) -> None:
    """fp8 x fp8 -> f32: the operands are widened exactly, the product summed in f32."""
    g = rng("matmul", io)
    a = randn(g, 4, 16).astype(NUMPY_DTYPES[io])
    b = randn(g, 16, 3).astype(NUMPY_DTYPES[io])
    got = run_node("matmul", [a, b], {}, "f32")
    want = torch.matmul(T(a.astype(np.float32)), T(b.astype(np.float32)))
    close(got, want, **tol(16))


# ----------------------------------------------------------------------------------------------
# Normalisations.

covers("batchnorm", "layernorm", "rmsnorm", "instancenorm", "groupnorm")


@pytest.mark.parametrize("eps", [1e-5, 1e-2])
@pytest.mark.parametrize("shape", [(2, 3), (2, 3, 7), (2, 3, 4, 5), (1, 2, 2, 3, 2)])
def test_batchnorm(shape: tuple[int, ...], eps: float) -> None:
    g = rng("bn", shape, eps)
    c = shape[1]
    x = randn(g, *shape, scale=2)
    mean, var = randn(g, c), uniform(g, 0.1, 3.0, c)
    scale, bias = randn(g, c), randn(g, c)
    got = ref("batchnorm", [x, mean, var, scale, bias], eps=eps)
    want = F.batch_norm(T(x), T(mean), T(var), T(scale), T(bias), training=False, eps=eps)
    close(got, want)


LAYERNORM_CASES = [((4, 8), 1), ((2, 3, 10), 1), ((2, 3, 4, 5), 2), ((2, 6, 4), 2), ((3, 16), 2)]


@pytest.mark.parametrize("eps", [1e-5, 1e-3])
@pytest.mark.parametrize(("shape", "naxes"), LAYERNORM_CASES)
def test_layernorm(shape: tuple[int, ...], naxes: int, eps: float) -> None:
    g = rng("ln", shape, naxes, eps)
    norm_shape = shape[len(shape) - naxes:]
    x = randn(g, *shape, scale=3) + np.float32(1.5)
    scale, bias = randn(g, *norm_shape), randn(g, *norm_shape)
    axes = tuple(range(len(shape) - naxes, len(shape)))
    got = ref("layernorm", [x, scale, bias], axes=axes, eps=eps)
    want = F.layer_norm(T(x), norm_shape, T(scale), T(bias), eps=eps)
    close(got, want, **tol(math.prod(norm_shape)))


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("eps", [1e-5, 1e-2])
@pytest.mark.parametrize(("shape", "naxes"), LAYERNORM_CASES)
def test_rmsnorm(shape: tuple[int, ...], naxes: int, eps: float, with_bias: bool) -> None:
    g = rng("rms", shape, naxes, eps, with_bias)
    norm_shape = shape[len(shape) - naxes:]
    x = randn(g, *shape, scale=2)
    scale, bias = randn(g, *norm_shape), randn(g, *norm_shape)
    axes = tuple(range(len(shape) - naxes, len(shape)))
    if with_bias:
        got = ref("rmsnorm", [x, scale, bias], axes=axes, eps=eps, operands=("x", "scale", "bias"))
    else:
        got = ref("rmsnorm", [x, scale], axes=axes, eps=eps, operands=("x", "scale"))
    want = F.rms_norm(T(x), norm_shape, T(scale), eps=eps)
    if with_bias:
        want = want + T(bias)
    close(got, want, **tol(math.prod(norm_shape)))


@pytest.mark.parametrize("eps", [1e-5, 1e-2])
@pytest.mark.parametrize("shape", [(2, 3, 5), (2, 3, 4, 5), (1, 2, 3, 3, 4), (3, 2, 1, 3)])
def test_instancenorm(shape: tuple[int, ...], eps: float) -> None:
    g = rng("in", shape, eps)
    c = shape[1]
    x = randn(g, *shape, scale=2) - np.float32(1.0)
    scale, bias = randn(g, c), randn(g, c)
    got = ref("instancenorm", [x, scale, bias], eps=eps)
    want = F.instance_norm(T(x), weight=T(scale), bias=T(bias), eps=eps)
    close(got, want, **tol(math.prod(shape[2:])))


@pytest.mark.parametrize("eps", [1e-5, 1e-2])
@pytest.mark.parametrize(("shape", "groups"), [((2, 6, 5), 3), ((2, 8, 4, 5), 2), ((1, 4, 3, 3), 4),
                                               ((3, 6, 2, 2, 2), 1), ((2, 4), 2)])
def test_groupnorm(shape: tuple[int, ...], groups: int, eps: float) -> None:
    g = rng("gn", shape, groups, eps)
    c = shape[1]
    x = randn(g, *shape, scale=2) - np.float32(1.0)
    scale, bias = randn(g, c), randn(g, c)
    got = ref("groupnorm", [x, scale, bias], groups=groups, eps=eps)
    want = F.group_norm(T(x), groups, weight=T(scale), bias=T(bias), eps=eps)
    close(got, want, **tol(math.prod(shape[1:]) // groups))


@pytest.mark.parametrize("storage", ["f16", "bf16"])
@pytest.mark.parametrize("op", ["batchnorm", "layernorm", "rmsnorm", "instancenorm"])
def test_norm_rounded(op: str, storage: str) -> None:
    g = rng(op, storage)
    x = randn(g, 2, 3, 4, 8, scale=2).astype(NP_FLOAT[storage])
    c = 3
    tx = T(x.astype(np.float32))
    if op == "batchnorm":
        mean, var = randn(g, c).astype(NP_FLOAT[storage]), uniform(g, 0.5, 2, c).astype(NP_FLOAT[storage])
        scale, bias = randn(g, c).astype(NP_FLOAT[storage]), randn(g, c).astype(NP_FLOAT[storage])
        got = run_node(op, [x, mean, var, scale, bias], {"eps": 1e-5}, storage)
        f = [T(v.astype(np.float32)) for v in (mean, var, scale, bias)]
        want = F.batch_norm(tx, *f, training=False, eps=1e-5)
    elif op == "instancenorm":
        scale, bias = randn(g, c).astype(NP_FLOAT[storage]), randn(g, c).astype(NP_FLOAT[storage])
        got = run_node(op, [x, scale, bias], {"eps": 1e-5}, storage)
        want = F.instance_norm(tx, weight=T(scale.astype(np.float32)),
                               bias=T(bias.astype(np.float32)), eps=1e-5)
    else:
        scale, bias = randn(g, 8).astype(NP_FLOAT[storage]), randn(g, 8).astype(NP_FLOAT[storage])
        ts, tb = T(scale.astype(np.float32)), T(bias.astype(np.float32))
        attrs = {"axes": (3,), "eps": 1e-5, "operands": ("x", "scale", "bias")}
        got = run_node(op, [x, scale, bias], attrs, storage)
        if op == "layernorm":
            want = F.layer_norm(tx, (8,), ts, tb, eps=1e-5)
        else:
            want = F.rms_norm(tx, (8,), ts, eps=1e-5) + tb
    close_rounded(got, want.to(TORCH_FLOAT[storage]), storage, ulps=1, atol=1e-4)


# ----------------------------------------------------------------------------------------------
# Reductions and genstats.

REDUCE_NAMES = ["reduce_sum", "reduce_mean", "reduce_max", "reduce_min", "reduce_amax",
                "reduce_prod", "reduce_l1", "reduce_l2"]
covers(*REDUCE_NAMES, "genstats")


def torch_reduce(name: str, x: Any, axes: tuple[int, ...], keepdims: bool) -> Any:
    dims = list(axes)
    if name == "reduce_sum":
        return torch.sum(x, dim=dims, keepdim=keepdims)
    if name == "reduce_mean":
        return torch.mean(x, dim=dims, keepdim=keepdims)
    if name == "reduce_max":
        return torch.amax(x, dim=dims, keepdim=keepdims)
    if name == "reduce_min":
        return torch.amin(x, dim=dims, keepdim=keepdims)
    if name == "reduce_amax":
        return torch.amax(torch.abs(x), dim=dims, keepdim=keepdims)
    if name == "reduce_prod":  # torch.prod takes one dim at a time
        out = x
        for d in sorted(dims, reverse=True):
            out = torch.prod(out, dim=d, keepdim=keepdims)
        return out
    if name == "reduce_l1":
        return torch.linalg.vector_norm(x, 1, dim=dims, keepdim=keepdims)
    if name == "reduce_l2":
        return torch.linalg.vector_norm(x, 2, dim=dims, keepdim=keepdims)
    raise AssertionError(name)


def reduce_input(name: str, g: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    if name == "reduce_prod":  # magnitudes near 1, random signs: no overflow
        mag = uniform(g, 0.6, 1.5, *shape)
        return (mag * np.where(g.random(shape) < 0.5, -1, 1)).astype(np.float32)
    return randn(g, *shape, scale=3)


def reduce_tol(name: str, k: int) -> dict[str, float]:
    if name == "reduce_prod":
        return {"rtol": RTOL * max(1.0, k / 16), "atol": 1e-30}
    return tol(k)


REDUCE_AXES = [((7,), (0,)), ((2, 3, 4, 5), (0,)), ((2, 3, 4, 5), (3,)), ((2, 3, 4, 5), (1, 2)),
               ((2, 3, 4, 5), (0, 2, 3)), ((2, 3, 4, 5), (0, 1, 2, 3)), ((4, 1, 6), (1,)),
               ((3, 50), (1,)), ((5, 2, 3), (0, 2))]


@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize(("shape", "axes"), REDUCE_AXES, ids=[f"{s}-{a}" for s, a in REDUCE_AXES])
@pytest.mark.parametrize("name", REDUCE_NAMES)
def test_reduce(name: str, shape: tuple[int, ...], axes: tuple[int, ...], keepdims: bool) -> None:
    x = reduce_input(name, rng(name, shape, axes), shape)
    got = ref(name, [x], axes=axes, keepdims=keepdims)
    want = torch_reduce(name, T(x), axes, keepdims)
    k = math.prod(shape[a] for a in axes)
    close(got, want, **reduce_tol(name, k))


@pytest.mark.parametrize("storage", ["f16", "bf16"])
@pytest.mark.parametrize("name", REDUCE_NAMES)
def test_reduce_rounded(name: str, storage: str) -> None:
    x = reduce_input(name, rng(name, storage), (3, 4, 6)).astype(NP_FLOAT[storage])
    got = run_node(name, [x], {"axes": (1, 2), "keepdims": False}, storage)
    want = torch_reduce(name, T(x.astype(np.float32)), (1, 2), False).to(TORCH_FLOAT[storage])
    close_rounded(got, want, storage, ulps=1, atol=tol(24)["atol"])


GENSTATS_SHAPES = [(2, 3), (4, 2, 7), (2, 3, 4, 5), (1, 2, 3, 2, 2)]


@pytest.mark.parametrize("output", [0, 1])
@pytest.mark.parametrize("shape", GENSTATS_SHAPES)
def test_genstats(shape: tuple[int, ...], output: int) -> None:
    x = randn(rng("genstats", shape), *shape, scale=2)
    got = ref("genstats", [x], output=output)
    dims = [0, *range(2, len(shape))]
    tx = T(x)
    want = torch.sum(tx if output == 0 else tx * tx, dim=dims, keepdim=True)
    assert got.shape == (1, shape[1], *([1] * (len(shape) - 2)))
    close(got, want, **tol(shape[0] * math.prod(shape[2:])))


def test_genstats_f16_to_f32() -> None:
    """f16 input, f32 statistics (the type rule makes both outputs f32)."""
    x = randn(rng("genstats-f16"), 2, 3, 4, 4, scale=2).astype(np.float16)
    tx = T(x.astype(np.float32))
    for output in (0, 1):
        got = run_node("genstats", [x], {"output": output}, "f32")
        want = torch.sum(tx if output == 0 else tx * tx, dim=[0, 2, 3], keepdim=True)
        assert got.dtype == np.float32
        close(got, want, **tol(32))


# ----------------------------------------------------------------------------------------------
# Scaled dot-product attention.

covers("sdpa")

# (B, Hq, Hk, Sq, Skv, Dk, Dv, scale, causal, window, bias shape or None)
SDPA_CASES = [
    (2, 4, 4, 5, 5, 8, 8, None, False, None, None),  # MHA
    (1, 4, 2, 6, 6, 8, 16, None, False, None, None),  # GQA
    (1, 6, 1, 4, 7, 16, 8, None, False, None, None),  # MQA
    (2, 2, 2, 6, 6, 8, 8, None, True, None, None),  # causal
    (1, 4, 2, 4, 7, 8, 8, None, True, None, None),  # causal, Sq < Skv (top-left aligned)
    (1, 2, 2, 5, 5, 8, 8, 0.3, False, None, None),  # custom scale
    (2, 2, 1, 5, 6, 8, 8, None, False, None, (2, 2, 5, 6)),  # full bias
    (2, 4, 2, 5, 5, 8, 8, 0.2, True, None, (1, 1, 5, 5)),  # causal + broadcast bias
    (1, 2, 2, 6, 6, 8, 8, None, False, None, (6,)),  # bias over keys only
    (1, 2, 2, 8, 8, 8, 8, None, True, 3, None),  # sliding window
    (1, 4, 2, 7, 7, 8, 8, None, True, 1, None),  # window 1: only the diagonal
    (1, 2, 2, 6, 8, 8, 8, None, False, 2, None),  # window without causal
    (2, 4, 2, 6, 6, 8, 16, 0.5, True, 4, (2, 1, 6, 6)),  # everything
]


def torch_sdpa(q: Any, k: Any, v: Any, scale: float | None, causal: bool, window: int | None,
               bias: Any | None) -> Any:
    sq, skv = q.shape[2], k.shape[2]
    if causal and window is None and bias is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale,
                                              enable_gqa=True)
    mask = torch.zeros(sq, skv)
    i = torch.arange(sq)[:, None]
    j = torch.arange(skv)[None, :]
    if causal:
        mask = mask.masked_fill(j > i, float("-inf"))
    if window is not None:
        mask = mask.masked_fill(j <= i - window, float("-inf"))
    if bias is not None:
        mask = mask + bias
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)


@pytest.mark.parametrize("case", SDPA_CASES, ids=[str(i) for i in range(len(SDPA_CASES))])
def test_sdpa_f32(case: tuple[Any, ...]) -> None:
    b, hq, hk, sq, skv, dk, dv, scale, causal, window, bias_shape = case
    g = rng("sdpa", case)
    q, k, v = randn(g, b, hq, sq, dk), randn(g, b, hk, skv, dk), randn(g, b, hk, skv, dv)
    xs = [q, k, v]
    operands = ["q", "k", "v"]
    bias = None
    if bias_shape is not None:
        bias = randn(g, *bias_shape)
        xs.append(bias)
        operands.append("bias")
    got = ref("sdpa", xs, scale=scale, causal=causal, window=window, operands=tuple(operands))
    want = torch_sdpa(T(q), T(k), T(v), scale, causal, window, None if bias is None else T(bias))
    close(got, want, **tol(max(dk, skv)))


@pytest.mark.parametrize(("sq", "skv", "hq", "hk"), [(1, 9, 2, 2), (3, 8, 4, 2), (5, 5, 1, 1)])
def test_sdpa_causal_bottom_right_equals_torch_lower_right(sq: int, skv: int, hq: int,
                                                         hk: int) -> None:
    """A query block at the end of the keys: PyTorch's own lower-right causal bias."""
    from torch.nn.attention.bias import causal_lower_right

    g = rng("sdpa-bottom-right", sq, skv, hq)
    q, k, v = randn(g, 2, hq, sq, 8), randn(g, 2, hk, skv, 8), randn(g, 2, hk, skv, 8)
    got = ref("sdpa", [q, k, v], scale=None, causal=True, window=None, align="bottom_right")
    want = F.scaled_dot_product_attention(T(q), T(k), T(v), attn_mask=causal_lower_right(sq, skv),
                                          enable_gqa=True)
    close(got, want, **tol(skv))


def test_sdpa_window_bottom_right_keeps_the_last_keys_up_to_each_query() -> None:
    """Window 2, one query block of 2 over 5 keys: query 0 stands at key 3 (keys 2, 3), query 1
    at key 4 (keys 3, 4). With v the one-hot keys, the weights are read off directly."""
    q = np.zeros((1, 1, 2, 8), np.float32)  # equal scores: the kept keys share the weight
    k = np.zeros((1, 1, 5, 8), np.float32)
    v = np.eye(5, 8, dtype=np.float32)[None, None]
    got = ref("sdpa", [q, k, v], scale=None, causal=True, window=2, align="bottom_right")
    np.testing.assert_allclose(got[0, 0, :, :5], [[0, 0, .5, .5, 0], [0, 0, 0, .5, .5]],
                               atol=1e-7)


def test_sdpa_without_operands_attr() -> None:
    """q, k, v only: `operands` may be absent."""
    g = rng("sdpa-plain")
    q, k, v = randn(g, 1, 2, 3, 8), randn(g, 1, 2, 4, 8), randn(g, 1, 2, 4, 8)
    got = ref("sdpa", [q, k, v], scale=None, causal=False, window=None)
    close(got, F.scaled_dot_product_attention(T(q), T(k), T(v)), **tol(8))


@pytest.mark.parametrize("storage", ["f16", "bf16"])
def test_sdpa_rounded(storage: str) -> None:
    g = rng("sdpa", storage)
    q = randn(g, 1, 4, 6, 16).astype(NP_FLOAT[storage])
    k = randn(g, 1, 2, 6, 16).astype(NP_FLOAT[storage])
    v = randn(g, 1, 2, 6, 16).astype(NP_FLOAT[storage])
    attrs = {"scale": None, "causal": True, "window": None, "operands": ("q", "k", "v")}
    got = run_node("sdpa", [q, k, v], attrs, storage)
    tq, tk, tv = (T(a.astype(np.float32)) for a in (q, k, v))
    want = F.scaled_dot_product_attention(tq, tk, tv, is_causal=True, enable_gqa=True)
    close_rounded(got, want.to(TORCH_FLOAT[storage]), storage, ulps=1, atol=tol(16)["atol"])


# ----------------------------------------------------------------------------------------------
# Pooling and upsampling.

covers("maxpool", "avgpool", "upsample")
_TMAX = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}
_TAVG = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}

# (x shape, window, stride, pad)
POOL_CASES = [
    ((2, 3, 8), (2,), (2,), (0,)),
    ((2, 3, 9), (3,), (2,), (1,)),
    ((1, 2, 7), (4,), (1,), (2,)),
    ((2, 3, 6, 7), (2, 2), (2, 2), (0, 0)),
    ((2, 3, 7, 7), (3, 3), (2, 2), (1, 1)),
    ((1, 2, 8, 5), (3, 2), (1, 2), (1, 0)),
    ((1, 2, 5, 6), (2, 3), (3, 1), (1, 1)),
    ((1, 2, 4, 5, 6), (2, 2, 2), (2, 2, 2), (0, 0, 0)),
    ((1, 2, 5, 4, 6), (3, 2, 3), (2, 1, 2), (1, 1, 1)),
]


@pytest.mark.parametrize("case", POOL_CASES, ids=[str(c) for c in POOL_CASES])
def test_maxpool(case: tuple[Any, ...]) -> None:
    xs, window, stride, pad = case
    x = randn(rng("maxpool", case), *xs)
    x = x - np.float32(10.0)  # all negative: padding (never a candidate) would win if it were 0
    got = ref("maxpool", [x], window=window, stride=stride, pad=pad)
    want = _TMAX[len(window)](T(x), window, stride, pad)
    exact(got.astype(np.float32), want.numpy())


@pytest.mark.parametrize("count_pad", [False, True])
@pytest.mark.parametrize("case", POOL_CASES, ids=[str(c) for c in POOL_CASES])
def test_avgpool(case: tuple[Any, ...], count_pad: bool) -> None:
    xs, window, stride, pad = case
    x = randn(rng("avgpool", case), *xs) + np.float32(2.0)
    got = ref("avgpool", [x], window=window, stride=stride, pad=pad, count_pad=count_pad)
    want = _TAVG[len(window)](T(x), window, stride, pad, count_include_pad=count_pad)
    close(got, want, **tol(math.prod(window)))


@pytest.mark.parametrize("storage", ["f16", "bf16"])
@pytest.mark.parametrize("op", ["maxpool", "avgpool"])
def test_pool_rounded(op: str, storage: str) -> None:
    x = randn(rng(op, storage), 1, 2, 7, 7).astype(NP_FLOAT[storage])
    attrs: dict[str, Any] = {"window": (3, 3), "stride": (2, 2), "pad": (1, 1)}
    tx = T(x.astype(np.float32))
    if op == "avgpool":
        attrs["count_pad"] = False
        want = F.avg_pool2d(tx, 3, 2, 1, count_include_pad=False)
    else:
        want = F.max_pool2d(tx, 3, 2, 1)
    got = run_node(op, [x], attrs, storage)
    close_rounded(got, want.to(TORCH_FLOAT[storage]), storage, ulps=1)


@pytest.mark.parametrize("pad", [0, 1])
def test_maxpool_int8(pad: int) -> None:
    x = rng("maxpool-i8").integers(-128, 128, (2, 3, 6, 7)).astype(np.int8)
    got = run_node("maxpool", [x], {"window": (3, 3), "stride": (2, 2), "pad": (pad, pad)}, "i8")
    exact(got, F.max_pool2d(T(x), 3, 2, pad).numpy())


_LINEAR = {1: "linear", 2: "bilinear", 3: "trilinear"}
UPSAMPLE_CASES = [
    ((2, 3, 5), (2,)), ((1, 2, 4), (3,)), ((2, 3, 4, 5), (2, 2)), ((1, 2, 3, 4), (3, 2)),
    ((1, 1, 4, 3), (1, 4)), ((1, 2, 2, 3, 4), (2, 1, 3)), ((1, 1, 1, 5), (2, 2)),
]


@pytest.mark.parametrize("mode", ["nearest", "bilinear"])
@pytest.mark.parametrize(("shape", "factor"), UPSAMPLE_CASES,
                         ids=[f"{s}-{f}" for s, f in UPSAMPLE_CASES])
def test_upsample(shape: tuple[int, ...], factor: tuple[int, ...], mode: str) -> None:
    x = randn(rng("upsample", shape, factor), *shape)
    got = ref("upsample", [x], factor=factor, mode=mode)
    n = len(factor)
    size = tuple(s * f for s, f in zip(shape[2:], factor))
    if mode == "nearest":
        want = F.interpolate(T(x), size=size, mode="nearest")
        exact(got.astype(np.float32), want.numpy())
    else:
        want = F.interpolate(T(x), size=size, mode=_LINEAR[n], align_corners=False)
        close(got, want)
        want2 = F.interpolate(T(x), scale_factor=tuple(float(f) for f in factor), mode=_LINEAR[n],
                              align_corners=False)
        close(got, want2)


@pytest.mark.parametrize("storage", ["f16", "bf16"])
@pytest.mark.parametrize("mode", ["nearest", "bilinear"])
def test_upsample_rounded(mode: str, storage: str) -> None:
    x = randn(rng("upsample", mode, storage), 1, 2, 3, 4).astype(NP_FLOAT[storage])
    got = run_node("upsample", [x], {"factor": (2, 3), "mode": mode}, storage)
    tmode = "nearest" if mode == "nearest" else "bilinear"
    kw = {} if mode == "nearest" else {"align_corners": False}
    want = F.interpolate(T(x.astype(np.float32)), size=(6, 12), mode=tmode, **kw)
    close_rounded(got, want.to(TORCH_FLOAT[storage]), storage, ulps=1)


# ----------------------------------------------------------------------------------------------
# Layout ops.

covers("reshape", "transpose", "slice", "concat", "expand")
RESHAPE_CASES = [((2, 3, 4), (6, 4)), ((2, 3, 4), (2, 12)), ((24,), (2, 3, 4)),
                 ((2, 3, 4), (4, 3, 2)), ((1, 6, 1), (6,)), ((2, 3, 4), (2, 3, 4, 1))]


@pytest.mark.parametrize(("shape", "new"), RESHAPE_CASES)
def test_reshape(shape: tuple[int, ...], new: tuple[int, ...]) -> None:
    x = randn(rng("reshape", shape), *shape)
    exact(ref("reshape", [x], shape=new), torch.reshape(T(x), new).numpy())
    xt = np.ascontiguousarray(x.T).T  # same values, another memory order
    exact(ref("reshape", [xt], shape=new), torch.reshape(T(x), new).numpy())


TRANSPOSE_CASES = [((3, 4), (1, 0)), ((2, 3, 4), (0, 2, 1)), ((2, 3, 4), (2, 0, 1)),
                   ((2, 3, 4, 5), (0, 2, 3, 1)), ((2, 3, 4, 5), (3, 2, 1, 0)), ((5,), (0,))]


@pytest.mark.parametrize(("shape", "perm"), TRANSPOSE_CASES)
def test_transpose(shape: tuple[int, ...], perm: tuple[int, ...]) -> None:
    x = randn(rng("transpose", shape, perm), *shape)
    got = ref("transpose", [x], perm=perm)
    exact(np.ascontiguousarray(got), torch.permute(T(x), perm).contiguous().numpy())


SLICE_CASES = [((5,), (1,), (4,)), ((4, 6), (0, 2), (4, 5)), ((4, 6), (3, 0), (4, 6)),
               ((2, 5, 6), (1, 1, 3), (2, 4, 6)), ((3, 4, 5, 6), (0, 0, 1, 2), (3, 4, 2, 6))]


@pytest.mark.parametrize(("shape", "starts", "ends"), SLICE_CASES)
def test_slice(shape: tuple[int, ...], starts: tuple[int, ...], ends: tuple[int, ...]) -> None:
    x = randn(rng("slice", shape, starts), *shape)
    got = ref("slice", [x], starts=starts, ends=ends)
    tx = T(x)
    for axis, (s, e) in enumerate(zip(starts, ends)):
        tx = torch.narrow(tx, axis, s, e - s)
    exact(np.ascontiguousarray(got), tx.contiguous().numpy())


CONCAT_CASES = [([(2, 3), (4, 3)], 0), ([(2, 3), (2, 1), (2, 5)], 1), ([(2, 3, 4)], 2),
                ([(1, 2, 3, 4), (1, 5, 3, 4)], 1), ([(2, 3, 1), (2, 3, 2)], 2)]


@pytest.mark.parametrize(("shapes", "axis"), CONCAT_CASES)
def test_concat(shapes: list[tuple[int, ...]], axis: int) -> None:
    g = rng("concat", shapes, axis)
    xs = [randn(g, *s) for s in shapes]
    got = ref("concat", xs, axis=axis, operands=tuple(f"xs.{i}" for i in range(len(xs))))
    exact(got, torch.cat([T(x) for x in xs], dim=axis).numpy())


@pytest.mark.parametrize(("shape", "target"), [((1, 1, 4), (3, 2, 4)), ((2, 1), (5, 2, 3)),
                                               ((3,), (2, 3)), ((1,), (4,))])
def test_expand(shape: tuple[int, ...], target: tuple[int, ...]) -> None:
    x = randn(rng("expand", shape, target), *shape)
    exact(ref("expand", [x], shape=target), T(x).expand(*target).numpy())


covers("gather", "arange")


@pytest.mark.parametrize(("shape", "axis", "index_shape"), [((7, 4), 0, (3,)), ((7, 4), 0, (2, 5)),
                                                             ((3, 6, 2), 1, (4,)),
                                                             ((3, 6, 2), -1, (2, 2))])
def test_gather(shape: tuple[int, ...], axis: int, index_shape: tuple[int, ...]) -> None:
    g = rng("gather", shape, axis, index_shape)
    x = randn(g, *shape)
    idx = g.integers(0, shape[axis], index_shape).astype(np.int64)
    a = axis % len(shape)
    want = torch.index_select(T(x), a, T(idx).reshape(-1))
    exact(ref("gather", [x, idx], axis=a), want.reshape(*shape[:a], *index_shape, *shape[a + 1:]))


def test_arange() -> None:
    exact(ref("arange", [], n=6, dtype="i64"), torch.arange(6))


covers("full", "cache_write")


def test_full() -> None:
    exact(ref("full", [], shape=(2, 3), value=7, dtype="i32"),
          torch.full((2, 3), 7, dtype=torch.int64))


@pytest.mark.parametrize("at", [0, 3, 6, -1])
def test_cache_write(at: int) -> None:
    """PyTorch's index_copy of the rows inside the cache (rows past its end dropped)."""
    g = rng("cache_write", at)
    cache, new = randn(g, 2, 3, 8, 4), randn(g, 2, 3, 3, 4)
    rows = [at + s for s in range(3) if 0 <= at + s < 8]
    kept = [s for s in range(3) if 0 <= at + s < 8]
    want = T(cache).index_copy(2, torch.tensor(rows, dtype=torch.int64),
                               T(new)[:, :, kept])
    exact(ref("cache_write", [cache, new, np.array([at], np.int32)]), want)


@pytest.mark.parametrize("storage", ["f16", "bf16"])
def test_layout_rounded(storage: str) -> None:
    """Moving data never changes a value."""
    x = randn(rng("layout", storage), 2, 3, 4).astype(NP_FLOAT[storage])
    tx = T(x.astype(np.float32)).to(TORCH_FLOAT[storage])
    cases = [
        ("reshape", [x], {"shape": (6, 4)}, tx.reshape(6, 4)),
        ("transpose", [x], {"perm": (2, 0, 1)}, tx.permute(2, 0, 1)),
        ("slice", [x], {"starts": (0, 1, 1), "ends": (2, 3, 3)}, tx[:, 1:3, 1:3]),
        ("concat", [x, x], {"axis": 1}, torch.cat([tx, tx], 1)),
        ("expand", [x[:, :1]], {"shape": (2, 2, 3, 4)}, tx[:, :1].expand(2, 2, 3, 4)),
    ]
    for op, xs, attrs, want in cases:
        got = run_node(op, xs, attrs, storage)
        close_rounded(got, want, storage, ulps=0, atol=0)


# ----------------------------------------------------------------------------------------------
# The reference's result stays in the compute dtype (RefFn's contract: "the result, still in the
# compute dtype (the caller rounds it)").

def _dtype_cases() -> list[Any]:
    return [pytest.param(name, dt, id=f"{name}-{dt}") for name in UNARY
            for dt in ("float32", "float16")]


@pytest.mark.parametrize(("name", "dt"), _dtype_cases())
def test_unary_reference_keeps_compute_dtype(name: str, dt: str) -> None:
    x = unary_input(name, rng(name, "dtype"), (4, 5)).astype(dt)
    attrs = UNARY_TORCH[name][1][-1]
    with np.errstate(all="ignore"):
        out = np.asarray(OPS[name].reference([x], attrs))
    assert out.dtype == np.dtype(dt)


def test_other_references_keep_f32() -> None:
    """One call of every non-unary float op on float32 operands returns float32."""
    g = rng("dtype-f32")
    x4 = randn(g, 2, 3, 4, 4)
    c = randn(g, 3)
    calls: list[tuple[str, list[np.ndarray], dict[str, Any]]] = [
        *((n, [randn(g, 2, 3), randn(g, 3)], {}) for n in BINARY_TORCH),
        ("select", [np.ones((2, 3), bool), randn(g, 2, 3), randn(g, 3)], {}),
        ("bias_add", [x4, c], {"axis": 1}), ("scale_mul", [x4, c], {"axis": 1}),
        ("conv", [x4, randn(g, 2, 3, 3, 3)],
         dict(stride=(1, 1), pre_pad=(1, 1), post_pad=(1, 1), dilation=(1, 1), groups=1)),
        ("conv_transpose", [x4, randn(g, 3, 2, 3, 3)],
         dict(stride=(2, 2), pad=(1, 1), dilation=(1, 1), output_pad=(1, 1))),
        ("matmul", [randn(g, 3, 4), randn(g, 4, 2)], {}),
        ("batchnorm", [x4, c, np.abs(c) + 1, c, c], {"eps": 1e-5}),
        ("layernorm", [x4, randn(g, 4), randn(g, 4)], {"axes": (3,), "eps": 1e-5}),
        ("rmsnorm", [x4, randn(g, 4)], {"axes": (3,), "eps": 1e-5, "operands": ("x", "scale")}),
        ("instancenorm", [x4, c, c], {"eps": 1e-5}),
        ("groupnorm", [randn(g, 2, 4, 4, 4), randn(g, 4), randn(g, 4)], {"groups": 2, "eps": 1e-5}),
        *((n, [x4], {"axes": (1, 2), "keepdims": False}) for n in REDUCE_NAMES),
        ("genstats", [x4], {"output": 1}),
        ("sdpa", [randn(g, 1, 2, 3, 8), randn(g, 1, 1, 4, 8), randn(g, 1, 1, 4, 8)],
         {"scale": None, "causal": True, "window": 2}),
        ("maxpool", [x4], {"window": (2, 2), "stride": (2, 2), "pad": (1, 1)}),
        ("avgpool", [x4], {"window": (3, 3), "stride": (1, 1), "pad": (1, 1), "count_pad": False}),
        ("avgpool", [x4], {"window": (3, 3), "stride": (1, 1), "pad": (1, 1), "count_pad": True}),
        ("upsample", [x4], {"factor": (2, 3), "mode": "bilinear"}),
        ("upsample", [x4], {"factor": (2, 3), "mode": "nearest"}),
        ("reshape", [x4], {"shape": (6, 16)}), ("transpose", [x4], {"perm": (0, 2, 3, 1)}),
        ("slice", [x4], {"starts": (0, 0, 1, 1), "ends": (2, 3, 3, 3)}),
        ("concat", [x4, x4], {"axis": 0}), ("cast", [x4], {"dtype": "f16"}),
        ("expand", [x4[:1]], {"shape": (3, 3, 4, 4)}),
        ("contiguous", [x4], {}),
    ]
    bad = []
    for op, xs, attrs in calls:
        out = ref(op, xs, **attrs)
        if out.dtype != np.float32:
            bad.append((op, out.dtype))
    assert not bad, bad


# ----------------------------------------------------------------------------------------------
# Hypothesis: random shapes and values for the pointwise and reduction families.

HYP = settings(max_examples=60, deadline=None, derandomize=True,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# Domain (lo, hi) per unary op for the random values (finite float32 in [lo, hi]).
HYP_DOMAIN = {name: UNARY_TORCH[name][2] for name in UNARY_TORCH}
HYP_DOMAIN["reciprocal"] = (0.01, 1e4)


def _f32(lo: float, hi: float) -> st.SearchStrategy[float]:
    return st.floats(float(np.float32(lo)), float(np.float32(hi)), width=32, allow_nan=False,
                     allow_infinity=False)


shapes = hnp.array_shapes(min_dims=0, max_dims=4, min_side=1, max_side=5)


@HYP
@given(data=st.data())
def test_hypothesis_unary(data: st.DataObject) -> None:
    name = data.draw(st.sampled_from(sorted(UNARY_TORCH)), label="op")
    attrs = data.draw(st.sampled_from(UNARY_TORCH[name][1]), label="attrs")
    lo, hi = HYP_DOMAIN[name]
    shape = data.draw(shapes, label="shape")
    x = data.draw(hnp.arrays(np.float32, shape, elements=_f32(lo, hi)), label="x")
    if name == "reciprocal":
        signs = data.draw(hnp.arrays(np.bool_, shape), label="signs")
        x = np.where(signs, -x, x).astype(np.float32)
    got = ref(name, [x], **attrs)
    want = UNARY_TORCH[name][0](T(x), attrs)
    if name in EXACT_UNARY:
        exact(got.astype(np.float32).reshape(want.shape), want.numpy())
    else:
        close(got, want)


@HYP
@given(data=st.data())
def test_hypothesis_binary(data: st.DataObject) -> None:
    name = data.draw(st.sampled_from(sorted([*BINARY_TORCH, *COMPARE_TORCH])), label="op")
    sa, sb = data.draw(hnp.mutually_broadcastable_shapes(num_shapes=2, max_dims=4, max_side=4),
                       label="shapes").input_shapes
    if name == "pow":
        a = data.draw(hnp.arrays(np.float32, sa, elements=_f32(0.01, 10)), label="a")
        b = data.draw(hnp.arrays(np.float32, sb, elements=_f32(-4, 4)), label="b")
    else:
        a = data.draw(hnp.arrays(np.float32, sa, elements=_f32(-1e4, 1e4)), label="a")
        b = data.draw(hnp.arrays(np.float32, sb, elements=_f32(-1e4, 1e4)), label="b")
    if name == "div":
        b = np.where(np.abs(b) < 1e-3, np.float32(1), b).astype(np.float32)
    fn = BINARY_TORCH.get(name) or COMPARE_TORCH[name]
    got = ref(name, [a, b])
    want = fn(T(a), T(b))
    if name == "pow":
        close(got, want)
    else:
        exact(got.astype(want.numpy().dtype), want.numpy())


@HYP
@given(data=st.data())
def test_hypothesis_select_and_along_axis(data: st.DataObject) -> None:
    sm, sa, sb = data.draw(hnp.mutually_broadcastable_shapes(num_shapes=3, max_dims=4, max_side=4),
                           label="shapes").input_shapes
    mask = data.draw(hnp.arrays(np.bool_, sm), label="mask")
    a = data.draw(hnp.arrays(np.float32, sa, elements=_f32(-1e3, 1e3)), label="a")
    b = data.draw(hnp.arrays(np.float32, sb, elements=_f32(-1e3, 1e3)), label="b")
    exact(ref("select", [mask, a, b]), torch.where(T(mask), T(a), T(b)).numpy())
    name = data.draw(st.sampled_from(["bias_add", "scale_mul"]), label="op")
    xshape = data.draw(hnp.array_shapes(min_dims=1, max_dims=5, min_side=1, max_side=4),
                       label="xshape")
    axis = data.draw(st.integers(0, len(xshape) - 1), label="axis")
    x = data.draw(hnp.arrays(np.float32, xshape, elements=_f32(-1e3, 1e3)), label="x")
    v = data.draw(hnp.arrays(np.float32, (xshape[axis],), elements=_f32(-1e3, 1e3)), label="v")
    shape = [1] * len(xshape)
    shape[axis] = xshape[axis]
    tv = T(v).reshape(shape)
    want = T(x) + tv if name == "bias_add" else T(x) * tv
    exact(ref(name, [x, v], axis=axis).astype(np.float32), want.numpy())


@HYP
@given(data=st.data())
def test_hypothesis_reduce(data: st.DataObject) -> None:
    name = data.draw(st.sampled_from(REDUCE_NAMES), label="op")
    shape = data.draw(hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=6),
                      label="shape")
    axes = tuple(sorted(data.draw(st.sets(st.integers(0, len(shape) - 1), min_size=1),
                                  label="axes")))
    keepdims = data.draw(st.booleans(), label="keepdims")
    if name == "reduce_prod":
        elements = _f32(0.5, 1.5)
    else:
        elements = _f32(-100, 100)
    x = data.draw(hnp.arrays(np.float32, shape, elements=elements), label="x")
    got = ref(name, [x], axes=axes, keepdims=keepdims)
    want = torch_reduce(name, T(x), axes, keepdims)
    k = math.prod(shape[a] for a in axes)
    t = reduce_tol(name, k)
    if name != "reduce_prod":
        t["atol"] *= 100  # values up to 100 rather than ~3
    close(got, want, **t)


@HYP
@given(data=st.data())
def test_hypothesis_genstats(data: st.DataObject) -> None:
    shape = data.draw(hnp.array_shapes(min_dims=2, max_dims=5, min_side=1, max_side=4),
                      label="shape")
    output = data.draw(st.sampled_from([0, 1]), label="output")
    x = data.draw(hnp.arrays(np.float32, shape, elements=_f32(-10, 10)), label="x")
    got = ref("genstats", [x], output=output)
    tx = T(x)
    want = torch.sum(tx if output == 0 else tx * tx, dim=[0, *range(2, len(shape))], keepdim=True)
    k = shape[0] * math.prod(shape[2:])
    close(got, want, rtol=RTOL, atol=(ATOL + 1e-6 * k) * 100)


# ----------------------------------------------------------------------------------------------


def test_every_op_is_covered() -> None:
    """Every op in OPS is declared covered here, and nothing else is."""
    missing = set(OPS) - COVERED
    assert not missing, f"ops without a reference test: {sorted(missing)}"
    assert not COVERED - set(OPS), f"unknown ops declared: {sorted(COVERED - set(OPS))}"


def test_every_op_was_exercised(request: pytest.FixtureRequest) -> None:
    """After a full run of this module (in one process), every op's reference was called. With
    part of the module selected, or tests spread over workers, this cannot be known: skipped,
    saying so."""
    module = request.module
    tests = {n for n in dir(module) if n.startswith("test_") and callable(getattr(module, n))}
    selected = {item.originalname for item in request.session.items
                if getattr(item, "module", None) is module}
    if not selected >= tests or hasattr(request.config, "workerinput"):
        pytest.skip("needs every test of test_op_references.py run in this process")
    assert set(OPS) == EXERCISED, sorted(set(OPS) - EXERCISED)
