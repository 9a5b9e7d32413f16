"""`repeat` over tuples: an instance that returns n values passes them on as the next instance's
first n positional arguments (a pre-norm block carrying the hidden state and the residual, as
fused add-and-norm layers do). The stack equals the same loop written in PyTorch by hand, the
parameter names are the instance paths (a second `*L` in the block's signature checks the same
axes), and a body that returns more values than its call
takes, or changes one's type, is E0303."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from dslc.ir import interp
from dslc.pipeline import lower_and_fuse
from tests.helpers import check_source, rng

STACK = """import "std/nn.cgraph"
def block(h: [B, D], res: [B, D], hidden: int) -> ([B, D], [B, D]) {
  let r = h + res
  let up = linear(r, out=hidden) as "up"
  let down = linear(relu(up), out=D) as "down"
  return down, r
}
model m {
  input x: f32[3, 8]
  input skip: f32[3, 8]
  let (h, res) = repeat 3 block(x, skip, hidden=16) as "layers.{i}"
  output y = h + res
}
"""


def test_repeat_carries_every_result_of_a_tuple(tmp_path: Path) -> None:
    model = check_source(STACK, tmp_path).model
    paths = [p.path for p in model.params]
    assert paths[:4] == ["layers.0.up.weight", "layers.0.up.bias", "layers.0.down.weight",
                         "layers.0.down.bias"]
    assert len(paths) == 12
    r = rng("repeat", "tuples")
    weights = {p.path: (r.standard_normal(p.shape) * 0.3).astype(np.float32) for p in model.params}
    x = r.standard_normal((3, 8)).astype(np.float32)
    skip = r.standard_normal((3, 8)).astype(np.float32)
    lowered, _ = lower_and_fuse(model)
    got = interp.run(lowered, {"x": x, "skip": skip}, weights, model.env)["y"]

    w = {k: torch.from_numpy(v).double() for k, v in weights.items()}
    h, res = torch.from_numpy(x).double(), torch.from_numpy(skip).double()
    for i in range(3):
        res = h + res
        up = torch.relu(res @ w[f"layers.{i}.up.weight"].T + w[f"layers.{i}.up.bias"])
        h = up @ w[f"layers.{i}.down.weight"].T + w[f"layers.{i}.down.bias"]
    np.testing.assert_allclose(got, (h + res).numpy(), rtol=1e-5, atol=1e-5)


def test_a_single_result_is_still_carried_alone(tmp_path: Path) -> None:
    text = """model m {
  input x: f32[2, 4]
  input y: f32[2, 4]
  let z = repeat 3 add(x, y)
  output o = z
}
"""
    model = check_source(text, tmp_path).model
    lowered, _ = lower_and_fuse(model)
    x, y = np.full((2, 4), 1.5, np.float32), np.full((2, 4), 0.25, np.float32)
    got = interp.run(lowered, {"x": x, "y": y}, {}, model.env)["o"]
    assert got.tolist() == [[2.25] * 4] * 2  # 1.5 + 3 * 0.25


@pytest.mark.parametrize(("call", "message"), [
    ("pair(x)", "passes 2 values on, but its call has 1 positional argument"),
    ("widen(x, x)", "changes the type it passes on"),
])
def test_a_body_that_cannot_feed_the_next_instance_is_e0303(call: str, message: str,
                                                             tmp_path: Path) -> None:
    text = f"""def pair(a: [2, D]) -> ([2, D], [2, D]) {{
  return a, a
}}
def widen(a: [2, D], b: [2, D]) -> ([2, D], [2, 2 * D]) {{
  return a, concat([a, b], axis=1)
}}
model m {{
  input x: f32[2, 4]
  let (p, q) = repeat 2 {call}
  output o = p
}}
"""
    checked = check_source(text, tmp_path)
    assert [d.code for d in checked.diagnostics if d.severity == "error"] == ["E0303"]
    assert message in checked.diagnostics[0].message


def test_a_second_variadic_checks_the_same_axes(tmp_path: Path) -> None:
    text = """def pairadd(x: [*L, D], res: [*L, D]) -> [*L, D] {
  return x + res
}
model m {
  input a: f32[2, 3, 4]
  input b: f32[3, 3, 4]
  output y = pairadd(a, a)
  output z = pairadd(a, b)
}
"""
    checked = check_source(text, tmp_path)
    assert checked.codes == ["E0301"]
    assert checked.diagnostics[0].span.line == 8
    assert checked.diagnostics[0].notes == ("`*L` is [2, 3], found [3, 3]",)
