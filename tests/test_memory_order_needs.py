"""What cuDNN needs of the memory it reads, met at compile time (found by generated programs on
the H200): an op's memory-order needs (`OpDef.needs`) are met by a row-major copy, so cuDNN runs
the op instead of a CuPy fallback; a view that starts off a 16-byte boundary is copied by a CuPy
kernel before cuDNN reads it (its 16-byte vector loads crashed the GPU)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from dslc.backend.target import load_target
from dslc.compile.stage import compile_model
from dslc.pipeline import lower_and_fuse
from tests.helpers import check_source


def _compiled(text: str, tmp_path: Path):  # type: ignore[no-untyped-def]
    model = check_source(text, tmp_path).model
    lowered, plan = lower_and_fuse(model)
    return compile_model(model, lowered, plan, load_target("h200"))


def test_a_matmul_batched_over_an_nhwc_conv_output_reads_a_copy_and_runs_on_cudnn(
        tmp_path: Path) -> None:
    c = _compiled("""model m {
  input x: [2, 1, 7, 9]
  param w: [16, 1, 5, 5]
  param p: [2, 32]
  let y = conv(x, w, stride=3)
  output o = matmul(y, p)
}
""", tmp_path)
    nodes = c.graph.by_name()
    kinds = Counter(s.kind for s in c.steps)
    assert kinds == {"graph": 3}, [(s.kind, s.reason) for s in c.steps]
    copies = [n for n in c.graph.nodes if n.op == "contiguous"]
    assert [n.name for n in copies] == ["y.row_major"]
    matmul = next(n for n in c.graph.nodes if n.op == "matmul")
    assert matmul.inputs[0] == "y.row_major" and nodes["y"].type.layout is not None


def test_a_view_starting_off_a_16_byte_boundary_is_copied_by_a_kernel_first(tmp_path: Path,
                                                                           ) -> None:
    """f32 views of a [2, 4] input starting at element 1 (4 bytes) and 2 (8 bytes) are copied
    on CuPy before cuDNN reads them; the one at element 0 is read in place."""
    c = _compiled("""model m {
  precision io=f16
  input x: f32[2, 4]
  output a = cast(x[:, 1:3], f16)
  output b = cast(x[:, 2:4], f16)
  output c = cast(x[:, 0:2], f16)
}
""", tmp_path)
    nodes = c.graph.by_name()
    kernels = [s.group.nodes for s in c.steps if s.kind == "kernel"]
    assert kernels == [("a.slice.aligned",), ("b.slice.aligned",)]
    assert all(nodes[n].op == "contiguous" and nodes[nodes[n].inputs[0]].op == "view"
               for (n,) in kernels)
    graphs = [s.group.nodes for s in c.steps if s.kind == "graph"]
    assert graphs == [("a",), ("b",), ("c",)]
    assert nodes[nodes["c"].inputs[0]].op == "view"  # aligned: read in place


# --- One memory order per cuDNN graph where the H200 computed mixed orders wrongly -----------

def test_a_conv_reads_nchw_data_through_a_channels_last_copy_with_channels_last_weights(
        tmp_path: Path) -> None:
    c = _compiled("""model m {
  precision io=f16
  input x: [2, 4, 6, 6]
  param w: [8, 4, 3, 3]
  let y = conv(x, w, pad=1)
  output o = relu(y)
}
""", tmp_path)
    nodes = c.graph.by_name()
    conv = next(n for n in c.graph.nodes if n.op == "conv")
    x, w = (nodes[i] for i in conv.inputs)
    assert x.name == "x.channels_last" and x.op == "contiguous" and x.inputs == ("x",)
    assert w.name.endswith(".channels_last")
    for node in (x, w, conv):
        assert node.type.layout is not None and node.type.layout.order == (0, 2, 3, 1), node


def test_a_conv_whose_result_is_an_nchw_output_writes_channels_last_then_copies(
        tmp_path: Path) -> None:
    c = _compiled("""model m {
  input x: [2, 4, 6, 6] @NHWC
  param w: [8, 4, 3, 3]
  output y = conv(x, w, pad=1)
}
""", tmp_path)
    nodes = c.graph.by_name()
    assert nodes["y"].op == "contiguous" and nodes["y"].inputs == ("y.channels_last_out",)
    inner = nodes["y.channels_last_out"]
    assert inner.op == "conv" and inner.type.layout is not None
    assert inner.type.layout.order == (0, 2, 3, 1)
    assert nodes["y"].type.layout is not None and nodes["y"].type.layout.is_row_major


def test_an_epilogue_that_writes_another_memory_order_runs_outside_the_conv_graph(
        tmp_path: Path) -> None:
    model = check_source("""model m {
  input x: [2, 4, 6, 6] @NHWC
  param w: [4, 4, 3, 3]
  param b: [4]
  let c = conv(x, w, pad=1)
  output y = relu(bias_add(c, b, axis=1))
}
""", tmp_path).model
    _, plan = lower_and_fuse(model)
    by_anchor = {g.nodes[-1]: g for g in plan.groups}
    conv_group = next(g for g in plan.groups if g.pattern == "conv_epilogue")
    assert "y" not in conv_group.nodes
    assert "unlike" in by_anchor["y"].reason, by_anchor["y"].reason


def test_a_select_reads_operands_stored_in_another_order_through_copies(tmp_path: Path) -> None:
    c = _compiled("""model m {
  precision io=f16
  input a: [2, 8, 5, 6] @NHWC
  input b: [2, 8, 5, 6]
  output o = select(a > (-0.25), a, b)
}
""", tmp_path)
    nodes = c.graph.by_name()
    select = next(n for n in c.graph.nodes if n.op == "select")
    assert select.type.layout is not None
    for name in select.inputs:
        n = nodes[name]
        seen = n.type.layout.order if n.type.layout is not None else None
        assert seen == select.type.layout.order, (name, seen)
    # The output is NCHW (an output's contract): `a`, stored NHWC, is the one read through a copy.
    assert any(nodes[i].op == "contiguous" and nodes[i].inputs == ("a",) for i in select.inputs)
    assert "b" in select.inputs


def test_a_mask_for_a_select_of_another_order_is_compared_again_never_copied(
        tmp_path: Path) -> None:
    """cuDNN stores masks as bits: a copy of one into another order came out wrong on the H200,
    so the comparison runs again in the select's order, on the copy of `a` the select reads."""
    c = _compiled("""model m {
  input a: [2, 8, 5, 6] @NHWC
  input b: [2, 8, 5, 6]
  output o = select(a > (-0.25), a, b)
}
""", tmp_path)
    nodes = c.graph.by_name()
    assert not [n.name for n in c.graph.nodes if n.op == "contiguous" and n.type.dtype == "bool"]
    select = next(n for n in c.graph.nodes if n.op == "select")
    mask, x, _ = (nodes[i] for i in select.inputs)
    assert mask.op == "cmp_gt" and mask.inputs[0] == x.name == "a.row_major"
    assert [n.name for n in c.graph.nodes if n.op == "cmp_gt"] == [mask.name]  # the first is dead


