"""The group-norm kernel (dslc/backend/groupnorm.py) against PyTorch's group_norm on the same
rounded random inputs (mean 1, spread 2: a variance of uncentred values would show): f32, f16
and bf16, NCHW and channels-last, ranks 2 to 5, one group and one channel a group, strided views
whose spatial axes do not nest (read through a copy, written through a buffer), and an f32
scale and bias beside an f16 image."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tests.gpu.common import as_cupy

pytestmark = pytest.mark.gpu

# (shape, groups)
SHAPES = [((2, 640, 32, 32), 32),  # Stable Diffusion's down block 1
          ((2, 320, 32, 32), 32),
          ((1, 4, 3, 3), 1),
          ((3, 6, 7), 3),
          ((2, 8, 4, 5, 6), 4),
          ((4, 64, 1, 1), 64),     # one channel a group, one pixel: the bias alone
          ((5, 12), 6)]
TOL = {"f32": 1e-5, "f16": 2e-3, "bf16": 1.6e-2}
TORCH = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}


def _inputs(shape: tuple[int, ...], dtype: str, param: str, seed: int) -> tuple[Any, Any, Any]:
    import torch

    rng = np.random.default_rng(seed)
    t = getattr(torch, TORCH[dtype])
    x = torch.tensor(rng.standard_normal(shape) * 2 + 1, dtype=torch.float32).to(t).cuda()
    p = getattr(torch, TORCH[param])
    scale = torch.tensor(rng.standard_normal(shape[1]), dtype=torch.float32).to(p).cuda()
    bias = torch.tensor(rng.standard_normal(shape[1]), dtype=torch.float32).to(p).cuda()
    return x, scale, bias


def _check(x: Any, scale: Any, bias: Any, y: Any, groups: int, dtype: str, param: str) -> None:
    import torch

    from dslc.backend import kernels

    assert not kernels.on_the_reference("groupnorm", [tuple(x.shape)], dtype, {})
    kernels.run_kernel("groupnorm", [as_cupy(x, dtype), as_cupy(scale, param),
                                     as_cupy(bias, param)], as_cupy(y, dtype),
                       {"groups": groups, "eps": 1e-5})
    torch.cuda.synchronize()
    want = torch.nn.functional.group_norm(x.float(), groups, scale.float(), bias.float(), 1e-5)
    err = float((y.float() - want).abs().max() / want.abs().max())
    assert err <= TOL[dtype], (tuple(x.shape), groups, dtype, err)


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize(("shape", "groups"), SHAPES,
                         ids=["x".join(map(str, s)) + f"g{g}" for s, g in SHAPES])
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_groupnorm_kernel_equals_torch(dtype: str, shape: tuple[int, ...], groups: int,
                                       layout: str) -> None:
    import torch

    if layout == "channels_last" and len(shape) != 4:
        pytest.skip("channels-last is a layout of rank-4 tensors")
    x, scale, bias = _inputs(shape, dtype, dtype, seed=sum(shape) + groups)
    y = torch.empty_like(x)
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
        y = y.contiguous(memory_format=torch.channels_last)
    _check(x, scale, bias, y, groups, dtype, dtype)


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_groupnorm_kernel_reads_and_writes_views_whose_spatial_axes_do_not_nest(dtype: str) -> None:
    import torch

    x, scale, bias = _inputs((2, 16, 12, 10), dtype, dtype, seed=7)
    strided = x[:, :, ::2, :]  # rows two apart: not one spatial axis
    buffer = torch.zeros((2, 16, 6, 13), dtype=x.dtype, device="cuda")
    y = buffer[:, :, :, 2:12]  # columns in a wider buffer
    _check(strided, scale, bias, y, 4, dtype, dtype)
    assert float(buffer[:, :, :, :2].abs().max()) == 0.0  # nothing written outside the view


def test_groupnorm_kernel_takes_an_f32_scale_and_bias_beside_an_f16_image() -> None:
    import torch

    x, scale, bias = _inputs((2, 32, 8, 8), "f16", "f32", seed=11)
    _check(x, scale, bias, torch.empty_like(x), 8, "f16", "f32")
