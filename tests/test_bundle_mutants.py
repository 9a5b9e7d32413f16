"""The bundle records, manifest and envelope at the edges that the `bundle` mutation group's
survivors showed no test held (docs/mutation.md). The payload is written out by hand (a model of
two cuDNN graphs, a load-time value and a view), so these tests compile nothing: each edits one
field and states what the format (`dslc.runtime.bundle`'s schema, `dslc.runtime.fields`'s
bounds and sentences) says the reader must make of it."""

from __future__ import annotations

import copy
import hashlib
import re
from pathlib import Path
from typing import Any

import msgpack
import pytest

from dslc.core.types import DTYPES
from dslc.runtime import bundle
from dslc.runtime.calibration import Calibration
from dslc.runtime.fields import BundleError
from dslc.runtime.irdata import GraphRecord
from dslc.runtime.manifest import Declared, DimDecl, Manifest, Where, Written
from dslc.runtime.records import (
    BucketRecord,
    Bundle,
    Candidate,
    Environment,
    OpRecord,
    PlanRecord,
    SpecRecord,
    StepRecord,
    TensorRecord,
)

TIB = 2**40  # fields.MAX_ELEMENTS and MAX_BYTES: 1 TiB
I31 = 2**31 - 1  # fields.MAX_DIM, the largest uid and engine id
TEXT = 1 << 16  # fields.MAX_TEXT
BLOB = 1 << 28  # fields.MAX_BLOB
ONE_OF_DTYPES = "one of " + ", ".join(sorted(DTYPES))

N = {"terms": [[[["N", 1]], 1, 1]]}  # the dim N, as the IR's data writes a symbol
SPAN = ["m.cgraph", 2, 3, 2, 9]


def refuses(message: str) -> Any:
    """The whole sentence of a BundleError, matched exactly."""
    return pytest.raises(BundleError, match=f"^{re.escape(message)}$")


def _node(name: str, op: str, inputs: list[str], shape: list[Any], layout: list[int] | None, /,
          **attrs: Any) -> dict[str, Any]:
    return {"name": name, "op": op, "inputs": inputs, "attrs": attrs,
            "type": {"dtype": "f32", "shape": shape, "layout": layout}, "path": "",
            "precision": ["f32", "f32", "f32"], "span": SPAN}


def _tensor(name: str, uid: int, role: str, rows: int = 2) -> dict[str, Any]:
    return {"name": name, "uid": uid, "dims": [1, 1, rows, 4],
            "strides": [4 * rows, 4 * rows, 4, 1], "dtype": "f32", "role": role, "value": 0.0}


def _declared(name: str, shape: list[Any], layout: list[int] | None,
              key: str = "name") -> dict[str, Any]:
    return {key: name, "dtype": "f32", "shape": shape, "layout": layout,
            "span": {"file": "m.cgraph", "line": 2, "col": 3}}


def _dim(**edits: Any) -> dict[str, Any]:
    return {"name": "N", "dynamic": True, "lo": 1, "hi": 8, "align": 1, "tune": [2],
            "span": {"file": "m.cgraph", "line": 1, "col": 3}, **edits}


def _graph(syms: list[int] | None = None) -> dict[str, Any]:
    return {"nodes": [_node("x", "input", [], [N, 4], [0, 1], name="x"),
                      _node("w", "param", [], [4], [0], path="w"),
                      _node("v", "relu", ["w"], [4], [0]),
                      _node("h.relu", "relu", ["x"], [N, 4], [0, 1]),
                      _node("h", "bias_add", ["h.relu", "v"], [N, 4], [0, 1], axis=1),
                      _node("t", "view", ["h"], [4, N], None, offset=0,
                            steps=[["transpose", [1, 0]]], strides=[1, 4]),
                      _node("s", "sigmoid", ["x"], [N, 4], [0, 1])],
            "outputs": [["y", "h"], ["t", "t"], ["s", "s"]], "floors": {},
            "syms": {"N": syms or [1, 8, 1]}}


def _plan() -> dict[str, Any]:
    return {"engine_id": None, "knobs": {}, "workspace": 0, "serialized": None}


def payload() -> dict[str, Any]:
    """A bundle's payload written by hand: x: [N, 4] input, w: [4] param; v = relu(w) at load
    time; h = relu(x) + v and s = sigmoid(x) in two cuDNN graphs; outputs y = h, t = h
    transposed (a view), s. One bucket, N = 2 (h and s: 2 * 4 f32 = 32 bytes each)."""
    spec_h = {"signature": "sig-h", "io": "f32", "intermediate": "f32", "compute": "f32",
              "tensors": [_tensor("x", 1, "input"), _tensor("v", 2, "input", rows=1),
                          _tensor("h.relu", 3, "virtual"), _tensor("h", 4, "output")],
              "ops": [{"node": "h.relu", "op": "relu", "inputs": ["x"], "attrs": {},
                       "compute": "f32"},
                      {"node": "h", "op": "bias_add", "inputs": ["h.relu", "v"],
                       "attrs": {"axis": 1}, "compute": "f32"}]}
    spec_s = {"signature": "sig-s", "io": "f32", "intermediate": "f32", "compute": "f32",
              "tensors": [_tensor("x", 1, "input"), _tensor("s", 2, "output")],
              "ops": [{"node": "s", "op": "sigmoid", "inputs": ["x"], "attrs": {},
                       "compute": "f32"}]}
    return {
        "model": "m", "source": "m.cgraph", "dslc_version": "0.1.0",
        "created": "2026-12-03T00:00:00+00:00", "target": "h200", "environment": {},
        "manifest": {"model": "m", "file": "m.cgraph", "metadata": {},
                     "inputs": [_declared("x", [N, 4], [0, 1])],
                     "outputs": [_declared("y", [N, 4], [0, 1]), _declared("t", [4, N], None),
                                 _declared("s", [N, 4], [0, 1])],
                     "params": [_declared("w", [4], [0], key="path")],
                     "dims": [_dim()], "buckets": [{"N": 2}]},
        "graph": _graph(), "load_time": ["w", "v"],
        "steps": [{"kind": "graph", "name": "h", "pattern": "pointwise",
                   "nodes": ["h.relu", "h"], "inputs": ["x", "v"], "outputs": ["h"],
                   "signature": "sig-h", "reason": ""},
                  {"kind": "graph", "name": "s", "pattern": "pointwise", "nodes": ["s"],
                   "inputs": ["x"], "outputs": ["s"], "signature": "sig-s", "reason": ""}],
        "buckets": [{"key": "N=2", "dims": {"N": 2},
                     "graphs": {"sig-h": {"spec": spec_h, "plan": _plan()},
                                "sig-s": {"spec": spec_s, "plan": _plan()}},
                     "memory": {"offsets": {"h": 0, "s": 32}, "arena_bytes": 64}}]}


def _graph_record(syms: list[int] | None = None) -> GraphRecord:
    return GraphRecord.from_data(_graph(syms))


def _spec(name: str = "sig-h") -> dict[str, Any]:
    spec: dict[str, Any] = payload()["buckets"][0]["graphs"][name]["spec"]
    return spec


def _read_spec(spec: dict[str, Any]) -> SpecRecord:
    return SpecRecord.from_data(spec, "spec", _graph_record().graph.by_name())


def _read_step(step: dict[str, Any]) -> StepRecord:
    return StepRecord.from_data(step, "step", _graph_record().graph.by_name())


def _step(**edits: Any) -> dict[str, Any]:
    return {**payload()["steps"][0], **edits}


def test_the_hand_written_payload_reads_back_as_written() -> None:
    data = payload()
    b = Bundle.from_data(copy.deepcopy(data))
    assert (b.model, b.source, b.dslc_version, b.created, b.target) == \
        ("m", "m.cgraph", "0.1.0", "2026-12-03T00:00:00+00:00", "h200")
    assert b.load_time == ("w", "v") and b.calibration is None and not b.uncalibrated
    assert b.environment == Environment()
    out = b.to_data()
    assert {k: out[k] for k in out if k != "graph"} == {k: data[k] for k in data if k != "graph"} \
        | {"environment": Environment().to_data()}