def test_a_channels_last_conv_epilogue_broadcast_along_a_spatial_axis_is_split(
        tmp_path: Path) -> None:
    def steps(operand: str, axis: str) -> list[tuple[str, ...]]:
        c = _compiled(f"""model m {{
  layout NHWC
  input x: f32[2, 4, 6, 5]
  param w: [8, 4, 3, 3]
  param s: {operand}
  output y = scale_mul(conv(x, w, pad=1), s, axis={axis})
}}
""", tmp_path)
        return [s.group.nodes for s in c.steps if s.kind == "graph"]

    assert len(steps("[5]", "3")) == 2  # along W: split
    assert len(steps("[6]", "2")) == 2  # along H: split
    assert len(steps("[8]", "1")) == 1  # along the channels: one graph


def test_a_matmul_of_one_tensors_memory_runs_its_epilogue_apart(tmp_path: Path) -> None:
    def graphs(expr: str) -> int:
        c = _compiled(f"""model m {{
  input x: f32[2, 8, 8]
  input z: f32[2, 8, 8]
  output y = sin({expr})
}}
""", tmp_path)
        return sum(s.kind == "graph" for s in c.steps)

    assert graphs("matmul(x, x)") == 2
    assert graphs("matmul(x, transpose(x, [0, 2, 1]))") == 2
    assert graphs("matmul(x, z)") == 1


