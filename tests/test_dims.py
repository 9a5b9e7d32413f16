"""Property tests of the symbolic dim arithmetic (`dslc.core.dims`) and of shape-pattern
unification through the checker.

Random dims are polynomials over a few symbols with ranges and alignments (built with
`add/sub/mul`, exact divisions and, where a test allows it, `floordiv` atoms); "admissible
values" are the multiples of each symbol's alignment inside its range.
"""

from __future__ import annotations

import operator
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from dslc.core import dims
from dslc.core.dims import Dim, DimEnv, SymInfo
from tests.helpers import Checked, check_source, model_snippet

SETTINGS = settings(deadline=None, max_examples=100,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])
CHECKER = settings(SETTINGS, max_examples=50)  # each example checks a model (a few ms)

# name, lo, hi, align: admissible H is even in 2..40, N a multiple of 4 in 4..32, S in {3, 6, 9}
SYMS = (SymInfo("H", 2, 40, 2), SymInfo("W", 3, 17, 1), SymInfo("N", 1, 32, 4),
        SymInfo("S", 1, 9, 3))
ADMISSIBLE = {s.name: [v for v in range(s.lo, s.hi + 1) if v % s.align == 0] for s in SYMS}
DIM_DECLS = "\n".join(f"  dim {s.name} = {s.lo}..{s.hi} align {s.align}" for s in SYMS)


def make_env() -> DimEnv:
    env = DimEnv()
    for s in SYMS:
        env.add(s)
    return env


# One env for the generated dims: floor atoms register themselves here by name (a name is a
# function of the atom's content, so sharing it across examples is harmless).
ENV = make_env()

H, W, N, S = (dims.sym(s.name) for s in SYMS)

# ---- strategies ------------------------------------------------------------------------------

leaves = st.one_of(st.sampled_from([H, W, N, S]), st.integers(-4, 6))


def _exact_or_self(x: Dim, c: int) -> Dim:
    q = dims.div_exact(x, c, ENV)
    return x if q is None else q


def _extend(children: st.SearchStrategy[Dim]) -> st.SearchStrategy[Dim]:
    return st.one_of(
        st.builds(dims.add, children, children),
        st.builds(dims.sub, children, children),
        st.builds(dims.mul, children, children),
        st.builds(_exact_or_self, children, st.integers(2, 4)),
    )


def _extend_floor(children: st.SearchStrategy[Dim]) -> st.SearchStrategy[Dim]:
    return st.one_of(_extend(children),
                     st.builds(lambda x, c: dims.floordiv(x, c, ENV), children, st.integers(1, 5)))


polys = st.recursive(leaves, _extend, max_leaves=6)  # integer-valued, no floor atoms
fpolys = st.recursive(leaves, _extend_floor, max_leaves=6)  # with floor atoms
values = st.fixed_dictionaries({name: st.sampled_from(vs) for name, vs in ADMISSIBLE.items()})
points = st.lists(values, min_size=1, max_size=6)
nonzero_ints = st.integers(-6, 6).filter(lambda c: c != 0)
monomials = st.builds(
    lambda c, syms: dims.mul(c, _product(syms)),
    nonzero_ints, st.lists(st.sampled_from([H, W, N, S]), min_size=1, max_size=3))
multi_term = st.builds(lambda a, k: dims.add(a, k), st.sampled_from([H, W, N, S]),
                       nonzero_ints)  # e.g. H + 1: a divisor with several terms


def _product(factors: list[Dim]) -> Dim:
    out: Dim = 1
    for f in factors:
        out = dims.mul(out, f)
    return out


def exact(a: Dim, b: Dim, env: DimEnv = ENV) -> Dim:
    q = dims.div_exact(a, b, env)
    assert q is not None, (a, b)
    return q


def ev(x: Dim, v: dict[str, int]) -> int:
    return dims.evaluate(x, v, ENV)


# ---- ring laws -------------------------------------------------------------------------------


@SETTINGS
@given(polys, polys, polys)
def test_add_commutative_and_associative(a: Dim, b: Dim, c: Dim) -> None:
    assert dims.add(a, b) == dims.add(b, a)
    assert dims.add(dims.add(a, b), c) == dims.add(a, dims.add(b, c))
    assert dims.add(a, 0) == a


@SETTINGS
@given(polys, polys, polys)
def test_mul_commutative_and_associative(a: Dim, b: Dim, c: Dim) -> None:
    assert dims.mul(a, b) == dims.mul(b, a)
    assert dims.mul(dims.mul(a, b), c) == dims.mul(a, dims.mul(b, c))
    assert dims.mul(a, 1) == a
    assert dims.mul(a, 0) == 0