# -- Candidate, PlanRecord ---------------------------------------------------------------------
def test_a_candidate_without_an_error_writes_no_error_field() -> None:
    assert Candidate(41, {"TILE": 3}, 0.0125).to_data() == \
        {"engine_id": 41, "knobs": {"TILE": 3}, "ms": 0.0125}
    assert Candidate(41, {}, None, 0.5).to_data() == \
        {"engine_id": 41, "knobs": {}, "ms": None, "error": 0.5}


def test_a_candidate_reads_every_field_and_cudnns_largest_engine_id() -> None:
    data = {"engine_id": I31, "knobs": {"TILE": 3}, "ms": 1, "error": 0.25}
    assert Candidate.from_data(data, "c") == Candidate(I31, {"TILE": 3}, 1.0, 0.25)
    with refuses(f"c.engine_id: expected an int in 0..{I31}, got {I31 + 1}"):
        Candidate.from_data({**data, "engine_id": I31 + 1}, "c")


def test_a_plan_writes_only_the_fields_it_has() -> None:
    plan = PlanRecord(3, {"TILE": 2}, 256, b"plan", note="kept", candidates=5, tuned=True,
                      heuristic=Candidate(3, {"TILE": 2}, 0.5),
                      top=(Candidate(3, {"TILE": 2}, 0.5), Candidate(4, {}, 0.75, 0.125)))
    assert plan.to_data() == {
        "engine_id": 3, "knobs": {"TILE": 2}, "workspace": 256, "serialized": b"plan",
        "note": "kept", "candidates": 5, "tuned": True,
        "heuristic": {"engine_id": 3, "knobs": {"TILE": 2}, "ms": 0.5},
        "top": [{"engine_id": 3, "knobs": {"TILE": 2}, "ms": 0.5},
                {"engine_id": 4, "knobs": {}, "ms": 0.75, "error": 0.125}]}
    assert PlanRecord(None, {}, 0, None).to_data() == \
        {"engine_id": None, "knobs": {}, "workspace": 0, "serialized": None}


def test_a_plan_updated_keeps_its_other_fields_and_checks_the_new_ones() -> None:
    plan = PlanRecord(3, {"TILE": 2}, 256, b"plan", note="kept")
    assert plan.updated({"workspace": 512, "ms": 0.5}, "p") == \
        PlanRecord(3, {"TILE": 2}, 512, b"plan", note="kept", ms=0.5)
    with refuses(f"p.workspace: expected an int in 0..{TIB}, got -1"):
        plan.updated({"workspace": -1}, "p")


def test_a_plan_reads_every_optional_field() -> None:
    data = {"engine_id": 3, "knobs": {"TILE": 2}, "workspace": TIB, "serialized": b"x",
            "note": "n", "candidates": TIB, "tuned": False, "built_on_device": True,
            "build_s": 2, "ms": 0.5, "error": 0.25,
            "heuristic": {"engine_id": 3, "knobs": {}, "ms": None},
            "top": [{"engine_id": i, "knobs": {}, "ms": 1.0} for i in range(64)],
            "tune_s": 3, "reused": False, "made_at_startup": "N=2"}
    plan = PlanRecord.from_data(data, "p")
    assert plan == PlanRecord(3, {"TILE": 2}, TIB, b"x", "n", TIB, False, True, 2.0, 0.5, 0.25,
                              Candidate(3, {}, None),
                              tuple(Candidate(i, {}, 1.0) for i in range(64)), 3.0, False, "N=2")


@pytest.mark.parametrize(("field", "value", "message"), [
    ("engine_id", -1, f"p.engine_id: expected an int in 0..{I31}, got -1"),
    ("knobs", 1, "p.knobs: expected a map, got 1"),
    ("workspace", TIB + 1, f"p.workspace: expected an int in 0..{TIB}, got {TIB + 1}"),
    ("serialized", "x", f'p.serialized: expected bytes (at most {BLOB}), got "x"'),
    ("note", 1, f"p.note: expected a string of at most {TEXT} characters, got 1"),
    ("candidates", -1, f"p.candidates: expected an int in 0..{TIB}, got -1"),
    ("candidates", TIB + 1, f"p.candidates: expected an int in 0..{TIB}, got {TIB + 1}"),
    ("tuned", 1, "p.tuned: expected true or false, got 1"),
    ("built_on_device", 1, "p.built_on_device: expected true or false, got 1"),
    ("build_s", "x", 'p.build_s: expected a number, got "x"'),
    ("ms", "x", 'p.ms: expected a number, got "x"'),
    ("error", "x", 'p.error: expected a number, got "x"'),
    ("heuristic", 1, "p.heuristic: expected a map, got 1"),
    ("top", [1], "p.top[0]: expected a map, got 1"),
    ("top", [{"engine_id": 1, "knobs": {}}] * 65, "p.top: 65 entries, expected 0..64"),
    ("tune_s", "x", 'p.tune_s: expected a number, got "x"'),
    ("reused", 1, "p.reused: expected true or false, got 1"),
    ("made_at_startup", 1, f"p.made_at_startup: expected a string of at most {TEXT} "
                           "characters, got 1"),
])
def test_a_plan_field_of_the_wrong_kind_is_refused_by_its_path(field: str, value: Any,
                                                                 message: str) -> None:
    with refuses(message):
        PlanRecord.from_data({**_plan(), field: value}, "p")


def test_a_tuning_entry_reads_without_a_workspace_as_zero() -> None:
    plan = PlanRecord.from_data({"engine_id": 3, "knobs": {}}, "e", tuning=True)
    assert (plan.workspace, plan.serialized) == (0, None)
    with refuses("e: unknown field `spare`"):
        PlanRecord.from_data({"engine_id": 3, "knobs": {}, "spare": 1}, "e", tuning=True)


# -- TensorRecord, SpecRecord ------------------------------------------------------------------
def test_a_tensor_reads_back_and_writes_what_it_read() -> None:
    data = {"name": "x", "uid": I31, "dims": [1] * 7 + [I31], "strides": [0] * 7 + [TIB],
            "dtype": "f16", "role": "scalar", "value": 2}
    t = TensorRecord.from_data(data, "t")
    assert t == TensorRecord("x", I31, (1,) * 7 + (I31,), (0,) * 7 + (TIB,), "f16", "scalar", 2.0)
    assert t.to_data() == {**data, "value": 2.0}
    del data["value"]
    assert TensorRecord.from_data(data, "t").value == 0.0


@pytest.mark.parametrize(("edit", "message"), [
    ({"dims": []}, "t.dims: 0 entries, expected 1..8"),
    ({"dims": [1] * 9, "strides": [1] * 9}, "t.dims: 9 entries, expected 1..8"),
    ({"dims": [0, 4]}, f"t.dims[0]: expected an int in 1..{I31}, got 0"),
    ({"dims": [I31 + 1, 4]}, f"t.dims[0]: expected an int in 1..{I31}, got {I31 + 1}"),
    ({"strides": [4]}, "t.strides: 1 entries, expected 2..2"),
    ({"strides": [4, 1, 1]}, "t.strides: 3 entries, expected 2..2"),
    ({"strides": [TIB + 1, 1]}, f"t.strides[0]: expected an int in 0..{TIB}, got {TIB + 1}"),
    ({"strides": [-1, 1]}, f"t.strides[0]: expected an int in 0..{TIB}, got -1"),
    ({"uid": 0}, f"t.uid: expected an int in 1..{I31}, got 0"),
    ({"uid": I31 + 1}, f"t.uid: expected an int in 1..{I31}, got {I31 + 1}"),
    ({"name": 1}, f"t.name: expected a string of at most {TEXT} characters, got 1"),
    ({"dtype": "f99"}, f't.dtype: expected {ONE_OF_DTYPES}, got "f99"'),
    ({"role": "weight"}, 't.role: expected one of input, output, scalar, virtual, got "weight"'),
    ({"value": "x"}, 't.value: expected a number, got "x"'),
    ({"spare": 1}, "t: unknown field `spare`"),
])
def test_a_damaged_tensor_is_refused_by_its_path(edit: dict[str, Any], message: str) -> None:
    data = {"name": "x", "uid": 1, "dims": [2, 4], "strides": [4, 1], "dtype": "f32",
            "role": "input", **edit}
    with refuses(message):
        TensorRecord.from_data(data, "t")