def test_attention_graphs_keep_f32_intermediates(tmp_path: Path) -> None:
    c = _compiled("""model m {
  precision io=f16, intermediate=f16
  input q: [1, 2, 8, 16]
  input k: [1, 2, 8, 16]
  input v: [1, 2, 8, 16]
  output o = sdpa(q, k, v, causal=true, window=2)
}
""", tmp_path)
    (spec,) = c.specs.values()
    assert (spec.io, spec.intermediate) == ("f16", "f32")


def test_a_wide_kernel_over_a_one_pixel_image_runs_as_a_fallback_kernel(tmp_path: Path) -> None:
    def conv_runs_on(hw: str, k: int) -> str:
        c = _compiled(f"""model m {{
  input x: f32[2, 3, {hw}]
  param w: [8, 3, {k}, {k}]
  output y = relu(conv(x, w, pad={k // 2}))
}}
""", tmp_path)
        nodes = c.graph.by_name()
        return next(s.kind for s in c.steps if any(nodes[n].op == "conv" for n in s.group.nodes))

    assert conv_runs_on("1, 1", 3) == "kernel"
    assert conv_runs_on("1, 4", 3) == "kernel"
    assert conv_runs_on("1, 1", 1) == "graph"
    assert conv_runs_on("2, 2", 3) == "graph"


def test_a_rank_3_instance_norm_is_given_to_cudnn_with_its_size_1_axis_last(
        tmp_path: Path) -> None:
    c = _compiled("""model m {
  input x: [8, 4, 6]
  param g: [4]
  param b: [4]
  output o = instancenorm(x, g, b, eps=1e-5)
}
""", tmp_path)
    spec = next(iter(c.specs.values()))
    x = next(t for t in spec.tensors if t.name == "x")
    assert (tuple(x.dims), tuple(x.strides)) == ((8, 4, 6, 1), (24, 6, 1, 1))


def test_a_norm_whose_epilogue_reads_a_second_full_size_tensor_is_split(tmp_path: Path) -> None:
    c = _compiled("""model m {
  precision io=f16
  input x: [4, 64]
  param p: [64]
  output o = max(x, rmsnorm(x, p, eps=1e-5))
}
""", tmp_path)
    graphs = [s for s in c.steps if s.kind == "graph"]
    assert len(graphs) == 2 and all(len(s.group.nodes) == 1 for s in graphs)
    assert "full-size" in graphs[0].reason + graphs[1].reason


def test_an_sdpa_bias_broadcast_over_batch_or_heads_is_read_at_full_size_by_cudnn(
        tmp_path: Path) -> None:
    """cuDNN's sdpa computed a broadcast bias wrongly on the H200: the bias is expanded first (a
    cuDNN identity where the broadcast axes are outermost, else a fallback kernel)."""
    def kinds(bias: str) -> list[str]:
        c = _compiled(f"""model m {{
  precision io=bf16
  input q: [2, 4, 8, 16]
  input k: [2, 4, 8, 16]
  input v: [2, 4, 8, 16]
  input b: {bias}
  output o = sdpa(q, k, v, bias=b)
}}
""", tmp_path)
        return [s.kind for s in c.steps]

    assert kinds("[8, 8]") == ["graph", "graph"]
    assert kinds("[2, 1, 8, 8]") == ["kernel", "graph"]
    assert kinds("[2, 4, 8, 8]") == ["graph"]


def test_inputs_and_params_no_output_reads_stay_part_of_the_model(tmp_path: Path) -> None:
    c = _compiled("""model m {
  input a: [2, 8]
  input unread: [2, 8]
  param unused: [8]
  output o = relu(a)
}
""", tmp_path)
    names = {n.name: n.op for n in c.graph.nodes}
    assert names["unread"] == "input" and names["unused"] == "param"


