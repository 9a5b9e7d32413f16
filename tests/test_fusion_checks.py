"""The fusion patterns' support checks, unit by unit on hand-made nodes (`dslc.fuse.patterns`):
what cuDNN cannot take (integer tensors, a matmul past 3 batch axes) and one memory order per
conv, matmul, norm or reduction graph; and the pattern table read off the op table."""

from __future__ import annotations

from pathlib import Path

from dslc.core.types import Layout, PrecisionSpec, TensorType
from dslc.diag.span import Span
from dslc.fuse.patterns import PATTERNS, _float_io, _matmul_epilogue, _one_memory_order, _ops
from dslc.ir.graph import Attrs, Node
from dslc.pipeline import lower_and_fuse
from tests.helpers import check_source

SPAN = Span("test.cgraph", 1, 1, 1, 2)
NHWC, NCHW = Layout((0, 2, 3, 1)), Layout((0, 1, 2, 3))


def node(name: str, op: str, shape: tuple[int, ...], dtype: str = "f16",
         layout: Layout | None = None) -> Node:
    return Node(name, op, (), Attrs({}), TensorType(dtype, shape, layout), SPAN, "",
                PrecisionSpec())


def test_integer_tensors_are_refused_by_every_pattern() -> None:
    for dtype in ("i64", "u8"):
        chain = [node("a", "relu", (4,)), node("b", "neg", (4,), dtype)]
        assert _float_io(chain) == f"cuDNN graphs do not take {dtype} tensors (%b)"
    assert _float_io([node("a", "relu", (4,)), node("b", "neg", (4,), "f32")]) is None


def test_a_matmul_takes_at_most_three_batch_axes() -> None:
    assert _matmul_epilogue([node("m", "matmul", (2, 3, 4, 5))]) is None
    assert _matmul_epilogue([node("m", "matmul", (2, 2, 3, 4, 5))]) == \
        "cuDNN matmul takes at most 3 batch axes; %m has rank 5"


def test_the_first_epilogue_op_in_another_memory_order_is_named_against_the_anchor() -> None:
    conv = node("c", "conv", (2, 8, 4, 4), layout=NHWC)
    same = node("r", "relu", (2, 8, 4, 4), layout=NHWC)
    other = node("o", "relu", (2, 8, 4, 4), layout=NCHW)
    assert _one_memory_order([conv, same]) is None
    assert _one_memory_order([conv, other]) == "%o is stored row-major, unlike %c (@NHWC)"
    assert _one_memory_order([conv, same, other]) == "%o is stored row-major, unlike %c (@NHWC)"
    # The same bytes: size-1 axes take no place in memory.
    one = [node("c", "conv", (2, 8, 1, 1), layout=NHWC), node("o", "relu", (2, 8, 1, 1),
                                                             layout=NCHW)]
    assert _one_memory_order(one) is None
    assert _one_memory_order([conv, node("i", "cast", (2, 8, 4, 4), "i64", NHWC)]) is not None


def test_the_pattern_table_reads_roles_and_families_off_the_op_table() -> None:
    assert _ops("anchor", "conv") == {"conv", "conv_transpose"}
    assert _ops("anchor", "matmul") == {"matmul"}
    assert _ops("anchor", "attention") == {"sdpa"}
    assert {"layernorm", "rmsnorm", "instancenorm", "batchnorm"} == _ops("norm")
    anchors = {p.name: p.anchors for p in PATTERNS}
    assert anchors["conv_epilogue"] == {"conv", "conv_transpose"}
    assert anchors["sdpa"] == {"sdpa"}


def _reasons(text: str, tmp_path: Path) -> dict[str, str]:
    """Each single-op group's reason, by the op's value name."""
    model = check_source(text, tmp_path).model
    _, plan = lower_and_fuse(model)
    return {g.nodes[0]: g.reason for g in plan.groups if len(g.nodes) == 1}


def test_each_op_left_alone_says_why(tmp_path: Path) -> None:
    reasons = _reasons("""model m {
  input x: [4, 8]
  param w: [8, 8]
  let a = relu(x)
  let v = transpose(a, [1, 0])
  let b = exp(v)
  let m = matmul(x, w)
  let s = sigmoid(m)
  let t = tanh(m)
  output o1 = a
  output o2 = b
  output o3 = s
  output o4 = t
  output o5 = neg(a)
}
""", tmp_path)
    assert reasons["a"] == "it reads the model input %x; no op runs before it"
    assert reasons["b"] == "it reads the view %v, whose base must be stored"
    assert reasons["s"] == "%m is also read by %t, so it is stored and this op starts a new graph"
    assert reasons["t"] == "%m is also read by %s, so it is stored and this op starts a new graph"
    assert reasons["o5"] == "%a is a model output, so it is stored"


