"""groupnorm: its type rule, and its lowering (a grouped view, two f32 reductions, pointwise ops)
run by the reference against PyTorch's GroupNorm (an independent implementation)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from dslc.backend.target import load_target
from dslc.compile.stage import compile_model
from dslc.ir import interp
from dslc.pipeline import lower_and_fuse
from tests.helpers import check_source, note_seed, rel_error


def _source(body: str, precision: str = "io=f32") -> str:
    return f'import "std/nn.cgraph"\nmodel m {{\n  precision {precision}\n{body}\n}}\n'


@pytest.mark.parametrize(("shape", "groups"), [((2, 8, 5, 6), 4), ((3, 6, 7), 3), ((1, 4, 3, 3), 1)])
def test_lowered_groupnorm_equals_pytorch(shape: tuple[int, ...], groups: int,
                                          tmp_path: Path) -> None:
    dims = ", ".join(map(str, shape))
    model = check_source(_source(f"  input x: [{dims}]\n  param g: [{shape[1]}]\n"
                                 f"  param b: [{shape[1]}]\n"
                                 f"  output y = groupnorm(x, g, b, groups={groups}, eps=1e-5)"),
                         tmp_path).model
    lowered, _ = lower_and_fuse(model)
    assert "groupnorm" not in {n.op for n in lowered.nodes}
    r = np.random.default_rng(note_seed("groupnorm", len(shape) * 10 + groups))
    x = (r.standard_normal(shape) * 2 + 1).astype(np.float32)
    g, b = (r.standard_normal(shape[1]).astype(np.float32) for _ in range(2))
    got = interp.run(lowered, {"x": x}, {"g": g, "b": b}, model.env)["y"]
    want = F.group_norm(torch.from_numpy(x), groups, torch.from_numpy(g), torch.from_numpy(b),
                        eps=1e-5).numpy()
    assert rel_error(got, want) < 1e-5


def test_the_statistics_of_an_f16_groupnorm_are_f32_and_it_runs_on_cudnn(tmp_path: Path) -> None:
    model = check_source(_source("  input x: [2, 8, 5, 6]\n"
                                 "  output y = group_norm(x, groups=2) as \"gn\"", "io=f16"),
                         tmp_path).model
    lowered, plan = lower_and_fuse(model)
    dtypes = {n.name: n.type.dtype for n in lowered.nodes}
    assert all(dtypes[f"y.{s}"] == "f32" for s in ("mean", "centred", "var", "inv_std"))
    assert dtypes["y"] == "f16"
    compiled = compile_model(model, lowered, plan, load_target("h200"))
    assert Counter(s.kind for s in compiled.steps) == {"graph": len(compiled.steps)}


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
