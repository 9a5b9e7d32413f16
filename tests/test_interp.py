"""The reference interpreter's own logic (dslc/ir/interp.py) and the view arithmetic it reads
views with (dslc/ir/views.py), unit by unit on graphs built here: dims read off the inputs and
each refusal, the logical and the strided meaning of view steps, the memory order a view has in
its base, and results rounded to the dtype they are stored in. Expected values are worked out by
hand or read off NumPy / PyTorch strides, never from the functions under test."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import torch

from dslc.core import dims
from dslc.core.types import Layout, PrecisionSpec, TensorType
from dslc.diag.span import Span
from dslc.ir import interp, views
from dslc.ir.graph import Attrs, Graph, Node
from dslc.pipeline import lower_and_fuse
from tests.helpers import check_source

SPAN = Span("test.cgraph", 1, 1, 1, 2)
F32 = PrecisionSpec()
S, T = dims.sym("S"), dims.sym("T")


def node(name: str, op: str, inputs: tuple[str, ...] = (), attrs: Mapping[str, Any] | None = None,
         shape: tuple[Any, ...] = (), dtype: str = "f32", layout: Layout | None = None,
         precision: PrecisionSpec = F32) -> Node:
    return Node(name, op, inputs, Attrs(attrs or {}), TensorType(dtype, shape, layout), SPAN, "",
                precision)


def inputs_graph(*shapes: tuple[Any, ...]) -> Graph:
    """A param, then one input per shape (`x0`, `x1`, ...): inputs need not come first."""
    nodes = [node("w", "param", attrs={"path": "w"}, shape=(2,))]
    nodes += [node(f"x{i}", "input", attrs={"name": f"x{i}"}, shape=s) for i, s in enumerate(shapes)]
    return Graph(tuple(nodes), tuple((n.name, n.name) for n in nodes[1:]))


def zeros(*shape: int) -> np.ndarray:
    return np.zeros(shape, np.float32)


# -- dims read off the inputs ------------------------------------------------------------------

def test_dims_are_read_off_every_input_also_after_a_param() -> None:
    graph = inputs_graph((4,), (S,), (dims.add(dims.mul(2, T), 1),))
    assert interp.bind_dims(graph, {"x0": zeros(4), "x1": zeros(3), "x2": zeros(11)}) == \
        {"S": 3, "T": 5}  # 2 * T + 1 = 11


def test_a_known_dim_is_checked_where_it_appears_again() -> None:
    graph = inputs_graph((S,), (dims.add(dims.mul(2, S), 1),))
    assert interp.bind_dims(graph, {"x0": zeros(3), "x1": zeros(7)}) == {"S": 3}
    with pytest.raises(interp.InterpError,
                       match=r"^input `x1` has a size 8 where 2 \* S \+ 1 is 7$"):
        interp.bind_dims(graph, {"x0": zeros(3), "x1": zeros(8)})


def test_a_size_no_value_of_the_dim_gives_is_refused() -> None:
    # 2 * T + 1 is odd: no T gives 10 (T = 4 would read 9 elements of a 10-element input).
    graph = inputs_graph((dims.add(dims.mul(2, T), 1),))
    with pytest.raises(interp.InterpError,
                       match=r"^input `x0` has a size 10, which no `T` gives for 2 \* T \+ 1$"):
        interp.bind_dims(graph, {"x0": zeros(10)})


def test_the_constant_term_of_a_dim_is_taken_off_before_solving() -> None:
    graph = inputs_graph((dims.add(T, 3),))
    assert interp.bind_dims(graph, {"x0": zeros(8)}) == {"T": 5}


def test_a_dim_beside_known_dims_is_solved_for_the_one_unknown() -> None:
    # S + T + 1 = 6 with T = 2 bound first: S = 3 (the other input order is solved too).
    graph = inputs_graph((T,), (dims.add(dims.add(S, T), 1),))
    assert interp.bind_dims(graph, {"x0": zeros(2), "x1": zeros(6)}) == {"S": 3, "T": 2}
    graph = inputs_graph((dims.add(dims.add(S, T), 1),), (T,))
    assert interp.bind_dims(graph, {"x0": zeros(6), "x1": zeros(2)}) == {"S": 3, "T": 2}


def test_a_known_dim_is_raised_to_its_power_before_solving() -> None:
    # S + T * T = 14 with T = 3: S = 5 (T * 2 in place of T ** 2 would give 8).
    graph = inputs_graph((T,), (dims.add(S, dims.mul(T, T)),))
    assert interp.bind_dims(graph, {"x0": zeros(3), "x1": zeros(14)}) == {"S": 5, "T": 3}


def test_a_product_with_the_unknown_dim_is_not_solved() -> None:
    # S * T = 6 with T = 2 is not c * S + k: refused rather than S = 6.
    graph = inputs_graph((T,), (dims.mul(S, T),))
    with pytest.raises(interp.InterpError, match=r"^cannot read S \* T off input `x1`$"):
        interp.bind_dims(graph, {"x0": zeros(2), "x1": zeros(6)})


def test_a_size_of_two_unknown_dims_is_not_guessed() -> None:
    graph = inputs_graph((dims.add(dims.add(S, T), 1),))
    with pytest.raises(interp.InterpError, match=r"^cannot read S \+ T \+ 1 off input `x0`$"):
        interp.bind_dims(graph, {"x0": zeros(6)})


@pytest.mark.parametrize(("given", "message"), [
    ({"x0": zeros(4)}, "missing input `x1`"),
    ({"x0": zeros(4, 1), "x1": zeros(3)}, "input `x0` has rank 2, expected 1"),
    ({"x0": zeros(5), "x1": zeros(3)}, "input `x0` has a size 5 where 4 is declared"),
])
def test_inputs_that_do_not_fit_are_refused_naming_them(given: dict[str, np.ndarray],
                                                        message: str) -> None:
    with pytest.raises(interp.InterpError, match=f"^{message}$"):
        interp.bind_dims(inputs_graph((4,), (S,)), given)


# -- the logical meaning of view steps ---------------------------------------------------------

def test_view_steps_apply_in_order() -> None:
    x = np.arange(24).reshape(2, 3, 4)
    steps = (("transpose", (2, 0, 1)), ("reshape", (4, 6)), ("slice", (1, 2), (3, 5)))
    expected = torch.arange(24).reshape(2, 3, 4).permute(2, 0, 1).reshape(4, 6)[1:3, 2:5]
    np.testing.assert_array_equal(interp.apply_view(x, steps), expected.numpy())


def test_a_malformed_view_step_is_refused() -> None:
    x = np.arange(6).reshape(2, 3)
    with pytest.raises(ValueError, match="unknown view step squeeze"):
        interp.apply_view(x, (("squeeze", 0),))
    with pytest.raises(ValueError):  # starts for one axis, ends for two: never half applied
        interp.apply_view(x, (("slice", (1,), (2, 3)),))


# -- the memory order a view has in its base ---------------------------------------------------

def _torch_order(t: torch.Tensor) -> tuple[int, ...]:
    """Axes outermost first, read off the strides PyTorch gives the view."""
    return tuple(sorted(range(t.dim()), key=lambda a: -t.stride()[a]))


@pytest.mark.parametrize("steps", [
    (("transpose", (2, 0, 1)),),
    (("transpose", (1, 2, 0)), ("transpose", (0, 2, 1))),
    (("slice", (0, 1, 0), (2, 3, 4)),),
    (("reshape", (6, 4)),),
    (("transpose", (2, 0, 1)), ("reshape", (4, 6))),
    (("slice", (0, 0, 1), (2, 3, 3)), ("transpose", (1, 0, 2))),
])
def test_a_views_memory_order_is_the_order_its_strides_have(steps: tuple[Any, ...]) -> None:
    base = torch.arange(24).reshape(2, 3, 4)
    t = base
    for step in steps:
        t = (t.permute(*step[1]) if step[0] == "transpose" else t.view(*step[1])
             if step[0] == "reshape" else t[tuple(slice(s, e) for s, e in zip(*step[1:]))])
    layout = views.view_layout(Layout.row_major(3), (2, 3, 4), steps)
    assert layout is not None and layout.order == _torch_order(t)


def test_a_channels_last_base_seen_through_a_reshape() -> None:
    x = torch.empty(2, 3, 4, 5).to(memory_format=torch.channels_last)
    merged = x.view(2, 3, 20)  # H and W merge: still a view, channels innermost
    layout = views.view_layout(Layout((0, 2, 3, 1)), (2, 3, 4, 5), (("reshape", (2, 3, 20)),))
    assert layout is not None and layout.order == _torch_order(merged) == (0, 2, 1)
    # C and H do not merge over channels-last memory: PyTorch refuses the view, so does dslc.
    with pytest.raises(RuntimeError):
        x.view(2, 12, 5)
    assert views.view_layout(Layout((0, 2, 3, 1)), (2, 3, 4, 5), (("reshape", (2, 12, 5)),)) is None


@pytest.mark.parametrize(("shape", "order", "new", "expected"), [
    ((1, 2, 3), (0, 1, 2), (1, 2, 3), tuple(torch.empty(1, 2, 3).stride())),
    ((2, 3), (0, 1), (2, 1, 3), tuple(torch.empty(2, 1, 3).stride())),
    # base memory order (2, 0, 1): axis 1 has stride 1, axis 2 stride 2; the size-1 axis 0 gets
    # the stride of axis 1 times its size, 2
    ((1, 2, 3), (2, 0, 1), (1, 2, 3), (2, 1, 2)),
])
def test_a_size_one_axis_of_a_reshaped_view_gets_the_dense_stride(
        shape: tuple[int, ...], order: tuple[int, ...], new: tuple[int, ...],
        expected: tuple[int, ...]) -> None:
    """Its stride reads nothing, but cuDNN reads a tensor's packing off all its strides: the next
    axis's stride times that axis's size, as in a contiguous PyTorch tensor."""
    assert views.strides(shape, Layout(order), (("reshape", new),)) == (expected, 0)


@pytest.mark.parametrize("check", [
    lambda: views.step_shape((2, 3), ("slice", (0, 1), (1,))),  # starts and ends differ
    lambda: views.strides((2, 3), Layout.row_major(2), (("slice", (0,), (1,)),)),  # not the rank
])
def test_a_slice_step_that_does_not_fit_is_refused(check: Any) -> None:
    with pytest.raises(ValueError):
        check()


@pytest.mark.parametrize(("offset", "itemsize", "ok"), [
    (8, 2, True),                                  # 16 bytes
    (6, 2, False),                                 # 12 bytes
    (dims.mul(4, S), 4, True),                     # 16 * S bytes for every S
    (dims.add(dims.mul(8, S), 4), 2, False),       # 16 * S + 8 bytes
    (S, 2, False),                                 # 2 * S bytes: S = 1 is off
    (dims.add(dims.mul(8, S), dims.mul(16, T)), 2, True),
])
def test_a_view_offset_is_aligned_only_if_every_value_of_its_dims_is(offset: Any, itemsize: int,
                                                                     ok: bool) -> None:
    assert views.aligned(offset, itemsize) is ok


# -- reading a view through its strides --------------------------------------------------------

def test_a_strided_read_is_what_as_strided_reads_from_the_bases_memory() -> None:
    base = np.arange(24, dtype=np.float32).reshape(2, 3, 4)  # base[a, b, c] = 12a + 4b + c

    def element(k: int) -> int:  # memory order (2, 0, 1): k = 6c + 3a + b
        a, b, c = k // 3 % 2, k % 3, k // 6
        return 12 * a + 4 * b + c

    expected = [[element(5 + 3 * i + 7 * j) for j in range(2)] for i in range(3)]
    got = interp.strided_view(base, (2, 0, 1), (3, 2), (3, 7), 5, "v")
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize(("shape", "strides", "offset", "message"), [
    ((2, 3), (3, 1), 19, "reads element 24 of a base of 24"),  # 19 + 1 * 3 + 2 * 1: one past
    ((1, 3), (3, 1), 22, "reads element 24 of a base of 24"),  # a size-1 axis reads nothing more
    ((0, 3), (3, 1), 25, "reads element 24 of a base of 24"),  # empty, but starting past the end
    ((3,), (-1,), 2, "negative size, stride or offset"),
    ((3,), (1,), -1, "negative size, stride or offset"),
    ((-1,), (1,), 0, "negative size, stride or offset"),
])
def test_a_strided_read_outside_its_base_is_refused(shape: tuple[int, ...],
                                                    strides: tuple[int, ...], offset: int,
                                                    message: str) -> None:
    base = np.arange(24, dtype=np.float32).reshape(4, 6)
    with pytest.raises(interp.ViewError, match=f"^view `v`: {message}$" if "negative" in message
                       else f"^view `v` {message}$"):
        interp.strided_view(base, (0, 1), shape, strides, offset, "v")


def test_an_empty_strided_read_reads_nothing() -> None:
    base = np.arange(6, dtype=np.float32)
    assert interp.strided_view(base, (0,), (0, 3), (3, 1), 6, "v").shape == (0, 3)


def test_a_zero_stride_repeats_an_element() -> None:
    base = np.arange(6, dtype=np.float32)
    assert interp.strided_view(base, (0,), (3,), (0,), 4, "v").tolist() == [4.0, 4.0, 4.0]


# -- rounding results to the dtype they are stored in ------------------------------------------

def test_e4m3_results_saturate_at_448_as_cudnn_converts() -> None:
    n = node("y", "cast", ("x",), {"dtype": "f8e4m3"}, (3,), "f8e4m3")
    out = interp.evaluate_node(n, [np.array([1000.0, -1000.0, 3.0], np.float32)], n.attrs,
                               "f8e4m3")
    assert out.dtype == ml_dtypes.float8_e4m3fn
    assert out.astype(np.float32).tolist() == [448.0, -448.0, 3.0]


def test_integer_operands_are_widened_before_the_math() -> None:
    # 100 * 100 + 100 * 100 = 20000 does not fit i8 or i16 math; it is exact in the i32 result.
    n = node("y", "matmul", ("a", "b"), {}, (1, 1), "i32")
    a = np.array([[100, 100]], np.int8)
    out = interp.evaluate_node(n, [a, a.T.copy()], n.attrs, "i32")
    assert out.dtype == np.int32 and out.tolist() == [[20000]]


def test_the_math_is_done_in_the_compute_dtype() -> None:
    # 2048 + 1 = 2049 in f32; f16 holds 2048 and 2050 only: the f16 sum is 2048 (ties to even).
    def add(precision: PrecisionSpec, attrs: Mapping[str, Any]) -> float:
        n = node("y", "add", ("a", "b"), attrs, (1,), precision=precision)
        out = interp.evaluate_node(n, [np.array([2048.0], np.float32), np.array([1.0], np.float32)],
                                   n.attrs, "f32")
        return float(out[0])

    assert float(torch.tensor([2048.0], dtype=torch.float16).add(1.0)[0]) == 2048.0
    assert add(F32, {}) == 2049.0
    assert add(PrecisionSpec(compute="f16"), {}) == 2048.0
    assert add(F32, {"compute": "f16"}) == 2048.0  # a call's own `compute=` wins


def test_f32_math_rounds_each_step_of_a_reference() -> None:
    # rsqrt(6) = 1 / sqrt(6): sqrt rounded to f32, then the quotient. Computed in f64 and rounded
    # once, it is one ulp away: the reference must not run in f64.
    want = (1 / torch.sqrt(torch.tensor([6.0], dtype=torch.float32))).numpy()
    assert want[0] != np.float32(1 / np.sqrt(np.float64(6.0)))
    n = node("y", "rsqrt", ("x",), {}, (1,))
    out = interp.evaluate_node(n, [np.array([6.0], np.float32)], n.attrs, "f32")
    assert out.dtype == np.float32 and out[0] == want[0]


def test_integer_math_is_exact_past_what_a_float_holds() -> None:
    big = 2**53 + 1  # no float32 or float64 holds it
    n = node("y", "add", ("a", "b"), {}, (1,), "i64")
    out = interp.evaluate_node(n, [np.array([big], np.int64), np.array([0], np.int64)], n.attrs,
                               "i64")
    assert out.dtype == np.int64 and int(out[0]) == big


def test_operands_of_dtypes_dslc_does_not_store_are_a_float_and_an_integer() -> None:
    # A long double is a float: it is computed in the compute dtype (f16: 1 + 2**-12 is 1, the
    # f16 spacing at 1 being 2**-10). An int16 is an integer: it is widened, exactly (f16 math
    # would round 30001 to 30000).
    n = node("y", "add", ("a", "b"), {"compute": "f16"}, (1,))
    wide = interp.evaluate_node(n, [np.array([1.0], np.longdouble),
                                    np.array([2.0**-12], np.longdouble)], n.attrs, "f32")
    assert wide.dtype == np.float32 and wide.tolist() == [1.0]
    short = interp.evaluate_node(n, [np.array([30001], np.int16), np.array([30000], np.int16)],
                                 n.attrs, "i32")
    assert short.dtype == np.int32 and short.tolist() == [60001]


def test_math_in_a_dtype_numpy_cannot_compute_in_is_done_in_f32() -> None:
    # e4m3 math is emulated in f32, step by step: rsqrt(6) as PyTorch gives it in f32, one ulp
    # away from the f64 result rounded once (test_f32_math_rounds_each_step_of_a_reference).
    want = (1 / torch.sqrt(torch.tensor([6.0], dtype=torch.float32))).numpy()
    n = node("y", "rsqrt", ("x",), {"compute": "f8e4m3"}, (1,))
    out = interp.evaluate_node(n, [np.array([6.0], np.float32)], n.attrs, "f32")
    assert out.dtype == np.float32 and out[0] == want[0]


def test_infinities_and_nans_come_out_without_a_numpy_warning() -> None:
    n = node("y", "log", ("x",), {}, (3,))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = interp.evaluate_node(n, [np.array([0.0, -1.0, 1.0], np.float32)], n.attrs, "f32")
    assert out[0] == -np.inf and np.isnan(out[1]) and out[2] == 0.0


def test_a_load_time_view_is_its_steps() -> None:
    # The runtime computes load-time values (a reshaped or transposed param) through here.
    n = node("v", "view", ("w",), {"steps": (("transpose", (1, 0)), ("reshape", (6,)))}, (6,))
    w = np.arange(6, dtype=np.float32).reshape(2, 3)
    out = interp.evaluate_node(n, [w], n.attrs, "f32")
    np.testing.assert_array_equal(out, torch.arange(6.0).reshape(2, 3).t().reshape(6).numpy())


# -- whole graphs -------------------------------------------------------------------------------

def _lowered(text: str, tmp_path: Path) -> tuple[Graph, Any]:
    checked = check_source(text, tmp_path)
    lowered, _ = lower_and_fuse(checked.model)
    return lowered, checked.model.env


def test_sizes_that_are_floors_of_a_dim_are_evaluated(tmp_path: Path) -> None:
    text = "model m {\n  dim H = 2..9\n  input x: [1, 1, H]\n" \
           "  output y = reshape(maxpool(x, window=2), [-1])\n}\n"
    graph, env = _lowered(text, tmp_path)
    assert any("⌊" in dims.format_dim(d) for n in graph.nodes for d in n.type.shape)
    x = np.arange(7, dtype=np.float32).reshape(1, 1, 7)
    [y] = interp.run(graph, {"x": x}, {}, env).values()
    assert y.tolist() == [1.0, 3.0, 5.0]  # the maxima of [0 1] [2 3] [4 5]; 6 is left over


def test_inputs_and_weights_are_first_rounded_to_their_declared_dtype(tmp_path: Path) -> None:
    # Each read on its own: x - 1.0 in f32 math is 2**-12 (which f16 holds) unless x was first
    # rounded to f16, where it is 1.
    text = "model m {\n  precision io=f16, compute=f32\n  input x: [1]\n  param w: [1]\n" \
           "  output y = x - 1.0\n  output z = w - 1.0\n}\n"
    graph, env = _lowered(text, tmp_path)
    near_one = np.array([1 + 2.0**-12])  # float64; f16 holds 1 and 1 + 2**-10 around it
    assert np.float16(2.0**-12) == 2.0**-12
    out = interp.run(graph, {"x": near_one}, {"w": near_one}, env)
    assert out["y"].dtype == out["z"].dtype == np.float16
    assert out["y"].tolist() == out["z"].tolist() == [0.0]


def test_each_value_is_held_in_the_dtype_it_is_stored_in(tmp_path: Path) -> None:
    # Inputs and params in their declared dtypes, a scalar in f32 (cuDNN takes scalars as f32).
    text = "model m {\n  precision io=bf16, compute=f32\n  input x: [2]\n  param w: [2]\n" \
           "  output y = x * w + 0.5\n}\n"
    graph, env = _lowered(text, tmp_path)
    kept = interp.run(graph, {"x": np.ones(2)}, {"w": np.ones(2)}, env,
                      keep=lambda n: n.op in ("input", "param", "scalar"))
    dtypes = {n.op: str(kept[n.name].dtype) for n in graph.nodes
              if n.op in ("input", "param", "scalar")}
    assert dtypes == {"input": "bfloat16", "param": "bfloat16", "scalar": "float32"}


def test_a_missing_weight_is_refused_naming_it(tmp_path: Path) -> None:
    graph, env = _lowered("model m {\n  input x: [2]\n  param w: [2]\n  output y = x + w\n}\n",
                          tmp_path)
    with pytest.raises(interp.InterpError, match=r"^missing weight `w`$"):
        interp.run(graph, {"x": zeros(2)}, {}, env)


def test_a_value_that_is_an_output_and_read_again_is_kept(tmp_path: Path) -> None:
    text = "model m {\n  input x: [3]\n  let a = relu(x)\n  output y = a\n" \
           "  output z = a * 2.0\n}\n"
    graph, env = _lowered(text, tmp_path)
    x = np.array([-1.0, 0.0, 2.0], np.float32)
    out = interp.run(graph, {"x": x}, {}, env)
    assert out["y"].tolist() == [0.0, 0.0, 2.0] and out["z"].tolist() == [0.0, 0.0, 4.0]


def test_a_view_is_read_through_its_strides_as_cudnn_reads_it(tmp_path: Path) -> None:
    """Not through its logical steps: a wrong stride gives the values the stride reads (so the
    end-to-end comparisons see it), and `check_views` names it."""
    text = "model m {\n  input x: [2, 3, 4]\n  output y: [2, 4, 3] = transpose(relu(x), [0, 2, 1])\n}\n"
    graph, env = _lowered(text, tmp_path)
    [view] = [n for n in graph.nodes if n.op == "view"]
    assert view.attrs["strides"] == (12, 1, 4)  # y[a, b, c] = relu(x)[a, c, b]: worked out by hand
    wrong = replace(view, attrs=Attrs({**dict(view.attrs), "strides": (12, 3, 1)}))
    graph = Graph(tuple(wrong if n is view else n for n in graph.nodes), graph.outputs)
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    [y] = interp.run(graph, {"x": x}, {}, env).values()
    np.testing.assert_array_equal(y, np.arange(24, dtype=np.float32).reshape(2, 4, 3))
    with pytest.raises(interp.ViewError, match=r"^view `y`: strides"):
        interp.run(graph, {"x": x}, {}, env, check_views=True)


def test_a_planned_view_reading_past_its_base_names_the_view() -> None:
    base = node("b", "relu", ("x",), {}, (2, 3), layout=Layout.row_major(2))
    view = node("v", "view", ("b",), {"steps": (("reshape", (6,)),), "strides": (2,), "offset": 0},
                (6,))
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(interp.ViewError, match=r"^view `v` reads element 10 of a base of 6$"):
        interp.planned_view(view, base, x, view.attrs, (6,))
    # Without `check` the strides are read as they are, not compared with the steps.
    short = dict(view.attrs, strides=(1,))
    assert interp.planned_view(view, base, np.arange(6.0).reshape(2, 3), short, (3,)).tolist() == \
        [0.0, 1.0, 2.0]


def test_a_calibration_run_observes_the_largest_finite_magnitude_of_each_tensor() -> None:
    """`_amax` with `observe`: this run's largest finite |value| (0 for none), kept as the
    largest over runs; read before the tensor is computed, it is an error naming it."""
    from dslc.ir.interp import InterpError, _amax

    seen: dict[str, float] = {}
    small = np.array([0.25, -0.5, np.inf, np.nan], dtype=np.float32)
    assert _amax("t", {"t": small}, None, seen) == 0.5 and seen == {"t": 0.5}
    assert _amax("t", {"t": np.array([0.125], dtype=np.float16)}, None, seen) == 0.125
    assert seen == {"t": 0.5}  # the largest over the runs
    assert _amax("u", {"u": np.array([np.inf], dtype=np.float32)}, None, seen) == 0.0
    with pytest.raises(InterpError) as err:
        _amax("v", {}, None, seen)
    assert str(err.value) == "the amax of `v` is read before `v` is computed"


def test_an_inference_run_reads_each_calibrated_amax_and_names_a_missing_one() -> None:
    from dslc.ir.interp import InterpError, _amax

    assert _amax("t", {}, {"t": 3.5}, None) == 3.5
    for amax in (None, {"u": 1.0}):
        with pytest.raises(InterpError) as err:
            _amax("t", {}, amax, None)
        assert str(err.value) == ("no calibrated amax for `t`, which is quantised to fp8 "
                                  "(calibrate the bundle: `dslc calibrate`)")
