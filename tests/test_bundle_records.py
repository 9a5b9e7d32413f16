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
from dslc.runtime.records import BundleError, Candidate, PlanRecord
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


@pytest.mark.parametrize(("edit", "message"), [
    (lambda b: b["dims"].update(Q=4), "buckets[0].dims.Q: 4 is not a value of a dim"),
    (lambda b: b["dims"].pop("N"), "buckets[0].dims: not a value for every dim of the model"),
    (lambda b: b["dims"].update(N=0), "buckets[0].dims.N"),
    (lambda b: b.update(key="N=999"), "buckets[0].key: `N=999` does not name its dims"),
    # a key is shown up to 40 characters
    (lambda b: b.update(key="N=" + "9" * 60), f"buckets[0].key: `N={'9' * 38}` does not name its dims"),
    (lambda b: b.update(extra=1), "buckets[0]: unknown field `extra`"),
    (lambda b: b["memory"]["offsets"].update(nosuchnode=0), "buckets[0].memory.offsets"),
    (lambda b: b["memory"].update(arena_bytes=-1), "buckets[0].memory.arena_bytes"),
    # past any GPU: would reach cupy.empty
    (lambda b: b["memory"].update(arena_bytes=2**50),
     "buckets[0].memory.arena_bytes: expected an int in"),
    (lambda b: b["memory"].update(spare=0), "buckets[0].memory: unknown field `spare`"),
])
def test_a_bucket_that_does_not_fit_the_model_is_refused_naming_its_field(
        edit: Any, message: str, tmp_path: Path) -> None:
    data = payload("mlp")
    edit(data["buckets"][0])
    refused(write(tmp_path, data), message)


def test_an_unknown_field_of_a_bucket_graph_is_refused(tmp_path: Path) -> None:
    data = payload("mlp")
    sig, entry = next(iter(data["buckets"][0]["graphs"].items()))
    entry["extra"] = 1
    refused(write(tmp_path, data), f"buckets[0].graphs.{sig[:40]}: unknown field `extra`")


def test_a_bucket_graph_under_a_signature_no_step_has_is_refused(tmp_path: Path) -> None:
    data = payload("mlp")
    graphs = data["buckets"][0]["graphs"]
    sig = next(iter(graphs))
    graphs["nosuchsignature"] = graphs.pop(sig)
    refused(write(tmp_path, data), "buckets[0].graphs.nosuchsignature: not the signature of a "
            "step")
    graphs["s" * 60] = graphs.pop("nosuchsignature")  # named up to 40 characters
    refused(write(tmp_path, data), f"buckets[0].graphs.{'s' * 40}: not the signature")


def test_a_bucket_graph_whose_spec_names_another_signature_is_refused(tmp_path: Path) -> None:
    data = payload("mlp")
    graphs = data["buckets"][0]["graphs"]
    first, second = list(graphs)[:2]
    graphs[first]["spec"], graphs[second]["spec"] = graphs[second]["spec"], graphs[first]["spec"]
    refused(write(tmp_path, data),
            f"buckets[0].graphs.{first[:40]}.spec.signature: differs from the graph's key")


def test_a_plan_reads_back_every_field_tuning_wrote(tmp_path: Path) -> None:
    data = payload("mlp")
    sig, entry = _tuned(data)
    entry["plan"].update(ms=0.0125, error=2e-3, tune_s=1.5, reused=True, made_at_startup="N=16")
    plan = bundle.load(write(tmp_path, data)).buckets[0].graphs[sig].plan
    assert (plan.ms, plan.error, plan.tune_s, plan.reused, plan.made_at_startup) == \
        (0.0125, 2e-3, 1.5, True, "N=16")


def test_a_plan_with_an_unknown_field_or_an_engine_past_cudnns_ids_is_refused(
        tmp_path: Path) -> None:
    data = payload("mlp")
    sig, entry = _tuned(data)
    entry["plan"]["speed"] = 1
    refused(write(tmp_path, data), f"buckets[0].graphs.{sig}.plan: unknown field `speed`")
    data = payload("mlp")
    sig, entry = _tuned(data)
    entry["plan"]["engine_id"] = 2**32
    refused(write(tmp_path, data), f"buckets[0].graphs.{sig}.plan.engine_id: expected an int "
            "in 0..2147483647")


def test_a_tuning_database_entry_needs_only_the_engine_and_its_knobs() -> None:
    entry = {"engine_id": 3, "knobs": {"TILE": 2}}
    plan = PlanRecord.from_data(entry, "entry", tuning=True)
    assert (plan.engine_id, dict(plan.knobs), plan.workspace, plan.serialized) == \
        (3, {"TILE": 2}, 0, None)
    with pytest.raises(BundleError, match="entry: missing field `workspace`"):
        PlanRecord.from_data(entry, "entry")
    with pytest.raises(BundleError, match="entry: missing field `knobs`"):
        PlanRecord.from_data({"engine_id": 3}, "entry", tuning=True)