def test_a_matmul_held_to_an_order_it_cannot_write_writes_row_major_then_copies(
        tmp_path: Path) -> None:
    """A rank-4 matmul output of a `layout NHWC` model is held to channels-last, which here puts
    a batch axis inside the matrix axes: the matmul writes row-major (one cuDNN graph) and a copy
    makes the output's order (before, cuDNN had no form for it: a fallback kernel, and in fp8 a
    failed build: tests/fuzz_cases/seed103_179_crash)."""
    c = _compiled("""model m {
  precision io=f16, intermediate=f32, compute=f32
  layout NHWC
  input x: [2, 4, 16]
  input i: i64[2, 1]
  param w: [16, 16]
  output o = matmul(gather(relu(x), i, axis=1), w)
}
""", tmp_path)
    nodes = c.graph.by_name()
    assert [(s.kind, [nodes[n].op for n in s.group.nodes]) for s in c.steps] == \
        [("graph", ["relu"]), ("kernel", ["gather"]), ("graph", ["matmul"]),
         ("graph", ["contiguous"])]
    matmul = next(n for n in c.graph.nodes if n.op == "matmul")
    assert matmul.type.layout is not None and matmul.type.layout.is_row_major


def test_which_memory_orders_a_matmul_writes() -> None:
    from dslc.core.types import Layout, TensorType
    from dslc.lower.views import matmul_writes

    def writes(shape: tuple[int, ...], order: tuple[int, ...]) -> bool:
        return matmul_writes(TensorType("f16", shape, Layout(order)))

    assert writes((2, 3, 4, 5), (0, 1, 2, 3)) and writes((2, 3, 4, 5), (0, 1, 3, 2))
    assert not writes((2, 3, 4, 5), (0, 2, 3, 1)) and not writes((2, 3, 4, 5), (1, 0, 2, 3))
    assert not writes((2, 3, 4, 5), (0, 2, 1, 3))  # a batch axis between the matrix axes
    assert writes((2, 1, 4, 5), (0, 2, 3, 1))  # a size-1 axis anywhere


def test_attention_writes_its_heads_inside_its_sequence_so_merging_them_is_a_view(
        tmp_path: Path) -> None:
    """sdpa writes [B, H, S, D] in BSHD memory order: the heads merged back (transpose to [B,
    S, H, D], reshape to [B, S, H * D]) read it in place, no copy."""
    from dslc.core.types import Layout

    c = _compiled("""model m {
  precision io=f16, intermediate=f32, compute=f32
  input q: [2, 4, 16, 8]
  input k: [2, 4, 16, 8]
  input v: [2, 4, 16, 8]
  output o = reshape(transpose(sdpa(q, k, v), perm=[0, 2, 1, 3]), shape=[2, 16, 32])
}
""", tmp_path)
    [attention] = [n for n in c.graph.nodes if n.op == "sdpa"]
    assert attention.type.layout == Layout((0, 2, 1, 3), "BSHD")
    from dslc.ir.printer import format_graph
    [line] = [ln for ln in format_graph(c.graph).splitlines() if " = sdpa(" in ln]
    assert line.endswith("f16[2, 4, 16, 8] @BSHD")  # the IR says which order, by its name
    assert not [n.name for n in c.graph.nodes if n.op == "contiguous"]
    assert [s.kind for s in c.steps] == ["graph"]


def test_a_matmul_writes_row_major_whatever_order_its_operand_is_read_in(
        tmp_path: Path) -> None:
    """A pointwise op writes in its first operand's memory order (here the transposed view's,
    column-major); a matmul, a sum and a concat choose theirs apart from it: the matmul's
    square result is row-major, not the relu's order."""
    c = _compiled("""model m {
  precision io=f16, intermediate=f32, compute=f32
  input x: [8, 8]
  param w: [8, 8]
  let r = relu(transpose(x, perm=[1, 0]))
  output o = matmul(r, w) + 1.0
}
""", tmp_path)
    relu = next(n for n in c.graph.nodes if n.op == "relu")
    matmul = next(n for n in c.graph.nodes if n.op == "matmul")
    assert relu.type.layout is not None and relu.type.layout.order == (1, 0)
    assert matmul.type.layout is None or matmul.type.layout.is_row_major


def test_a_concat_writes_in_its_first_operands_memory_order(tmp_path: Path) -> None:
    """The first operand a channels-last conv result, the second a row-major input: the concat
    is written channels-last, as its first operand (not its second)."""
    c = _compiled("""model m {
  precision io=f16, intermediate=f32, compute=f32
  input x: [2, 16, 8, 8] @NHWC
  input y: [2, 16, 8, 8]
  param w: [16, 16, 1, 1]
  let c = concat([conv(x, w), y], axis=1)
  output o = reduce_sum(c, axes=[1], keepdims=true)
}
""", tmp_path)
    concat = next(n for n in c.graph.nodes if n.op == "concat")
    assert concat.type.layout is not None and concat.type.layout.order == (0, 2, 3, 1)


