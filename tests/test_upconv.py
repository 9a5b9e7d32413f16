"""A transposed convolution whose kernel is its stride runs as a matmul per kernel row, each
writing its rows of the channels-last output in place (`dslc.lower.upconv`): which ones are
rewritten, the bias as the matmuls' epilogue, the rows written in place, and the values against
PyTorch's conv_transpose2d of the source (the oracle never goes through the rewrite, nor through
numpy)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from dslc.check.checker import CheckedModel
from dslc.ir import interp
from dslc.ir.placement import in_place
from dslc.lower.canonical import load_time
from dslc.pipeline import lower_and_fuse
from tests.helpers import check_source, rng

UP = """model m {
  precision io=%(dtype)s, intermediate=f32, compute=f32
  %(layout)s
  dim N = 1..4
  input x: [N, 6, 5, %(w)d]
  param w: [6, 4, %(kh)d, %(kw)d]
  param b: [4]
  let u = conv_transpose(x, w, stride=%(stride)s%(more)s)
  %(tail)s
}
"""
BIAS = "output y = relu(bias_add(u, b))"


def _model(tmp_path: Path, *, dtype: str = "f32", w: int = 7, kh: int = 2, kw: int = 2,
           stride: str = "2", more: str = "", tail: str = BIAS,
           layout: str = "layout NHWC") -> CheckedModel:
    src = UP % {"dtype": dtype, "w": w, "kh": kh, "kw": kw, "stride": stride, "more": more,
                "tail": tail, "layout": layout}
    return check_source(src, tmp_path).model


def _run(model: CheckedModel, kh: int, kw: int, n: int = 3,
         dtype: str = "f32") -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    lowered, plan = lower_and_fuse(model)
    g = rng(f"upconv {kh} {kw} {dtype}")
    narrow = np.float16 if dtype == "f16" else np.float32
    x = g.standard_normal((n, 6, 5, 7)).astype(narrow)
    params = {"w": (g.standard_normal((6, 4, kh, kw)) / 3).astype(narrow),
              "b": g.standard_normal(4).astype(narrow)}
    got = interp.run(lowered, {"x": x}, params, model.env, virtual=plan.virtual(),
                     check_views=True)
    return {"x": x, **params}, got


def _torch(v: dict[str, np.ndarray], stride: tuple[int, int]) -> torch.Tensor:
    t = {k: torch.from_numpy(a.astype(np.float64)) for k, a in v.items()}
    return torch.nn.functional.conv_transpose2d(t["x"], t["w"], stride=stride)


@pytest.mark.parametrize(("kh", "kw", "stride"), [(2, 2, "2"), (3, 2, "[3, 2]"), (1, 1, "1")])
@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_a_transposed_conv_with_its_kernel_as_stride_is_a_matmul_and_equals_pytorch(
        kh: int, kw: int, stride: str, dtype: str, tmp_path: Path) -> None:
    model = _model(tmp_path, dtype=dtype, kh=kh, kw=kw, stride=stride)
    lowered, _ = lower_and_fuse(model)
    ops = [n.op for n in lowered.nodes]
    assert "conv_transpose" not in ops and ops.count("matmul") == kh  # one per kernel row
    matmuls = {n.name for n in lowered.nodes if n.op == "matmul"}
    biases = [n for n in lowered.nodes if n.op == "bias_add"]
    assert {b.inputs[0] for b in biases} == matmuls and {b.attrs["axis"] for b in biases} == {3}
    constant = load_time(lowered)  # the weights' and the bias' copies, once, at load
    copies = {n.name for n in lowered.nodes if n.op in ("contiguous", "concat")} - constant
    placed = in_place(lowered, constant)
    assert all(placed[b.name][0] in copies for b in biases) if kh > 1 else not copies
    assert len(copies) <= 1  # the rows' concat, every row written in place: it copies nothing
    v, got = _run(model, kh, kw, dtype=dtype)
    want = torch.relu(_torch(v, (kh, kw)) + torch.from_numpy(
        v["b"].astype(np.float64))[:, None, None]).numpy()
    assert got["y"].shape == want.shape and np.abs(want).max() > 0.5
    tolerance = 4e-3 if dtype == "f16" else 1e-6  # f16: the output's rounding
    assert np.abs(got["y"].astype(np.float64) - want).max() <= tolerance * np.abs(want).max()


def test_without_a_bias_or_with_the_result_read_twice_the_matmul_stands_alone(
        tmp_path: Path) -> None:
    tail = "output y = bias_add(u, b)\n  output z = relu(u)"
    model = _model(tmp_path, tail=tail)
    lowered, _ = lower_and_fuse(model)
    matmuls = {n.name for n in lowered.nodes if n.op == "matmul"}
    assert "conv_transpose" not in [n.op for n in lowered.nodes] and len(matmuls) == 2
    assert all(not matmuls & set(n.inputs) for n in lowered.nodes if n.op == "bias_add")
    v, got = _run(model, 2, 2)
    u = _torch(v, (2, 2))
    want = {"y": (u + torch.from_numpy(v["b"].astype(np.float64))[:, None, None]).numpy(),
            "z": torch.relu(u).numpy()}
    for name, w in want.items():
        assert np.abs(got[name] - w).max() <= 1e-6 * np.abs(w).max(), name


def test_in_a_channels_first_model_the_input_and_the_output_are_copied_and_equal_pytorch(
        tmp_path: Path) -> None:
    """Without `layout NHWC` the rows the matmul reads, and the output it writes, are no views
    of NCHW memory: one copy each way, and the same numbers."""
    model = _model(tmp_path, layout="# NCHW")
    lowered, _ = lower_and_fuse(model)
    assert "conv_transpose" not in [n.op for n in lowered.nodes]
    v, got = _run(model, 2, 2)
    want = torch.relu(_torch(v, (2, 2)) + torch.from_numpy(
        v["b"].astype(np.float64))[:, None, None]).numpy()
    assert np.abs(got["y"] - want).max() <= 1e-6 * np.abs(want).max()


def test_a_bias_along_another_axis_is_no_epilogue_of_the_matmul(tmp_path: Path) -> None:
    """A vector added along the width is not the conv's bias: the matmul stands alone (taken
    as the bias, it would be added per channel) and the numbers are PyTorch's."""
    model = _model(tmp_path, tail="param v: [14]\n  output y = bias_add(u, v, axis=3)")
    lowered, plan = lower_and_fuse(model)
    matmuls = {n.name for n in lowered.nodes if n.op == "matmul"}
    assert all(not matmuls & set(n.inputs) for n in lowered.nodes if n.op == "bias_add")
    g = rng("upconv width bias")
    v = {"x": g.standard_normal((3, 6, 5, 7)).astype(np.float32),
         "w": (g.standard_normal((6, 4, 2, 2)) / 3).astype(np.float32),
         "v": g.standard_normal(14).astype(np.float32)}
    params = {"w": v["w"], "v": v["v"], "b": np.ones(4, np.float32)}  # b: declared, unread
    got = interp.run(lowered, {"x": v["x"]}, params, model.env,
                     virtual=plan.virtual(), check_views=True)["y"]
    want = (_torch(v, (2, 2)) + torch.from_numpy(v["v"].astype(np.float64))).numpy()
    assert np.abs(got - want).max() <= 1e-6 * np.abs(want).max()