@SETTINGS
@given(polys, polys, polys)
def test_mul_distributes_over_add_and_sub(a: Dim, b: Dim, c: Dim) -> None:
    assert dims.mul(a, dims.add(b, c)) == dims.add(dims.mul(a, b), dims.mul(a, c))
    assert dims.mul(dims.sub(b, c), a) == dims.sub(dims.mul(b, a), dims.mul(c, a))


@SETTINGS
@given(fpolys, fpolys)
def test_sub_and_neg(a: Dim, b: Dim) -> None:
    assert dims.sub(a, a) == 0
    assert dims.add(dims.sub(a, b), b) == a
    assert dims.neg(dims.neg(a)) == a
    assert dims.add(a, dims.neg(a)) == 0


@SETTINGS
@given(fpolys, fpolys)
def test_equal_dims_hash_equal(a: Dim, b: Dim) -> None:
    # built in two different orders, the normal forms are the same object value
    x = dims.add(dims.mul(a, b), a)
    y = dims.mul(dims.add(b, 1), a)
    assert x == y
    assert hash(x) == hash(y)


def test_normal_form_equality_is_structural() -> None:
    env = make_env()
    assert dims.div_exact(dims.mul(H, 2), 2, env) == H
    assert dims.div_exact(dims.mul(2, H), 2, env) is not None
    assert dims.mul(dims.add(H, W), dims.sub(H, W)) == dims.sub(dims.mul(H, H), dims.mul(W, W))
    assert dims.add(H, H) == dims.mul(2, H) == dims.mul(H, 2)
    assert dims.sub(dims.add(H, 3), 3) == H and isinstance(dims.sub(dims.add(H, 3), H), int)
    assert dims.mul(exact(H, 2, env), 2) == H  # H / 2 * 2 == H (H has align 2)
    # N and W are never equal, whatever their ranges
    assert dims.sym("A") != dims.sym("B")
    assert dims.compare(W, dims.sym("W2"), "==", env) is None


# ---- exact division --------------------------------------------------------------------------


@SETTINGS
@given(fpolys, st.one_of(nonzero_ints, monomials))
def test_div_exact_inverts_mul(a: Dim, c: Dim) -> None:
    assert dims.div_exact(dims.mul(a, c), c, ENV) == a


@SETTINGS
@given(polys, multi_term)
def test_div_exact_inverts_mul_by_multi_term_divisor(a: Dim, c: Dim) -> None:
    assert dims.div_exact(dims.mul(a, c), c, ENV) == a


@SETTINGS
@given(fpolys, st.one_of(nonzero_ints, monomials), points)
def test_div_exact_is_sound(a: Dim, b: Dim, vs: list[dict[str, int]]) -> None:
    """When `div_exact` answers q, then a == q * b at every admissible value; when the division
    leaves a remainder at some admissible value, it must answer None."""
    q = dims.div_exact(a, b, ENV)
    for v in vs:
        va, vb = ev(a, v), ev(b, v)
        if va % vb != 0:
            assert q is None, (a, b, q, v)
        if q is not None:
            assert ev(q, v) * vb == va, (a, b, q, v)


@SETTINGS
@given(st.one_of(st.tuples(polys, polys), st.tuples(polys, multi_term),
                 multi_term.map(lambda m: (m, m))), points)
def test_div_exact_is_sound_for_any_divisor(ab: tuple[Dim, Dim], vs: list[dict[str, int]]) -> None:
    a, b = ab
    q = dims.div_exact(a, b, ENV)
    if q is None:  # sound: "cannot tell" is always allowed, except for a dim over itself
        assert a != b, (a, b)
        return
    for v in vs:
        assert ev(q, v) * ev(b, v) == ev(a, v), (a, b, q, v)


def test_div_exact_self_is_one() -> None:
    env = make_env()
    for a in (H, dims.mul(3, H), dims.mul(H, W), 7):
        assert dims.div_exact(a, a, env) == 1



def test_div_exact_multi_term_self_is_one() -> None:
    env = make_env()
    a = dims.add(H, 1)
    assert dims.div_exact(a, a, env) == 1


def test_div_exact_rejects_inexact() -> None:
    env = DimEnv()
    env.add(SymInfo("H", 1, 64))  # H may be odd
    env.add(SymInfo("E", 2, 64, 2))  # E is even
    h, e = dims.sym("H"), dims.sym("E")
    assert dims.div_exact(h, 2, env) is None
    assert dims.div_exact(dims.mul(3, h), 2, env) is None
    assert dims.div_exact(dims.add(e, 1), 2, env) is None  # E + 1 is odd
    assert dims.div_exact(e, 4, env) is None  # E = 6 is admissible
    assert dims.div_exact(dims.mul(h, e), 2, env) is not None  # H * E is even
    assert dims.div_exact(e, 2, env) is not None
    assert dims.div_exact(dims.add(e, 2), 2, env) == dims.add(exact(e, 2, env), 1)
    assert dims.div_exact(7, 2, env) is None
    assert dims.div_exact(h, 0, env) is None
    assert dims.div_exact(h, dims.mul(h, e), env) is None  # 1 / E is not a polynomial


