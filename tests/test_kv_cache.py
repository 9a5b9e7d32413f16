"""`cache_write`: the reference against rows written by hand, PyTorch's translation against
the reference, the memory plan giving the result the cache input's storage (no arena bytes, the
step writing the caller's buffer: the CPU arena run), the manifest marking such inputs and the
bundle reader holding it to the graph, and plain calls keeping a CUDA graph per cache pointer
(recording faked: it needs a GPU, tests/gpu/test_decode_gpu.py)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
import torch

from dslc.backend.device import ArrayRef
from dslc.backend.target import load_target
from dslc.compile.stage import compile_model
from dslc.emit import bundle as emit_bundle
from dslc.fuzz import arena
from dslc.ir import interp
from dslc.ir.to_torch import run as run_torch
from dslc.ir.to_torch import to_torch
from dslc.pipeline import lower_and_fuse
from dslc.runtime import replay
from dslc.runtime.bundle import read
from dslc.runtime.fields import BundleError
from dslc.runtime.records import Bundle
from dslc.runtime.schedule import Schedule
from tests.helpers import check_source, rng

STEP = """
model step {{
  precision io={io}
  dim B = 1..4 tune [2]
  dim MAX = 8..64 tune [16]
  dim S = 1..8 tune [3]
  input k_cache: [B, 2, MAX, 8]{layout}
  input k_new: [B, 2, S, 8]
  input pos: i32[1]
  let k = cache_write(k_cache, k_new, at=pos)
  output y = k * 2.0
}}
"""


def _source(io: str = "f32", layout: str = "") -> str:
    return STEP.format(io=io, layout=layout)


def _inputs(pos: int, rows: int = 3) -> dict[str, np.ndarray]:
    r = rng("cache_write", pos, rows)
    return {"k_cache": r.standard_normal((2, 2, 16, 8)).astype(np.float32),
            "k_new": r.standard_normal((2, 2, rows, 8)).astype(np.float32),
            "pos": np.array([pos], dtype=np.int32)}


def _by_hand(x: dict[str, np.ndarray]) -> np.ndarray:
    """Row by row: cache row p + s is new row s, where it is inside the cache."""
    out = x["k_cache"].copy()
    p = int(x["pos"][0])
    for s in range(x["k_new"].shape[2]):
        if 0 <= p + s < out.shape[2]:
            out[:, :, p + s, :] = x["k_new"][:, :, s, :]
    return out


@pytest.mark.parametrize("pos", [0, 5, 13, 15, -2])
def test_reference_writes_the_rows_at_the_offset(pos: int, tmp_path: Path) -> None:
    """Rows past the end (13 + 3 > 16) and before the start (-2) are dropped."""
    model = check_source(_source(), tmp_path).model
    lowered, _ = lower_and_fuse(model)
    x = _inputs(pos)
    got = interp.run(lowered, x, {}, model.env)["y"]
    np.testing.assert_array_equal(got, _by_hand(x) * 2)


@pytest.mark.parametrize("pos", [0, 5, 14, -1])
def test_pytorch_translation_equals_the_reference(pos: int, tmp_path: Path) -> None:
    model = check_source(_source(), tmp_path).model
    lowered, _ = lower_and_fuse(model)
    x = _inputs(pos)
    program = to_torch(model.graph, {"B": 2, "MAX": 16, "S": 3}, env=model.env)
    np.testing.assert_array_equal(run_torch(program, x)["y"],
                                  interp.run(lowered, x, {}, model.env)["y"])


def _compiled(tmp_path: Path, io: str = "f16", layout: str = "") -> Schedule:
    model = check_source(_source(io, layout), tmp_path).model
    lowered, plan = lower_and_fuse(model)
    c = compile_model(model, lowered, plan, load_target("h200"))
    path = tmp_path / "step.bundle"
    emit_bundle.write(path, emit_bundle.records(c))
    return Schedule(read(path))


@pytest.mark.parametrize("layout", ["", " @BSHD"])
def test_the_result_is_the_cache_inputs_memory(layout: str, tmp_path: Path) -> None:
    program = _compiled(tmp_path, layout=layout)
    k = next(n.name for n in program.graph.nodes if n.op == "cache_write")
    assert program.nodes[k].type.layout == program.nodes["k_cache"].type.layout
    plan = program.memory_plan({"B": 2, "MAX": 16, "S": 3})
    assert plan.storage[k] == plan.storage["k_cache"]
    assert plan.storage[k].base == "k_cache"
    assert k not in plan.offsets and "k_cache" not in plan.offsets  # no arena bytes
    assert program.written_inputs() == {"k_cache"}
    step = next(s for s in program.steps if s.nodes == (k,))
    assert step.kind == "kernel"


def test_the_schedule_writes_into_the_callers_buffer(tmp_path: Path) -> None:
    """The compiled schedule run on the CPU in memory laid out as on the GPU: the input's own
    buffer holds the new rows afterwards, and the output read them."""
    program = _compiled(tmp_path, io="f32", layout=" @BSHD")
    x = _inputs(6)
    written: dict[str, np.ndarray] = {}
    out = arena.run(program, {"B": 2, "MAX": 16, "S": 3}, x, {}, written)
    np.testing.assert_array_equal(written["k_cache"], _by_hand(x))
    np.testing.assert_array_equal(out["y"], _by_hand(x) * 2)


def test_the_manifest_marks_written_inputs_and_the_reader_holds_it_to_the_graph(
        tmp_path: Path) -> None:
    program = _compiled(tmp_path)
    (w,) = program.bundle.manifest.written
    assert (w.input, w.at, str(w.rows)) == ("k_cache", "pos", str(program.nodes["k_new"].type.shape[2]))
    data = program.bundle.to_data()
    assert data["manifest"]["written"] == [w.to_data()]
    without = {**data, "manifest": {k: v for k, v in data["manifest"].items() if k != "written"}}
    with pytest.raises(BundleError, match=r"manifest\.written: the inputs written in place differ"):
        Bundle.from_data(without)
    wrong = {**data, "manifest": {**data["manifest"], "written": [{**w.to_data(), "at": None}]}}
    with pytest.raises(BundleError, match=r"manifest\.written"):
        Bundle.from_data(wrong)


class _Exe:
    key = "B=2,MAX=16,S=1"


class _Captured:
    made: ClassVar[list[tuple[int, ...]]] = []

    def __init__(self, model: Any, inputs: Any, bound: Any) -> None:
        refs = bound[0]
        _Captured.made.append(tuple(refs[n].ptr for n in sorted(refs)))
        self.computed = frozenset({"y"})

    def __call__(self, inputs: Any) -> dict[str, Any]:
        return {"y": torch.zeros(1)}


class _Model:
    log = logging.getLogger("dslc.runtime")

    class bundle:
        model = "step"

    class program:
        @staticmethod
        def written_inputs() -> frozenset[str]:
            return frozenset({"k_cache"})


def _refs(cache: int, x: int) -> dict[str, ArrayRef]:
    return {"k_cache": ArrayRef(cache, (2,), (1,), "f16", "torch", None),
            "x": ArrayRef(x, (2,), (1,), "f16", "torch", None)}


def test_plain_calls_keep_a_graph_per_cache_buffer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Another cache buffer is another graph (it records the pointer it writes); another buffer
    of an input that is copied in is not."""
    _Captured.made = []
    monkeypatch.setattr(replay, "Captured", _Captured)
    r = replay.Replays()
    for cache, x in ((256, 512), (256, 512), (256, 1024), (768, 512), (768, 512)):
        r.call(_Model(), _refs(cache, x), _Exe(), "torch")  # type: ignore[arg-type]
    # the first call of a size runs step by step; then one graph per cache pointer
    assert _Captured.made == [(256, 512), (768, 512)]


