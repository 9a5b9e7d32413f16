"""A pointwise op writes in the memory order its first operand is read in, a view's included:
ConvNeXt's layer scale, on the channels-first view of a channels-last matmul result, fuses with
the residual add of the channels-last input (one group, one memory order) and computes what
numpy computes."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dslc.fuzz import arena
from dslc.fuzz.oracle import relative_error
from dslc.pipeline import lower_and_fuse
from dslc.weights import random_weights
from tests.helpers import check_source, deviceless_program, rng

SCALED_RESIDUAL = """model m {
  layout NHWC
  input x: [2, 8, 6, 6]
  param w: [8, 8]
  param scale: [8, 1, 1]
  let y = matmul(transpose(x, [0, 2, 3, 1]), w)
  output z = x + transpose(y, [0, 3, 1, 2]) * scale
}
"""


def test_a_scale_on_a_channels_first_view_is_written_channels_last(tmp_path: Path) -> None:
    lowered, plan = lower_and_fuse(check_source(SCALED_RESIDUAL, tmp_path).model)
    [scale] = [n for n in lowered.nodes if n.op == "scale_mul"]
    assert scale.type.layout is not None and scale.type.layout.order == (0, 2, 3, 1)
    ops = lowered.by_name()
    assert [[ops[n].op for n in g.nodes] for g in plan.groups] == [["matmul"],
                                                                  ["scale_mul", "add"]]


def test_the_fused_scale_and_residual_compute_what_numpy_does(tmp_path: Path) -> None:
    model, program = deviceless_program(SCALED_RESIDUAL, tmp_path)
    x = rng("scaled residual").standard_normal((2, 8, 6, 6)).astype(np.float32)
    w = random_weights(model.params, 4)
    y = np.einsum("nchw,ck->nkhw", x, w["w"])
    want = x + y * w["scale"]
    assert relative_error(arena.run(program, {}, {"x": x}, w)["z"], want) < 1e-6