def test_the_partitioner_reasons_for_every_other_case(tmp_path: Path) -> None:
    """An op after load-time operands is judged by what follows them; an op whose input's
    group ended is named against that group; an op no pattern starts with, whose group's
    pattern is `single`."""
    model = check_source("""model m {
  dim B = 1..4 tune [2]
  input x: [B, 8]
  param w: [8]
  param p: [1, 8]
  let f = w * 2.0
  let a = f + x
  let (s, q) = genstats(reshape(x, [B, 8, 1]))
  let b = bias_add(q, w[0:1], axis=1)
  let e = expand(p, [B, 8])
  output o1 = a
  output o2 = b
  output o3 = e
  output o4 = x > 0.5
}
""", tmp_path).model
    _, plan = lower_and_fuse(model)
    alone = {g.nodes[0]: g for g in plan.groups if len(g.nodes) == 1}
    assert alone["a"].reason == "it reads the model input %x; no op runs before it"
    genstats = next(n for n in alone if n.startswith("s_q.genstats"))
    assert alone["b"].reason == f"no fusion pattern continues the group of %{genstats} " \
                                "(genstats) with bias_add"
    assert alone["e"].reason == "no fusion pattern starts with this op"
    assert alone["o4"].reason == "no fusion pattern starts with this op"
    assert (alone["o4"].pattern, alone["e"].pattern, alone["a"].pattern) == \
        ("single", "single", "pointwise")


def test_the_plan_lists_the_views_nothing_runs_and_no_other_value(tmp_path: Path) -> None:
    model = check_source("""model m {
  input x: [4, 8]
  param w: [4, 8]
  let a = relu(x)
  output y = transpose(a, [1, 0])
  output z = matmul(a, transpose(w, [1, 0]) * 1.0 + 0.0)
}
""", tmp_path).model
    lowered, plan = lower_and_fuse(model)
    nodes = lowered.by_name()
    assert plan.views and all(nodes[v].op == "view" for v in plan.views)
    assert set(plan.views) == {n.name for n in lowered.nodes if n.op == "view"} - \
        set(plan.load_time)


def test_an_op_after_a_load_time_operand_is_judged_by_the_operands_after_it(
        tmp_path: Path) -> None:
    """`f - x` keeps its operands in order (a sub is not reordered as an add is): the load-time
    `f` comes first and tells nothing, the model input after it does."""
    reasons = _reasons("""model m {
  input x: [4, 8]
  param w: [4, 8]
  let f = w * 2.0
  output o = f - x
}
""", tmp_path)
    assert reasons == {"o": "it reads the model input %x; no op runs before it"}


def test_an_op_its_support_check_refuses_says_why_and_later_anchors_still_fuse(
        tmp_path: Path) -> None:
    """A rank-5 matmul (more batch axes than cuDNN takes) and an i64 cast: no pattern takes
    them, and the plan gives the check's reason, not "no fusion pattern starts with this op";
    the matmul after the refused one still fuses with its relu. (An integer output keeps its
    dtype: the cast back to f32 is written.)"""
    model = check_source("""model m {
  input x: [2, 2, 2, 4, 8]
  input y: [2, 2, 2, 8, 4]
  input u: [4, 8]
  input v: [8, 4]
  output big = matmul(x, y)
  let n = matmul(u, v)
  output r = relu(n)
  let i = cast(u, i64)
  output o = cast(i, f32)
}
""", tmp_path).model
    _, plan = lower_and_fuse(model)
    by_node = {g.nodes: (g.pattern, g.reason) for g in plan.groups}
    assert by_node[("big",)] == ("single", "cuDNN matmul takes at most 3 batch axes; %big has "
                                           "rank 5")
    assert by_node[("n", "r")] == ("matmul_epilogue", "")
    assert by_node[("i",)] == ("single", "cuDNN graphs do not take i64 tensors (%i)")
    # its cast back to f32 runs alone for the same reason
    assert by_node[("o",)] == ("pointwise", "cuDNN graphs do not take i64 tensors (%i)")


def test_a_group_is_named_after_the_param_its_load_time_weight_comes_from(
        tmp_path: Path) -> None:
    model = check_source("""model m {
  input x: [4, 8]
  param w: [8, 8]
  output e = matmul(x, w * 2.0)
  output r = relu(x)
}
""", tmp_path).model
    _, plan = lower_and_fuse(model)
    assert {g.nodes: g.name for g in plan.groups} == {("e",): "w", ("r",): "r"}


def test_a_value_written_into_a_concat_is_planned_there_and_its_signature_says_so(
        tmp_path: Path) -> None:
    """relu(x), read only by the concat, is written into columns 0..8 of its [4, 16] buffer;
    relu(y) and relu(z), stored on their own, are the same computation as it and share a
    signature that its group, written through the concat's strides, does not."""
    model = check_source("""model m {
  input x: [4, 8]
  input y: [4, 8]
  input z: [4, 8]
  let a = relu(x)
  output c = concat([a, y], axis=1)
  output b = relu(y)
  output d = relu(z)
}
""", tmp_path).model
    _, plan = lower_and_fuse(model)
    assert plan.placement == {"a": ("c", (("slice", (0, 0), (4, 8)),))}
    signature = {g.nodes[0]: g.signature for g in plan.groups}
    assert signature["b"] == signature["d"] != signature["a"]
