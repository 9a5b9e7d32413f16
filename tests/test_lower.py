"""Lowering passes: `.cgraph` snippet in, expected IR text out; the verifier is clean after every
pass on every example model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dslc.core.types import PrecisionSpec
from dslc.diag.diagnostic import Sink
from dslc.ir.printer import format_graph
from dslc.ir.verify import verify
from dslc.lower import PASSES, lower
from dslc.pipeline import Options, front_end
from tests.conftest import ROOT
from tests.helpers import check_source, rng


def _lowered(src: str, tmp_path: Path) -> str:
    model = check_source(src, tmp_path).model
    seen: list[str] = []

    def after(name: str, g) -> None:  # type: ignore[no-untyped-def]
        seen.append(name)
        _assert_sound(name, g, model.env)

    graph = lower(model.graph, after, model.env)
    assert seen == [p.__name__ for p in PASSES] and seen  # the verifier saw every pass
    return format_graph(graph)


def _assert_sound(name: str, graph, env) -> None:  # type: ignore[no-untyped-def]
    problems = verify(graph, env)
    assert not problems, f"after {name}: {problems[:3]}"


def test_batchnorm_after_conv_folds_into_weight_and_bias(tmp_path: Path) -> None:
    src = """import "std/nn.cgraph"
model m {
  precision io=f16
  input x: [1, 3, 8, 8] @NHWC
  let c = conv2d(x, out=4, k=3, pad=1)
  let b = batchnorm2d(c)
  output y: [1, 4, 8, 8] @NHWC = relu(b)
}"""
    assert _lowered(src, tmp_path) == """\
%x = input {name="x"} : f16[1, 3, 8, 8] @NHWC
%c.weight = param {path="c.weight"} : f16[4, 3, 3, 3]
%b.weight = param {path="b.weight"} : f32[4]
%b.bias = param {path="b.bias"} : f32[4]
%b.running_mean = param {path="b.running_mean"} : f32[4]
%b.running_var = param {path="b.running_var"} : f32[4]
%b.eps = scalar {value=1e-05} : f32[]
%b.var_eps = add(%b.running_var, %b.eps) : f32[4]
%b.inv_std = rsqrt(%b.var_eps) : f32[4]
%b.scale = mul(%b.weight, %b.inv_std) : f32[4]
%b.moved = mul(%b.running_mean, %b.scale) : f32[4]
%b.shift = sub(%b.bias, %b.moved) : f32[4]
%b.scale_col = view(%b.scale) {offset=0, steps=[["reshape", [4, 1, 1, 1]]], strides=[1, 1, 1, 1]} : f32[4, 1, 1, 1]
%c.folded_weight = mul(%c.weight, %b.scale_col) : f32[4, 3, 3, 3]
%c.folded_weight.f16 = cast(%c.folded_weight) {dtype="f16"} : f16[4, 3, 3, 3]
%b.shift.f16 = cast(%b.shift) {dtype="f16"} : f16[4]
%c.folded_weight.f16.channels_last = contiguous(%c.folded_weight.f16) : f16[4, 3, 3, 3] @NHWC
%c = conv(%x, %c.folded_weight.f16.channels_last) {dilation=[1, 1], groups=1, pad=none, post_pad=[1, 1], pre_pad=[1, 1], stride=[1, 1]} : f16[1, 4, 8, 8] @NHWC
%b = bias_add(%c, %b.shift.f16) {axis=1} : f16[1, 4, 8, 8] @NHWC
%y = relu(%b) : f16[1, 4, 8, 8] @NHWC
output y = %y
"""


def test_batchnorm_without_conv_becomes_scale_and_shift(tmp_path: Path) -> None:
    src = """import "std/nn.cgraph"
model m {
  input x: f32[1, 4, 8, 8]
  output y = batchnorm2d(x) as "bn"
}"""
    assert _lowered(src, tmp_path) == """\
%x = input {name="x"} : f32[1, 4, 8, 8]
%bn.weight = param {path="bn.weight"} : f32[4]
%bn.bias = param {path="bn.bias"} : f32[4]
%bn.running_mean = param {path="bn.running_mean"} : f32[4]
%bn.running_var = param {path="bn.running_var"} : f32[4]
%y.eps = scalar {value=1e-05} : f32[]
%y.var_eps = add(%bn.running_var, %y.eps) : f32[4]
%y.inv_std = rsqrt(%y.var_eps) : f32[4]
%y.scale = mul(%bn.weight, %y.inv_std) : f32[4]
%y.moved = mul(%bn.running_mean, %y.scale) : f32[4]
%y.shift = sub(%bn.bias, %y.moved) : f32[4]
%y.scaled = scale_mul(%x, %y.scale) {axis=1} : f32[1, 4, 8, 8]
%y = bias_add(%y.scaled, %y.shift) {axis=1} : f32[1, 4, 8, 8]
output y = %y
"""


def test_channel_vector_add_and_mul_become_bias_and_scale(tmp_path: Path) -> None:
    src = """model m {
  input x: f32[2, 16]
  param w: f32[16, 8]
  param b: f32[8]
  param s: f32[8]
  output y = matmul(x, w) * s + b
}"""
    assert _lowered(src, tmp_path) == """\
%x = input {name="x"} : f32[2, 16]
%w = param {path="w"} : f32[16, 8]
%b = param {path="b"} : f32[8]
%s = param {path="s"} : f32[8]
%y.matmul = matmul(%x, %w) : f32[2, 8]
%y.mul = scale_mul(%y.matmul, %s) {axis=1} : f32[2, 8]
%y = bias_add(%y.mul, %b) {axis=1} : f32[2, 8]
output y = %y
"""


def test_identities_and_scalar_arithmetic_fold_away(tmp_path: Path) -> None:
    src = """model m {
  input x: f32[2, 16]
  output y = cast(x * 1.0 + 0.0, f32) * (2.0 * 0.5)
}"""
    assert _lowered(src, tmp_path) == '%x = input {name="x"} : f32[2, 16]\noutput y = %x\n'


def test_reshape_transpose_slice_chain_is_one_strided_view(tmp_path: Path) -> None:
    src = """model m {
  dim S = 1..64 tune [8]
  input x: f32[2, S, 12]
  let h = transpose(reshape(x, [2, S, 3, 4]), [0, 2, 1, 3])
  output y = relu(h[:, 1:3])
}"""
    assert _lowered(src, tmp_path) == """\