def test_a_spec_reads_back_and_writes_what_it_read() -> None:
    spec = _read_spec(_spec())
    assert spec.signature == "sig-h" and (spec.io, spec.intermediate, spec.compute) == \
        ("f32", "f32", "f32")
    assert [t.name for t in spec.tensors] == ["x", "v", "h.relu", "h"]
    assert spec.ops == (OpRecord("h.relu", "relu", ("x",), {}, "f32"),
                        OpRecord("h", "bias_add", ("h.relu", "v"), {"axis": 1}, "f32"))
    assert spec.to_data() == _spec()


def _spec_with(**edits: Any) -> dict[str, Any]:
    spec = _spec()
    for key, value in edits.items():
        if key.startswith("op1_"):
            spec["ops"][1][key[4:]] = value
        else:
            spec[key] = value
    return spec


@pytest.mark.parametrize(("spec", "message"), [
    (_spec_with(tensors=[]), "spec.tensors: 0 entries, expected 1..4096"),
    (_spec_with(tensors=[_tensor("x", 1, "input")] * 4097), "spec.tensors: 4097 entries, "
     "expected 1..4096"),
    (_spec_with(tensors=[_tensor("x", 1, "input"), _tensor("x", 2, "input")]),
     "spec.tensors: two tensors share a name or a uid"),
    (_spec_with(tensors=[_tensor("x", 1, "input"), _tensor("h", 1, "output")]),
     "spec.tensors: two tensors share a name or a uid"),
    (_spec_with(tensors=[{"name": "x"}]), "spec.tensors[0]: missing field `uid`"),
    (_spec_with(ops=[]), "spec.ops: 0 entries, expected 1..4096"),
    (_spec_with(op1_node="q"), "spec.ops[1].node: `q` is not a tensor of the spec"),
    (_spec_with(op1_op="relu"), "spec.ops[1]: not an op of the graph"),
    (_spec_with(op1_op=1), f"spec.ops[1].op: expected a string of at most {TEXT} characters, "
     "got 1"),
    (_spec_with(op1_inputs=["h.relu", "w"]), "spec.ops[1].inputs[1]: `w` is not a tensor of "
     "the spec"),
    (_spec_with(op1_attrs=[]), "spec.ops[1].attrs: expected a map, got a list of 0"),
    (_spec_with(op1_attrs={"axis": {}}), "spec.ops[1].attrs.axis: expected a number, string, "
     "bool, none or list, got a map"),
    (_spec_with(op1_compute="f99"), f'spec.ops[1].compute: expected {ONE_OF_DTYPES}, '
     'got "f99"'),
    (_spec_with(op1_spare=1), "spec.ops[1]: unknown field `spare`"),
    (_spec_with(signature=1), f"spec.signature: expected a string of at most {TEXT} "
     "characters, got 1"),
    (_spec_with(io="f99"), f'spec.io: expected {ONE_OF_DTYPES}, got "f99"'),
    (_spec_with(intermediate="f99"), f'spec.intermediate: expected {ONE_OF_DTYPES}, got "f99"'),
    (_spec_with(compute="f99"), f'spec.compute: expected {ONE_OF_DTYPES}, got "f99"'),
    (_spec_with(spare=1), "spec: unknown field `spare`"),
])
def test_a_damaged_spec_is_refused_by_its_path(spec: dict[str, Any], message: str) -> None:
    with refuses(message):
        _read_spec(spec)


def test_a_spec_op_of_a_tensor_that_is_no_node_is_refused() -> None:
    spec = _spec()
    spec["tensors"].append(_tensor("q", 9, "virtual"))
    spec["ops"][1]["node"] = "q"
    with refuses("spec.ops[1]: not an op of the graph"):
        _read_spec(spec)


def test_a_spec_op_attribute_nested_four_deep_is_read() -> None:
    spec = _spec()
    spec["ops"][1]["attrs"] = {"axis": 1, "k": [[[[2]]]]}
    assert _read_spec(spec).ops[1].attrs == {"axis": 1, "k": [[[[2]]]]}


# -- BucketRecord ------------------------------------------------------------------------------
def test_a_bucket_writes_what_it_read() -> None:
    data = payload()
    b = Bundle.from_data(copy.deepcopy(data)).buckets[0]
    assert (b.key, dict(b.dims), dict(b.offsets), b.arena_bytes) == \
        ("N=2", {"N": 2}, {"h": 0, "s": 32}, 64)
    assert b.to_data() == data["buckets"][0]


@pytest.mark.parametrize(("edit", "message"), [
    (lambda b: b["dims"].update(N=9), "buckets[0].dims.N: 9 is not a value of a dim of the "
     "model"),
    (lambda b: b["dims"].update(N=0), "buckets[0].dims.N: 0 is not a value of a dim of the "
     "model"),
    (lambda b: b["dims"].update(N=-1), f"buckets[0].dims.N: expected an int in 0..{I31}, "
     "got -1"),
    (lambda b: b["graphs"]["sig-h"].update(spare=1), "buckets[0].graphs.sig-h: unknown field "
     "`spare`"),
    (lambda b: b["graphs"]["sig-h"]["spec"].update(signature="sig-s"),
     "buckets[0].graphs.sig-h.spec.signature: differs from the graph's key"),
    (lambda b: b["graphs"]["sig-h"]["plan"].update(workspace=-1),
     f"buckets[0].graphs.sig-h.plan.workspace: expected an int in 0..{TIB}, got -1"),
    (lambda b: b["memory"].update(arena_bytes=TIB + 1),
     f"buckets[0].memory.arena_bytes: expected an int in 0..{TIB}, got {TIB + 1}"),
    (lambda b: b["memory"]["offsets"].update(s=65),
     "buckets[0].memory.offsets.s: expected an int in 0..64, got 65"),
    (lambda b: b["memory"]["offsets"].update(s=-1),
     "buckets[0].memory.offsets.s: expected an int in 0..64, got -1"),
    (lambda b: b["memory"]["offsets"].update(q=0),
     "buckets[0].memory.offsets: `q` is not a value of the graph"),
    (lambda b: b.update(spare=1), "buckets[0]: unknown field `spare`"),
])
def test_a_damaged_bucket_is_refused_by_its_path(edit: Any, message: str) -> None:
    data = payload()
    edit(data["buckets"][0])
    with refuses(message):
        Bundle.from_data(data)


def test_a_bucket_at_a_dims_bounds_and_its_arenas_end_is_read() -> None:
    for n in (1, 8):
        data = payload()
        data["buckets"][0].update(key=f"N={n}", dims={"N": n},
                                  memory={"offsets": {"h": 64, "s": 64}, "arena_bytes": 64})
        b = Bundle.from_data(data).buckets[0]
        assert (dict(b.dims), dict(b.offsets)) == ({"N": n}, {"h": 64, "s": 64})


def test_a_bucket_dim_off_the_dims_alignment_is_refused() -> None:
    graph = _graph_record([2, 8, 2])
    data = payload()["buckets"][0]
    nodes = graph.graph.by_name()
    data.update(key="N=4", dims={"N": 4})
    assert dict(BucketRecord.from_data(copy.deepcopy(data), "b", graph, nodes,
                                       {"sig-h", "sig-s"}).dims) == {"N": 4}
    data.update(key="N=3", dims={"N": 3})
    with refuses("b.dims.N: 3 is not a value of a dim of the model"):
        BucketRecord.from_data(data, "b", graph, nodes, {"sig-h", "sig-s"})


def test_a_bucket_graph_under_an_unknown_signature_is_named_by_forty_characters() -> None:
    data = payload()
    graphs = data["buckets"][0]["graphs"]
    graphs["s" * 50] = graphs.pop("sig-s")
    with refuses(f"buckets[0].graphs.{'s' * 40}: not the signature of a step"):
        Bundle.from_data(data)


# -- StepRecord, the schedule ------------------------------------------------------------------
def test_a_step_reads_back_and_writes_what_it_read() -> None:
    step = _read_step(_step())
    assert step == StepRecord("graph", "h", "pointwise", ("h.relu", "h"), ("x", "v"), ("h",),
                              "sig-h", "")
    assert step.to_data() == _step()
    data = _step(reason="split here")
    assert _read_step(data).reason == "split here"
    del data["reason"]
    assert _read_step(data).reason == ""