def test_a_transposed_conv_reads_nchw_data_through_a_channels_last_copy(tmp_path: Path) -> None:
    c = _compiled("""model m {
  precision io=f16, intermediate=f32, compute=f32
  input x: [1, 16, 6, 6]
  param w: [16, 8, 3, 3]
  output y = relu(conv_transpose(x, w, stride=2))
}
""", tmp_path)
    [convt] = [n for n in c.graph.nodes if n.op == "conv_transpose"]
    assert convt.inputs[0] == "x.channels_last" and convt.type.layout is not None
    assert convt.type.layout.order == (0, 2, 3, 1)


def test_a_conv_over_rows_sliced_from_channels_last_data_reads_a_copy(tmp_path: Path) -> None:
    """A view of channels-last data with gaps (rows of both images) is read through a dense
    copy (cuDNN computed a conv over such a view 77% off on the H200); rows of one image are a
    dense block, read in place."""
    def data_of_conv(view: str, n: int) -> str:
        c = _compiled(f"""model m {{
  precision io=f16, intermediate=f32, compute=f32
  input x: [2, 16, 6, 6] @NHWC
  param w: [16, 16, 3, 3]
  output y: [{n}, 16, 2, 4] @NHWC = conv({view}, w)
}}
""", tmp_path)
        [conv] = [node for node in c.graph.nodes if node.op == "conv"]
        return c.graph.by_name()[conv.inputs[0]].op

    assert data_of_conv("x[:, :, 0:4, :]", 2) == "contiguous"
    assert data_of_conv("x[0:1, :, 0:4, :]", 1) == "view"


@pytest.mark.parametrize(("body", "inner_op", "suffix", "order"), [
    ("  input x: [2, 4, 6, 6] @NHWC\n  param w: [4, 8, 3, 3]\n"
     "  output y = conv_transpose(x, w, stride=2)", "conv_transpose", "channels_last_out",
     (0, 2, 3, 1)),
    ("  layout NHWC\n  input x: [2, 3, 5, 8]\n  param w: [8, 16]\n  output y = matmul(x, w)",
     "matmul", "row_major_out", (0, 1, 2, 3)),
])
def test_an_op_writing_another_order_than_its_outputs_is_named_for_what_it_writes(
        body: str, inner_op: str, suffix: str, order: tuple[int, ...], tmp_path: Path) -> None:
    """A transposed conv writes channels-last, a matmul its batch axes outermost: where the
    output is held to another order, the op writes its own into `y.<its order>_out` and a copy
    gives the output's."""
    c = _compiled(f"model m {{\n{body}\n}}\n", tmp_path)
    nodes = c.graph.by_name()
    assert nodes["y"].op == "contiguous" and nodes["y"].inputs == (f"y.{suffix}",)
    inner = nodes[f"y.{suffix}"]
    assert inner.op == inner_op and inner.type.layout is not None
    assert inner.type.layout.order == order
    assert nodes["y"].type.layout is not None and nodes["y"].type.layout.order != order


def test_a_transposed_conv_on_channels_last_data_reads_channels_last_weights(
        tmp_path: Path) -> None:
    """As a conv does: its weight [C, K, R, S] copied once (at load time) into (0, 2, 3, 1)."""
    c = _compiled("""model m {
  layout NHWC
  input x: [2, 4, 6, 6]
  param w: [4, 8, 3, 3]
  output y = relu(conv_transpose(x, w, stride=2))
}
""", tmp_path)
    nodes = c.graph.by_name()
    conv = next(n for n in c.graph.nodes if n.op == "conv_transpose")
    w = nodes[conv.inputs[1]]
    assert (w.name, w.op, w.inputs) == ("w.channels_last", "contiguous", ("w",))
    assert w.type.layout is not None and w.type.layout.order == (0, 2, 3, 1)