%x = input {name="x"} : f32[2, S, 12]
%y.slice = view(%x) {offset=4, steps=[["reshape", [2, S, 3, 4]], ["transpose", [0, 2, 1, 3]], ["slice", [0, 1, 0, 0], [2, 3, S, 4]]], strides=[12 * S, 4, 12, 1]} : f32[2, 2, S, 4]
%y = relu(%y.slice) : f32[2, 2, S, 4]
output y = %y
"""


def test_reshape_that_is_no_view_of_channels_last_gets_a_copy(tmp_path: Path) -> None:
    src = """model m {
  input x: f32[1, 3, 8, 8] @NHWC
  param w: f32[4, 3, 3, 3]
  let c = relu(conv(x, w, pad=1))
  output y = reshape(c, [1, 256])
}"""
    assert _lowered(src, tmp_path) == """\
%x = input {name="x"} : f32[1, 3, 8, 8] @NHWC
%w = param {path="w"} : f32[4, 3, 3, 3]
%w.channels_last = contiguous(%w) : f32[4, 3, 3, 3] @NHWC
%c.conv = conv(%x, %w.channels_last) {dilation=[1, 1], groups=1, pad=none, post_pad=[1, 1], pre_pad=[1, 1], stride=[1, 1]} : f32[1, 4, 8, 8] @NHWC
%c = relu(%c.conv) : f32[1, 4, 8, 8] @NHWC
%y.copy = contiguous(%c) : f32[1, 4, 8, 8]
%y = view(%y.copy) {offset=0, steps=[["reshape", [1, 256]]], strides=[256, 1]} : f32[1, 256]
output y = %y
"""


def test_dead_values_are_removed(tmp_path: Path) -> None:
    src = """model m {
  input x: f32[4]
  let unused = exp(x)
  output y = relu(x)
}"""
    text = _lowered(src, tmp_path)
    assert "exp" not in text and "relu" in text


@pytest.mark.parametrize("name", ["mlp", "resnet18", "resnet50", "encoder", "unet"])
@pytest.mark.parametrize("precision", [None, PrecisionSpec("f32", "f32", "f32")])
def test_verifier_is_clean_after_every_pass(name: str, precision: PrecisionSpec | None) -> None:
    result = front_end(ROOT / "models" / f"{name}.cgraph",
                       Options(precision=precision, backend="reference"), Sink())
    assert result.model is not None
    assert not verify(result.model.graph, result.model.env)
    graph = result.model.graph
    assert PASSES
    for p in PASSES:
        graph = p(graph, result.model.env)
        _assert_sound(p.__name__, graph, result.model.env)


def test_a_layout_copy_is_named_by_the_memory_order_it_makes() -> None:
    """Copies show in `dslc inspect` by name: `x.row_major`, `x.channels_last` (rank 3 to 5),
    else the order's axes outermost first."""
    from dslc.lower.views import _order_name

    assert _order_name((0, 1, 2, 3)) == "row_major" and _order_name((0, 1)) == "row_major"
    assert [_order_name(o) for o in ((0, 2, 1), (0, 2, 3, 1), (0, 2, 3, 4, 1))] == \
        ["channels_last"] * 3
    assert _order_name((1, 0, 2, 3)) == "order_1023" and _order_name((1, 0)) == "order_10"


def _folded(op: str, a: float | None, b: float | None) -> tuple[str, float | None]:
    """`op(a, b)` through `fold_scalars`, each operand a scalar of that value or (None) an input
    x: what the output becomes (its op, and its value if it is a scalar)."""
    from dslc.core.types import TensorType
    from dslc.diag.span import Span
    from dslc.ir.graph import Attrs, Graph, Node
    from dslc.lower.canonical import fold_scalars
    from dslc.lower.rewrite import rewrite

    span, f32 = Span("t.cgraph", 1, 1, 1, 2), PrecisionSpec()

    def leaf(name: str, value: float | None) -> Node:
        if value is None:
            return Node(name, "input", (), Attrs({"name": name}), TensorType("f32", ()), span,
                        "", f32)
        return Node(name, "scalar", (), Attrs({"value": value}), TensorType("f32", ()), span,
                    "", f32)

    nodes = (leaf("a", a), leaf("b", b),
             Node("y", op, ("a", "b"), Attrs({}), TensorType("f32", ()), span, "", f32))
    g = rewrite(Graph(nodes, (("y", "y"),)), fold_scalars)
    out = g.by_name()[dict(g.outputs)["y"]]
    return out.op, (float(out.attrs["value"]) if out.op == "scalar" else None)


@pytest.mark.parametrize(("op", "a", "b", "want"), [
    ("add", 6.0, 4.0, 10.0), ("sub", 6.0, 4.0, 2.0), ("mul", 6.0, 4.0, 24.0),
    ("div", 6.0, 4.0, 1.5)])
def test_arithmetic_on_two_scalars_is_done_at_compile_time(op: str, a: float, b: float,
                                                           want: float) -> None:
    assert _folded(op, a, b) == ("scalar", want)


def test_a_division_of_scalars_by_zero_is_nan() -> None:
    op, value = _folded("div", 1.0, 0.0)
    assert op == "scalar" and value is not None and value != value


@pytest.mark.parametrize(("op", "a", "b", "want"), [
    ("add", None, 0.0, "input"), ("add", 0.0, None, "input"), ("sub", None, 0.0, "input"),
    ("sub", 0.0, None, "sub"), ("mul", None, 1.0, "input"), ("mul", 1.0, None, "input"),
    ("div", None, 1.0, "input"), ("div", 1.0, None, "div"), ("add", None, 1.0, "add"),
    ("mul", None, 0.0, "mul")])
def test_identities_vanish_on_the_side_they_are_identities(op: str, a: float | None,
                                                           b: float | None, want: str) -> None:
    assert _folded(op, a, b)[0] == want