def test_a_write_nothing_reads_is_kept_for_its_effect(tmp_path: Path) -> None:
    """A cache written and not read here (the next step reads it) is neither dead code nor an
    unused value: the step stays and the caller's buffer gets the rows."""
    text = """model step {
  precision io=f32
  input k_cache: [1, 2, 16, 8]
  input k_new: [1, 2, 1, 8]
  input x: [4]
  input pos: i32[1]
  let k = cache_write(k_cache, k_new, at=pos)
  output y = relu(x)
}
"""
    checked = check_source(text, tmp_path)
    assert checked.codes == []  # no W0201
    lowered, plan = lower_and_fuse(checked.model)
    assert [n.op for n in lowered.nodes if n.op == "cache_write"] == ["cache_write"]
    c = compile_model(checked.model, lowered, plan, load_target("h200"))
    emit_bundle.write(tmp_path / "b.bundle", emit_bundle.records(c))
    program = Schedule(read(tmp_path / "b.bundle"))
    r = rng("cache_write", "unread")
    x = {"k_cache": r.standard_normal((1, 2, 16, 8)).astype(np.float32),
         "k_new": r.standard_normal((1, 2, 1, 8)).astype(np.float32),
         "x": r.standard_normal(4).astype(np.float32), "pos": np.array([9], np.int32)}
    written: dict[str, np.ndarray] = {}
    arena.run(program, {}, x, {}, written)
    np.testing.assert_array_equal(written["k_cache"], _by_hand(x))
    _, by_reference = interp.run_in_place(lowered, x, {}, checked.model.env)
    np.testing.assert_array_equal(by_reference["k_cache"], _by_hand(x))