def test_an_sdpa_reads_a_view_through_a_row_major_copy_and_a_stored_value_in_place(
        tmp_path: Path) -> None:
    """The op's rule (`needs`: the last axis contiguous) asks for copies: a key whose last axis
    is strided (a transpose) and a value read through a view (a slice) each read a row-major
    copy; the query, a stored row-major value, is read as it is. The result against PyTorch's
    attention."""
    import numpy as np
    import torch

    from dslc.ir import interp
    from tests.helpers import rng

    model = check_source("""model m {
  input x: [2, 2, 4, 16]
  input kt: [2, 2, 16, 4]
  input vv: [4, 2, 4, 16]
  let a = sdpa(relu(x), transpose(kt, [0, 1, 3, 2]), vv[0:2])
  output y = a * 2.0
}
""", tmp_path).model
    lowered, _ = lower_and_fuse(model)
    nodes = lowered.by_name()
    assert nodes["a"].inputs == ("a.relu", "a.transpose.row_major", "a.slice.row_major")
    layout = nodes["a"].type.layout  # written row-major too, not in an sdpa's own BSHD
    assert layout is not None and layout.is_row_major
    for name in nodes["a"].inputs[1:]:
        assert nodes[name].op == "contiguous" and nodes[nodes[name].inputs[0]].op == "view"
    r = rng("sdpa copies")
    x = {"x": r.standard_normal((2, 2, 4, 16)), "kt": r.standard_normal((2, 2, 16, 4)),
         "vv": r.standard_normal((4, 2, 4, 16))}
    x = {k: v.astype(np.float32) for k, v in x.items()}
    got = interp.run(lowered, x, {}, model.env)["y"]
    t = {k: torch.from_numpy(v) for k, v in x.items()}
    want = 2.0 * torch.nn.functional.scaled_dot_product_attention(
        torch.relu(t["x"]), t["kt"].transpose(2, 3), t["vv"][0:2]).numpy()
    assert np.abs(got - want).max() < 1e-5


def test_a_sum_keeping_its_operands_shape_is_written_row_major_not_in_its_order(
        tmp_path: Path) -> None:
    """A sum over a channel axis of size 1 keeps a channels-last conv result's shape; unlike a
    pointwise op it chooses its memory order apart from its operand's: row-major."""
    c = _compiled("""model m {
  precision io=f16, intermediate=f32, compute=f32
  input x: [2, 4, 6, 6] @NHWC
  param w: [1, 4, 1, 1]
  let c = conv(x, w)
  output o = reduce_sum(c, axes=[1], keepdims=true) + 1.0
}
""", tmp_path)
    nodes = c.graph.by_name()
    assert nodes["c"].type.layout is not None and nodes["c"].type.layout.order == (0, 2, 3, 1)
    total = next(n for n in c.graph.nodes if n.op == "reduce_sum")
    assert total.type.shape == nodes["c"].type.shape and total.type.layout is not None
    assert total.type.layout.is_row_major


def test_a_select_of_transposed_views_copies_its_branches_and_reads_its_mask_as_written(
        tmp_path: Path) -> None:
    """The branches (views, column-major in their bases) are read through row-major copies; the
    comparison, computed here, is written row-major in the first place, so it needs none: two
    copies, not three."""
    c = _compiled("""model m {
  precision io=f16, intermediate=f32, compute=f32
  input x: [8, 6]
  input y: [8, 6]
  output o = select(transpose(x, perm=[1, 0]) > 0.0, transpose(x, perm=[1, 0]),
                    transpose(y, perm=[1, 0]))
}
""", tmp_path)
    copies = sorted(n.name for n in c.graph.nodes if n.op == "contiguous")
    assert copies == ["o.transpose_1.row_major", "o.transpose_2.row_major"]
    select = next(n for n in c.graph.nodes if n.op == "select")
    assert select.inputs == ("o.cmp_gt", *copies)


def test_a_layernorm_with_a_memory_order_need_reads_a_sliced_scale_through_a_copy(
        tmp_path: Path) -> None:
    """The layernorm over a transposed view needs row-major operands: the view of x and the
    slice of s (a vector, aligned, but a view) are each read through a row-major copy; the
    stored bias in place."""
    c = _compiled("""model m {
  precision io=f16, intermediate=f32, compute=f32
  input x: [8, 6]
  param s: [16]
  param b: [8]
  output o = layernorm(transpose(x, perm=[1, 0]), s[8:16], b, eps=1e-5)
}
""", tmp_path)
    norm = next(n for n in c.graph.nodes if n.op == "layernorm")
    assert norm.inputs == ("o.transpose.row_major", "o.slice.row_major", "b")