def test_a_view_chain_that_stops_being_a_view_copies_its_view_prefix(tmp_path: Path) -> None:
    """A slice of an NHWC image is a view; flattening it row-major is not: the slice's view
    (strides of the NHWC memory, offset to pixel (1, 1)) is copied row-major, and the reshape
    views the copy. The numbers: numpy's slice and reshape of the logical image."""
    import numpy as np

    from dslc.ir import interp
    from dslc.pipeline import lower_and_fuse

    model = check_source("""model m {
  layout NHWC
  input x: [2, 4, 6, 6]
  let s = slice(x, starts=[0, 0, 1, 1], ends=[2, 4, 5, 5])
  output y = relu(reshape(s, [2, 64]))
}
""", tmp_path).model
    lowered, plan = lower_and_fuse(model)
    nodes = lowered.by_name()
    part, copy, flat = nodes["y.reshape.part"], nodes["y.reshape.copy"], nodes["y.reshape"]
    # NHWC [2, 4, 6, 6]: n 6*6*4, c 1, h 6*4, w 4; pixel (1, 1) at 24 + 4
    assert (part.attrs["strides"], part.attrs["offset"]) == ((144, 1, 24, 4), 28)
    assert copy.op == "contiguous" and copy.inputs == ("y.reshape.part",)
    assert flat.inputs == ("y.reshape.copy",) and flat.attrs["strides"] == (64, 1)
    x = rng("view prefix copied").standard_normal((2, 4, 6, 6)).astype(np.float32)
    [y] = interp.run(lowered, {"x": x}, {}, model.env, virtual=plan.virtual()).values()
    assert np.array_equal(y, np.maximum(x[:, :, 1:5, 1:5].reshape(2, 64), 0))


def test_a_concat_and_a_pointwise_op_on_a_view_take_the_memory_order_they_read(
        tmp_path: Path) -> None:
    """A concat of channels-last conv results is channels-last; a per-channel scale of the
    channels-first view of a row-major `[N, H, W, C]` matmul result is written in the order the
    view has in that memory (channels last: ConvNeXt's layer scale, which must fuse with the
    residual add of a channels-last input)."""
    from dslc.pipeline import lower_and_fuse

    model = check_source("""model m {
  input x: [2, 4, 6, 6]
  param w1: [8, 4, 3, 3]
  param w2: [8, 4, 3, 3]
  param p: [8, 8]
  param s: [8]
  let a = conv(x, w1, pad=1)
  let c = concat([a, conv(x, w2, pad=1)], axis=1)
  let h = matmul(transpose(a, [0, 2, 3, 1]), p)
  let t = transpose(h, [0, 3, 1, 2]) * reshape(s, [1, 8, 1, 1])
  output o1 = reduce_sum(c, axes=[2])
  output o2 = relu(t)
}
""", tmp_path).model
    lowered, _ = lower_and_fuse(model)
    nodes = lowered.by_name()
    nhwc = (0, 2, 3, 1)
    assert nodes["a"].type.layout is not None and nodes["a"].type.layout.order == nhwc
    assert nodes["c"].type.layout is not None and nodes["c"].type.layout.order == nhwc
    assert nodes["h"].type.layout is not None and nodes["h"].type.layout.order == (0, 1, 2, 3)
    assert nodes["t"].op == "scale_mul" and nodes["t"].type.layout is not None
    assert nodes["t"].type.layout.order == nhwc


def test_l1_and_l2_reductions_become_sums_cudnn_has(tmp_path: Path) -> None:
    """cuDNN's reduction has no L1 or L2 mode: sum(|x|) and sqrt(sum(x * x))."""
    src = """model m {
  input x: f32[2, 16]
  output a = reduce_l1(x, axes=[1])
  output b = reduce_l2(x, axes=[1])
}"""
    assert _lowered(src, tmp_path) == """\
%x = input {name="x"} : f32[2, 16]
%a.abs = abs(%x) : f32[2, 16]
%a = reduce_sum(%a.abs) {axes=[1], keepdims=false} : f32[2]
%b.square = mul(%x, %x) : f32[2, 16]
%b.sum = reduce_sum(%b.square) {axes=[1], keepdims=false} : f32[2]
%b = sqrt(%b.sum) : f32[2]
output a = %a
output b = %b
"""


def test_a_channel_vector_on_the_left_of_an_add_becomes_a_bias_too(tmp_path: Path) -> None:
    src = """model m {
  input x: f32[2, 16]
  param w: f32[16, 8]
  param b: f32[8]
  output y = b + matmul(x, w)
}"""
    lines = _lowered(src, tmp_path).splitlines()
    assert "%y = bias_add(%y.matmul, %b) {axis=1} : f32[2, 8]" in lines
    assert not [ln for ln in lines if " = add(" in ln]


def test_an_identity_is_kept_where_it_writes_the_memory_order_the_output_asks(
        tmp_path: Path) -> None:
    """`x * 1.0` folds to `x` only where nothing tells them apart: here the output is declared
    channels-last and x is not, so the multiply stays and writes that order."""
    model = check_source("""model m {
  input x: f32[1, 4, 8, 8]
  output y: f32[1, 4, 8, 8] @NHWC = x * 1.0
}""", tmp_path).model
    graph = lower(model.graph, env=model.env)
    produced = graph.by_name()[dict(graph.outputs)["y"]]
    assert produced.op != "input"
    assert produced.type.layout is not None and produced.type.layout.order == (0, 2, 3, 1)


def _lower_checked(model):  # type: ignore[no-untyped-def]
    """`lower_and_fuse`, the lowered graph verified (a slice whose steps disagree with its type
    computes the same through its strides, but is no sound IR)."""
    from dslc.pipeline import lower_and_fuse

    lowered, plan = lower_and_fuse(model)
    assert not verify(lowered, model.env), verify(lowered, model.env)[:3]
    return lowered, plan


ROTARY = """model m {
  input x: [2, 4, 3, 8]
  input cos: [3, 8]
  input sin: [3, 8]
  let rotated = concat([-x[:, :, :, 4:8], x[:, :, :, 0:4]], axis=3)
  output y = x * cos + rotated * sin
}
"""


