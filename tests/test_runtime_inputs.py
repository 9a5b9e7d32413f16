"""The runtime's input binding (`dslc.runtime.inputs.bind_inputs`), on the CPU: the dynamic dims
read off the given shapes, and each refusal with its R-code, one sentence and the `.cgraph` line
it points at (R0201 missing or unexpected, R0301 shape, R0401 dtype, R0601 range, R0602
alignment); R0501 (layout, device) where the CPU can reach it."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest

from dslc.core import dims
from dslc.core.errors import RunnerError
from dslc.diag.diagnostic import Sink
from dslc.emit.manifest import manifest_record
from dslc.pipeline import Options, front_end
from dslc.runtime.inputs import bind_inputs
from dslc.runtime.manifest import Declared, DimDecl, Manifest, Where
from tests.conftest import ROOT
from tests.helpers import check_source

# Line numbers below are those of this text in the file (line 1 is `model m {`).
SOURCE = """model m {
  precision io=f16
  dim S = 2..64 align 2
  dim T = 1..8
  input a: [S, T]
  input b: [2 * S + 1]
  input c: [S / 2, 3]
  input d: [S * T]
  input e: bf16[T, 4]
  output y = relu(a)
  output z = relu(b)
  output w = relu(c)
  output v = relu(d)
  output u = relu(e)
}
"""
# Only a derived size can bind S here.
DERIVED_ONLY = """model only_derived {
  precision io=f32
  dim S = 2..64 align 2
  input b: [2 * S + 1]
  output z = relu(b)
}
"""


@pytest.fixture(scope="module")
def manifests(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Manifest]:
    out = {}
    for name, text in (("m", SOURCE), ("derived", DERIVED_ONLY)):
        checked = check_source(text, tmp_path_factory.mktemp(name))
        assert not checked.diagnostics, [d.message for d in checked.diagnostics]
        out[name] = manifest_record(checked.model)
    return out


def good(s: int = 4, t: int = 3) -> dict[str, tuple[tuple[int, ...], str]]:
    """Inputs consistent with S = s, T = t, worked out by hand from SOURCE."""
    return {"a": ((s, t), "f16"), "b": ((2 * s + 1,), "f16"), "c": ((s // 2, 3), "f16"),
            "d": ((s * t,), "f16"), "e": ((t, 4), "bf16")}


def refused(manifest: Manifest, given: dict[str, Any]) -> RunnerError:
    with pytest.raises(RunnerError) as err:
        bind_inputs(manifest, given)
    assert "\n" not in str(err.value)
    return err.value


def line_of(err: RunnerError) -> int:
    assert err.span is not None
    return int(err.span["line"])


@pytest.mark.parametrize("s, t", [(2, 1), (4, 3), (64, 8), (30, 7)])
def test_dims_are_read_off_the_shapes(manifests: dict[str, Manifest], s: int, t: int) -> None:
    assert bind_inputs(manifests["m"], good(s, t)) == {"S": s, "T": t}


@pytest.mark.parametrize("size, s", [(5, 2), (9, 4), (129, 64)])
def test_a_dim_is_solved_from_a_linear_size(manifests: dict[str, Manifest], size: int, s: int) -> None:
    """`2 * S + 1` given 9 binds S = 4 (no other input names S)."""
    assert bind_inputs(manifests["derived"], {"b": ((size,), "f32")}) == {"S": s}


@pytest.mark.parametrize("name, dtype", [("a", "f32"), ("b", "bf16"), ("e", "f16"), ("d", "i8")])
def test_a_wrong_dtype_is_r0401(manifests: dict[str, Manifest], name: str, dtype: str) -> None:
    given = good()
    given[name] = (given[name][0], dtype)
    err = refused(manifests["m"], given)
    want = "bf16" if name == "e" else "f16"
    assert err.code == "R0401"
    assert err.message == f"input `{name}` is {dtype}, expected {want}"
    assert line_of(err) == {"a": 5, "b": 6, "d": 8, "e": 9}[name]


def test_r0401_is_reported_before_the_shape_is_looked_at(manifests: dict[str, Manifest]) -> None:
    given = good()
    given["a"] = ((1, 2, 3), "f32")  # wrong rank and wrong dtype: the dtype is named
    assert refused(manifests["m"], given).code == "R0401"


def test_a_missing_input_is_r0201(manifests: dict[str, Manifest]) -> None:
    given = good()
    del given["c"]
    err = refused(manifests["m"], given)
    assert (err.code, err.message, line_of(err)) == ("R0201", "input `c` is missing", 7)


def test_an_unexpected_input_is_r0201_naming_the_inputs(manifests: dict[str, Manifest]) -> None:
    err = refused(manifests["m"], {**good(), "f": ((1,), "f16")})
    assert err.code == "R0201"
    assert err.message == "`m` has no input `f`; its inputs are a, b, c, d, e"


@pytest.mark.parametrize("name, shape, message, line", [
    ("a", (4,), "input `a` has rank 1, expected 2", 5),
    ("c", (2, 4), "input `c` has size 4 on axis 1, expected 3", 7),
    ("e", (3, 5), "input `e` has size 5 on axis 1, expected 4", 9),
    # derived sizes, once S = 4 and T = 3 are known from `a`
    ("b", (10,), "input `b` has size 10 on axis 0, expected 1 + 2 * S = 9", 6),
    ("c", (3, 3), "input `c` has size 3 on axis 0, expected 1/2 * S = 2", 7),
    ("d", (13,), "input `d` has size 13 on axis 0, expected S * T = 12", 8),
    ("e", (2, 4), "input `e` has size 2 on axis 0, expected T = 3", 9),
])
def test_a_wrong_shape_is_r0301(manifests: dict[str, Manifest], name: str, shape: tuple[int, ...],
                                message: str, line: int) -> None:
    err = refused(manifests["m"], {**good(), name: (shape, good()[name][1])})
    assert (err.code, err.message, line_of(err)) == ("R0301", message, line)


def test_a_size_no_value_of_the_dim_gives_is_r0301_in_one_sentence(
        manifests: dict[str, Manifest]) -> None:
    """10 is 2 * S + 1 for no integer S, and no other input binds S: the message names the
    expected size without a value (it once said `= None`)."""
    err = refused(manifests["derived"], {"b": ((10,), "f32")})
    assert err.code == "R0301" and line_of(err) == 4
    assert err.message == "input `b` has size 10 on axis 0, expected 1 + 2 * S"


@pytest.mark.parametrize("s, t, dim, value", [(66, 3, "S", 66), (0, 3, "S", 0), (4, 9, "T", 9),
                                              (4, 0, "T", 0)])
def test_a_dim_outside_its_range_is_r0601(manifests: dict[str, Manifest], s: int, t: int, dim: str,
                                          value: int) -> None:
    err = refused(manifests["m"], good(s, t))
    lo, hi, line = {"S": (2, 64, 3), "T": (1, 8, 4)}[dim]
    assert err.code == "R0601" and line_of(err) == line
    assert err.message == f"dim `{dim}` is {value}, outside {lo}..{hi}"


def test_a_dim_solved_from_a_derived_size_is_range_checked(manifests: dict[str, Manifest]) -> None:
    err = refused(manifests["derived"], {"b": ((201,), "f32")})  # S = 100 > 64
    assert (err.code, err.message) == ("R0601", "dim `S` is 100, outside 2..64")


def test_a_dim_off_its_alignment_is_r0602(manifests: dict[str, Manifest]) -> None:
    err = refused(manifests["m"], good(5, 3))
    assert (err.code, err.message, line_of(err)) == ("R0602", "dim `S` is 5, not a multiple of 2", 3)


def test_a_dim_solved_from_a_derived_size_is_alignment_checked(manifests: dict[str, Manifest]) -> None:
    err = refused(manifests["derived"], {"b": ((11,), "f32")})  # S = 5
    assert (err.code, err.message, line_of(err)) == ("R0602", "dim `S` is 5, not a multiple of 2", 3)


def test_example_models_bind_their_buckets() -> None:
    """Each bucket of the encoder, given as shapes, binds back to itself; one off fails."""
    result = front_end(ROOT / "models" / "encoder.cgraph", Options(), Sink())
    assert result.model is not None
    manifest = manifest_record(result.model)
    assert manifest.buckets
    for bucket in manifest.buckets:
        b, s = bucket["B"], bucket["S"]
        assert bind_inputs(manifest, {"tokens": ((b, s, 768), "bf16")}) == {"B": b, "S": s}
    err = refused(manifest, {"tokens": ((1, 12, 768), "bf16")})
    assert (err.code, err.message) == ("R0602", "dim `S` is 12, not a multiple of 8")


# -- R0501: where the runtime takes device arrays (`dslc.backend.device.as_array`) -------------
def test_a_cpu_torch_tensor_is_r0501() -> None:
    torch = pytest.importorskip("torch")
    from dslc.backend.device import as_array

    span = {"file": "m.cgraph", "line": 5, "col": 3}
    with pytest.raises(RunnerError) as err:
        as_array(torch.zeros(2, 3, dtype=torch.float16), "a", span)
    assert err.value.code == "R0501"
    assert str(err.value) == ("error[R0501]: input `a` is a CPU tensor; move it to the GPU "
                              "(`.cuda()`) (declared at m.cgraph:5:3)")


# -- manifests written out here: sizes of every form the binder reads, worked out by hand ------

def poly(*terms: tuple[tuple[tuple[str, int], ...], int, int]) -> Any:
    """A manifest dim: sum of num/den * product of sym**power."""
    return dims.make({mono: Fraction(num, den) for mono, num, den in terms})


HERE = Where("h.cgraph", 1, 1)


def hand_manifest(*shapes: list[Any], dims: str = "PQSTU", hi: dict[str, int] | None = None,
                  ) -> Manifest:
    return Manifest("h", "h.cgraph", {},
                    tuple(Declared(f"x{i}", "f32", tuple(s), None, HERE)
                          for i, s in enumerate(shapes)), (), (),
                    tuple(DimDecl(d, True, 0, (hi or {}).get(d, 100), 1, None, HERE)
                          for d in dims), ())


def given(*sizes: int) -> dict[str, tuple[tuple[int, ...], str]]:
    return {f"x{i}": ((n,), "f32") for i, n in enumerate(sizes)}


T1, U1 = (("T", 1),), (("U", 1),)


def test_known_terms_with_any_coefficient_are_taken_off_before_solving() -> None:
    # P + 3 * T + U / 2 + 2 = 15 with T = 2, U = 4: P = 15 - 6 - 2 - 2 = 5; 3 * S / 2 = 6: S = 4.
    m = hand_manifest([poly(((("P", 1),), 1, 1), (T1, 3, 1), (U1, 1, 2), ((), 2, 1))],
                      [poly(((("S", 1),), 3, 2))], [poly((T1, 1, 1))], [poly((U1, 1, 1))])
    assert bind_inputs(m, given(15, 6, 2, 4)) == {"P": 5, "S": 4, "T": 2, "U": 4}


def test_a_known_dim_is_raised_to_its_power() -> None:
    # P + T * T = 14 with T = 3: P = 5; and T * T is checked as 9 (T * 2 would be 6).
    m = hand_manifest([poly((T1, 1, 1))], [poly(((("P", 1),), 1, 1), ((("T", 2),), 1, 1))],
                      [poly(((("T", 2),), 1, 1))])
    assert bind_inputs(m, given(3, 14, 9)) == {"P": 5, "T": 3}


def test_a_square_of_the_unknown_dim_is_not_solved_but_refused() -> None:
    m = hand_manifest([poly(((("S", 2),), 1, 1))])
    with pytest.raises(RunnerError, match=r"^error\[R0301\]: input `x0` has size 9 on axis 0, "
                                          r"expected S \* S\b"):
        bind_inputs(m, given(9))


def test_sizes_are_solved_down_a_chain_of_later_inputs() -> None:
    # Q + P = 10, P + T = 5, T = 2, declared in that order: T, then P = 3, then Q = 7.
    m = hand_manifest([poly(((("Q", 1),), 1, 1), ((("P", 1),), 1, 1))],
                      [poly(((("P", 1),), 1, 1), (T1, 1, 1))], [poly((T1, 1, 1))])
    assert bind_inputs(m, given(10, 5, 2)) == {"P": 3, "Q": 7, "T": 2}


def test_a_dim_no_input_binds_does_not_stop_the_range_checks_of_the_others() -> None:
    m = hand_manifest([poly((T1, 1, 1))], dims="PT", hi={"T": 8})
    with pytest.raises(RunnerError, match=r"^error\[R0601\]: dim `T` is 9, outside 0\.\.8\b"):
        bind_inputs(m, given(9))
