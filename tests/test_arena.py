"""The arena oracle (dslc/fuzz/arena.py): a compiled schedule run on the CPU in memory laid out
as the runtime lays it out equals the reference executor, and it does not when the memory
picture is wrong (two live values in the same bytes, a saved graph bound with wrong strides)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from dslc.fuzz import arena
from dslc.fuzz.oracle import relative_error
from dslc.ir import interp
from dslc.runtime import schedule
from dslc.runtime.schedule import Schedule
from dslc.weights import random_weights
from tests.helpers import deviceless_program, rng

CHAIN = """import "std/nn.cgraph"
model m {
  layout NHWC
  input x: [2, 8, 6, 6]
  let a = relu(conv2d(x, out=8, k=3, pad=1, has_bias=true))
  let b = relu(conv2d(a, out=8, k=3, pad=1, has_bias=true)) + a
  let c = maxpool(b, window=2)
  output y = reduce_mean(c * 2.0, axes=[2, 3], keepdims=true)
  output z = transpose(c, [0, 2, 3, 1])
}
"""


def _compiled(text: str, tmp_path: Path) -> tuple[Schedule, dict[str, np.ndarray],
                                                   dict[str, np.ndarray]]:
    """The deviceless bundle of `text` read back, inputs at its first bucket, random weights."""
    model, program = deviceless_program(text, tmp_path)
    g = rng("arena", text)
    dims = dict(program.bundle.buckets[0].dims)
    inputs = {n: g.standard_normal(program.storage(v, dims).shape).astype(np.float32)
              for n, v in program.inputs.items()}
    return program, inputs, random_weights(model.params, 5)


def _errors(program: Schedule, inputs: dict[str, np.ndarray],
            weights: dict[str, np.ndarray]) -> dict[str, float]:
    virtual = program.virtual()
    want = interp.run(program.graph, inputs, weights, program.env, virtual=virtual)
    got = arena.run(program, {}, inputs, weights)
    return {k: relative_error(got[k], want[k]) for k in want}


def test_a_schedule_in_its_memory_plan_equals_the_reference(tmp_path: Path) -> None:
    program, inputs, weights = _compiled(CHAIN, tmp_path)
    assert len(program.memory_plan({}).offsets) >= 3  # values share an arena
    assert max(_errors(program, inputs, weights).values()) < 1e-6


LATER = """model m {
  input x: [2, 64]
  input w: [64, 64]
  let a = relu(matmul(x, w))
  let b = sigmoid(matmul(x, w) * 0.5)
  output y = (a + b) * b + a
}
"""


def test_a_step_writing_bytes_it_reads_is_found(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    program, inputs, weights = _compiled(CHAIN, tmp_path)
    plan = schedule.plan_memory

    def at_zero(buffers):  # type: ignore[no-untyped-def]
        offsets, size = plan(buffers)
        return {name: 0 for name in offsets}, size

    monkeypatch.setattr(schedule, "plan_memory", at_zero)
    with pytest.raises(arena.Overlap):
        arena.run(program, {}, inputs, weights)


def test_a_value_overwritten_before_its_last_reader_is_found(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`a` is read by the last step; `b` is written while `a` is still needed, by a step that
    does not read `a`: placing `b` in `a`'s bytes races nothing, it loses `a`."""
    program, inputs, weights = _compiled(LATER, tmp_path)
    writer = {v: s for s in program.steps for v in s.outputs}
    a, b = writer["a"].nodes[-1], writer["b"].nodes[-1]
    assert "a" not in writer["b"].inputs and program.steps.index(writer["a"]) < \
        program.steps.index(writer["b"])
    plan = schedule.plan_memory

    def b_on_a(buffers):  # type: ignore[no-untyped-def]
        offsets, size = plan(buffers)
        return {**offsets, b: offsets[a]}, size

    monkeypatch.setattr(schedule, "plan_memory", b_on_a)
    assert max(_errors(program, inputs, weights).values()) > 1e-2


def test_a_graph_bound_with_wrong_strides_is_found(tmp_path: Path) -> None:
    program, inputs, weights = _compiled(CHAIN, tmp_path)
    bucket = program.bundle.buckets[0]
    sig, entry = next((s, g) for s, g in bucket.graphs.items()
                      if any(t.role == "input" and t.dims[1] == 8 for t in g.spec.tensors))
    # H and W swapped (6 x 6: the same bytes, read transposed)
    tensors = tuple(replace(t, strides=(*t.strides[:2], t.strides[3], t.strides[2]))
                    if t.role == "input" and t.dims[1] == 8 else t for t in entry.spec.tensors)
    graphs = {**bucket.graphs, sig: replace(entry, spec=replace(entry.spec, tensors=tensors))}
    broken = replace(program.bundle, buckets=(replace(bucket, graphs=graphs),))
    assert max(_errors(Schedule(broken), inputs, weights).values()) > 1e-2


@pytest.mark.parametrize(("name", "dims"), [("mlp", {"N": 16}), ("unet", {"N": 1, "H": 64,
                                                                        "W": 64})])
def test_the_example_models_in_their_memory_plans(name: str, dims: dict[str, int],
                                                  tmp_path: Path) -> None:
    program, _, weights = _compiled((Path("models") / f"{name}.cgraph").read_text(), tmp_path)
    g = rng("arena", name)
    inputs = {n: g.standard_normal(program.storage(v, dims).shape).astype(np.float32)
              for n, v in program.inputs.items()}
    virtual = program.virtual()
    want = interp.run(program.graph, inputs, weights, program.env, virtual=virtual)
    got = arena.run(program, dims, inputs, weights)
    assert max(relative_error(got[k], want[k]) for k in want) < 1e-2  # f16 storage
