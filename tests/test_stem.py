"""A stride-2 convolution over few channels runs as a stride-1 convolution over the 2x2
space-to-depth of its input (`dslc.lower.stem`): which convs are rewritten, the shapes and pads
of the new conv, and its values against PyTorch's convolution of the source (the oracle never
goes through the rewrite, nor through numpy's conv)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from dslc.check.checker import CheckedModel
from dslc.ir import interp
from dslc.pipeline import lower_and_fuse
from tests.helpers import check_source, rng

STEM = """model m {
  precision io=%(dtype)s, intermediate=f32, compute=f32
  layout NHWC
  input x: [2, %(c)d, %(h)d, %(w)d]
  param w: [8, %(c)d, %(k)d, %(k)d]
  param b: [8]
  output y = relu(bias_add(conv(x, w, stride=%(stride)s, %(pads)s), b))
}
"""


def _model(tmp_path: Path, *, dtype: str = "f16", c: int = 3, h: int = 16, w: int = 12,
           k: int = 7, stride: str = "2", pads: str = "pad=3") -> CheckedModel:
    src = STEM % {"dtype": dtype, "c": c, "h": h, "w": w, "k": k, "stride": stride, "pads": pads}
    return check_source(src, tmp_path).model


def _conv(lowered):  # type: ignore[no-untyped-def]
    [conv] = [n for n in lowered.nodes if n.op == "conv"]
    return conv, lowered.by_name()


@pytest.mark.parametrize(("k", "pads", "torch_pad", "taps", "new_pads"), [
    (7, "pad=3", (3, 3, 3, 3), 4, ((2, 2), (1, 1))),  # ResNet's stem: one zero tap in front
    (3, "pad=1", (1, 1, 1, 1), 2, ((1, 1), (0, 0))),
    (5, "pad=2", (2, 2, 2, 2), 3, ((1, 1), (1, 1))),  # even pad: one zero tap behind
    (4, "pad=0", (0, 0, 0, 0), 2, ((0, 0), (0, 0))),
    (3, "pre_pad=[1, 0], post_pad=[0, 2]", (0, 2, 1, 0), 2, ((1, 0), (0, 1))),  # torch: w, h
])
@pytest.mark.parametrize("dtype", ["f16", "f32"])
def test_a_stride_2_conv_over_3_channels_runs_over_its_space_to_depth_and_equals_pytorch(
        k: int, pads: str, torch_pad: tuple[int, ...], taps: int,
        new_pads: tuple[tuple[int, int], tuple[int, int]], dtype: str, tmp_path: Path) -> None:
    model = _model(tmp_path, dtype=dtype, k=k, pads=pads)
    lowered, plan = lower_and_fuse(model)
    conv, nodes = _conv(lowered)
    x_read, w_read = (nodes[i] for i in conv.inputs)
    assert tuple(conv.attrs["stride"]) == (1, 1)
    assert (tuple(conv.attrs["pre_pad"]), tuple(conv.attrs["post_pad"])) == new_pads
    assert tuple(x_read.type.shape) == (2, 12, 8, 6)
    assert tuple(w_read.type.shape)[:2] == (8, 12) and tuple(w_read.type.shape)[2:] == (taps, taps)
    # the image is rearranged by one copy, the conv reading it in place, channels-last
    copies = [n for n in lowered.nodes if n.op == "contiguous" and n.name.startswith("y")]
    assert len([n for n in copies if "space_to_depth" in n.name]) == 1, [n.name for n in copies]

    g = rng(f"stem {k} {pads} {dtype}")
    narrow = np.float16 if dtype == "f16" else np.float32
    x = g.standard_normal((2, 3, 16, 12)).astype(narrow)
    params = {"w": (g.standard_normal((8, 3, k, k)) / k).astype(narrow),
              "b": g.standard_normal(8).astype(narrow)}
    got = interp.run(lowered, {"x": x}, params, model.env, virtual=plan.virtual(),
                     check_views=True)["y"].astype(np.float64)
    xt = torch.nn.functional.pad(torch.from_numpy(x.astype(np.float64)), torch_pad)
    want = torch.relu(torch.nn.functional.conv2d(
        xt, torch.from_numpy(params["w"].astype(np.float64)), stride=2)
        + torch.from_numpy(params["b"].astype(np.float64))[:, None, None]).numpy()
    assert got.shape == want.shape and np.abs(want).max() > 0.5
    tolerance = 4e-3 if dtype == "f16" else 1e-6  # f16: the output's rounding
    assert np.abs(got - want).max() <= tolerance * np.abs(want).max()


@pytest.mark.parametrize(("changes", "why"), [
    ({"stride": "1", "pads": "pad=3"}, "stride 1: no space to fold"),
    ({"c": 8}, "8 channels: cuDNN's kernels read them as they are"),
    ({"k": 1, "pads": "pad=0"}, "a 1x1 conv: nothing to gain"),
    ({"h": 15, "pads": "pad=3"}, "an odd height"),
    ({"stride": "[2, 1]"}, "stride 2 along one axis only"),
    ({"dtype": "f16", "pads": "pad=3, dilation=2"}, "dilated"),
])
def test_other_convs_keep_their_form(changes: dict[str, object], why: str,
                                     tmp_path: Path) -> None:
    model = _model(tmp_path, **changes)  # type: ignore[arg-type]
    lowered, _ = lower_and_fuse(model)
    conv, nodes = _conv(lowered)
    assert nodes[conv.inputs[0]].type.shape[1] == changes.get("c", 3), why
    assert not [n for n in lowered.nodes if "space_to_depth" in n.name], why


def test_a_dynamic_image_keeps_its_form(tmp_path: Path) -> None:
    src = (STEM % {"dtype": "f16", "c": 3, "h": 16, "w": 12, "k": 7, "stride": "2",
                   "pads": "pad=3"}).replace("input x: [2, 3, 16, 12]",
                                             "dim H = 8..64 align 8\n  input x: [2, 3, H, 12]")
    model = check_source(src, tmp_path).model
    lowered, _ = lower_and_fuse(model)
    assert not [n for n in lowered.nodes if "space_to_depth" in n.name]


RESNET_STEM = """import "std/nn.cgraph"
model m {
  precision io=f16, intermediate=f32, compute=f32
  layout NHWC
  input x: [2, 3, 32, 32]
  let c = conv2d(x, out=16, k=7, stride=2, pad=3) as "conv1"
  let n = batchnorm2d(c) as "bn1"
  output y = maxpool(relu(n), window=3, stride=2, pad=1)
}
"""


def test_a_resnet_stem_in_its_memory_plan_equals_pytorch(tmp_path: Path) -> None:
    """ResNet's stem compiled (deviceless) and run as the runtime lays memory out (the arena
    oracle: the image's space-to-depth a fallback copy of rank 6, the conv a cuDNN graph over
    its view): PyTorch's conv, batchnorm, relu and max pooling of the source's values."""
    from dslc.fuzz import arena
    from dslc.weights import random_weights
    from tests.helpers import deviceless_program

    model, program = deviceless_program(RESNET_STEM, tmp_path)
    [copy] = [s for s in program.steps if "space_to_depth" in s.name]
    assert copy.kind == "kernel" and "rank 6" in copy.reason
    g = rng("resnet stem arena")
    x = g.standard_normal((2, 3, 32, 32)).astype(np.float16)
    weights = random_weights(model.params, 5)
    got = arena.run(program, {}, {"x": x}, weights)["y"].astype(np.float64)
    t = {k: torch.from_numpy(np.asarray(v, dtype=np.float64)) for k, v in weights.items()}
    conv = torch.nn.functional.conv2d(torch.from_numpy(x.astype(np.float64)), t["conv1.weight"],
                                      stride=2, padding=3)
    norm = torch.nn.functional.batch_norm(conv, t["bn1.running_mean"], t["bn1.running_var"],
                                          t["bn1.weight"], t["bn1.bias"], eps=1e-5)
    want = torch.nn.functional.max_pool2d(torch.relu(norm), 3, stride=2, padding=1).numpy()
    assert got.shape == want.shape and np.abs(want).max() > 0.5
    assert np.abs(got - want).max() <= 4e-3 * np.abs(want).max()


def test_a_stem_over_4_channels_reads_16(tmp_path: Path) -> None:
    lowered, _ = lower_and_fuse(_model(tmp_path, c=4))
    conv, nodes = _conv(lowered)
    assert tuple(nodes[conv.inputs[0]].type.shape) == (2, 16, 8, 6)


@pytest.mark.parametrize(("declarations", "call", "why"), [
    ("param w: [9, 1, 7, 7]\n  param b: [9]", "conv(x, w, stride=2, pad=3, groups=3)",
     "grouped (a group per channel)"),
    ("input w: [8, 3, 7, 7]\n  param b: [8]", "conv(x, w, stride=2, pad=3)",
     "weights known only at run time"),
])
def test_a_grouped_conv_or_one_of_run_time_weights_keeps_its_form(
        declarations: str, call: str, why: str, tmp_path: Path) -> None:
    src = f"""model m {{
  precision io=f16
  layout NHWC
  input x: [2, 3, 16, 12]
  {declarations}
  output y = relu(bias_add({call}, b))
}}
"""
    lowered, _ = lower_and_fuse(check_source(src, tmp_path).model)
    assert not [n for n in lowered.nodes if "space_to_depth" in n.name], why
