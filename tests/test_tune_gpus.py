"""Tuning across the GPUs of a host (`dslc.tune.gpus`, `--gpus`): the distinct graphs are spread
over one process per GPU, one key's graphs on one GPU, the shares even; the results merge into
one set of plans the bundle takes; two kinds of GPU, or a worker that fails, are one sentence.

There is no GPU here nor in CI, so the measuring is a fake backend (`fake_share`, in place of
`tune_share`, which runs `tune` on its GPU): it returns, for each job of its share, a plan
naming the GPU that measured it, and publishes it to the shared tuning database. The processes
(spawned, as on a GPU machine), the spreading, the pickled bundle and store, and the merging
are the real ones. On a machine with two GPUs, `dslc tune BUNDLE --gpus all` runs it for real.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from dslc.backend.spec import GroupSpec
from dslc.backend.target import load_target
from dslc.compile.stage import compile_model
from dslc.diag.diagnostic import Sink
from dslc.emit import bundle as emit_bundle
from dslc.emit.bundle import records
from dslc.pipeline import Options, front_end, lower_and_fuse
from dslc.runtime.bundle import load
from dslc.runtime.records import Bundle, Environment
from dslc.runtime.tuningdb import measured, spec_key
from dslc.runtime.tuningdb.sqlite import SQLiteStore
from dslc.tune import Report, Row, Tuned, tuned_bundle
from dslc.tune.gpus import Share, SpreadError, across, cost, parse_gpus, spread, visible
from tests.conftest import ROOT
from tests.helpers import run_cli

FAKE_GPU = Environment(device_name="Fake GPU", compute_capability="9.0", sm_count=132,
                       cudnn_backend=91900, cudnn_frontend="1.32.0", live=True)


@pytest.fixture(scope="module")
def bundle() -> Bundle:
    """resnet18 over all its buckets, compiled deviceless: 3 sizes of its distinct graphs."""
    result = front_end(ROOT / "models" / "resnet18.cgraph", Options(), Sink())
    assert result.model is not None
    lowered, plan = lower_and_fuse(result.model)
    return records(compile_model(result.model, lowered, plan, load_target("h200")))


def keys_of(bundle: Bundle) -> dict[tuple[str, str], str]:
    return {(b.key, sig): spec_key(GroupSpec.from_data(e.spec.to_data()))
            for b in bundle.buckets for sig, e in b.graphs.items()}


def fake_share(bundle: Bundle, share: Share) -> Tuned:
    """The fake measuring backend: a plan per job, as if measured on `share.gpu`."""
    keys = keys_of(bundle)
    plans, rows = {}, []
    for b in bundle.buckets:
        for sig, entry in b.graphs.items():
            if (b.key, sig) not in share.jobs:
                continue
            plan = replace(entry.plan, engine_id=share.gpu, ms=0.1 + share.gpu, error=1e-3,
                           tuned=True, serialized=b"fake plan")
            plans[(b.key, sig)] = plan
            rows.append(Row(b.key, sig, sig, 0.2, plan.ms, 1e-3, "tuned", 3, share.gpu))
            if share.db is not None:
                share.db.put("fake env", keys[(b.key, sig)], measured(plan))
    env = FAKE_GPU if share.gpu != 7 else replace(FAKE_GPU, device_name="Another Fake GPU")
    return Tuned(plans, env, Report(rows))


def broken_share(bundle: Bundle, share: Share) -> Tuned:
    if share.gpu == 1:
        raise RuntimeError("CUDA error: out of memory")
    return fake_share(bundle, share)


@pytest.mark.parametrize("text, count, want", [
    ("all", 4, [0, 1, 2, 3]), ("0,1", 2, [0, 1]), ("3, 1", 4, [3, 1]), ("all", None, None),
    ("2", None, [2]),
])
def test_gpus_named(text: str, count: int | None, want: list[int] | None) -> None:
    assert parse_gpus(text, count) == want


@pytest.mark.parametrize("text, count, words", [
    ("0,0", 2, "names a GPU twice"), ("one", 2, "write `all` or GPU numbers"),
    ("2", 2, "there is no GPU 2 here (this machine has 2: 0..1)"), ("all", 0, "no GPU"),
    ("-1", 2, "there is no GPU -1"),
])
def test_gpus_that_are_not_here_are_one_sentence(text: str, count: int, words: str) -> None:
    with pytest.raises(SpreadError) as err:
        parse_gpus(text, count)
    assert words in str(err.value)


def test_the_distinct_graphs_are_spread_evenly_one_key_on_one_gpu(bundle: Bundle) -> None:
    keys = keys_of(bundle)
    shares = spread(bundle, [0, 1, 2])
    jobs = [job for share in shares.values() for job in share]
    assert sorted(jobs) == sorted(keys)  # every job once
    gpu_of_key: dict[str, set[int]] = {}
    for gpu, share in shares.items():
        for job in share:
            gpu_of_key.setdefault(keys[job], set()).add(gpu)
    assert all(len(g) == 1 for g in gpu_of_key.values())  # each key measured on one GPU only
    costs = {keys[(b.key, s)]: cost(GroupSpec.from_data(e.spec.to_data()))
             for b in bundle.buckets for s, e in b.graphs.items()}
    load = {gpu: sum(costs[k] for k in {keys[j] for j in share}) for gpu, share in shares.items()}
    assert max(load.values()) - min(load.values()) <= max(costs.values())  # even, within a key
    assert spread(bundle, [0, 1, 2]) == shares  # the same on every run
    assert set(spread(bundle, [5])) == {5} and spread(bundle, [5])[5] == frozenset(keys)


def test_across_gpus_each_graph_is_measured_once_and_the_plans_merge(
        bundle: Bundle, tmp_path: Path) -> None:
    db = SQLiteStore(tmp_path / "tuning.db")
    shares = spread(bundle, [0, 1])
    tuned = across(bundle, [0, 1], db, 1.0, 60.0, "heuristics", work=fake_share)
    assert set(tuned.plans) == set(keys_of(bundle))
    for job, plan in tuned.plans.items():  # from the one process that measured it
        assert plan.engine_id == next(g for g, share in shares.items() if job in share)
    order = [(b.key, s) for b in bundle.buckets for s in b.graphs]
    assert [(r.bucket, r.signature) for r in tuned.report.rows] == order
    assert {r.gpu for r in tuned.report.rows} == {0, 1} and tuned.environment == FAKE_GPU
    assert db.size() == len(set(keys_of(bundle).values()))  # both published to one database
    out = tmp_path / "tuned.bundle"
    emit_bundle.write(out, tuned_bundle(bundle, tuned))  # what the bundle takes, validated
    again = load(out)
    assert again.environment == FAKE_GPU
    assert {e.plan.engine_id for b in again.buckets for e in b.graphs.values()} == {0, 1}


def test_two_kinds_of_gpu_cannot_go_into_one_bundle(bundle: Bundle) -> None:
    with pytest.raises(SpreadError, match=r"GPUs 0 and 7 differ \(Fake GPU with cuDNN 91900; "
                                          r"Another Fake GPU with cuDNN 91900\)"):
        across(bundle, [0, 7], None, 1.0, 60.0, "heuristics", work=fake_share, context="fork")


def test_a_worker_that_fails_is_named(bundle: Bundle) -> None:
    with pytest.raises(SpreadError, match="tuning failed on GPU 1: RuntimeError: CUDA error: "
                                          "out of memory"):
        across(bundle, [0, 1], None, 1.0, 60.0, "heuristics", work=broken_share,
               context="fork")


def test_gpus_on_the_command_line(tmp_path: Path) -> None:
    assert run_cli("compile", "models/mlp.cgraph", "-o", str(tmp_path), "-q").code == 0
    path = str(tmp_path / "mnist_mlp.bundle")
    run = run_cli("compile", "models/mlp.cgraph", "-o", str(tmp_path / "b"), "--gpus", "0,x")
    assert run.code == 2 and "`--gpus 0,x`: write `all` or GPU numbers" in run.stderr
    run = run_cli("tune", path, "--gpus", "all")  # this machine has no GPU
    assert run.code == 3 and "R0801" in run.stderr and "Traceback" not in run.stderr


def test_a_worker_sees_only_its_gpu_numbered_as_the_parent_sees_them() -> None:
    assert [visible(g, None) for g in (0, 1)] == ["0", "1"]
    assert [visible(g, "2,3") for g in (0, 1)] == ["2", "3"]  # a scheduler gave us 2 and 3
    assert visible(1, "GPU-5f3c, GPU-77aa") == "GPU-77aa" and visible(0, "") == "0"