def test_a_rotary_runs_on_the_halves_of_its_concatenation(tmp_path: Path) -> None:
    """`x * cos + rotate_half(x) * sin`: the product and the sum run on each half (x's halves,
    cos's and sin's), written into the concatenation, which nothing computes from; two steps.
    The values are the rotation written out in numpy (an oracle apart from the interpreter)."""
    from dslc.ir import interp

    model = check_source(ROTARY, tmp_path).model
    lowered, plan = _lower_checked(model)
    nodes = lowered.by_name()
    assert nodes["y"].op == "concat"
    assert not any(nodes[i].op == "concat" for n in lowered.nodes for i in n.inputs)
    running = [g for g in plan.groups if nodes[g.nodes[0]].op != "concat"]
    assert sorted(sorted(nodes[n].op for n in g.nodes) for g in running) == [
        ["add", "mul", "mul"], ["add", "mul", "mul", "neg"]]
    assert set(plan.placement) == {n for g in running for n in g.outputs}  # written in place
    g = rng("rotary halves")
    x, cos, sin = (g.standard_normal(s).astype(np.float32) for s in [(2, 4, 3, 8), (3, 8), (3, 8)])
    x1, x2 = x[..., :4], x[..., 4:]
    want = np.concatenate([x1 * cos[:, :4] - x2 * sin[:, :4], x2 * cos[:, 4:] + x1 * sin[:, 4:]],
                          axis=3)
    got = interp.run(lowered, {"x": x, "cos": cos, "sin": sin}, {}, model.env)["y"]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(("body", "why"), [
    ("""  let c = concat([relu(x), x], axis=1)
  output y = c * s
  output z = c""", "the concatenation is read twice"),
    ("""  output y = concat([x, x * 2.0, relu(x)], axis=1) * t""", "three parts"),
    ("""  output y = concat([x, x], axis=1) * s""", "no part would take the op"),
    ("""  let a = x * 2.0
  output y = concat([a, matmul(x, w)], axis=1) * s""", "a part the concatenation would not copy"),
])
def test_a_concatenation_stays_where_running_on_its_parts_would_add_a_step(
        body: str, why: str, tmp_path: Path) -> None:

    src = f"""model m {{
  input x: [4, 6]
  input s: [4, 12]
  input t: [4, 18]
  param w: [6, 6]
{body}
}}
"""
    lowered, _ = _lower_checked(check_source(src, tmp_path).model)
    assert any(n.op == "mul" and any(lowered.by_name()[i].op == "concat" for i in n.inputs)
               for n in lowered.nodes), why


def test_an_operand_broadcast_along_the_axis_is_read_whole_by_each_part(tmp_path: Path) -> None:
    from dslc.ir import interp

    model = check_source("""model m {
  input x: [4, 6]
  input s: [4, 1]
  output y = concat([relu(x), -x], axis=1) * s
}
""", tmp_path).model
    lowered, _ = _lower_checked(model)
    nodes = lowered.by_name()
    assert nodes["y"].op == "concat"
    assert [i for p in nodes["y"].inputs for i in nodes[p].inputs if i == "s"] == ["s", "s"]
    g = rng("broadcast parts")
    x, s = g.standard_normal((4, 6)).astype(np.float32), g.standard_normal((4, 1)).astype(np.float32)
    got = interp.run(lowered, {"x": x, "s": s}, {}, model.env)["y"]
    np.testing.assert_allclose(got, np.concatenate([np.maximum(x, 0), -x], axis=1) * s,
                               rtol=1e-6)


def test_a_scale_along_the_concatenated_axis_is_sliced_with_it(tmp_path: Path) -> None:
    """With load-time angles (params), `rotated * sin` is a per-channel scale (`scale_mul`):
    it runs on the halves too, each with its half of the vector (the generated programs'
    rotary form)."""
    from dslc.ir import interp

    model = check_source("""model m {
  input x: [4, 8]
  param a: [8]
  output y = concat([-x[:, 4:8], x[:, 0:4]], axis=1) * sin(a)
}
""", tmp_path).model
    lowered, _ = _lower_checked(model)
    nodes = lowered.by_name()
    assert nodes["y"].op == "concat"
    assert sorted(nodes[p].op for p in nodes["y"].inputs) == ["scale_mul", "scale_mul"]
    g = rng("scaled halves")
    x, a = g.standard_normal((4, 8)).astype(np.float32), g.standard_normal(8).astype(np.float32)
    got = interp.run(lowered, {"x": x}, {"a": a}, model.env)["y"]
    np.testing.assert_allclose(got, np.concatenate([-x[:, 4:], x[:, :4]], axis=1) * np.sin(a),
                               rtol=1e-6)


