"""What a bundle reader checks in a tuned plan's candidates and in a bucket (written for the
survivors of the `bundle` mutation group): a tuned bundle's candidates read back as written
and each damaged one named by its field; a bucket's dims, key, graph signatures and memory
plan held to the model. Deviceless bundles hold no candidates (only tuning on a GPU writes
them), so they are added to a deviceless payload here, as `dslc tune` would write them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dslc.runtime import bundle
from dslc.runtime.records import Candidate
from tests.test_bundle_hostile import payload, refused, write


def _tuned(data: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    sig, entry = next(iter(data["buckets"][0]["graphs"].items()))
    entry["plan"]["heuristic"] = {"engine_id": 41, "knobs": {"TILE": 3}, "ms": 0.0125}
    entry["plan"]["top"] = [{"engine_id": 41, "knobs": {"TILE": 3}, "ms": 0.0125},
                            {"engine_id": 7, "knobs": {}, "ms": 0.02, "error": 1.5e-3}]
    return sig, entry


def test_a_tuned_plans_candidates_read_back_as_written(tmp_path: Path) -> None:
    data = payload("mlp")
    sig, _ = _tuned(data)
    plan = bundle.load(write(tmp_path, data)).buckets[0].graphs[sig].plan
    assert plan.heuristic == Candidate(41, {"TILE": 3}, 0.0125)
    assert plan.top == (Candidate(41, {"TILE": 3}, 0.0125), Candidate(7, {}, 0.02, 1.5e-3))
    assert [c.to_data() for c in plan.top] == data["buckets"][0]["graphs"][sig]["plan"]["top"]


@pytest.mark.parametrize(("edit", "message"), [
    (lambda c: c.pop("engine_id"), "top[1]: missing field `engine_id`"),
    (lambda c: c.pop("knobs"), "top[1]: missing field `knobs`"),
    (lambda c: c.update(speed=1), "top[1]: unknown field `speed`"),
    (lambda c: c.update(engine_id=-1), "top[1].engine_id: expected an int in 0..2147483647"),
    (lambda c: c.update(knobs={"TILE": "x"}), "top[1].knobs"),
    (lambda c: c.update(ms="fast"), "top[1].ms"),
    (lambda c: c.update(error="small"), "top[1].error"),
])
def test_a_damaged_candidate_is_refused_naming_its_field(edit: Any, message: str,
                                                         tmp_path: Path) -> None:
    data = payload("mlp")
    sig, entry = _tuned(data)
    edit(entry["plan"]["top"][1])
    refused(write(tmp_path, data), f"buckets[0].graphs.{sig}.plan.{message}")


def test_a_candidate_without_a_time_reads_as_unmeasured(tmp_path: Path) -> None:
    data = payload("mlp")
    sig, entry = _tuned(data)
    del entry["plan"]["heuristic"]["ms"]
    plan = bundle.load(write(tmp_path, data)).buckets[0].graphs[sig].plan
    assert plan.heuristic == Candidate(41, {"TILE": 3}, None)


def test_a_bucket_whose_dims_do_not_fit_the_model_is_refused(tmp_path: Path) -> None:
    data = payload("mlp")
    data["buckets"][0]["dims"]["Q"] = 4
    refused(write(tmp_path, data), "buckets[0].dims.Q: 4 is not a value of a dim")
    data = payload("mlp")
    del data["buckets"][0]["dims"]["N"]
    refused(write(tmp_path, data), "buckets[0].dims: not a value for every dim of the model")
    data = payload("mlp")
    data["buckets"][0]["dims"]["N"] = 0
    refused(write(tmp_path, data), "buckets[0].dims.N")


def test_a_bucket_key_that_does_not_name_its_dims_is_refused(tmp_path: Path) -> None:
    data = payload("mlp")
    data["buckets"][0]["key"] = "N=999"
    refused(write(tmp_path, data), "buckets[0].key: `N=999` does not name its dims")


def test_a_bucket_graph_under_a_signature_no_step_has_is_refused(tmp_path: Path) -> None:
    data = payload("mlp")
    graphs = data["buckets"][0]["graphs"]
    sig = next(iter(graphs))
    graphs["nosuchsignature"] = graphs.pop(sig)
    refused(write(tmp_path, data), "buckets[0].graphs.nosuchsignature: not the signature of a "
            "graph step")


def test_a_bucket_graph_whose_spec_names_another_signature_is_refused(tmp_path: Path) -> None:
    data = payload("mlp")
    graphs = data["buckets"][0]["graphs"]
    first, second = list(graphs)[:2]
    graphs[first]["spec"], graphs[second]["spec"] = graphs[second]["spec"], graphs[first]["spec"]
    refused(write(tmp_path, data), f"buckets[0].graphs.{first[:40]}.spec")


def test_a_memory_plan_naming_no_node_or_a_negative_arena_is_refused(tmp_path: Path) -> None:
    data = payload("mlp")
    data["buckets"][0]["memory"]["offsets"]["nosuchnode"] = 0
    refused(write(tmp_path, data), "buckets[0].memory.offsets")
    data = payload("mlp")
    data["buckets"][0]["memory"]["arena_bytes"] = -1
    refused(write(tmp_path, data), "buckets[0].memory.arena_bytes")
    data = payload("mlp")
    data["buckets"][0]["memory"]["spare"] = 0
    refused(write(tmp_path, data), "buckets[0].memory: unknown field `spare`")
