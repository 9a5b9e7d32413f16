"""bf16 CNNs compile: every op that runs as a fallback kernel (pooling, upsampling, concat, the
reductions cuDNN rejects) takes f32, f16 and bf16, so a bf16 ResNet no longer stops at E0801.
The kernels' numbers are checked on the GPU (tests/gpu/test_ops_gpu.py, `*_bf16` cases)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from dslc.backend.kernels import DTYPES as KERNEL_DTYPES
from dslc.backend.target import load_target
from dslc.compile.stage import compile_model
from dslc.pipeline import lower_and_fuse
from tests.helpers import check_source

CNN = """import "std/nn.cgraph"
model small_cnn {
  precision io=DTYPE, intermediate=f32, compute=f32
  layout NHWC
  input x: [2, 8, 16, 16]
  let c = conv2d(x, out=16, k=3, pad=1)
  let b = batchnorm2d(c)
  let p = maxpool(relu(b), window=3, stride=2, pad=1)
  let a = avgpool(p, window=2)
  let u = upsample(a, factor=2)
  output y = concat([u, p], axis=1)
}
"""


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_a_cnn_with_pooling_upsampling_and_concat_compiles_deviceless(dtype: str,
                                                                     tmp_path: Path) -> None:
    model = check_source(CNN.replace("DTYPE", dtype), tmp_path).model
    lowered, plan = lower_and_fuse(model)
    compiled = compile_model(model, lowered, plan, load_target("h200"))
    nodes = compiled.graph.by_name()
    kernels = Counter(nodes[s.group.nodes[0]].op for s in compiled.steps if s.kind == "kernel")
    assert kernels == {"maxpool": 1, "avgpool": 1, "upsample": 1, "concat": 1}
    assert all(nodes[s.group.nodes[0]].type.dtype == dtype for s in compiled.steps
               if s.kind == "kernel")


def test_every_float_dtype_is_a_kernel_dtype() -> None:
    assert {"f32", "f16", "bf16"} <= set(KERNEL_DTYPES)
