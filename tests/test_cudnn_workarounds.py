"""What the compiler does around cuDNN defects that generated programs found on the H200 (each
shrunk there; `tests/gpu/test_ops_gpu.py` holds the GPU cases): the forms below are what cuDNN
gets instead of the ones it computed wrongly. Checked deviceless, through the real frontend."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dslc.backend.target import load_target
from dslc.compile.stage import Compiled, compile_model
from dslc.pipeline import lower_and_fuse
from tests.helpers import check_source

NN = 'import "std/nn.cgraph"\n'


def _compiled(text: str, tmp_path: Path) -> Compiled:
    model = check_source(text, tmp_path).model
    lowered, plan = lower_and_fuse(model)
    return compile_model(model, lowered, plan, load_target("h200"))


def _pointwise_modes(c: Compiled) -> list[str]:
    modes = []
    for built in c.builds.values():
        graph: dict[str, Any] = json.loads(str(built.graph))
        modes += [str(n.get("mode")) for n in graph["nodes"] if n.get("tag") == "POINTWISE"]
    return modes


def test_a_conv_over_a_slice_of_rows_reads_a_dense_channels_last_copy(tmp_path: Path) -> None:
    # 77% off on the H200 when the conv read the slice's strides (gaps between its rows)
    c = _compiled(NN + """model m {
  precision io=f16
  input x: [2, 1, 4, 7]
  let v = x[:, :, 0:2, :]
  output y = conv2d(v, out=4, k=3, pad=1)
}""", tmp_path)
    nodes = c.graph.by_name()
    conv = next(n for n in c.graph.nodes if n.op == "conv")
    data = nodes[conv.inputs[0]]
    assert data.op == "contiguous" and nodes[data.inputs[0]].op == "view"


def test_a_conv_over_a_dense_view_reads_it_in_place(tmp_path: Path) -> None:
    c = _compiled(NN + """model m {
  precision io=f16
  input x: [2, 1, 4, 7]
  let v = x[0:1, :, :, :]
  output y = conv2d(v, out=4, k=3, pad=1)
}""", tmp_path)
    conv = next(n for n in c.graph.nodes if n.op == "conv")
    assert c.graph.by_name()[conv.inputs[0]].op == "view"


def test_an_expand_of_the_channels_of_a_channels_last_value_runs_as_a_fallback_kernel(
        tmp_path: Path) -> None:
    # 100% off on the H200 as cuDNN's identity broadcasting the innermost axis
    c = _compiled("""model m {
  layout NHWC
  input x: f32[2, 1, 4, 4]
  let r = relu(x)
  output s = r
  output y = expand(r, shape=[2, 2, 4, 4])
}""", tmp_path)
    kinds = {c.graph.by_name()[s.group.nodes[0]].op: s.kind for s in c.steps}
    assert kinds == {"relu": "graph", "expand": "kernel"}
    # read by the expand alone, the relu joins it: one kernel, no cuDNN graph
    fused = _compiled("""model m {
  layout NHWC
  input x: f32[2, 1, 4, 4]
  output y = expand(relu(x), shape=[2, 2, 4, 4])
}""", tmp_path)
    nodes = fused.graph.by_name()
    assert [([nodes[n].op for n in s.group.nodes], s.kind) for s in fused.steps] == \
        [(["relu", "expand"], "kernel")]
    # a chain no one kernel computes (clamp has no expression): the broadcast runs on its own
    split = _compiled("""model m {
  layout NHWC
  input x: f32[2, 1, 4, 4]
  output y = expand(clamp(x, lo=0.0, hi=1.0), shape=[2, 2, 4, 4])
}""", tmp_path)
    nodes = split.graph.by_name()
    assert [([nodes[n].op for n in s.group.nodes], s.kind) for s in split.steps] == \
        [(["clamp"], "graph"), (["expand"], "kernel")]


def test_leaky_relu_lowers_to_the_max_of_x_and_its_scaled_self(tmp_path: Path) -> None:
    # cuDNN's leaky relu in a matmul epilogue was 19% off on the H200
    small = _compiled(NN + """model m {
  input x: f32[1, 4, 16]
  output y = leaky_relu(linear(x, out=8, has_bias=false), slope=0.01)
}""", tmp_path)
    assert _pointwise_modes(small) == ["MUL", "MAX"]
    steep = _compiled("""model m {
  input x: f32[4, 16]
  output y = leaky_relu(x, slope=3.0)
}""", tmp_path)
    assert _pointwise_modes(steep) == ["MUL", "MIN"]


def test_a_copy_gives_a_size_one_axis_whose_stride_ties_another_the_outermost_one(
        tmp_path: Path) -> None:
    # [2, 1, 12, 7] read as [1, 2, 12, 7] has strides [84, 84, 7, 1]; its copy into
    # channels-last was 60% off on the H200
    c = _compiled("""model m {
  precision io=f16
  layout NHWC
  input x: [2, 1, 12, 7]
  let r = relu(x)
  output y = contiguous(transpose(r, perm=[1, 0, 2, 3]))
}""", tmp_path)
    [spec] = [s for s in c.specs.values() if [o.op for o in s.ops] == ["contiguous"]]
    [source] = [t for t in spec.tensors if t.role == "input"]
    assert source.dims == (1, 2, 12, 7)
    assert source.strides == (168, 84, 7, 1)  # the size-1 axis outside all: 84 * 2


def _kinds(c: Compiled) -> dict[str, str]:
    return {c.graph.by_name()[s.group.nodes[0]].op: s.kind for s in c.steps}


def test_a_copy_that_moves_the_batch_axis_inward_runs_as_a_fallback_kernel(
        tmp_path: Path) -> None:
    # 133% off on the H200 as cuDNN's copy (NHWC [2, 3, 4, 4] transposed [1, 0, 2, 3]: the batch
    # outermost in the result, inside the channels in the operand)
    c = _compiled("""model m {
  layout NHWC
  input x: f32[2, 3, 4, 4]
  output y = transpose(x, perm=[1, 0, 2, 3])
}""", tmp_path)
    [step] = c.steps
    assert step.kind == "kernel" and "batch axis" in step.reason


def test_a_pointwise_op_over_such_a_transpose_runs_as_a_fallback_kernel_too(
        tmp_path: Path) -> None:
    c = _compiled("""model m {
  layout NHWC
  input x: f32[2, 3, 4, 5]
  output y = relu(transpose(x, perm=[2, 0, 3, 1]))
}""", tmp_path)
    assert _kinds(c) == {"relu": "kernel"}


def test_a_conv_over_a_transpose_of_batch_and_channels_copies_its_data_in_a_kernel(
        tmp_path: Path) -> None:
    # 150% off on the H200: the conv's channels-last copy of the transposed data was wrong
    c = _compiled("""model m {
  input x: f32[2, 3, 4, 4]
  param w: [1, 2, 1, 1]
  output y = conv(transpose(x, perm=[1, 0, 2, 3]), w, stride=1, dilation=1, groups=1)
}""", tmp_path)
    nodes = c.graph.by_name()
    conv = next(s for s in c.steps if nodes[s.group.nodes[0]].op == "conv")
    [copy] = [s for s in c.steps if conv.group.inputs[0] in s.group.outputs]
    assert conv.kind == "graph" and copy.kind == "kernel"


def test_layout_copies_that_keep_the_batch_outermost_stay_on_cudnn(tmp_path: Path) -> None:
    # a batch of one, NCHW to channels-last: the channels and the rows trade places as the
    # outermost axis, the batch is not moved (the Stable Diffusion block's group norms)
    one = _compiled("""model m {
  input x: f32[1, 3, 4, 5]
  param w: [2, 3, 1, 1]
  output y = conv(x, w, stride=1, dilation=1, groups=1)
}""", tmp_path)
    many = _compiled("""model m {
  layout NHWC
  input x: f32[2, 3, 4, 5]
  output y = relu(transpose(x, perm=[0, 2, 3, 1]))
}""", tmp_path)
    assert set(_kinds(one).values()) == {"graph"} and _kinds(many) == {"relu": "graph"}