@pytest.mark.parametrize(("edit", "message"), [
    ({"nodes": []}, "step.nodes: 0 entries, expected 1..1048576"),
    ({"nodes": ["h.relu", "q"]}, "step.nodes[1]: `q` is not a value of the graph"),
    ({"kind": "fused"}, 'step.kind: expected one of graph, kernel, got "fused"'),
    ({"nodes": ["w", "h"]}, "step.nodes: not the computed nodes of one step"),
    ({"nodes": ["h.relu", "x"]}, "step.nodes: not the computed nodes of one step"),
    ({"name": 1}, f"step.name: expected a string of at most {TEXT} characters, got 1"),
    ({"pattern": 1}, f"step.pattern: expected a string of at most {TEXT} characters, got 1"),
    ({"signature": 1}, f"step.signature: expected a string of at most {TEXT} characters, "
     "got 1"),
    ({"reason": 1}, f"step.reason: expected a string of at most {TEXT} characters, got 1"),
    ({"inputs": ["x", "q"]}, "step.inputs[1]: `q` is not a value of the graph"),
    ({"outputs": ["x"]}, "step.outputs[0]: `x` is not a node of the step"),
    ({"inputs": ["v", "x"]}, "step.inputs: not what the step's nodes read, in order"),
    ({"inputs": ["x"]}, "step.inputs: not what the step's nodes read, in order"),
    ({"inputs": ["x", "v", "v"]}, "step.inputs: not what the step's nodes read, in order"),
    ({"inputs": ["x", "h.relu", "v"]}, "step.inputs: not what the step's nodes read, in order"),
    ({"spare": 1}, "step: unknown field `spare`"),
])
def test_a_damaged_step_is_refused_by_its_path(edit: dict[str, Any], message: str) -> None:
    with refuses(message):
        _read_step(_step(**edit))


def test_a_kernel_step_of_one_op_needs_no_fused_plan() -> None:
    step = _read_step(_step(kind="kernel", nodes=["h"], inputs=["h.relu", "v"], outputs=["h"]))
    assert (step.kind, step.nodes) == ("kernel", ("h",))


# -- Environment -------------------------------------------------------------------------------
def test_an_empty_environment_reads_as_unknown_and_writes_every_field() -> None:
    assert Environment.from_data({}) == Environment()
    assert Environment.from_data({"live": None}).live is False
    assert Environment(sm_count=132, live=True).to_data() == {
        "cudnn_backend": None, "cudnn_frontend": None, "cuda_runtime": None, "driver": None,
        "driver_release": None, "device_name": None, "compute_capability": None,
        "sm_count": 132, "memory_bytes": None, "device_properties": None, "live": True}


def test_an_environment_reads_each_field_at_its_bound() -> None:
    data = {"cudnn_backend": 2**62, "cudnn_frontend": "1.32.0", "cuda_runtime": 0,
            "driver": 13000, "driver_release": "r", "device_name": "d",
            "compute_capability": "9.0", "sm_count": 132, "memory_bytes": 2**62,
            "device_properties": "p" * (TEXT + 1), "live": True}
    assert Environment.from_data(data) == Environment(2**62, "1.32.0", 0, 13000, "r", "d", "9.0",
                                                      132, 2**62, "p" * (TEXT + 1), True)


@pytest.mark.parametrize(("edit", "message"), [
    ({"live": 1}, "environment.live: expected true or false, got 1"),
    ({"sm_count": 2**62 + 1}, f"environment.sm_count: expected an int in 0..{2**62}, got "
     f"{2**62 + 1}"),
    ({"driver": -1}, f"environment.driver: expected an int in 0..{2**62}, got -1"),
    ({"device_name": 1}, f"environment.device_name: expected a string of at most {BLOB} "
     "characters, got 1"),
    ({"spare": 1}, "environment: unknown field `spare`"),
])
def test_a_damaged_environment_is_refused_by_its_path(edit: dict[str, Any],
                                                      message: str) -> None:
    with refuses(message):
        Environment.from_data(edit)


# -- Bundle: the payload, the schedule ---------------------------------------------------------
def test_a_bundle_with_other_plans_replaces_only_those() -> None:
    b = Bundle.from_data(payload())
    tuned = PlanRecord(7, {"TILE": 1}, 128, b"p")
    env = Environment(sm_count=132)
    out = b.with_plans({("N=2", "sig-s"): tuned, ("N=4", "sig-h"): tuned}, env)
    graphs = out.buckets[0].graphs
    assert graphs["sig-s"].plan == tuned and graphs["sig-h"].plan == b.buckets[0].graphs[
        "sig-h"].plan
    assert graphs["sig-s"].spec == b.buckets[0].graphs["sig-s"].spec
    assert out.environment == env and out.steps == b.steps and out.manifest == b.manifest


@pytest.mark.parametrize(("edit", "message"), [
    (lambda p: p.update(spare=1), "payload: unknown field `spare`"),
    (lambda p: p.pop("target"), "payload: missing field `target`"),
    (lambda p: p.update(model=1), f"model: expected a string of at most {TEXT} characters, "
     "got 1"),
    (lambda p: p.update(source=1), f"source: expected a string of at most {TEXT} characters, "
     "got 1"),
    (lambda p: p.update(dslc_version=1), f"dslc_version: expected a string of at most {TEXT} "
     "characters, got 1"),
    (lambda p: p.update(created=1), f"created: expected a string of at most {TEXT} "
     "characters, got 1"),
    (lambda p: p.update(target=1), f"target: expected a string of at most {TEXT} characters, "
     "got 1"),
    (lambda p: p.update(environment=1), "environment: expected a map, got 1"),
    (lambda p: p.update(load_time=["w", "q"]), "load_time[1]: `q` is not a value of the graph"),
    (lambda p: p["steps"][1].update(kind="wrong"),
     'steps[1].kind: expected one of graph, kernel, got "wrong"'),
    (lambda p: p["buckets"].append(copy.deepcopy(p["buckets"][0])),
     "buckets: two buckets have one key"),
    (lambda p: p["buckets"][0].update(key=1), f"buckets[0].key: expected a string of at most "
     f"{TEXT} characters, got 1"),
    (lambda p: p["manifest"].update(model=1), f"manifest.model: expected a string of at most "
     f"{TEXT} characters, got 1"),
    (lambda p: p.update(calibration=1), "calibration: expected a map, got 1"),
])
def test_a_damaged_payload_is_refused_by_its_path(edit: Any, message: str) -> None:
    data = payload()
    edit(data)
    with pytest.raises(BundleError) as err:
        Bundle.from_data(data)
    assert str(err.value).startswith(message)


def test_a_kernel_step_may_keep_its_graph_at_a_bucket() -> None:
    """The tuner keeps a kernel step's graph at the buckets where the graph measured faster
    (`tune.fusion.KernelMeasured.graph_at`): the reader takes it, and the step runs it there."""
    from dslc.runtime.schedule import Schedule

    data = payload()
    data["steps"][1]["kind"] = "kernel"
    plain = Bundle.from_data(data).steps[1]  # a kernel step of a signature a bucket holds
    assert not Schedule.runs_graph(plain, data["buckets"][0]["key"])
    key = data["buckets"][0]["key"]
    data["steps"][1]["graph_at"] = [key]
    step = Bundle.from_data(data).steps[1]
    assert step.kind == "kernel" and step.graph_at == (key,)
    assert Schedule.runs_graph(step, key) and Schedule.runs_graph(step, None)
    assert not Schedule.runs_graph(step, "N=1000")
    data["steps"][1]["graph_at"] = ["N=1000"]
    with refuses("steps[1].graph_at: no graph of the step at bucket `N=1000`"):
        Bundle.from_data(data)
    data["steps"][1]["kind"] = "graph"
    data["steps"][1]["graph_at"] = [key]
    with refuses("steps[1].graph_at: a graph step runs its graph at every bucket"):
        Bundle.from_data(data)