def test_a_channel_scale_through_a_concatenation_of_channels_takes_each_part_its_channels(
        tmp_path: Path) -> None:
    """A per-channel scale of NCHW values (`scale_mul` along axis 1, not the last) on a
    concatenation along the channels: each part is scaled by its own channels' entries (a
    vector broadcast right-aligned would meet the last axis instead)."""
    from dslc.ir import interp

    model = check_source("""model m {
  input x: [2, 4, 3, 3]
  param s: [8]
  output y = concat([-x, relu(x)], axis=1) * reshape(s, [1, 8, 1, 1])
}
""", tmp_path).model
    lowered, _ = _lower_checked(model)
    nodes = lowered.by_name()
    assert [nodes[p].op for p in nodes["y"].inputs] == ["scale_mul", "scale_mul"]
    g = rng("channel scale through concat")
    x = g.standard_normal((2, 4, 3, 3)).astype(np.float32)
    s = g.standard_normal(8).astype(np.float32)
    got = interp.run(lowered, {"x": x}, {"s": s}, model.env)["y"]
    want = np.concatenate([-x, np.maximum(x, 0)], axis=1) * s[None, :, None, None]
    np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize(("part", "inputs"), [
    ("x", {}), ("w", {}), ("x2[:, 2:8]", {"x2": (4, 8)}), ("reshape(x3, [4, 6])", {"x3": (24,)}),
    ("transpose(x4, [1, 0])", {"x4": (6, 4)}),
])
@pytest.mark.parametrize("form", ["s - c", "c / s", "relu(c * s)"])
def test_each_part_computes_the_op_with_its_slice_whichever_side_the_concat_is(
        part: str, inputs: dict[str, tuple[int, ...]], form: str, tmp_path: Path) -> None:
    """The concatenation on either side of a subtraction or division, its second part an
    input, a param or a view of one (each of which the concatenation would copy), concatenated
    along the last axis written -1: the op runs on each part, with the result of numpy's own
    concatenate-then-op."""
    from dslc.ir import interp

    decls = "".join(f"  input {k}: {list(v)}\n" for k, v in inputs.items())
    model = check_source(f"""model m {{
  input x: [4, 6]
  input s: [4, 12]
  param w: [4, 6]
{decls}  let c = concat([relu(x), {part}], axis=-1)
  output y = {form}
}}
""", tmp_path).model
    lowered, _ = _lower_checked(model)
    nodes = lowered.by_name()
    concat = nodes["y.mul" if form.startswith("relu") else "y"]
    assert concat.op == "concat", format_graph(lowered)
    g = rng("parts", part, form)
    values = {"x": g.standard_normal((4, 6)), "s": g.uniform(0.5, 2.0, (4, 12)),
              "w": g.standard_normal((4, 6)),
              **{k: g.standard_normal(v) for k, v in inputs.items()}}
    values = {k: v.astype(np.float32) for k, v in values.items()}
    second = {"x": values["x"], "w": values["w"], "x2[:, 2:8]": values.get("x2", values["x"])[:, 2:8],
              "reshape(x3, [4, 6])": values.get("x3", np.zeros(24)).reshape(4, 6),
              "transpose(x4, [1, 0])": values.get("x4", np.zeros((6, 4))).T}[part]
    c = np.concatenate([np.maximum(values["x"], 0), second], axis=1)
    s = values["s"]
    want = {"s - c": s - c, "c / s": c / s, "relu(c * s)": np.maximum(c * s, 0)}[form]
    got = interp.run(lowered, {k: v for k, v in values.items() if k != "w"}, {"w": values["w"]},
                     model.env)["y"]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_a_vector_along_another_axis_than_the_concatenated_one_is_read_whole(
        tmp_path: Path) -> None:
    from dslc.ir import interp

    model = check_source("""model m {
  input x: [2, 8]
  param a: [8]
  output y = concat([-x, relu(x)], axis=0) * sin(a)
}
""", tmp_path).model
    lowered, _ = _lower_checked(model)
    nodes = lowered.by_name()
    assert nodes["y"].op == "concat"
    vectors = [nodes[p].inputs[1] for p in nodes["y"].inputs]
    assert vectors[0] == vectors[1]  # the one vector, not slices of it
    g = rng("vector along another axis")
    x, a = g.standard_normal((2, 8)).astype(np.float32), g.standard_normal(8).astype(np.float32)
    got = interp.run(lowered, {"x": x}, {"a": a}, model.env)["y"]
    np.testing.assert_allclose(got, np.concatenate([-x, np.maximum(x, 0)]) * np.sin(a), rtol=1e-6)


@pytest.mark.parametrize(("body", "why"), [
    ("""  let c: [2, 4, 6, 6] @NHWC = concat([relu(v), -v], axis=1)
  output y = c * t""", "the concatenation is stored in a chosen memory order"),
    ("""  output y = concat([relu(x), -x], axis=1) * u""", "the op's result is larger"),
])
def test_a_concatenation_in_its_own_order_or_broadcast_stays(body: str, why: str,
                                                             tmp_path: Path) -> None:

    src = f"""model m {{
  input x: [4, 6]
  input u: [3, 4, 12]
  input v: [2, 2, 6, 6]
  input t: [2, 4, 6, 6]
{body}
}}
"""
    lowered, _ = _lower_checked(check_source(src, tmp_path).model)
    assert lowered.by_name()["y"].op != "concat", why


def test_a_value_read_elsewhere_is_sliced_and_what_it_reads_stays_whole(tmp_path: Path) -> None:
    """The other operand is computed on the parts' slices only where the op alone reads it,
    and only it (not what it reads, which other parts of the model may read); a concatenation
    along the first axis slices a full-size operand there."""
    from dslc.ir import interp

    model = check_source("""model m {
  input x: [4, 6]
  input u: [8, 6]
  input v: [8, 6]
  let a = relu(u)
  let b = a * v
  output y = concat([relu(x), -x], axis=0) * b
  output z = concat([relu(x), -x], axis=0) - (u * 2.0)
  output w = relu(b)
  output q = concat([relu(x), -x], axis=0) * (sigmoid(u) * v)
}
""", tmp_path).model
    lowered, _ = _lower_checked(model)
    nodes = lowered.by_name()
    assert nodes["y"].op == "concat" and nodes["z"].op == "concat" and nodes["q"].op == "concat"
    assert [n.inputs for n in lowered.nodes if n.op == "sigmoid"] == [("u",)]  # whole, once
    assert sum(n.op == "relu" and n.inputs == ("u",) for n in lowered.nodes) == 1  # a, once
    assert sum(n.op == "mul" and "v" in n.inputs for n in lowered.nodes) == 1  # b, once
    assert sum(n.op == "mul" and nodes[n.inputs[0]].op == "view"
               and nodes[n.inputs[0]].inputs == ("u",) for n in lowered.nodes) == 2  # u * 2.0
    assert [nodes[i].op for p in nodes["y"].inputs for i in nodes[p].inputs[1:]] == ["view"] * 2
    g = rng("read elsewhere")
    x, u, v = (g.standard_normal(s).astype(np.float32) for s in [(4, 6), (8, 6), (8, 6)])
    got = interp.run(lowered, {"x": x, "u": u, "v": v}, {}, model.env)
    c = np.concatenate([np.maximum(x, 0), -x], axis=0)
    b = np.maximum(u, 0) * v
    np.testing.assert_allclose(got["y"], c * b, rtol=1e-6)
    np.testing.assert_allclose(got["z"], c - u * 2, rtol=1e-6)
    np.testing.assert_allclose(got["w"], np.maximum(b, 0), rtol=1e-6)
    np.testing.assert_allclose(got["q"], c * (1 / (1 + np.exp(-u)) * v), rtol=1e-5)


@pytest.mark.parametrize(("body", "why"), [
    ("""  let p = relu(x)
  output y = concat([p, x], axis=1) * s
  output z = p * 2.0""", "a part another op reads too"),
    ("""  output y: [2, 4, 6, 6] @NHWC = concat([relu(v), -v], axis=1) * t""",
     "a result stored in another order than row-major"),
])
def test_a_concatenation_whose_part_is_shared_or_result_ordered_stays(
        body: str, why: str, tmp_path: Path) -> None:
    src = f"""model m {{
  input x: [4, 6]
  input s: [4, 12]
  input v: [2, 2, 6, 6]
  input t: [2, 4, 6, 6]
{body}
}}
"""
    lowered, _ = _lower_checked(check_source(src, tmp_path).model)
    assert lowered.by_name()["y"].op != "concat", why


