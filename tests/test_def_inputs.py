"""`input` in a def: each instance declares a model input of its own, named by its path as a
param is, so `repeat` can give every layer of a decoder its own cache. Checked against numpy
written out layer by layer (not the interpreter's code), through the manifest, the runner's
arguments and the diagnostics."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dslc.core.types import format_shape
from dslc.ir import interp
from dslc.pipeline import lower_and_fuse
from tests.helpers import check_source, deviceless_program, rng

STACK = """
def step(x: [B, D], pos: [1], max_len: int) -> [B, D] {
  input cache: [B, 1, max_len, D]
  param w: [D, D]
  let c = cache_write(cache, reshape(x, [B, 1, 1, D]), at=pos)
  return matmul(x, w) + reshape(reduce_sum(c, axes=[2]), [B, D])
}
model m {
  dim B = 1..8 tune [2]
  dim MAX = 4..64 tune [6]
  input x: [B, 4]
  input pos: i32[1]
  let y = repeat 3 step(x, pos, max_len=MAX) as "layers.{i}"
  output out = y
}
"""
CACHES = [f"layers.{i}.cache" for i in range(3)]


def test_each_instance_declares_an_input_named_by_its_path(tmp_path: Path) -> None:
    model = check_source(STACK, tmp_path).model
    assert model is not None
    assert [i.name for i in model.inputs] == ["x", "pos", *CACHES]
    assert [format_shape(i.type.shape) for i in model.inputs[2:]] == ["[B, 1, MAX, 4]"] * 3


def test_every_layer_writes_its_own_cache_and_reads_it(tmp_path: Path) -> None:
    model = check_source(STACK, tmp_path).model
    assert model is not None
    lowered, _ = lower_and_fuse(model)
    r = rng("def inputs", "stack")
    x = r.standard_normal((2, 4)).astype(np.float32)
    caches = {n: r.standard_normal((2, 1, 6, 4)).astype(np.float32) for n in CACHES}
    weights = {f"layers.{i}.w": r.standard_normal((4, 4)).astype(np.float32) for i in range(3)}
    got = interp.run(lowered, {"x": x, "pos": np.array([2], np.int32), **caches}, weights,
                     model.env)["out"]
    h = x
    for i in range(3):  # by hand: row 2 of layer i's cache becomes its input, then the sum
        cache = caches[f"layers.{i}.cache"].copy()
        cache[:, 0, 2, :] = h
        h = h @ weights[f"layers.{i}.w"] + cache[:, 0].sum(axis=1)
    np.testing.assert_allclose(got, h, rtol=1e-5, atol=1e-5)


def test_the_manifest_and_the_runner_name_each_layers_cache(tmp_path: Path) -> None:
    _, program = deviceless_program(STACK, tmp_path)
    assert sorted(program.written_inputs()) == CACHES
    assert [w.at for w in program.bundle.manifest.written] == ["pos"] * 3


def test_a_def_that_declares_only_an_input_needs_an_instance_name(tmp_path: Path) -> None:
    checked = check_source("""
def read(x: [2, 4]) -> [2, 4] {
  input extra: [2, 4]
  return x + extra
}
def outer(x: [2, 4]) -> [2, 4] {
  return read(x)
}
model m {
  input x: [2, 4]
  let y = outer(x)
  output out = y
}
""", tmp_path)
    assert [d.code for d in checked.diagnostics] == ["E0208"]
    assert "has no name" in checked.diagnostics[0].message
