"""expand (broadcast_to): its type rule, the ViT class-token pattern on the reference against
PyTorch, and its compile: a cuDNN identity that broadcasts, never a load-time value when its size
depends on an input's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from dslc.backend.target import load_target
from dslc.compile.stage import compile_model
from dslc.ir import interp
from dslc.lower.canonical import load_time
from dslc.pipeline import lower_and_fuse
from tests.helpers import check_source, note_seed

CLASS_TOKEN = """model m {
  dim B = 1..8 tune [1, 8]
  input tokens: [B, 6, 16]
  param cls: [1, 1, 16]
  output y = concat([expand(cls, shape=[B, 1, 16]), tokens], axis=1)
  output z = expand(cls, [B, -1, -1]) * 2.0
}
"""


@pytest.mark.parametrize(("shape", "code"), [("[4, 2, 3]", None), ("[-1, -1]", None),
                                              ("[2, 5]", "E0301"), ("[3]", "E0301"),
                                              ("[0, 3]", "E0305"), ("[-1, 2, 3]", "E0305")])
def test_the_type_rule_repeats_only_size_1_axes_and_adds_only_leading_ones(
        shape: str, code: str | None, tmp_path: Path) -> None:
    checked = check_source(f"model m {{\n  input x: [2, 3]\n  input o: [2, 1]\n"
                           f"  output y = expand(x, shape={shape})\n}}\n", tmp_path)
    assert checked.codes == ([code] if code else [])


def test_the_class_token_pattern_equals_pytorch(tmp_path: Path) -> None:
    model = check_source(CLASS_TOKEN, tmp_path).model
    lowered, _ = lower_and_fuse(model)
    r = np.random.default_rng(note_seed("expand", 3))
    tokens = r.standard_normal((3, 6, 16)).astype(np.float32)
    cls = r.standard_normal((1, 1, 16)).astype(np.float32)
    got = interp.run(lowered, {"tokens": tokens}, {"cls": cls}, model.env)
    tc = torch.from_numpy(cls)
    np.testing.assert_array_equal(got["y"], torch.cat([tc.expand(3, -1, -1),
                                                       torch.from_numpy(tokens)], 1).numpy())
    np.testing.assert_array_equal(got["z"], (tc.expand(3, -1, -1) * 2.0).numpy())


def test_a_param_expanded_to_a_batch_is_computed_at_each_size_on_cudnn(tmp_path: Path) -> None:
    model = check_source(CLASS_TOKEN, tmp_path).model
    lowered, plan = lower_and_fuse(model)
    expands = [n.name for n in lowered.nodes if n.op == "expand"]
    assert expands and not set(expands) & load_time(lowered)
    compiled = compile_model(model, lowered, plan, load_target("h200"))
    kinds = {s.group.nodes[0]: s.kind for s in compiled.steps}
    assert all(kinds[e] == "graph" for e in expands)