@pytest.mark.parametrize(("edit", "message"), [
    (lambda p: p.update(load_time=["x"]), "load_time[0]: `x` is not computed from params alone"),
    (lambda p: p.update(load_time=["v"]), "load_time[0]: `v` is not computed from params alone"),
    (lambda p: p.update(load_time=["w"]), "steps[0].inputs: `v` is read before a step writes "
     "it"),
    (lambda p: p["steps"][1].update(name="h"), "steps[1].name: `h` names an earlier step too"),
    (lambda p: p["steps"].pop(), "graph.outputs: output `s` is never written"),
])
def test_a_schedule_that_could_not_run_is_refused(edit: Any, message: str) -> None:
    data = payload()
    edit(data)
    with refuses(message):
        Bundle.from_data(data)


def test_steps_that_read_only_inputs_may_run_in_any_order() -> None:
    data = payload()
    data["steps"].reverse()
    assert [s.name for s in Bundle.from_data(data).steps] == ["s", "h"]


# -- manifest ----------------------------------------------------------------------------------
def test_a_where_reads_and_writes_its_three_fields() -> None:
    assert Where.from_data({"file": "m.cgraph", "line": 3, "col": 5}, "s") == \
        Where("m.cgraph", 3, 5)
    assert Where("m.cgraph", 3, 5).to_data() == {"file": "m.cgraph", "line": 3, "col": 5}


@pytest.mark.parametrize(("edit", "message"), [
    ({"file": 1}, f"s.file: expected a string of at most {TEXT} characters, got 1"),
    ({"line": -1}, f"s.line: expected an int in 0..{TIB}, got -1"),
    ({"col": "x"}, 's.col: expected a non-negative int, got "x"'),
    ({"spare": 1}, "s: unknown field `spare`"),
])
def test_a_damaged_where_is_refused_by_its_path(edit: dict[str, Any], message: str) -> None:
    with refuses(message):
        Where.from_data({"file": "m.cgraph", "line": 3, "col": 5, **edit}, "s")


def test_a_declared_value_reads_and_writes_under_its_key() -> None:
    symbols = {"N": None}
    data = _declared("w", [0, N], [1, 0], key="path")
    d = Declared.from_data(data, "p", symbols, "path")
    assert (d.name, d.dtype, d.shape[0], d.layout, d.span) == \
        ("w", "f32", 0, (1, 0), Where("m.cgraph", 2, 3))
    assert d.to_data("path") == data
    assert Declared.from_data(_declared("s", [], None), "o", symbols).to_data() == \
        _declared("s", [], None)


@pytest.mark.parametrize(("edit", "message"), [
    ({"shape": [4] * 17, "layout": None}, "d.shape: 17 entries, expected 0..16"),
    ({"shape": [-1, 4]}, f"d.shape[0]: expected an int in 0..{TIB}, got -1"),
    ({"layout": [0]}, "d.layout: 1 entries, expected 2..2"),
    ({"layout": [0, 1, 2]}, "d.layout: 3 entries, expected 2..2"),
    ({"layout": [0, 17]}, "d.layout[1]: expected an int in 0..16, got 17"),
    ({"layout": [-1, 0]}, "d.layout[0]: expected an int in 0..16, got -1"),
    ({"name": 1}, f"d.name: expected a string of at most {TEXT} characters, got 1"),
    ({"dtype": "f99"}, f'd.dtype: expected {ONE_OF_DTYPES}, got "f99"'),
    ({"span": 1}, "d.span: expected a map, got 1"),
    ({"spare": 1}, "d: unknown field `spare`"),
])
def test_a_damaged_declared_value_is_refused_by_its_path(edit: dict[str, Any],
                                                          message: str) -> None:
    with refuses(message):
        Declared.from_data({**_declared("x", [2, 4], [0, 1]), **edit}, "d", {"N": None})


def test_a_declared_value_with_a_dim_of_no_symbol_is_refused() -> None:
    with refuses("d.shape[0].terms[0][0][0][0]: `N` is not a declared dim"):
        Declared.from_data(_declared("x", [N, 4], [0, 1]), "d", {})


def test_a_dim_reads_and_writes_every_field() -> None:
    data = _dim(lo=0, hi=0, align=1, tune=[])
    d = DimDecl.from_data(data, "d")
    assert d == DimDecl("N", True, 0, 0, 1, (), Where("m.cgraph", 1, 3))
    assert d.to_data() == data
    assert DimDecl.from_data(_dim(tune=None), "d").to_data() == _dim(tune=None)
    assert DimDecl.from_data(_dim(tune=[0] * 4096, hi=I31, align=I31), "d").tune == (0,) * 4096


@pytest.mark.parametrize(("edit", "message"), [
    ({"lo": -1}, f"d.lo: expected an int in 0..{I31}, got -1"),
    ({"lo": I31 + 1}, f"d.lo: expected an int in 0..{I31}, got {I31 + 1}"),
    ({"hi": 0}, f"d.hi: expected an int in 1..{I31}, got 0"),
    ({"hi": I31 + 1}, f"d.hi: expected an int in 1..{I31}, got {I31 + 1}"),
    ({"align": 0}, f"d.align: expected an int in 1..{I31}, got 0"),
    ({"align": I31 + 1}, f"d.align: expected an int in 1..{I31}, got {I31 + 1}"),
    ({"tune": [-1]}, f"d.tune[0]: expected an int in 0..{I31}, got -1"),
    ({"tune": [I31 + 1]}, f"d.tune[0]: expected an int in 0..{I31}, got {I31 + 1}"),
    ({"tune": [1] * 4097}, "d.tune: 4097 entries, expected 0..4096"),
    ({"name": 1}, f"d.name: expected a string of at most {TEXT} characters, got 1"),
    ({"dynamic": 1}, "d.dynamic: expected true or false, got 1"),
    ({"span": {}}, "d.span: missing field `file`"),
    ({"spare": 1}, "d: unknown field `spare`"),
])
def test_a_damaged_dim_is_refused_by_its_path(edit: dict[str, Any], message: str) -> None:
    with refuses(message):
        DimDecl.from_data(_dim(**edit), "d")


def test_a_written_input_with_an_unknown_field_is_refused() -> None:
    with refuses("w: unknown field `spare`"):
        Written.from_data({"input": "k", "at": None, "rows": 1, "spare": 0}, "w", {})


def test_a_written_input_reads_its_offset_input_or_none() -> None:
    assert Written.from_data({"input": "k", "at": None, "rows": 3}, "w", {}) == \
        Written("k", None, 3)
    assert Written.from_data({"input": "k", "at": "pos", "rows": N}, "w", {"N": None}) == \
        Written("k", "pos", Written.from_data({"input": "k", "at": None, "rows": N}, "w",
                                              {"N": None}).rows)
    assert Written("k", "pos", 3).to_data() == {"input": "k", "at": "pos", "rows": 3}


@pytest.mark.parametrize(("edit", "message"), [
    ({"rows": 0}, f"w.rows: expected an int in 1..{TIB}, got 0"),
    ({"input": 1}, f"w.input: expected a string of at most {TEXT} characters, got 1"),
    ({"at": 1}, f"w.at: expected a string of at most {TEXT} characters, got 1"),
    ({"rows": N}, "w.rows.terms[0][0][0][0]: `N` is not a declared dim"),
])
def test_a_damaged_written_input_is_refused_by_its_path(edit: dict[str, Any],
                                                        message: str) -> None:
    with refuses(message):
        Written.from_data({"input": "k", "at": "pos", "rows": 1, **edit}, "w", {})


def _manifest(**edits: Any) -> dict[str, Any]:
    return {**payload()["manifest"], **edits}


def test_a_manifest_reads_and_writes_what_it_read() -> None:
    data = _manifest(metadata={"version": "1.0", "n": 2})
    m = Manifest.from_data(copy.deepcopy(data), _graph_record())
    assert (m.model, m.file, dict(m.metadata)) == ("m", "m.cgraph", {"version": "1.0", "n": 2})
    assert [x.name for x in m.inputs] == ["x"] and [x.name for x in m.params] == ["w"]
    assert [x.name for x in m.outputs] == ["y", "t", "s"]
    assert [d.name for d in m.dims] == ["N"] and m.buckets == ({"N": 2},) and m.written == ()
    assert m.to_data() == data