def test_a_scale_computed_only_for_the_op_keeps_its_vector_along_its_own_axis(
        tmp_path: Path) -> None:
    """The other operand a scale along the channels (`z * s` as `scale_mul` on axis 1),
    computed per part of a concatenation along the last axis: each part's scale reads the
    whole channel vector, not a slice of it taken as if it lay along the last axis (which
    the first form of the rewrite did: an IR the verifier refused, E0301)."""
    from dslc.ir import interp

    model = check_source("""model m {
  input x: [2, 8, 3, 8]
  input z: [2, 8, 3, 8]
  param s: [8]
  output y = concat([relu(x[:, :, :, 0:4]), -x[:, :, :, 4:8]], axis=3) * (z * reshape(s, [1, 8, 1, 1]))
}
""", tmp_path).model
    lowered, _ = _lower_checked(model)
    nodes = lowered.by_name()
    scales = [nodes[i] for p in nodes["y"].inputs for i in nodes[p].inputs
              if nodes[i].op == "scale_mul"]
    assert len(scales) == 2 and all(nodes[s.inputs[1]].type.shape == (8,) for s in scales)
    g = rng("channel scale per part")
    x, z = (g.standard_normal((2, 8, 3, 8)).astype(np.float32) for _ in range(2))
    s = g.standard_normal(8).astype(np.float32)
    got = interp.run(lowered, {"x": x, "z": z}, {"s": s}, model.env)["y"]
    want = np.concatenate([np.maximum(x[..., :4], 0), -x[..., 4:]], axis=3) * (
        z * s.reshape(1, 8, 1, 1))
    np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("intermediate", ["f16", "bf16"])
def test_an_l2_norm_accumulates_its_squares_in_f32_under_narrow_intermediates(
        intermediate: str, tmp_path: Path) -> None:
    """An f16 norm of values near 300 squares them past f16's 65,504: held in the model's
    intermediate dtype the sum was infinite where the norm itself (about 3,000) is not (a
    generated program, seed 117 #159). The squares and their sum are f32, stored or inside a
    group; the reference, with its fused groups, equals PyTorch's norm of the same f16 values
    in f32, rounded to f16."""
    import torch

    from dslc.ir import interp
    from dslc.pipeline import lower_and_fuse

    model = check_source(f"""model m {{
  precision io=f16, intermediate={intermediate}, compute=f32
  input x: [2, 96]
  output y = reduce_l2(x, axes=[1])
}}""", tmp_path).model
    lowered, plan = lower_and_fuse(model)
    nodes = lowered.by_name()
    held = [nodes["y.square"], nodes["y.sum"]]
    assert [(n.type.dtype, n.precision.intermediate) for n in held] == [("f32", "f32")] * 2
    assert str(nodes["y"].type) == "f16[2]"
    x = (300.0 + 10.0 * rng("l2 in f32").standard_normal((2, 96))).astype(np.float16)
    virtual = {n for g in plan.groups for n in g.nodes if n not in g.outputs}
    assert "y.sum" in virtual  # held in its group (the squares are a step of their own: stored)
    got = interp.run(lowered, {"x": x}, {}, model.env, virtual=virtual)["y"]
    want = torch.linalg.vector_norm(torch.from_numpy(x).float(), dim=1).half().numpy()
    assert np.isfinite(got).all()
    assert np.array_equal(got, want)


def test_a_rotary_quantised_for_fp8_stays_whole_for_its_calibration(tmp_path: Path) -> None:
    """The rotation an fp8 matmul reads is what its amax observes: no pass may split it into
    parts nothing computes whole (the calibration then read a value the graph no longer had).
    The observed amax is the rotation's, written out in numpy."""
    from dslc.ir import interp
    from dslc.ir.graph import CALIBRATED

    src = """model m {
  input x: [2, 4, 3, 16]
  input cos: [3, 16]
  input sin: [3, 16]
  param w: [16, 16]
  let r = x * cos + concat([-x[:, :, :, 8:16], x[:, :, :, 0:8]], axis=3) * sin
  output y = matmul(r, w, precision=f8e4m3)
}
"""
    _lowered(src, tmp_path)  # the verifier (an amax's tensor computed before it) after each pass
    model = check_source(src, tmp_path).model
    lowered, plan = _lower_checked(model)
    nodes = lowered.by_name()
    amax = [n for n in lowered.nodes if n.op == CALIBRATED]
    assert [n.attrs["tensor"] for n in amax] == ["r"] and nodes["r"].op == "concat"
    g = rng("rotary fp8")
    x, cos, sin = (g.standard_normal(s).astype(np.float32) for s in [(2, 4, 3, 16), (3, 16), (3, 16)])
    w = g.standard_normal((16, 16)).astype(np.float32)
    x1, x2 = x[..., :8], x[..., 8:]
    r = np.concatenate([x1 * cos[:, :8] - x2 * sin[:, :8], x2 * cos[:, 8:] + x1 * sin[:, 8:]],
                       axis=3)
    seen: dict[str, float] = {}
    interp.run(lowered, {"x": x, "cos": cos, "sin": sin}, {"w": w}, model.env,
               virtual=plan.virtual(), observe=seen)
    assert seen == {"r": pytest.approx(float(np.abs(r).max()), rel=1e-6)}


def test_the_verifier_names_an_amax_of_a_value_not_computed_before_it(tmp_path: Path) -> None:
    from dataclasses import replace

    from dslc.core.types import TensorType
    from dslc.ir.graph import CALIBRATED, Attrs, Graph

    model = check_source("model m {\n  input x: [4]\n  output y = x * 2.0\n}\n", tmp_path).model
    x = model.graph.by_name()["x"]
    amax = replace(x, name="x.amax", op=CALIBRATED, attrs=Attrs({"tensor": "x"}),
                   type=TensorType("f32", ()))
    graph = Graph((amax, *model.graph.nodes), model.graph.outputs)
    assert verify(graph) == ["%x.amax (amax): the amax of %x, which is not computed before it"]


