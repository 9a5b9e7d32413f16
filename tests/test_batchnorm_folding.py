"""Batchnorm folding, numerically: a conv followed by batchnorm runs as one conv whose weight and
bias were folded at load time, a batchnorm alone as a scale and a shift; the reference executor's
results equal PyTorch's `conv2d` then `batch_norm` (inference mode) on the same weights.

f32: within 1e-5. f16 storage (the batchnorm statistics f32, as declared): PyTorch runs in f16
with f32 statistics; dslc rounds the folded weight to f16 once more than PyTorch rounds anything
(a relative error of at most u on each term of the conv's sum, one rounding's worth on its
result), so the tolerance is `precision_tolerance("f16", depth + 1)` (tests/helpers.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from dslc.ir import interp
from dslc.pipeline import lower_and_fuse
from tests.helpers import check_source, precision_tolerance, rel_error, rng, rounding_depth

CONV_BN = """import "std/nn.cgraph"
model m {{
  precision io={io}
  input x: [2, 3, 9, 9]{layout}
  let c = conv2d(x, out=5, k=3, stride={stride}, pad=1)
  let b = batchnorm2d(c)
  output y: [2, 5, {size}, {size}]{layout} = {act}(b)
}}
"""
BN_ALONE = """import "std/nn.cgraph"
model m {{
  precision io={io}
  input x: [2, 5, 4, 6]
  output y = batchnorm2d(x) as "b"
}}
"""
NP = {"f32": np.float32, "f16": np.float16}
TORCH = {"f32": torch.float32, "f16": torch.float16}


def _weights(model: Any, key: str) -> dict[str, np.ndarray]:
    """Conv weights ~ N(0, 1/fan_in); batchnorm scale, shift, mean ~ N(0, 1), variance in
    [0.25, 4] (far from 1, so a missing rsqrt would show)."""
    g = rng("batchnorm folding", key)
    out = {}
    for p in model.params:
        if p.path.endswith("running_var"):
            a = g.uniform(0.25, 4.0, p.shape)
        elif p.path.startswith("c."):
            a = g.standard_normal(p.shape) / np.sqrt(np.prod(p.shape[1:]))
        else:
            a = g.standard_normal(p.shape)
        out[p.path] = a.astype(interp.NUMPY_DTYPES[p.dtype])
    return out


def _run(model: Any, x: np.ndarray, weights: dict[str, np.ndarray]) -> np.ndarray:
    lowered, plan = lower_and_fuse(model)
    assert not any(n.op == "batchnorm" for n in lowered.nodes)  # folded away
    [y] = interp.run(lowered, {"x": x}, weights, model.env, virtual=plan.virtual()).values()
    return y


def _t(a: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    return torch.from_numpy(np.asarray(a, np.float32)).to(dtype)


def _torch_bn(y: torch.Tensor, w: dict[str, np.ndarray], prefix: str) -> torch.Tensor:
    stats = [_t(w[f"{prefix}.{k}"], torch.float32) for k in
             ("running_mean", "running_var", "weight", "bias")]
    return F.batch_norm(y, stats[0], stats[1], stats[2], stats[3], training=False, eps=1e-5)


@pytest.mark.parametrize("io", ["f32", "f16"])
@pytest.mark.parametrize("stride, act, layout", [(1, "relu", ""), (2, "relu", " @NHWC"),
                                                 (1, "sigmoid", " @NHWC")])
def test_conv_then_batchnorm_folds_to_what_pytorch_computes(tmp_path: Path, io: str, stride: int,
                                                            act: str, layout: str) -> None:
    size = (9 + 2 - 3) // stride + 1
    src = CONV_BN.format(io=io, stride=stride, act=act, layout=layout, size=size)
    model = check_source(src, tmp_path).model
    weights = _weights(model, f"{io}-{stride}-{act}-{layout}")
    x = rng("batchnorm folding x", io, stride).standard_normal((2, 3, 9, 9)).astype(NP[io])
    ours = _run(model, x, weights)
    assert ours.dtype == NP[io]
    with torch.no_grad():
        conv = F.conv2d(_t(x, TORCH[io]), _t(weights["c.weight"], TORCH[io]), stride=stride,
                        padding=1)
        theirs = getattr(torch, act)(_torch_bn(conv, weights, "b").to(TORCH[io])).float().numpy()
    tolerance = 1e-5 if io == "f32" else precision_tolerance(io, rounding_depth(model.graph) + 1)
    err = rel_error(ours, theirs)
    assert err <= tolerance, f"relative error {err:.2e} > {tolerance:.2e}"


@pytest.mark.parametrize("io", ["f32", "f16"])
def test_batchnorm_alone_is_a_scale_and_a_shift_like_pytorch(tmp_path: Path, io: str) -> None:
    model = check_source(BN_ALONE.format(io=io), tmp_path).model
    weights = _weights(model, f"alone-{io}")
    x = rng("batchnorm alone x", io).standard_normal((2, 5, 4, 6)).astype(NP[io])
    ours = _run(model, x, weights)
    with torch.no_grad():
        theirs = _torch_bn(_t(x, TORCH[io]), weights, "b").to(TORCH[io]).float().numpy()
    tolerance = 1e-5 if io == "f32" else precision_tolerance(io, rounding_depth(model.graph))
    err = rel_error(ours, theirs)
    assert err <= tolerance, f"relative error {err:.2e} > {tolerance:.2e}"


CONV_BIAS_BN = """import "std/nn.cgraph"
model m {{
  precision io={io}
  input x: [2, 3, 9, 9]
  let c = conv2d(x, out=5, k=3, pad=1, has_bias=true)
  let b = batchnorm2d(c)
  output y = relu(b)
}}
"""


@pytest.mark.parametrize("io", ["f32", "f16"])
def test_a_conv_bias_before_the_batchnorm_moves_its_mean(tmp_path: Path, io: str) -> None:
    """conv + bias + batchnorm folds with t = beta - (mean - bias) * s: PyTorch's conv with its
    bias, then batch_norm, on the same weights."""
    model = check_source(CONV_BIAS_BN.format(io=io), tmp_path).model
    weights = _weights(model, f"conv-bias-{io}")
    x = rng("batchnorm folding bias x", io).standard_normal((2, 3, 9, 9)).astype(NP[io])
    ours = _run(model, x, weights)
    with torch.no_grad():
        conv = F.conv2d(_t(x, TORCH[io]), _t(weights["c.weight"], TORCH[io]),
                        _t(weights["c.bias"], TORCH[io]), padding=1)
        theirs = torch.relu(_torch_bn(conv, weights, "b").to(TORCH[io])).float().numpy()
    tolerance = 1e-5 if io == "f32" else precision_tolerance(io, rounding_depth(model.graph) + 1)
    err = rel_error(ours, theirs)
    assert err <= tolerance, f"relative error {err:.2e} > {tolerance:.2e}"


def _folded(io: str, tmp_path: Path) -> list[Any]:
    """The nodes the fold adds: its per-channel vectors, the folded weight, their casts."""
    lowered, _ = lower_and_fuse(check_source(CONV_BIAS_BN.format(io=io), tmp_path).model)
    return [n for n in lowered.nodes if n.op not in ("param", "input")
            and (n.name.startswith("b.") or ".folded_weight" in n.name)]


def test_the_fold_computes_in_f32_in_an_f16_model(tmp_path: Path) -> None:
    """LANGUAGE.md 5.3: the folded vectors and weight are computed in f32 at load time, then
    cast once to the activations' dtype (not computed in the model's f16)."""
    folded = _folded("f16", tmp_path)
    assert {n.op for n in folded} >= {"scalar", "add", "rsqrt", "mul", "sub", "cast"}
    assert all((n.precision.io, n.precision.intermediate, n.precision.compute) ==
               ("f32", "f32", "f32") for n in folded), [(n.name, n.precision) for n in folded]
    assert sorted(n.type.dtype for n in folded if n.op == "cast") == ["f16", "f16"]


def test_an_f32_model_folds_without_casts(tmp_path: Path) -> None:
    assert not [n.name for n in _folded("f32", tmp_path) if n.op == "cast"]


def test_a_conv_that_is_also_an_output_keeps_its_weight(tmp_path: Path) -> None:
    """Folding changes the conv's result: where the model outputs it too (read once, but
    exported), the batchnorm stays a scale and a shift after it."""
    src = """import "std/nn.cgraph"
model m {
  input x: [2, 3, 9, 9]
  let c = conv2d(x, out=5, k=3, pad=1)
  output raw = c
  output y = batchnorm2d(c) as "b"
}
"""
    model = check_source(src, tmp_path).model
    lowered, plan = lower_and_fuse(model)
    assert not [n.name for n in lowered.nodes if "folded" in n.name]
    weights = _weights(model, "exported conv")
    x = rng("batchnorm exported conv x").standard_normal((2, 3, 9, 9)).astype(np.float32)
    got = interp.run(lowered, {"x": x}, weights, model.env, virtual=plan.virtual())
    with torch.no_grad():
        conv = F.conv2d(_t(x, torch.float32), _t(weights["c.weight"], torch.float32), padding=1)
        bn = _torch_bn(conv, weights, "b")
    assert rel_error(got["raw"], conv.numpy()) <= 1e-5
    assert rel_error(got["y"], bn.numpy()) <= 1e-5