# ---- evaluation ------------------------------------------------------------------------------


@SETTINGS
@given(fpolys, fpolys, values)
def test_evaluate_is_a_ring_homomorphism(a: Dim, b: Dim, v: dict[str, int]) -> None:
    va, vb = ev(a, v), ev(b, v)
    assert ev(dims.add(a, b), v) == va + vb
    assert ev(dims.sub(a, b), v) == va - vb
    assert ev(dims.mul(a, b), v) == va * vb
    assert ev(dims.neg(a), v) == -va


@SETTINGS
@given(fpolys, st.integers(1, 6), values)
def test_floordiv_agrees_with_python(a: Dim, c: int, v: dict[str, int]) -> None:
    assert ev(dims.floordiv(a, c, ENV), v) == ev(a, v) // c


@SETTINGS
@given(polys, st.integers(1, 6))
def test_floordiv_is_exact_when_alignment_allows(a: Dim, c: int) -> None:
    """floor(c * a / c) is simplified back to `a` (no opaque atom) for an integer-valued `a`."""
    assert dims.floordiv(dims.mul(a, c), c, ENV) == a


@SETTINGS
@given(fpolys, values)
def test_interval_contains_every_admissible_value(a: Dim, v: dict[str, int]) -> None:
    lo, hi = dims.interval(a, ENV)
    assert lo <= ev(a, v) <= hi


def test_interval_is_tight_for_a_single_symbol() -> None:
    env = make_env()
    assert dims.interval(H, env) == (2, 40)
    assert dims.interval(N, env) == (4, 32)  # lo 1 rounded up to the alignment
    assert dims.interval(S, env) == (3, 9)
    assert dims.interval(dims.sub(10, W), env) == (-7, 7)


COMPARE_OPS: dict[str, Callable[[int, int], bool]] = {
    "==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le,
    ">": operator.gt, ">=": operator.ge}


@SETTINGS
@given(fpolys, fpolys, points)
def test_compare_never_contradicts_evaluation(a: Dim, b: Dim, vs: list[dict[str, int]]) -> None:
    for op, fn in COMPARE_OPS.items():
        verdict = dims.compare(a, b, op, ENV)
        if verdict is None:
            continue
        for v in vs:
            assert fn(ev(a, v), ev(b, v)) == verdict, (a, op, b, v)


def test_compare_decides_what_ranges_prove() -> None:
    env = make_env()
    assert dims.compare(H, 1, ">=", env) is True
    assert dims.compare(H, 41, "<", env) is True
    assert dims.compare(W, 2, "<=", env) is False
    assert dims.compare(H, W, "==", env) is None
    assert dims.compare(dims.add(H, 1), H, ">", env) is True
    assert dims.compare(dims.mul(2, H), dims.add(H, H), "==", env) is True


# ---- printing round-trips through the checker ------------------------------------------------


@pytest.fixture(scope="module")
def workdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as d:
        yield Path(d)


