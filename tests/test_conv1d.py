"""A 1-d convolution (an audio encoder's over mel frames) runs as cuDNN's 2-d one over a single
row: its group's tensors [N, C, T] as [N, C, 1, T], the window's attributes given the row's
(`backend.spec`, the "one_row" form). Before, the rank-3 form was refused by cuDNN and the conv
ran as a fallback kernel. The oracle of the 2-d form is PyTorch's conv1d of the source."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from dslc.backend.device import run_reference
from dslc.backend.spec import GroupSpec, one_row_attrs
from dslc.backend.target import load_target
from dslc.compile.stage import Compiled, compile_model
from dslc.emit import bundle as emit_bundle
from dslc.pipeline import lower_and_fuse
from dslc.runtime import bundle
from dslc.runtime.records import BundleError
from tests.helpers import check_source, rng

SOURCE = """model m {{
  precision io={io}, intermediate=f32, compute=f32
  {layout}
  input x: [2, 16, 40]
  input s: [2, 20, 32]
  param w: [32, 16, 3]
  param b: [32]
  let c = bias_add(conv(x, w, stride=2, pad={dilation}, dilation={dilation}), b)
  output y = transpose(gelu(c) + transpose(s, [0, 2, 1]), [0, 2, 1])
}}"""
SHAPES = {"x": (2, 16, 40), "s": (2, 20, 32), "w": (32, 16, 3), "b": (32,)}


def _compiled(tmp_path: Path, io: str = "f32", layout: str = "", dilation: int = 1) -> Compiled:
    model = check_source(SOURCE.format(io=io, layout=layout, dilation=dilation), tmp_path).model
    lowered, plan = lower_and_fuse(model)
    return compile_model(model, lowered, plan, load_target("h200"))


def _conv_spec(c: Compiled) -> GroupSpec:
    [built] = [b for b in c.builds.values() if b.spec.ops[0].op == "conv"]
    return built.spec


@pytest.mark.parametrize(("io", "layout"), [("f32", ""), ("f16", "layout NHWC")])
def test_a_1d_conv_and_its_epilogue_are_one_cudnn_graph(io: str, layout: str,
                                                        tmp_path: Path) -> None:
    c = _compiled(tmp_path, io, layout)
    nodes = c.graph.by_name()
    [step] = [s for s in c.steps if nodes[s.group.nodes[0]].op == "conv"]
    assert step.kind == "graph" and not step.reason, step.reason
    assert [nodes[n].op for n in step.group.nodes] == ["conv", "bias_add", "gelu", "add"]
    spec = _conv_spec(c)
    x, w = (spec.tensor(n) for n in spec.ops[0].inputs)
    assert (x.dims, w.dims) == ((2, 16, 1, 40), (32, 16, 1, 3))
    assert x.strides == (640, 1, 640, 16)  # channels-last: [N, T, C] in memory
    attrs = spec.ops[0].attrs
    assert (tuple(attrs["stride"]), tuple(attrs["dilation"])) == ((1, 2), (1, 1))
    assert (tuple(attrs["pre_pad"]), tuple(attrs["post_pad"])) == ((0, 1), (0, 1))
    assert spec.tensor(spec.ops[1].inputs[1]).dims == (1, 32, 1, 1)  # the bias on the channels


@pytest.mark.parametrize("dilation", [1, 2])
def test_the_one_row_form_computes_the_1d_conv(dilation: int, tmp_path: Path) -> None:
    """The group's ops, run by their references on the form's tensors with the form's
    attributes (as the tuner checks a plan), equal PyTorch's conv1d of the source."""
    spec = _conv_spec(_compiled(tmp_path, dilation=dilation))
    draw = rng("one-row conv", dilation)
    source = {n: draw.standard_normal(s).astype(np.float32) for n, s in SHAPES.items()}
    given = {"x.channels_last": source["x"], "w.channels_last": source["w"], "b": source["b"],
             "y.transpose": source["s"].transpose(0, 2, 1)}  # what each tensor holds
    held = {t.name: given[t.name].reshape(t.dims) for t in spec.tensors if t.role == "input"}
    for op in spec.ops:
        held[op.node] = run_reference(np, op.op, [held[i] for i in op.inputs], op.attrs, "f32")
    t = {k: torch.from_numpy(v).double() for k, v in source.items()}
    want = F.gelu(F.conv1d(t["x"], t["w"], t["b"], stride=2, padding=dilation,
                           dilation=dilation)) + t["s"].transpose(1, 2)
    got = held[spec.ops[-1].node].reshape(want.shape)
    assert np.abs(got - want.numpy()).max() <= 1e-5 * np.abs(want.numpy()).max()


def test_an_epilogue_axis_past_the_channels_moves_past_the_unit_height() -> None:
    """A bias or scale along the row of a 1-d convolution's result ([N, K, T], axis 2) is on axis
    3 of the form; along the channels (axis 1) it stays; a window attribute gains the row's."""
    assert one_row_attrs("scale_mul", {"axis": 2})["axis"] == 3
    assert one_row_attrs("bias_add", {"axis": 1})["axis"] == 1
    assert one_row_attrs("conv_transpose", {"stride": (2,), "pad": (1,), "output_pad": (1,),
                                            "dilation": (1,)}) == {
        "stride": (1, 2), "pad": (0, 1), "output_pad": (0, 1), "dilation": (1, 1)}


@pytest.mark.parametrize(("stride", "refused"), [([1, 2], False), ([2], True), ([2, 1], True)])
def test_a_stored_1d_conv_graph_is_checked_in_its_2d_form(stride: list[int], refused: bool,
                                                          tmp_path: Path) -> None:
    """The runtime checks a stored graph's attributes against its node's in the one-row form:
    the form as compiled loads; the source's 1-d stride, or the stride on the wrong axis, is
    refused in one sentence, never run."""
    data = emit_bundle.payload(_compiled(tmp_path))
    [entry] = [e for e in data["buckets"][0]["graphs"].values()
               if e["spec"]["ops"][0]["op"] == "conv"]
    assert list(entry["spec"]["ops"][0]["attrs"]["stride"]) == [1, 2]
    entry["spec"]["ops"][0]["attrs"]["stride"] = stride
    path = tmp_path / "m.bundle"
    path.write_bytes(bundle.pack(data))
    if not refused:
        bundle.load(path)
        return
    with pytest.raises(BundleError) as err:
        bundle.load(path)
    assert "the attributes of `c.conv` are not those of node `c.conv`" in str(err.value)