def test_a_broadcast_attention_bias_is_copied_once_per_size_of_its_scores(
        tmp_path: Path) -> None:
    """A mask broadcast over batch and heads is read as a full-size copy [B, H, Sq, Skv]: one
    for the two attentions of 3 queries, another for the one of 5 (the copy was made once per
    mask: the second size read the first's, E0301 from the verifier, an internal error); a
    [Sq, Skv] bias with B = H = 2 is copied too. The results against PyTorch's attention."""
    import torch

    from dslc.ir import interp
    from dslc.pipeline import lower_and_fuse

    model = check_source("""model m {
  input q: [2, 2, 3, 16]
  input p: [2, 2, 5, 16]
  input k: [2, 2, 5, 16]
  input v: [2, 2, 5, 16]
  input mask: [2, 1, 1, 5]
  input near: [3, 5]
  output y = sdpa(q, k, v, bias=mask)
  output w = sdpa(q, v, k, bias=mask)
  output z = sdpa(p, k, v, bias=mask)
  output n = sdpa(q, k, v, bias=near)
}""", tmp_path).model
    lowered, _ = lower_and_fuse(model, verify=True)
    nodes = lowered.by_name()
    copies = {n.name: (n.inputs[0], n.type.shape) for n in lowered.nodes if n.op == "expand"}
    assert sorted(copies.values()) == [("mask", (2, 2, 3, 5)), ("mask", (2, 2, 5, 5)),
                                       ("near", (2, 2, 3, 5))]
    assert nodes["y"].inputs[3] == nodes["w"].inputs[3] != nodes["z"].inputs[3]
    r = rng("broadcast attention bias")
    shapes = {"q": (2, 2, 3, 16), "p": (2, 2, 5, 16), "k": (2, 2, 5, 16), "v": (2, 2, 5, 16),
              "mask": (2, 1, 1, 5), "near": (3, 5)}
    x = {name: r.standard_normal(s).astype(np.float32) for name, s in shapes.items()}
    got = interp.run(lowered, x, {}, model.env)
    t = {name: torch.from_numpy(a) for name, a in x.items()}
    for out, (qn, kn, vn, bias) in {"y": ("q", "k", "v", "mask"), "w": ("q", "v", "k", "mask"),
                                    "z": ("p", "k", "v", "mask"),
                                    "n": ("q", "k", "v", "near")}.items():
        want = torch.nn.functional.scaled_dot_product_attention(
            t[qn], t[kn], t[vn], attn_mask=t[bias]).numpy()
        assert np.abs(got[out] - want).max() < 1e-5, out


def test_a_rule_taking_a_later_nodes_name_renames_it_and_its_readers_follow(
        tmp_path: Path) -> None:
    """A rule's new nodes named like a later node of the graph (`b`, twice): they are `b` and
    `b_1`, the graph's own `b` is emitted as `b_2`, and its reader reads `b_2`, so the output
    is still exp(-relu(x)), computed here in numpy."""
    from dslc.ir import interp
    from dslc.ir.graph import Node
    from dslc.lower.rewrite import Rewriter, rewrite

    model = check_source("""model m {
  input x: [4]
  let a = relu(x)
  let b = neg(a)
  output c = exp(b)
}""", tmp_path).model

    def rule(rw: Rewriter, node: Node) -> str | None:
        if node.name != "a":
            return None
        for _ in range(2):
            rw.new("abs", ("x",), {}, node.type, node, "b")
        return rw.emit(node)

    graph = rewrite(model.graph, rule)
    nodes = graph.by_name()
    assert [n.name for n in graph.nodes] == ["x", "b", "b_1", "a", "b_2", "c"]
    assert (nodes["b_2"].op, nodes["b_2"].inputs, nodes["c"].inputs) == ("neg", ("a",), ("b_2",))
    x = rng("a renamed reader").standard_normal(4).astype(np.float32)
    got = interp.run(graph, {"x": x}, {}, model.env)["c"]
    assert np.allclose(got, np.exp(-np.maximum(x, 0)), rtol=1e-6)


MASKED = """model m {
  input ids: i64[2, 5]
  input x: [2, 5]
  let keep = reshape(cast(ids, f32), [2, 1, 1, 5])
  output y = (1.0 - keep) * -100.0
  output z = reshape(relu(x * 2.0), [2, 1, 5])
  let r = relu(x)
  output r_out = r
  output w = reshape(r, [10])
}
"""


def test_a_reshape_of_a_cast_input_is_a_view_of_the_input_then_the_cast(tmp_path: Path) -> None:
    """`reshape(cast(ids))`: the cast moves after the reshape, now a view of the input, and joins
    the ops after it (one group); not a relu of a computed value (it stays in its group), nor
    a relu also read whole. The values are numpy's, written out (not the interpreter)."""
    from dslc.ir import interp

    model = check_source(MASKED, tmp_path).model
    lowered, plan = _lower_checked(model)
    nodes = lowered.by_name()
    keep = nodes[nodes["y"].inputs[0]].inputs[1]  # y = mul(sub(1, keep), -100)
    assert nodes[keep].op == "cast" and nodes[nodes[keep].inputs[0]].op == "view"
    assert nodes[nodes[nodes[keep].inputs[0]].inputs[0]].op == "input"
    assert any(set(g.nodes) >= {keep, "y"} for g in plan.groups)
    z = nodes[dict(lowered.outputs)["z"]]
    assert z.op == "view" and nodes[z.inputs[0]].op == "relu"
    w = nodes[dict(lowered.outputs)["w"]]
    assert w.op == "view" and nodes[w.inputs[0]].op == "relu"
    g = rng("reshape before cast")
    ids = g.integers(0, 2, (2, 5)).astype(np.int64)
    x = g.standard_normal((2, 5)).astype(np.float32)
    out = interp.run(lowered, {"ids": ids, "x": x}, {}, model.env)
    want = (1.0 - ids.astype(np.float32).reshape(2, 1, 1, 5)) * np.float32(-100.0)
    assert np.array_equal(out["y"], want) and set(np.unique(want)) == {0.0, -100.0}
    assert np.array_equal(out["z"], np.maximum(x * 2, 0).reshape(2, 1, 5))


RESIDUAL = """import "std/nn.cgraph"
model m {
  precision io=f16
  layout NHWC
  input x: [2, 4, 3, 3]
  input r: [2, 6, 3, 3]
  let c = conv2d(x, out=6, k=1)
  let b = batchnorm2d(c)
  output y = relu(b + r)
  %s
}
"""