HI = {s.name: (s.hi // s.align) * s.align for s in SYMS}  # the only bucket of each dim


@CHECKER
@given(polys)
def test_format_dim_round_trips_through_the_checker(workdir: Path, a: Dim) -> None:
    # A dim must be at least 1 over the whole range of the dims it uses (E0606 otherwise).
    assume(dims.interval(a, ENV)[0] >= 1)
    text = dims.format_dim(a)
    c = check_source(model_snippet(f"{DIM_DECLS}\n  dim X = {text}\n  input x: [3]\n  output y = x"),
               workdir)
    assert c.codes == [], (text, [d.message for d in c.diagnostics])
    (decl,) = [d for d in c.model.dims if d.name == "X"]
    assert decl.value == a, text


# ---- unification through def shape patterns --------------------------------------------------

# spellings of dims in the model, each with its normal form
SPELLINGS: list[tuple[str, Dim]] = [
    ("H", H), ("H + 0", H), ("2 * H / 2", H), ("W", W), ("W - 2 + 2", W),
    ("2 * H", dims.mul(2, H)), ("H + H", dims.mul(2, H)), ("H * 2", dims.mul(2, H)),
    ("4 * H / 2", dims.mul(2, H)), ("H / 2", exact(H, 2)),
    ("H * W", dims.mul(H, W)), ("W * H", dims.mul(H, W)), ("3", 3), ("1 + 2", 3), ("6 / 2", 3),
    ("D", 3), ("1", 1), ("N", N), ("N / 4", exact(N, 4)), ("6", 6), ("2 * D", 6),
    ("W - 2", dims.sub(W, 2)), ("2 * W - 4", dims.mul(2, dims.sub(W, 2))), ("5", 5),
    ("2 * W - 5", dims.sub(dims.mul(2, W), 5)), ("H - 1", dims.sub(H, 1)),
]
MODEL_DIMS = DIM_DECLS + "\n  dim D = 3"
spelling = st.sampled_from(SPELLINGS)


def _shape_of(c: Checked, node_op: str) -> list[tuple[Dim, ...]]:
    return [n.type.shape for n in c.model.graph.nodes if n.op == node_op]


def _input_shapes(c: Checked) -> dict[str, tuple[Dim, ...]]:
    return {n.name: n.type.shape for n in c.model.graph.nodes if n.op == "input"}


IDENTITY_DEF = "def f(x: [A, B]) -> [A, B] {\n  return relu(x)\n}\n"


@CHECKER
@given(spelling, spelling)
def test_def_pattern_binds_any_dims(workdir: Path, d1: tuple[str, Dim],
                                    d2: tuple[str, Dim]) -> None:
    src = model_snippet(f"{MODEL_DIMS}\n  input a: [{d1[0]}, {d2[0]}]\n  output y = f(a)",
                        IDENTITY_DEF)
    c = check_source(src, workdir)
    assert c.codes == [], [d.message for d in c.diagnostics]
    assert _input_shapes(c)["a"] == (d1[1], d2[1])
    assert _shape_of(c, "relu") == [(d1[1], d2[1])]


REPEATED_DEF = "def g(x: [K, K]) -> [K, K] {\n  return relu(x)\n}\n"


@CHECKER
@given(spelling, spelling)
def test_repeated_pattern_name_needs_equal_dims(workdir: Path, d1: tuple[str, Dim],
                                                d2: tuple[str, Dim]) -> None:
    src = model_snippet(f"{MODEL_DIMS}\n  input a: [{d1[0]}, {d2[0]}]\n  output y = g(a)",
                        REPEATED_DEF)
    c = check_source(src, workdir)
    if d1[1] == d2[1]:
        assert c.codes == [], [d.message for d in c.diagnostics]
        assert _shape_of(c, "relu") == [(d1[1], d2[1])]
    else:
        assert c.codes == ["E0301"], [d.message for d in c.diagnostics]


CHECKED_DEF = "def h(x: [K, 2 * K - 1]) -> [K, 2 * K - 1] {\n  return relu(x)\n}\n"


@CHECKER
@given(spelling, spelling)
def test_pattern_expression_is_checked(workdir: Path, d1: tuple[str, Dim],
                                       d2: tuple[str, Dim]) -> None:
    """`[K, 2 * K - 1]`: K binds, then the second axis must equal 2 * K - 1 in normal form."""
    src = model_snippet(f"{MODEL_DIMS}\n  input a: [{d1[0]}, {d2[0]}]\n  output y = h(a)",
                        CHECKED_DEF)
    c = check_source(src, workdir)
    if dims.sub(dims.mul(2, d1[1]), 1) == d2[1]:
        assert c.codes == [], [d.message for d in c.diagnostics]
        assert _shape_of(c, "relu") == [(d1[1], d2[1])]
    else:
        assert c.codes == ["E0301"], [d.message for d in c.diagnostics]


VARIADIC_DEFS = """
def v(x: [*L, Z]) -> [*L, Z] {
  return relu(x)
}
def r(x: [*L, Z]) -> [*L, 1] {
  return reduce_sum(x, axes=[-1], keepdims=true)
}
def m(x: [A, *L, B]) -> [A, *L, B] {
  return sigmoid(x)
}
"""


@CHECKER
@given(st.lists(spelling, min_size=0, max_size=5))
def test_variadic_pattern_binds_any_prefix(workdir: Path, shape: list[tuple[str, Dim]]) -> None:
    text = ", ".join(s for s, _ in shape)
    body = f"{MODEL_DIMS}\n  input a: [{text}]\n  output y = v(a)\n  output z = r(a)"
    if len(shape) >= 2:
        body += "\n  output w = m(a)"
    c = check_source(model_snippet(body, VARIADIC_DEFS), workdir)
    if not shape:  # `[*L, Z]` needs at least one axis
        assert "E0301" in c.codes and all(code.startswith("E03") for code in c.codes)
        return
    assert c.codes == [], [d.message for d in c.diagnostics]
    a = _input_shapes(c)["a"]
    assert a == tuple(d for _, d in shape)
    assert _shape_of(c, "relu") == [a]
    assert _shape_of(c, "reduce_sum") == [(*a[:-1], 1)]
    assert _shape_of(c, "sigmoid") == ([a] if len(shape) >= 2 else [])
