"""The depthwise conv kernel (dslc/backend/depthwise.py) against PyTorch's conv2d with
`groups=C` on the same rounded random inputs: f32, f16 and bf16, channels-last (the 16-byte
vector path) and NCHW or misaligned (the scalar path), strides, dilations, padding, channel
counts that split over several block rows and counts that split into no vector."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tests.gpu.common import as_cupy

pytestmark = pytest.mark.gpu

# (N, C, H, W, k, stride, pad, dilation)
SHAPES = [(4, 96, 28, 28, 7, 1, 3, 1),    # ConvNeXt's: two block rows of 48 channels
          (2, 240, 14, 14, 3, 2, 1, 1),   # MobileNet's strided 3x3
          (2, 100, 11, 13, 5, 1, 4, 2),   # dilated, 100 channels: vectors of 4 only (f32)
          (3, 768, 7, 7, 7, 1, 3, 1),     # ten block rows
          (1, 3, 9, 9, 3, 1, 0, 1)]       # 3 channels: no vector, no padding
TOL = {"f32": 1e-5, "f16": 2e-3, "bf16": 1.6e-2}


def _arrays(shape: tuple[int, ...], dtype: str, seed: int) -> tuple[Any, Any, Any]:
    import torch

    n, c, h, w, k, stride, pad, dil = shape
    rng = np.random.default_rng(seed)
    x = torch.tensor(rng.standard_normal((n, c, h, w)), dtype=torch.float32)
    f = torch.tensor(rng.standard_normal((c, 1, k, k)) / k, dtype=torch.float32)
    t = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}[dtype]
    x, f = x.to(t).cuda(), f.to(t).cuda()
    want = torch.nn.functional.conv2d(x.float(), f.float(), stride=stride, padding=pad,
                                      dilation=dil, groups=c)
    return x, f, want


def _run(x: Any, f: Any, shape: tuple[int, ...], dtype: str, y_layout: str) -> Any:
    import torch

    from dslc.backend import kernels

    n, c, h, w, k, stride, pad, dil = shape
    ho = (h + 2 * pad - dil * (k - 1) - 1) // stride + 1
    wo = (w + 2 * pad - dil * (k - 1) - 1) // stride + 1
    y = torch.empty((n, c, ho, wo), dtype=x.dtype, device="cuda")
    if y_layout == "nhwc":
        y = y.contiguous(memory_format=torch.channels_last)
    attrs = {"stride": [stride, stride], "pre_pad": [pad, pad], "post_pad": [pad, pad],
             "dilation": [dil, dil], "groups": c}
    kernels.run_kernel("conv", [as_cupy(x, dtype), as_cupy(f, dtype)], as_cupy(y, dtype), attrs)
    torch.cuda.synchronize()
    return y.float()


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("shape", SHAPES, ids=[f"c{s[1]}k{s[4]}s{s[5]}d{s[7]}" for s in SHAPES])
@pytest.mark.parametrize("layout", ["nhwc", "nchw"])
def test_depthwise_kernel_equals_torch(dtype: str, shape: tuple[int, ...], layout: str) -> None:
    import torch

    from dslc.backend.kernels import on_the_reference

    x, f, want = _arrays(shape, dtype, seed=sum(shape))
    assert not on_the_reference("conv", [tuple(x.shape), tuple(f.shape)], dtype,
                                {"groups": shape[1]})
    if layout == "nhwc":
        x = x.contiguous(memory_format=torch.channels_last)
        f = f.contiguous(memory_format=torch.channels_last)
    got = _run(x, f, shape, dtype, layout)
    err = float((got - want).abs().max() / want.abs().max())
    assert err <= TOL[dtype], (dtype, shape, layout, err)


def test_depthwise_kernel_reads_an_image_that_starts_off_a_vector() -> None:
    """A channels-last image one element into its buffer: the scalar loads, right values."""
    import torch

    shape = (2, 96, 14, 14, 7, 1, 3, 1)
    x, f, want = _arrays(shape, "f16", seed=5)
    nhwc = x.permute(0, 2, 3, 1).contiguous()
    buf = torch.empty(nhwc.numel() + 1, dtype=x.dtype, device="cuda")
    buf[1:] = nhwc.flatten()
    shifted = buf[1:].view(nhwc.shape).permute(0, 3, 1, 2)
    got = _run(shifted, f, shape, "f16", "nhwc")
    assert float((got - want).abs().max() / want.abs().max()) <= TOL["f16"]
