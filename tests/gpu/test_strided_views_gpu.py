"""Channel slices of channels-last data and cuDNN's graphs, on the H200, against the reference
executor. Generated programs found cuDNN's graphs wrong over concatenation slices with gaps
off 16 bytes (docs/DESIGN.md, "What cuDNN needs of the memory it reads";
`ir.placement._aligned`). Here: a view of a computed value (`lower.views`) whose pixels lie
12, 38 or 16 bytes apart (4 channels of 6, 16 of 19, 8 of 16 in f16) read by a residual add
and a product (the conv reads a copy), whichever backend the compiler gives those readers
(a cuDNN graph, or the fallback kernel where cuDNN has no engine); and the slices the
placement rule still writes in place: pixels 16 bytes apart with runs of 8 (f32, 2 channels of
4) or 16 (f16, 8 of 16)."""

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
    program = model.program
    assert program.nodes["s"].op == "view"  # read in place by a graph step, not copied
    readers = [st for st in program.steps
               if "s" in st.inputs and program.nodes[st.nodes[0]].op != "contiguous"]
    # compiled on the H200 (session 14) both readers were fallback kernels; the reasons say why
    for st in readers:
        print(f"{io} {part} of {total}: {st.name} reads the view as a {st.kind}: {st.reason}")
    assert len(readers) == 2
    inputs = random_inputs(bundle, seed=part * 100 + total)
    got = to_host(model.run(to_device(inputs, bundle)))
    want = reference(bundle, inputs)
    for name in ("o", "p"):
        err = rel_error(got[name], want[name])
        print(f"{io} {part} of {total} channels, {name}: relative error {err:.2e}")
        assert err < TOLERANCE[io] and np.isfinite(got[name]).all(), name


PLACED = """
model m {{
  precision io={io}, intermediate={io}, compute=f32
  layout NHWC
  input x: [2, {part}, 6, 4]
  input z: [2, {part}, 6, 4]
  param w: [8, {total}, 1, 1]
  let a = relu(x)
  let b = sigmoid(z)
  output y = conv(concat([a, b], axis=1), w, stride=1, pad=0, dilation=1, groups=1)
}}
"""


@pytest.mark.parametrize(("io", "part", "placed"), [
    ("f32", 2, {"a"}),  # b's slice starts 8 bytes in: a buffer of its own, copied
    ("f16", 8, {"a", "b"}),
])
def test_slices_written_in_place_into_a_concat_equal_the_reference(
        io: str, part: int, placed: set[str], tmp_path: Path) -> None:
    from dslc.runtime import Model

    bundle = compile_source(PLACED.format(io=io, part=part, total=2 * part), tmp_path)
    model = Model(bundle, bundle.with_suffix(".safetensors"), tuning_db=None)
    assert set(model.program.placement) == placed
    inputs = random_inputs(bundle, seed=part)
    got = to_host(model.run(to_device(inputs, bundle)))
    want = reference(bundle, inputs)
    err = rel_error(got["y"], want["y"])
    print(f"{io} {part} channels of {2 * part} in place: relative error {err:.2e}")
    assert err < TOLERANCE[io] and np.isfinite(got["y"]).all()