def test_a_written_cache_read_by_a_concat_is_copied_into_it(tmp_path: Path) -> None:
    """Its memory is the caller's cache, so its producer cannot write it into the concat's
    buffer: the concat copies it (the arena run would read poison otherwise)."""
    text = """model step {
  precision io=f32
  input k_cache: [1, 2, 16, 8]
  input k_new: [1, 2, 1, 8]
  input pos: i32[1]
  input other: [1, 2, 4, 8]
  let k = cache_write(k_cache, k_new, at=pos)
  output y = concat([relu(other), k], axis=2)
}
"""
    model = check_source(text, tmp_path).model
    lowered, plan = lower_and_fuse(model)
    k = next(n.name for n in lowered.nodes if n.op == "cache_write")
    assert k not in plan.placement
    c = compile_model(model, lowered, plan, load_target("h200"))
    emit_bundle.write(tmp_path / "b.bundle", emit_bundle.records(c))
    program = Schedule(read(tmp_path / "b.bundle"))
    r = rng("cache_write", "concat")
    x = {"k_cache": r.standard_normal((1, 2, 16, 8)).astype(np.float32),
         "k_new": r.standard_normal((1, 2, 1, 8)).astype(np.float32),
         "pos": np.array([3], np.int32), "other": r.standard_normal((1, 2, 4, 8)).astype(np.float32)}
    out = arena.run(program, {}, x, {})
    want = np.concatenate([np.maximum(x["other"], 0), _by_hand(x)], axis=2)
    np.testing.assert_array_equal(out["y"], want)


def test_a_bundle_whose_written_input_has_a_second_reader_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """E0211 holds in a bundle too. The checker refuses such a model, so the hostile bundle is
    made with its rule switched off: making its records names the written input (the manifest
    is held to the graph when made and when read)."""
    monkeypatch.setattr("dslc.check.elaborate.check_in_place", lambda *a, **k: None)
    text = STEP.format(io="f32", layout="").replace(
        "output y = k * 2.0", "output y = k * 2.0\n  output z = k_cache * 3.0")
    model = check_source(text, tmp_path).model
    lowered, plan = lower_and_fuse(model)
    compiled = compile_model(model, lowered, plan, load_target("h200"))
    with pytest.raises(BundleError, match=r"manifest\.written\[0\]: input `k_cache` is written "
                                          r"in place and read by something else too"):
        emit_bundle.records(compiled)


def test_the_reference_of_a_step_sizes_its_views_through_the_models_dims(
        tmp_path: Path) -> None:
    """New rows pooled two into one from T (floor((T - 2) / 2) + 1 of them, a dim only the
    model's dim environment evaluates: 2 at T=5), written at `pos` and read by a view: the
    in-place reference sizes the view through that environment."""
    text = """model step {
  precision io=f32
  dim T = 2..8
  input k_cache: [1, 2, 16, 8]
  input k_new: [1, 2, T, 8]
  input pos: i32[1]
  let rows = maxpool(k_new, window=[2, 1], stride=[2, 1])
  output y = relu(cache_write(k_cache, rows, at=pos))
  output z = transpose(rows, [0, 2, 1, 3])
}
"""
    checked = check_source(text, tmp_path)
    lowered, _ = lower_and_fuse(checked.model)
    r = rng("cache_write", "pooled")
    x = {"k_cache": r.standard_normal((1, 2, 16, 8)).astype(np.float32),
         "k_new": r.standard_normal((1, 2, 5, 8)).astype(np.float32),
         "pos": np.array([9], np.int32)}
    rows = np.maximum(x["k_new"][:, :, 0:4:2], x["k_new"][:, :, 1:4:2])
    want = x["k_cache"].copy()
    want[:, :, 9:11] = rows
    outputs, written = interp.run_in_place(lowered, x, {}, checked.model.env)
    np.testing.assert_array_equal(written["k_cache"], want)
    np.testing.assert_array_equal(outputs["y"], np.maximum(want, 0))
    np.testing.assert_array_equal(outputs["z"], rows.transpose(0, 2, 1, 3))