@pytest.mark.parametrize(("edit", "message"), [
    ({"spare": 1}, "manifest: unknown field `spare`"),
    ({"file": 1}, f"manifest.file: expected a string of at most {TEXT} characters, got 1"),
    ({"metadata": 1}, "manifest.metadata: expected a map, got 1"),
    ({"metadata": {"v": [1]}}, "manifest.metadata.v: expected a number, string, bool, none or "
     "list, got a list of 1"),
    ({"inputs": 1}, "manifest.inputs: expected a list, got 1"),
    ({"outputs": [1]}, "manifest.outputs[0]: expected a map, got 1"),
    ({"params": [_declared("w", [4], [0])]}, "manifest.params[0]: missing field `path`"),
    ({"inputs": [_declared("x", [N, 4], [0, 1], key="path")]},
     "manifest.inputs[0]: missing field `name`"),
    ({"dims": [1]}, "manifest.dims[0]: expected a map, got 1"),
    ({"buckets": [{"N": -1}]}, f"manifest.buckets[0].N: expected an int in 0..{I31}, got -1"),
    ({"buckets": 1}, "manifest.buckets: expected a list, got 1"),
    ({"written": [1]}, "manifest.written[0]: expected a map, got 1"),
    ({"written": 1}, "manifest.written: expected a list, got 1"),
    ({"inputs": []}, "manifest.inputs: the names differ from the graph's inputs"),
    ({"outputs": [_declared("y", [N, 4], [0, 1])]},
     "manifest.outputs: the names differ from the graph's outputs"),
    ({"params": []}, "manifest.params: the names differ from the graph's params"),
    ({"written": [{"input": "x", "at": None, "rows": 1}]},
     "manifest.written: the inputs written in place differ from the graph's"),
    ({"dims": [_dim(hi=9)]}, "manifest.dims[0]: dim `N` differs from the graph's"),
    ({"dims": [_dim(lo=2)]}, "manifest.dims[0]: dim `N` differs from the graph's"),
    ({"dims": [_dim(align=2)]}, "manifest.dims[0]: dim `N` differs from the graph's"),
    ({"dims": [_dim(dynamic=False)]}, "manifest.dims[0]: dim `N` differs from the graph's"),
    ({"dims": [_dim(name="M" * 50)]}, f"manifest.dims[0]: dim `{'M' * 40}` differs from the "
     "graph's"),
])
def test_a_manifest_that_does_not_describe_the_graph_is_refused(edit: dict[str, Any],
                                                                message: str) -> None:
    with refuses(message):
        Manifest.from_data(_manifest(**edit), _graph_record())


def test_a_manifest_metadata_value_may_be_any_scalar() -> None:
    data = _manifest(metadata={"a": None, "b": True, "c": 1.5, "d": "x"})
    assert dict(Manifest.from_data(data, _graph_record()).metadata) == \
        {"a": None, "b": True, "c": 1.5, "d": "x"}


def test_a_manifest_buckets_dim_may_be_zero() -> None:
    assert Manifest.from_data(_manifest(buckets=[{"N": 0}]), _graph_record()).buckets == \
        ({"N": 0},)


@pytest.mark.parametrize(("part", "index", "edit"), [
    ("inputs", 0, {"dtype": "f16"}),
    ("inputs", 0, {"shape": [N, 5]}),
    ("inputs", 0, {"layout": [1, 0]}),
    ("outputs", 2, {"dtype": "f16"}),
    ("params", 0, {"shape": [5]}),
])
def test_a_declared_value_unlike_its_node_is_refused(part: str, index: int,
                                                     edit: dict[str, Any]) -> None:
    data = _manifest()
    data[part][index].update(edit)
    name = data[part][index].get("name", data[part][index].get("path"))
    node = {"y": "h"}.get(name, name)
    with refuses(f"manifest.{part}[{index}]: `{name}` differs from its node `{node}` in the "
                 "graph"):
        Manifest.from_data(data, _graph_record())


def test_a_view_output_is_not_held_to_a_memory_order() -> None:
    data = _manifest()
    data["outputs"][1]["layout"] = [0, 1]  # t is a view: it has its base's order
    assert Manifest.from_data(data, _graph_record()).outputs[1].layout == (0, 1)


# -- the envelope ------------------------------------------------------------------------------
def _envelope(**edits: Any) -> bytes:
    body = msgpack.packb(payload(), use_bin_type=True)
    envelope = {"magic": "dslc-bundle", "schema_version": 1,
                "checksum": hashlib.sha256(body).hexdigest(), "payload": body, **edits}
    return bytes(msgpack.packb(envelope, use_bin_type=True))


def test_a_packed_bundle_is_the_documented_envelope() -> None:
    data = msgpack.unpackb(bundle.pack(payload()), raw=False)
    assert set(data) == {"magic", "schema_version", "checksum", "payload"}
    assert (data["magic"], data["schema_version"]) == ("dslc-bundle", 1)
    assert data["checksum"] == hashlib.sha256(data["payload"]).hexdigest()
    assert msgpack.unpackb(data["payload"], raw=False) == payload()
    assert bundle.pack(Bundle.from_data(payload())) == bundle.pack(Bundle.from_data(
        payload()).to_data())


def test_a_hand_written_envelope_reads_back() -> None:
    assert bundle.unpack_payload(_envelope()) == payload()
    assert bundle.unpack(_envelope(), "m").steps[1].name == "s"


@pytest.mark.parametrize(("data", "message"), [
    (_envelope(magic="dslc"), "`m` is not a dslc bundle (no `dslc-bundle` magic)"),
    (msgpack.packb([1]), "`m` is not a dslc bundle (no `dslc-bundle` magic)"),
    (_envelope(schema_version=2), "`m` has bundle schema 2; this dslc reads schema 1 "
     "(recompile the model)"),
    (_envelope(schema_version="1"), "`m` has bundle schema of an unknown kind; this dslc reads "
     "schema 1 (recompile the model)"),
    (_envelope(checksum="0" * 64), "`m` is corrupt (checksum mismatch): recompile or copy it "
     "again"),
    (_envelope(payload="x"), "`m` is corrupt (checksum mismatch): recompile or copy it again"),
    (_envelope(payload=msgpack.packb([1]), checksum=hashlib.sha256(msgpack.packb([1]))
               .hexdigest()), "`m` has a malformed payload (not a map)"),
    # msgpack's own error, said; one without a text (0xc1 is a reserved byte) by its type
    (b"\x01\x02", "`m` is not a dslc bundle (the file is not msgpack: unpack(b) received extra "
     "data.)"),
    (b"\xc1", "`m` is not a dslc bundle (the file is not msgpack: FormatError)"),
])
def test_a_damaged_envelope_is_refused_in_one_sentence(data: bytes, message: str) -> None:
    with refuses(message):
        bundle.unpack_payload(data, "`m`")


def test_a_payload_refused_by_its_records_names_the_source() -> None:
    data = payload()
    data["model"] = 1
    with refuses(f"`m` is not a valid bundle: model: expected a string of at most {TEXT} "
                 "characters, got 1"):
        bundle.unpack(bundle.pack(data), "`m`")


def _past_the_arena() -> dict[str, Any]:
    """A payload whose records read, but whose memory plan puts h (2 x 4 f32: 32 bytes) at the
    arena's end: only the bindings check (`schedule.check_buckets`) can tell."""
    data = payload()
    data["buckets"][0]["memory"]["offsets"]["h"] = 64
    return data


def test_a_memory_plan_past_its_arena_is_refused_unless_the_caller_checks_the_bindings() -> None:
    data = bundle.pack(_past_the_arena())
    assert bundle.unpack(data, "`m`", bindings=False).buckets[0].offsets["h"] == 64
    with refuses("`m` is not a valid bundle: buckets[0].memory.offsets.h: 64 + 32 bytes is "
                 "past the arena"):
        bundle.unpack(data, "`m`")


def test_a_bundle_file_reads_as_records_or_as_plain_data(tmp_path: Path) -> None:
    path = tmp_path / "m.bundle"
    path.write_bytes(bundle.pack(_past_the_arena()))
    assert bundle.load(path, bindings=False).buckets[0].offsets["h"] == 64
    with refuses(f"`{path}` is not a valid bundle: buckets[0].memory.offsets.h: 64 + 32 bytes "
                 "is past the arena"):
        bundle.load(path)
    path.write_bytes(bundle.pack(payload()))
    assert bundle.load(path).model == "m"
    assert bundle.read(path)["buckets"][0]["memory"] == \
        {"offsets": {"h": 0, "s": 32}, "arena_bytes": 64}


