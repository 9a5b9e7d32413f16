"""groupnorm: its type rule, the reference against PyTorch's GroupNorm (an independent
implementation), its compiled form (one fallback kernel step, any layout), and the kernel's
reading of spatial strides (its numbers are checked on the GPU: tests/gpu/test_groupnorm_gpu.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from dslc.backend.groupnorm import spatial_stride
from dslc.backend.target import load_target
from dslc.compile.stage import compile_model
from dslc.core.types import Layout
from dslc.ir import interp
from dslc.pipeline import lower_and_fuse
from tests.helpers import check_source, note_seed, rel_error


def _source(body: str, precision: str = "io=f32") -> str:
    return f'import "std/nn.cgraph"\nmodel m {{\n  precision {precision}\n{body}\n}}\n'


@pytest.mark.parametrize(("shape", "groups"), [((2, 8, 5, 6), 4), ((3, 6, 7), 3), ((1, 4, 3, 3), 1)])
def test_a_lowered_groupnorm_equals_pytorch(shape: tuple[int, ...], groups: int,
                                            tmp_path: Path) -> None:
    dims = ", ".join(map(str, shape))
    model = check_source(_source(f"  input x: [{dims}]\n  param g: [{shape[1]}]\n"
                                 f"  param b: [{shape[1]}]\n"
                                 f"  output y = groupnorm(x, g, b, groups={groups}, eps=1e-5)"),
                         tmp_path).model
    lowered, _ = lower_and_fuse(model)
    r = np.random.default_rng(note_seed("groupnorm", len(shape) * 10 + groups))
    x = (r.standard_normal(shape) * 2 + 1).astype(np.float32)
    g, b = (r.standard_normal(shape[1]).astype(np.float32) for _ in range(2))
    got = interp.run(lowered, {"x": x}, {"g": g, "b": b}, model.env)["y"]
    want = F.group_norm(torch.from_numpy(x), groups, torch.from_numpy(g), torch.from_numpy(b),
                        eps=1e-5).numpy()
    assert rel_error(got, want) < 1e-5


def test_an_f16_groupnorm_compiles_to_one_kernel_step_in_the_layout_of_its_conv(
        tmp_path: Path) -> None:
    """Spelled with reductions it was eight steps and a copy into the grouped view; between
    two convs (channels-last) the norm reads and writes their layout: no copy between them."""
    model = check_source(_source("  input x: [2, 8, 6, 6]\n"
                                 "  let c = conv2d(x, out=8, k=3, pad=1) as \"c\"\n"
                                 "  let n = group_norm(c, groups=2) as \"gn\"\n"
                                 "  output y = conv2d(n, out=8, k=3, pad=1) as \"d\"", "io=f16"),
                         tmp_path).model
    lowered, plan = lower_and_fuse(model)
    compiled = compile_model(model, lowered, plan, load_target("h200"))
    nodes = lowered.by_name()
    ops = [(s.kind, [nodes[n].op for n in s.group.nodes]) for s in compiled.steps]
    copy = ("graph", ["contiguous"])  # the row-major input and output, channels-last inside
    assert ops == [copy, ("graph", ["conv"]), ("kernel", ["groupnorm"]), ("graph", ["conv"]), copy]
    norm = next(n for n in lowered.nodes if n.op == "groupnorm")
    assert norm.type.dtype == "f16"
    assert norm.type.layout == nodes[norm.inputs[0]].type.layout == Layout((0, 2, 3, 1))  # NHWC


@pytest.mark.parametrize(("shape", "strides", "want"), [
    ((2, 8, 5, 6), (240, 30, 6, 1), (30, 1)),      # NCHW
    ((2, 8, 5, 6), (240, 1, 48, 8), (30, 8)),      # NHWC: the pixels 8 apart
    ((2, 8, 5, 1, 6), (240, 30, 6, 6, 1), (30, 1)),  # a size-1 axis has any stride
    ((2, 8), (8, 1), (1, 1)),                      # no spatial axes
    ((2, 8, 5, 6), (480, 60, 12, 1), None),        # every other row: no single stride
    ((2, 8, 5, 6), (240, 30, 1, 5), None)])        # transposed spatial axes
def test_the_kernel_reads_nested_spatial_axes_as_one(shape: tuple[int, ...],
                                                     strides: tuple[int, ...],
                                                     want: tuple[int, int] | None) -> None:
    assert spatial_stride(shape, strides) == want


def test_the_std_def_names_its_params_as_torch_does(tmp_path: Path) -> None:
    model = check_source(_source("  input x: [2, 8, 5, 6]\n"
                                 "  output y = group_norm(x, groups=4) as \"encoder.gn\""),
                         tmp_path).model
    assert sorted(p.path for p in model.params) == ["encoder.gn.bias", "encoder.gn.weight"]


@pytest.mark.parametrize(("groups", "code"), [(3, "E0301"), (0, "E0305"), (16, "E0301")])
def test_groups_that_do_not_split_the_channels_are_refused(groups: int, code: str,
                                                           tmp_path: Path) -> None:
    checked = check_source(_source("  input x: [2, 8, 5, 6]\n  param g: [8]\n  param b: [8]\n"
                                   f"  output y = groupnorm(x, g, b, groups={groups})"), tmp_path)
    assert checked.codes == [code]


def test_the_statistics_stay_f32_inside_a_bf16_fused_group(tmp_path: Path) -> None:
    """A group of one value normalises to 0, so the result is the bias: with the mean rounded to
    the bf16 intermediate dtype, x - mean was 1e-4 and 1/sqrt(eps) made the result 0.1 off."""
    model = check_source(_source("  input x: f32[1, 4, 1, 1]\n  param g: [4]\n  param b: [4]\n"
                                 "  output y = groupnorm(x, g, b, groups=4, eps=1e-5)",
                                 "io=bf16, intermediate=bf16, compute=f32"), tmp_path).model
    lowered, plan = lower_and_fuse(model)
    x = np.array([0.22789852, 0.21274008, 0.24967523, 0.27594087], np.float32).reshape(1, 4, 1, 1)
    g = np.array([0.5, -1.0, 2.0, 0.25], np.float32)
    b = np.array([0.0795898, 0.0218506, 0.103027, 0.0952148], np.float32)
    got = interp.run(lowered, {"x": x}, {"g": g, "b": b}, model.env, virtual=plan.virtual())["y"]
    bias_bf16 = torch.from_numpy(b).to(torch.bfloat16).float().numpy()
    np.testing.assert_allclose(got.ravel(), bias_bf16, rtol=0, atol=1e-6)
