"""Channel slices of channels-last data read by cuDNN's graphs, on the H200: a conv with its
residual and a product read a slice whose pixels lie 12, 38 or 16 bytes apart (4 channels of
6, 16 of 19, 8 of 16 in f16), against the reference executor. Generated programs found
cuDNN's graphs wrong over concatenation slices with such gaps (docs/DESIGN.md, "What cuDNN
needs of the memory it reads"; `ir.placement._aligned`); a view of a computed value reaches
them by another way (`lower.views`), which this checks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.gpu.common import (
    TOLERANCE,
    compile_source,
    random_inputs,
    reference,
    rel_error,
    to_device,
    to_host,
)

pytestmark = pytest.mark.gpu

SOURCE = """
model m {{
  precision io={io}, intermediate={io}, compute=f32
  layout NHWC
  input x: [2, {total}, 6, 4]
  input y: [2, {part}, 6, 4]
  param w: [{part}, {part}, 3, 3]
  let a = relu(x)
  let s = a[:, 0:{part}, :, :]
  output o = conv(s, w, stride=1, pad=1, dilation=1, groups=1) + s
  output p = s * y
}}
"""


@pytest.mark.parametrize("io", ["f16", "f32"])
@pytest.mark.parametrize(("part", "total"), [(4, 6), (16, 19), (8, 16)])
def test_a_channel_slice_read_by_cudnn_equals_the_reference(
        io: str, part: int, total: int, tmp_path: Path) -> None:
    from dslc.runtime import Model

    bundle = compile_source(SOURCE.format(io=io, part=part, total=total), tmp_path)
    model = Model(bundle, bundle.with_suffix(".safetensors"), tuning_db=None)
    inputs = random_inputs(bundle, seed=part * 100 + total)
    got = to_host(model.run(to_device(inputs, bundle)))
    want = reference(bundle, inputs)
    for name in ("o", "p"):
        err = rel_error(got[name], want[name])
        print(f"{io} {part} of {total} channels, {name}: relative error {err:.2e}")
        assert err < TOLERANCE[io] and np.isfinite(got[name]).all(), name