def test_a_path_that_is_no_bundle_file_is_refused_naming_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with refuses(f"cannot read `{tmp_path}` as a bundle: it is a folder, not a file"):
        bundle.load(tmp_path)
    with refuses(f"cannot read `{tmp_path / 'none'}`: No such file or directory"):
        bundle.load(tmp_path / "none")
    path = tmp_path / "m.bundle"
    path.write_bytes(b"x" * 11)
    monkeypatch.setattr(bundle, "MAX_BYTES", 10)
    with refuses(f"cannot read `{path}` as a bundle: larger than 10 bytes (11)"):
        bundle.load(path)
    path.write_bytes(b"\x01" * 10)  # at the limit: read, then refused as msgpack
    with refuses(f"`{path}` is not a dslc bundle (the file is not msgpack: unpack(b) received "
                 "extra data.)"):
        bundle.load(path)


def test_the_maps_and_lists_a_file_makes_are_counted_in_the_envelope_and_the_payload(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # the envelope is one map; the payload here a map holding one list and one map: three
    body = msgpack.packb({"a": [], "b": {}})
    envelope = msgpack.packb({"magic": "dslc-bundle", "schema_version": 1, "payload": body,
                              "checksum": hashlib.sha256(body).hexdigest()})
    monkeypatch.setattr(bundle, "MAX_CONTAINERS", 3)
    assert bundle.unpack_payload(envelope, "`m`") == {"a": [], "b": {}}
    monkeypatch.setattr(bundle, "MAX_CONTAINERS", 2)
    with refuses("`m` is not a dslc bundle (its payload holds more than 2 maps and lists)"):
        bundle.unpack_payload(envelope, "`m`")
    monkeypatch.setattr(bundle, "MAX_CONTAINERS", 0)
    with refuses("`m` is not a dslc bundle (the file holds more than 0 maps and lists)"):
        bundle.unpack_payload(envelope, "`m`")


def test_the_container_count_is_written_with_thousands_separators(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bundle, "MAX_CONTAINERS", 1000)
    with refuses("`m` is not a dslc bundle (the file holds more than 1,000 maps and lists)"):
        bundle.unpack_payload(msgpack.packb([[]] * 1000), "`m`")


def test_a_candidate_or_a_bundles_plan_missing_a_field_is_refused() -> None:
    with refuses("c: unknown field `speed`"):
        Candidate.from_data({"engine_id": 1, "knobs": {}, "speed": 1}, "c")
    with refuses("c: missing field `knobs`"):
        Candidate.from_data({"engine_id": 1}, "c")
    with refuses("p: missing field `workspace`"):
        PlanRecord.from_data({"engine_id": 1, "knobs": {}, "serialized": None}, "p")
    with refuses("p: missing field `serialized`"):
        PlanRecord.from_data({"engine_id": 1, "knobs": {}, "workspace": 0}, "p")


S = {"terms": [[[["S", 1]], 1, 1]]}  # the dim S, as data


def _cache_graph(extra: list[dict[str, Any]] | None = None,
                 outputs: list[list[str]] | None = None, cache: str = "c") -> GraphRecord:
    """c: [1, 1, 4, 2], n: [1, 1, S, 2], pos: i32[1]; k = cache_write(c, n, at=pos) (c written in
    place, S rows at pos); y = relu(k). (`cache` names c.)"""
    pos = _node("pos", "input", [], [1], [0], name="pos")
    pos["type"]["dtype"] = "i32"
    nodes = [_node(cache, "input", [], [1, 1, 4, 2], [0, 1, 2, 3], name=cache),
             _node("n", "input", [], [1, 1, S, 2], [0, 1, 2, 3], name="n"), pos,
             _node("k", "cache_write", [cache, "n", "pos"], [1, 1, 4, 2], [0, 1, 2, 3]),
             _node("y", "relu", ["k"], [1, 1, 4, 2], [0, 1, 2, 3]), *(extra or [])]
    return GraphRecord.from_data({"nodes": nodes, "outputs": outputs or [["y", "y"]],
                                  "floors": {}, "syms": {"S": [1, 2, 1]}})


def _cache_manifest(outputs: list[str] | None = None) -> dict[str, Any]:
    pos = _declared("pos", [1], [0])
    pos["dtype"] = "i32"
    return {"model": "m", "file": "m.cgraph", "metadata": {},
            "inputs": [_declared("c", [1, 1, 4, 2], [0, 1, 2, 3]),
                       _declared("n", [1, 1, S, 2], [0, 1, 2, 3]), pos],
            "outputs": [_declared(o, [1, 1, 4, 2], [0, 1, 2, 3]) for o in outputs or ["y"]],
            "params": [], "dims": [_dim(name="S", lo=1, hi=2, tune=[1])], "buckets": [{"S": 1}],
            "written": [{"input": "c", "at": "pos", "rows": S}]}


def test_an_input_written_in_place_is_named_with_its_offset_input_and_rows() -> None:
    m = Manifest.from_data(_cache_manifest(), _cache_graph())
    assert [w.to_data() for w in m.written] == [{"input": "c", "at": "pos", "rows": S}]
    assert m.to_data()["written"] == [{"input": "c", "at": "pos", "rows": S}]



def test_a_write_at_a_computed_offset_names_no_offset_input(tmp_path: Path) -> None:
    """`at` is an input's name only where the offset is an input; `pos + 1` is computed
    (the runner cannot take it as an argument): None."""
    from dslc.runtime.manifest import written_inputs
    from tests.helpers import check_source

    graph = check_source("""model m {
  input c: [1, 1, 4, 2]
  input n: [1, 1, 1, 2]
  input pos: i32[1]
  output y = relu(cache_write(c, n, pos + 1))
}""", tmp_path).model.graph
    assert written_inputs(graph) == (Written("c", None, 1),)

@pytest.mark.parametrize(("written", "message"), [
    ([], "manifest.written: the inputs written in place differ from the graph's"),
    ([{"input": "c", "at": None, "rows": S}],
     "manifest.written: the inputs written in place differ from the graph's"),
    ([{"input": "n", "at": "pos", "rows": S}],
     "manifest.written: the inputs written in place differ from the graph's"),
    ([{"input": "c", "at": "pos", "rows": 1}],
     "manifest.written: the inputs written in place differ from the graph's"),
])
def test_a_manifest_unlike_the_graphs_writes_is_refused(written: list[Any], message: str) -> None:
    data = _cache_manifest()
    data["written"] = written
    with refuses(message):
        Manifest.from_data(data, _cache_graph())


def test_an_input_written_in_place_and_read_elsewhere_is_refused() -> None:
    z = _node("z", "relu", ["c"], [1, 1, 4, 2], [0, 1, 2, 3])
    with refuses("manifest.written[0]: input `c` is written in place and read by something "
                 "else too"):
        Manifest.from_data(_cache_manifest(["y", "z"]),
                           _cache_graph([z], [["y", "y"], ["z", "z"]]))


def test_an_input_written_in_place_and_exported_is_refused() -> None:
    with refuses("manifest.written[0]: input `c` is written in place and read by something "
                 "else too"):
        Manifest.from_data(_cache_manifest(["y", "c"]), _cache_graph(None, [["y", "y"],
                                                                            ["c", "c"]]))


def test_a_manifests_sentences_quote_forty_characters_of_a_name() -> None:
    """The manifest's checks quote 40 characters of each name (the schedule's, 60)."""
    long, shown = "c" * 70, "c" * 40
    z = _node("z", "relu", [long], [1, 1, 4, 2], [0, 1, 2, 3])
    data = _renamed(_cache_manifest(["y", "z"]), "c", long)
    with refuses(f"manifest.written[0]: input `{shown}` is written in place and read by "
                 "something else too"):
        Manifest.from_data(data, _cache_graph([z], [["y", "y"], ["z", "z"]], cache=long))
    data = _renamed(_cache_manifest(), "c", long)
    data["inputs"][0]["dtype"] = "f16"
    with refuses(f"manifest.inputs[0]: `{shown}` differs from its node `{shown}` in the graph"):
        Manifest.from_data(data, _cache_graph(cache=long))


def test_a_serialized_plan_that_is_no_text_survives_packing() -> None:
    data = payload()
    data["buckets"][0]["graphs"]["sig-s"]["plan"]["serialized"] = b"\xff\x00"  # not UTF-8
    read = bundle.unpack(bundle.pack(data), "`m`")
    assert read.buckets[0].graphs["sig-s"].plan.serialized == b"\xff\x00"


def _renamed(data: Any, old: str, new: str) -> Any:
    """`data` with every string (value or key) that is `old` made `new`."""
    if isinstance(data, dict):
        return {_renamed(k, old, new): _renamed(v, old, new) for k, v in data.items()}
    if isinstance(data, list):
        return [_renamed(x, old, new) for x in data]
    return new if data == old else data


LONG = "q" * 70  # a name past the 60 characters a schedule's sentence quotes
SHOWN = "q" * 60


@pytest.mark.parametrize(("old", "edit", "message"), [
    ("x", lambda p: p.update(load_time=[LONG]),
     f"load_time[0]: `{SHOWN}` is not computed from params alone"),
    ("h", lambda p: [s.update(name=LONG) for s in p["steps"]],
     f"steps[1].name: `{SHOWN}` names an earlier step too"),
    ("v", lambda p: p.update(load_time=["w"]),
     f"steps[0].inputs: `{SHOWN}` is read before a step writes it"),
    ("s", lambda p: p["steps"].pop(), f"graph.outputs: output `{SHOWN}` is never written"),
])
def test_a_schedules_sentence_quotes_sixty_characters_of_a_name(old: str, edit: Any,
                                                                message: str) -> None:
    data = _renamed(payload(), old, LONG)
    edit(data)
    with refuses(message):
        Bundle.from_data(data)


def test_a_step_that_writes_a_view_is_refused() -> None:
    data = _renamed(payload(), "t", LONG)
    data["steps"].append({"kind": "kernel", "name": "t", "pattern": "single", "nodes": [LONG],
                          "inputs": ["h"], "outputs": [LONG], "signature": "", "reason": ""})
    with refuses(f"steps[2].outputs: `{SHOWN}` is a view, not a stored value"):
        Bundle.from_data(data)


def test_a_scalar_is_there_for_every_step_without_being_loaded() -> None:
    data = payload()
    c = _node("c", "scalar", [], [], [], value=2.0)
    data["graph"]["nodes"][-1:] = [c, _node("s", "mul", ["x", "c"], [N, 4], [0, 1])]
    data["steps"][1]["inputs"] = ["x", "c"]
    spec = data["buckets"][0]["graphs"]["sig-s"]["spec"]
    spec["tensors"][1:1] = [{"name": "c", "uid": 3, "dims": [1, 1], "strides": [1, 1],
                             "dtype": "f32", "role": "scalar", "value": 2.0}]
    spec["ops"] = [{"node": "s", "op": "mul", "inputs": ["x", "c"], "attrs": {},
                    "compute": "f32"}]
    assert Bundle.from_data(data).steps[1].inputs == ("x", "c")


def test_an_envelope_with_an_integer_key_is_still_read() -> None:
    body = msgpack.packb(payload(), use_bin_type=True)
    envelope = msgpack.packb({"magic": "dslc-bundle", "schema_version": 1, 7: "spare",
                              "checksum": hashlib.sha256(body).hexdigest(), "payload": body},
                             use_bin_type=True)
    assert bundle.unpack_payload(envelope)["model"] == "m"


def test_an_unnamed_source_is_called_the_bundle() -> None:
    with refuses("the bundle is not a dslc bundle (the file is not msgpack: FormatError)"):
        bundle.unpack_payload(b"\xc1")
    with refuses("the bundle is not a dslc bundle (the file is not msgpack: FormatError)"):
        bundle.unpack(b"\xc1")
    data = payload()
    data["model"] = 1
    with refuses(f"the bundle is not a valid bundle: model: expected a string of at most {TEXT} "
                 "characters, got 1"):
        bundle.unpack(bundle.pack(data))


def test_a_payload_nested_past_pythons_recursion_limit_is_refused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def deep(data: Any) -> Bundle:
        raise RecursionError("maximum recursion depth exceeded")
    monkeypatch.setattr(bundle.Bundle, "from_data", deep)
    with refuses("`m` is not a valid bundle: nested too deep"):
        bundle.unpack(bundle.pack(payload()), "`m`")


def _kernel(nodes: list[str], inputs: list[str], outputs: list[str]) -> dict[str, Any]:
    return {"kind": "kernel", "name": "k", "pattern": "single", "nodes": nodes,
            "inputs": inputs, "outputs": outputs, "signature": "", "reason": ""}


def test_a_kernel_step_of_one_op_is_read_whatever_the_op() -> None:
    nodes = _cache_graph().graph.by_name()
    step = StepRecord.from_data(_kernel(["k"], ["c", "n", "pos"], ["k"]), "step", nodes)
    assert (step.kind, step.nodes) == ("kernel", ("k",))


def test_a_kernel_step_of_pointwise_ops_is_read_and_of_others_refused() -> None:
    step = _read_step(_kernel(["h.relu", "h"], ["x", "v"], ["h"]))
    assert step.nodes == ("h.relu", "h")
    nodes = _cache_graph().graph.by_name()
    with refuses("step.nodes: not ops one fallback kernel computes: `cache_write` has no "
                 "expression in one pointwise kernel"):
        StepRecord.from_data(_kernel(["k", "y"], ["c", "n", "pos"], ["y"]), "step", nodes)


def _matmul_nodes(dtype: str) -> dict[str, Any]:
    """m = x @ w ([N, 4] @ [4, 4]) and r = relu(m), all of `dtype`."""
    nodes = [_node("x", "input", [], [N, 4], [0, 1], name="x"),
             _node("w", "param", [], [4, 4], [0, 1], path="w"),
             _node("m", "matmul", ["x", "w"], [N, 4], [0, 1]),
             _node("r", "relu", ["m"], [N, 4], [0, 1])]
    for n in nodes:
        n["type"]["dtype"] = dtype
    graph = GraphRecord.from_data({"nodes": nodes, "outputs": [["r", "r"]], "floors": {},
                                   "syms": {"N": [1, 8, 1]}})
    return graph.graph.by_name()


def test_a_kernel_step_of_a_half_precision_matmul_and_its_epilogue_is_read() -> None:
    step = StepRecord.from_data(_kernel(["m", "r"], ["x", "w"], ["r"]), "step",
                                _matmul_nodes("f16"))
    assert step.nodes == ("m", "r")


def test_a_kernel_step_of_an_f32_matmul_is_refused_with_the_matmul_kernels_reason() -> None:
    with refuses("step.nodes: not ops one fallback kernel computes: its matmul is no f16 or "
                 "bf16 product with a 2-d weight"):
        StepRecord.from_data(_kernel(["m", "r"], ["x", "w"], ["r"]), "step",
                             _matmul_nodes("f32"))


@pytest.mark.parametrize(("field", "message"), [
    ("graph", "graph: expected a map, got 1"),
    ("steps", "steps: expected a list, got 1"),
    ("buckets", "buckets: expected a list, got 1"),
    ("load_time", "load_time: expected a list, got 1"),
    ("manifest", "manifest: expected a map, got 1"),
])
def test_a_payload_part_of_the_wrong_kind_is_refused_by_its_name(field: str,
                                                                 message: str) -> None:
    data = payload()
    data[field] = 1
    with refuses(message):
        Bundle.from_data(data)


def test_a_calibration_reads_back_and_is_written_with_the_payload() -> None:
    data = payload()
    data["calibration"] = {"amax": {}, "samples": 3, "data": "a" * 64, "weights": "b" * 64}
    b = Bundle.from_data(copy.deepcopy(data))
    assert b.calibration == Calibration({}, 3, "a" * 64, "b" * 64)
    assert b.to_data()["calibration"] == data["calibration"]
    assert "calibration" not in Bundle.from_data(payload()).to_data()
