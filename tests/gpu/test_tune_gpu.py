"""Tuning and start-up on the GPU: a tuned bundle is correct and never slower than the
heuristics' choice beyond noise; one case per start-up decision path, simulated by editing the
recorded environment, each taken, logged and still matching the reference; the tuning database
serves a second build; a size between buckets runs correctly, built on first use."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dslc.backend.measure import FIRST, NOISE
from dslc.core.errors import RunnerError
from dslc.emit import bundle as emit_bundle
from dslc.runtime.bundle import load, read
from dslc.runtime.tuningdb.sqlite import SQLiteStore
from dslc.tune import tune, tuned_bundle
from tests.conftest import ROOT
from tests.gpu.common import TOLERANCE, compile_file, random_inputs, reference, rel_error, to_device, to_host

pytestmark = pytest.mark.gpu

BUCKET = {"N": 16}


@pytest.fixture(scope="module")
def tuned(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    outdir = tmp_path_factory.mktemp("tuned")
    bundle = compile_file(ROOT / "models" / "mlp.cgraph", outdir, BUCKET)
    records = load(bundle)
    done = tune(records, SQLiteStore(outdir / "tuning.db"), budget_s=3.0)
    emit_bundle.write(bundle, tuned_bundle(records, done))
    return bundle, done.report


def _run(bundle: Path, inputs: dict[str, np.ndarray], **options: Any) -> tuple[Any, dict]:
    from dslc.runtime import Model

    options.setdefault("tuning_db", None)  # each decision path as it is without a database
    model = Model(bundle, bundle.with_suffix(".safetensors"), **options)
    return model, to_host(model.run(to_device(inputs, bundle)))


def _check(bundle: Path, outputs: dict[str, np.ndarray], inputs: dict[str, np.ndarray]) -> None:
    for name, want in reference(bundle, inputs).items():
        assert rel_error(outputs[name], want) <= TOLERANCE["f16"], name


def test_tuned_plans_are_correct_and_not_slower(tuned: tuple[Path, Any]) -> None:
    bundle, report = tuned
    assert report.rows and all(r.source == "tuned" for r in report.rows)
    assert all(r.candidates <= FIRST for r in report.rows)  # the heuristics' first FIRST
    for r in report.rows:
        print(f"{r.group}: heuristic {r.heuristic_ms:.4f} ms, tuned {r.tuned_ms:.4f} ms, "
              f"error {r.error:.1e}, {r.candidates} candidates")
        assert r.tuned_ms <= r.heuristic_ms * (1 + NOISE)
    plan = next(iter(read(bundle)["buckets"][0]["graphs"].values()))["plan"]
    assert plan["tuned"] and plan["top"] and plan["heuristic"]["ms"] > 0
    inputs = random_inputs(bundle, BUCKET, seed=11)
    _check(bundle, _run(bundle, inputs)[1], inputs)


def _edited(tuned: Path, tmp: Path, env: dict[str, Any], corrupt: bool = False) -> Path:
    payload = read(tuned)
    payload["environment"] = {**payload["environment"], **env}
    if corrupt:  # a plan that will not deserialize: start-up must fall back to the engine id
        for bucket in payload["buckets"]:
            for entry in bucket["graphs"].values():
                entry["plan"]["serialized"] = b"not a plan"
    bundle = tmp / tuned.name
    emit_bundle.write(bundle, payload)
    (tmp / tuned.with_suffix(".safetensors").name).write_bytes(
        tuned.with_suffix(".safetensors").read_bytes())
    return bundle


CASES = [  # edit to the recorded environment, policy, decision, how each plan was made
    ({}, "retune", "restore", "restored", False),
    ({"cudnn_backend": 1}, "retune", "replay", "replayed", True),
    ({"driver": 1}, "retune", "retime", "retimed", False),
    ({"device_name": "Another GPU"}, "retune", "retune", "retuned", False),
    ({"device_name": "Another GPU"}, "heuristic", "heuristic", "heuristics", False),
]


@pytest.mark.parametrize("env,policy,action,how,corrupt", CASES,
                         ids=[c[2] if c[1] == "retune" else f"policy-{c[1]}" for c in CASES])
def test_startup_decision_path(tuned: tuple[Path, Any], tmp_path: Path,
                               caplog: pytest.LogCaptureFixture, env: dict, policy: str,
                               action: str, how: str, corrupt: bool) -> None:
    bundle = _edited(tuned[0], tmp_path, env, corrupt)
    inputs = random_inputs(bundle, BUCKET, seed=12)
    with caplog.at_level(logging.INFO, logger="dslc.runtime"):
        start = time.perf_counter()
        model, outputs = _run(bundle, inputs, on_mismatch=policy)
        seconds = time.perf_counter() - start
    print(f"{action}: {model.decision().explain()}; {seconds:.2f} s")
    assert model.decision().action == action
    assert {s["how"] for s in model.startup} == {how}
    assert f"start-up of {read(bundle)['model']}" in caplog.text
    _check(bundle, outputs, inputs)


def test_a_changed_gpu_takes_the_databases_plans_before_measuring(
        tuned: tuple[Path, Any], tmp_path: Path) -> None:
    """The database the fixture's tuning filled holds this GPU's plans, serialized under this
    driver: start-up restores them from their bytes, as fast as a bundle's own restore, and
    measures nothing (`dslc.runtime.fleet`)."""
    bundle = _edited(tuned[0], tmp_path, {"device_name": "Another GPU"})
    inputs = random_inputs(bundle, BUCKET, seed=16)
    restored, _ = _run(tuned[0], inputs)
    start = time.perf_counter()
    model, outputs = _run(bundle, inputs, tuning_db=str(tuned[0].parent / "tuning.db"))
    plans_s = sum(s["seconds"] for s in model.startup)
    restore_s = sum(s["seconds"] for s in restored.startup)
    print(f"retune from the database: {time.perf_counter() - start:.2f} s, plans {plans_s:.4f} s "
          f"against a bundle's restore {restore_s:.4f} s")
    assert model.decision().action == "retune"
    assert {s["how"] for s in model.startup} == {"database"}
    assert plans_s <= 2 * restore_s + 0.005  # a replay builds each graph: tens of ms apiece
    _check(bundle, outputs, inputs)
    empty = tmp_path / "empty.db"  # nothing there: measured here, and published
    model, outputs = _run(bundle, inputs, tuning_db=str(empty))
    assert {s["how"] for s in model.startup} == {"retuned"}
    _check(bundle, outputs, inputs)
    from dslc.runtime.tuningdb.sqlite import SQLiteStore

    assert SQLiteStore(empty).size() == len(model.startup)


def test_write_back_saves_plans_the_next_start_restores(tuned: tuple[Path, Any],
                                                        tmp_path: Path) -> None:
    bundle = _edited(tuned[0], tmp_path, {"driver": 1})
    inputs = random_inputs(bundle, BUCKET, seed=13)
    model, outputs = _run(bundle, inputs, write_back=True)
    assert model.decision().action == "retime"
    _check(bundle, outputs, inputs)
    again, outputs = _run(bundle, inputs)  # a fresh start-up on the rewritten bundle
    print(f"after write-back: {again.decision().explain()}")
    assert again.decision().action == "restore"
    assert {s["how"] for s in again.startup} == {"restored"}
    _check(bundle, outputs, inputs)


def test_error_policy_refuses_a_changed_gpu(tuned: tuple[Path, Any], tmp_path: Path) -> None:
    bundle = _edited(tuned[0], tmp_path, {"device_name": "Another GPU"})
    with pytest.raises(RunnerError, match="R0802"):
        _run(bundle, random_inputs(bundle, BUCKET), on_mismatch="error")


def test_database_serves_a_second_build(tuned: tuple[Path, Any], tmp_path: Path) -> None:
    bundle = compile_file(ROOT / "models" / "mlp.cgraph", tmp_path, BUCKET)
    records = load(bundle)
    done = tune(records, SQLiteStore(tuned[0].parent / "tuning.db"), budget_s=3.0)
    report = done.report
    assert report.rows and all(r.source == "database" for r in report.rows)
    emit_bundle.write(bundle, tuned_bundle(records, done))
    inputs = random_inputs(bundle, BUCKET, seed=13)
    _check(bundle, _run(bundle, inputs)[1], inputs)


def test_size_between_buckets_is_built_on_first_use(tuned: tuple[Path, Any],
                                                    tmp_path: Path) -> None:
    from dslc.runtime import Model

    bundle = tuned[0]
    cache = tmp_path / "plans"
    model = Model(bundle, bundle.with_suffix(".safetensors"), plan_cache=cache)
    inputs = random_inputs(bundle, {"N": 24}, seed=14)
    device_inputs = to_device(inputs, bundle)
    times = []
    for _ in range(2):
        start = time.perf_counter()
        outputs = to_host(model.run(device_inputs))
        times.append(time.perf_counter() - start)
    print(f"N=24 (no bucket): first use {times[0] * 1e3:.1f} ms, second {times[1] * 1e3:.2f} ms")
    # Built from the heuristics' choice, not a neighbouring bucket's engine (see
    # `Executable._between_buckets`), then checked against the reference.
    assert {s["how"] for s in model.startup if s["bucket"] == "N=24"} == {"heuristics"}
    _check(bundle, outputs, inputs)
    # Opt-in: sizes of one graph share kernels through cuDNN's kernel cache.
    shared = Model(bundle, bundle.with_suffix(".safetensors"), plan_cache=None,
                   shared_kernels=True)
    for n in (24, 20):
        other = random_inputs(bundle, {"N": n}, seed=15)
        start = time.perf_counter()
        other_out = to_host(shared.run(to_device(other, bundle)))
        hows = sorted({(s["how"], s["kernel_cache"]) for s in shared.startup
                       if s["bucket"] == f"N={n}"})
        print(f"N={n} (no bucket) with shared kernels: first use "
              f"{(time.perf_counter() - start) * 1e3:.1f} ms, {hows}")
        assert hows == [("heuristics", True)]
        _check(bundle, other_out, other)
    with pytest.raises(RunnerError, match="R0601"):
        model.run(to_device(random_inputs(bundle, {"N": 300}), bundle))
    # The next process finds the plans in the on-disk cache.
    later = Model(bundle, bundle.with_suffix(".safetensors"), plan_cache=cache)
    start = time.perf_counter()
    outputs = to_host(later.run(device_inputs))
    print(f"N=24 in a new model, from the plan cache: {(time.perf_counter() - start) * 1e3:.1f} ms")
    assert {s["how"] for s in later.startup if s["bucket"] == "N=24"} == {"restored"}
    assert len(list(cache.glob("*.plan"))) >= 1
    _check(bundle, outputs, inputs)


FUSION_CHOICE = """import "std/nn.cgraph"
model residual {
  precision io=f16
  layout NHWC
  input x: [16, 64, 28, 28]
  let a = relu(conv2d(x, out=64, k=3, pad=1, has_bias=true)) as "c1"
  output y = relu(conv2d(a, out=64, k=1, has_bias=true) + x) as "c2"
}
"""


def test_fusion_measured_keeps_or_splits_each_group_and_stays_correct(tmp_path: Path) -> None:
    """`dslc tune --fusion measure`: both groups measured fused and split after their bias,
    each step saying which won and by how much, and the tuned model still the reference's."""
    from dslc.runtime import Model
    from dslc.tune.fusion import splits
    from tests.gpu.common import compile_source
    from tests.helpers import run_cli

    bundle = compile_source(FUSION_CHOICE, tmp_path)
    before = read(bundle)
    run = run_cli("tune", str(bundle), "--fusion", "measure", "--budget", "2",
                  "--tuning-db", "none", "-q")
    print(run.stdout)
    assert run.code == 0, run.stderr
    assert run.stdout.count("fusion measured: static: fused") == 2
    after = load(bundle)
    told = [s for s in after.steps if "fusion measured" in s.reason]
    assert len(told) >= 2 and len(after.steps) >= len(before["steps"])
    assert not splits_left_unmeasured(after, splits)
    inputs = random_inputs(bundle, seed=21)
    model = Model(bundle, bundle.with_suffix(".safetensors"), tuning_db=None)
    _check(bundle, to_host(model.run(to_device(inputs, bundle))), inputs)


