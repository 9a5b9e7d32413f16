"""Params with dotted names (`param encoder.pos_embedding: [...]` at model level): the path is
the name as written, so a checkpoint's keys load without a wrapper def, and expressions read the
param by that name."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dslc.ir import interp
from dslc.pipeline import lower_and_fuse
from tests.helpers import check_source, rng

VIT_FRONT = """model m {
  input x: [2, 4, 8]
  param encoder.pos_embedding: [1, 4, 8]
  param class_token: [1, 1, 8]
  output y = concat([expand(class_token, [2, 1, 8]), x + encoder.pos_embedding], axis=1)
}
"""


def test_the_path_is_the_dotted_name_and_expressions_read_it(tmp_path: Path) -> None:
    checked = check_source(VIT_FRONT, tmp_path)
    assert checked.codes == []
    assert [p.path for p in checked.model.params] == ["encoder.pos_embedding", "class_token"]
    g = rng("dotted params")
    x = g.standard_normal((2, 4, 8)).astype(np.float32)
    pos = g.standard_normal((1, 4, 8)).astype(np.float32)
    cls = g.standard_normal((1, 1, 8)).astype(np.float32)
    lowered, _ = lower_and_fuse(checked.model)
    y = interp.run(lowered, {"x": x}, {"encoder.pos_embedding": pos, "class_token": cls},
                   checked.model.env)["y"]
    np.testing.assert_array_equal(y, np.concatenate([np.broadcast_to(cls, (2, 1, 8)), x + pos], 1))


def test_inside_a_def_the_instance_path_comes_first(tmp_path: Path) -> None:
    checked = check_source("""def block(x: [B, D]) -> [B, D] {
  param norm.weight: [D]
  return x * norm.weight
}
model m {
  input x: [2, 8]
  output y = block(x) as "layers.0"
}
""", tmp_path)
    assert checked.codes == [] and [p.path for p in checked.model.params] == ["layers.0.norm.weight"]


def test_a_dotted_path_declared_twice_is_e0208(tmp_path: Path) -> None:
    checked = check_source("model m {\n  input x: [4]\n  param a.b: [4]\n  param a.b: [4]\n"
                           "  output y = x + a.b\n}\n", tmp_path)
    assert "E0208" in checked.codes


def test_an_undeclared_dotted_name_is_an_unknown_value(tmp_path: Path) -> None:
    checked = check_source("model m {\n  input x: [4]\n  param enc.pos: [4]\n"
                           "  output y = x + enc.poss\n}\n", tmp_path)
    assert checked.codes[0] == "E0201"