def test_a_residual_is_added_before_the_convs_bias_in_one_group(tmp_path: Path) -> None:
    """relu(bias_add(conv) + r) -> relu(bias_add(conv + r)): the order cuDNN's precompiled fused
    convolutions take, in one group; the values numpy's (a 1x1 conv as a product over channels,
    the batchnorm written out), not the interpreter's own."""
    from dslc.ir import interp

    model = check_source(RESIDUAL % "", tmp_path).model
    lowered, plan = _lower_checked(model)
    nodes = lowered.by_name()
    relu = nodes[dict(lowered.outputs)["y"]]
    bias = nodes[relu.inputs[0]]
    assert bias.op == "bias_add" and nodes[bias.inputs[0]].op == "add"
    assert [nodes[i].op for i in nodes[bias.inputs[0]].inputs] == ["conv", "input"]
    [group] = [g for g in plan.groups if relu.name in g.nodes]
    assert [nodes[n].op for n in group.nodes] == ["conv", "add", "bias_add", "relu"]
    g = rng("residual before bias")
    x, r = g.standard_normal((2, 4, 3, 3)), g.standard_normal((2, 6, 3, 3))
    params = {"c.weight": g.standard_normal((6, 4, 1, 1)), "b.weight": g.standard_normal(6),
              "b.bias": g.standard_normal(6), "b.running_mean": g.standard_normal(6),
              "b.running_var": g.uniform(0.5, 2.0, 6)}
    params = {k: v.astype(np.float16 if k == "c.weight" else np.float32)
              for k, v in params.items()}
    x, r = x.astype(np.float16).astype(np.float64), r.astype(np.float16).astype(np.float64)
    got = interp.run(lowered, {"x": x.astype(np.float16), "r": r.astype(np.float16)}, params,
                     model.env)["y"]
    conv = np.einsum("kc,nchw->nkhw", params["c.weight"][:, :, 0, 0].astype(np.float64), x)
    scale = params["b.weight"] / np.sqrt(params["b.running_var"].astype(np.float64) + 1e-5)
    norm = (conv - params["b.running_mean"][:, None, None]) * scale[:, None, None] + \
        params["b.bias"][:, None, None]
    want = np.maximum(norm + r, 0)
    assert np.abs(want).max() > 0.5 and np.allclose(got, want, rtol=1e-2, atol=1e-2)


def test_a_conv_read_elsewhere_keeps_its_bias_before_the_residual(tmp_path: Path) -> None:
    """The conv's result also an output: the sum keeps its order (the conv alone is read too)."""
    model = check_source(RESIDUAL % "output z = c", tmp_path).model
    lowered, _ = _lower_checked(model)
    nodes = lowered.by_name()
    add = nodes[nodes[dict(lowered.outputs)["y"]].inputs[0]]
    assert add.op == "add" and nodes[add.inputs[0]].op == "bias_add"


def _ops_under(lowered, name: str, depth: int = 2) -> list[str]:  # type: ignore[no-untyped-def]
    """The ops of `name` and of its first operands, `depth` steps down."""
    nodes = lowered.by_name()
    out, node = [], nodes[name]
    for _ in range(depth + 1):
        out.append(node.op)
        if not node.inputs:
            break
        node = nodes[node.inputs[0]]
    return out


@pytest.mark.parametrize(("body", "want"), [
    # the residual on the left: rewritten as on the right
    ("let c = conv2d(x, out=6, k=1)\n  output y = relu(r + batchnorm2d(c))",
     ["relu", "bias_add", "add", "conv"]),
    # a product is no residual
    ("let c = conv2d(x, out=6, k=1)\n  output y = relu(batchnorm2d(c) * r)",
     ["relu", "mul", "bias_add", "conv"]),
    # a conv result broadcast by the sum: its bias stays first
    ("let c = conv2d(x[:, :, 0:1, 0:1], out=6, k=1)\n  output y = relu(batchnorm2d(c) + r)",
     ["relu", "add", "bias_add", "conv"]),
])
def test_which_sums_take_the_residual_before_the_bias(body: str, want: list[str],
                                                      tmp_path: Path) -> None:
    src = f"""import "std/nn.cgraph"
model m {{
  precision io=f16
  layout NHWC
  input x: [2, 4, 3, 3]
  input r: [2, 6, 3, 3]
  {body}
}}
"""
    lowered, _ = _lower_checked(check_source(src, tmp_path).model)
    assert _ops_under(lowered, dict(lowered.outputs)["y"], 3) == want


@pytest.mark.parametrize("convs", [
    """  let main  = conv2d(x, out=6, k=1, has_bias=true)
  let short = conv2d(x, out=6, k=1, has_bias=true)""",
    # the biases declared in the other order than the convs are computed: the convs decide
    """  param short.b: [6]
  param main.b: [6]
  param main.w: [6, 4, 1, 1]
  param short.w: [6, 4, 1, 1]
  let main  = bias_add(conv(x, main.w), main.b)
  let short = bias_add(conv(x, short.w), short.b)""",
])
def test_of_two_convs_with_their_biases_the_first_computed_takes_the_residual(
        convs: str, tmp_path: Path) -> None:
    """`short + main`, main computed first: main's group grows over the sum (fusion starts at
    the first conv), so main's conv takes the residual and the shortcut keeps its bias."""
    src = f"""import "std/nn.cgraph"
model m {{
  precision io=f16
  layout NHWC
  input x: [2, 4, 3, 3]
{convs}
  output y = relu(short + main)
}}
"""
    lowered, plan = _lower_checked(check_source(src, tmp_path).model)
    nodes = lowered.by_name()
    bias = nodes[nodes[dict(lowered.outputs)["y"]].inputs[0]]
    summed = nodes[bias.inputs[0]]
    assert (bias.op, summed.op) == ("bias_add", "add")
    conv, shortcut = (nodes[i] for i in summed.inputs)
    assert conv.op == "conv" and conv.name.startswith("main")
    assert shortcut.op == "bias_add" and nodes[shortcut.inputs[0]].name.startswith("short")
    assert sorted([nodes[n].op for n in g.nodes] for g in plan.groups) == [
        ["conv", "add", "bias_add", "relu"], ["conv", "bias_add"]]