def splits_left_unmeasured(bundle: Any, splits: Any) -> list[str]:
    """Steps that could split and say nothing of a measurement (a split's parts say it)."""
    from dslc.runtime.schedule import Schedule

    return [s.step.name for s in splits(Schedule(bundle)) if "fusion measured" not in s.step.reason]


POINTWISE_CHOICE = """model gates {
  precision io=f16
  input x: [1, 2048]
  input z: [1, 2048]
  input u: [64, 8192]
  input v: [64, 8192]
  output y = sigmoid(x * z + 1.0) as "small"
  output w = tanh(u * v - 0.5) as "large"
}
"""


def test_pointwise_graphs_measured_against_one_kernel_keep_the_faster_and_stay_correct(
        tmp_path: Path) -> None:
    """`dslc tune --fusion measure` times each graph of pointwise ops against the one fallback
    kernel that computes it (in the same buffers, checked against the reference), makes the
    step that kernel where it is faster, and the tuned model still computes the reference's."""
    from dslc.runtime import Model
    from tests.gpu.common import compile_source
    from tests.helpers import run_cli

    bundle = compile_source(POINTWISE_CHOICE, tmp_path)
    graphs = {s["name"] for s in read(bundle)["steps"] if s["kind"] == "graph"}
    run = run_cli("tune", str(bundle), "--fusion", "measure", "--budget", "2",
                  "--tuning-db", "none", "-q")
    print(run.stdout)
    assert run.code == 0, run.stderr
    assert run.stdout.count("backend measured: static: cuDNN graph") == len(graphs) >= 1
    after = {s.name: s for s in load(bundle).steps}
    assert all("backend measured" in after[name].reason for name in graphs)
    inputs = random_inputs(bundle, seed=22)
    model = Model(bundle, bundle.with_suffix(".safetensors"), tuning_db=None)
    _check(bundle, to_host(model.run(to_device(inputs, bundle))), inputs)