def test_a_3d_transposed_conv_with_its_kernel_as_stride_stays_a_convolution(
        tmp_path: Path) -> None:
    """The rewrite is of 2-d convolutions (the blocks' rows and columns)."""
    src = """model m {
  precision io=f32, intermediate=f32, compute=f32
  input x: [2, 6, 3, 4, 5]
  param w: [6, 4, 2, 2, 2]
  output y = conv_transpose(x, w, stride=2)
}
"""
    lowered, _ = lower_and_fuse(check_source(src, tmp_path).model)
    assert "conv_transpose" in [n.op for n in lowered.nodes]


@pytest.mark.parametrize(("kh", "stride", "more"), [
    (3, "2", ""),  # overlapping blocks: a kernel larger than the stride
    (2, "2", ", pad=1"),
    (2, "2", ", output_pad=1"),
    (2, "2", ", dilation=2"),
])
def test_a_transposed_conv_whose_blocks_overlap_or_are_cut_stays_a_convolution(
        kh: int, stride: str, more: str, tmp_path: Path) -> None:
    model = _model(tmp_path, kh=kh, kw=kh, stride=stride, more=more)
    lowered, _ = lower_and_fuse(model)
    assert "conv_transpose" in [n.op for n in lowered.nodes]
    assert "matmul" not in [n.op for n in lowered.nodes]


def test_each_row_matmul_is_one_cudnn_graph_writing_every_other_block_row(
        tmp_path: Path) -> None:
    """Each kernel row's matmul, its bias the epilogue, is a cuDNN graph of [N*H, W, C] times
    [1, C, kw*O] (the weights broadcast over the batch; deviceless), whose result's rows are
    two block rows apart: the channels-last output's rows of that kernel row."""
    from dslc.backend.target import load_target
    from dslc.compile.stage import compile_model

    model = _model(tmp_path, dtype="f16", tail="output y = bias_add(u, b)")
    lowered, plan = lower_and_fuse(model)
    c = compile_model(model, lowered, plan, load_target("h200"))
    specs = [b.spec for b in c.builds.values() if "matmul" in [o.op for o in b.spec.ops]]
    assert len(specs) == 2 and all([o.op for o in s.ops] == ["matmul", "bias_add"] for s in specs)
    for i, spec in enumerate(specs):
        form = {t.name: (t.dims, t.strides) for t in spec.tensors}
        assert form["y.rows"] == ((20, 7, 6), (42, 6, 1))  # N * H (N = 4), W, C
        assert form[f"y.taps{i}"][0] == (1, 6, 8)  # C, the taps j and channels o
        assert form[f"y.row{i}.bias_add"] == ((20, 7, 8), (112, 8, 1))  # every other row