def test_an_fp8_model_tunes_each_graph_and_stays_correct(tmp_path: Path) -> None:
    """Tuning reads each tensor through the dtype it is stored as: an fp8 input read as f32
    (four bytes to the element, past its buffer) lost the CUDA context at the first fp8 graph
    tuned (the 4 GPT blocks, 2026-12-03). The fp8 MLP tuned graph by graph, every graph
    measured, then calibrated and run, equals the fp8 reference executor."""
    from dslc.runtime import Model
    from dslc.runtime import bundle as bundlefile
    from dslc.runtime.calibrate import calibrate, calibrated
    from dslc.runtime.schedule import Schedule
    from dslc.weights import random_weights, save
    from tests.helpers import check_source
    from tests.test_fp8 import MLP

    source = MLP % ""
    model = check_source(source, tmp_path, "mlp8.cgraph").model
    bundle = compile_file(tmp_path / "mlp8.cgraph", tmp_path / "out", {})
    weights = {k: np.asarray(v) for k, v in random_weights(model.params, seed=3).items()}
    save(bundle.with_suffix(".safetensors"), weights)
    x = np.random.default_rng(4).standard_normal((16, 64)).astype(np.float16)
    records = load(bundle)
    records = calibrated(records, calibrate(Schedule(records), weights, {"x": x[None]}))
    done = tune(records, SQLiteStore(tmp_path / "tuning.db"), budget_s=2.0)
    assert done.report.rows and all(r.source == "tuned" and r.tuned_ms is not None
                                    for r in done.report.rows), \
        [(r.group, r.source) for r in done.report.rows]
    emit_bundle.write(bundle, tuned_bundle(records, done))
    program = Schedule(bundlefile.load(bundle))
    assert program.bundle.calibration is not None
    got = to_host(Model(bundle, bundle.with_suffix(".safetensors"), tuning_db=None).run(
        to_device({"x": x}, bundle)))["y"]
    from dslc.ir import interp

    want = interp.run(program.graph, {"x": x}, weights, program.env, virtual=program.virtual(),
                      amax=program.bundle.calibration.amax)["y"]
    assert rel_error(got, want) < 2e-2
