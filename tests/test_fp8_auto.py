"""fp8 as a measured choice (`dslc compile --fp8 auto`; dslc/tune/precision.py): the rule that
keeps the ops making the model faster within the error budget, the model lowered with a subset
of its fp8 requests, the error measured on the samples against the f32 model without fp8 (on
the reference executor, as the GPU build does), what the built bundle says of the choice, and
the usage errors said before any work. The times here are given as numbers: measuring them
needs a GPU (tests/gpu/test_fp8_gpu.py runs the whole choice there)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dslc.backend.target import load_target
from dslc.lower.quantize import only, requested
from dslc.pipeline import _Fp8Bench, lower_and_fuse, with_fp8
from dslc.tune.precision import Decision, OpTime, decide
from dslc.weights import random_weights
from tests.helpers import check_source, rng, run_cli

MLP = """cgraph 0.1
model mlp8 {
  precision io=f16, intermediate=f32, compute=f32, matmul=f8e4m3
  input x: [16, 64]
  param w1: [64, 32]
  param w2: [32, 16]
  let h = matmul(x, w1)
  output y = matmul(relu(h), w2)
}
"""


def _times(table: dict[frozenset[str], float]):  # type: ignore[no-untyped-def]
    calls: list[frozenset[str]] = []

    def measure(chosen: frozenset[str]) -> float:
        calls.append(chosen)
        return table[chosen]

    return measure, calls


A, B = "h", "y"  # the two matmuls, named after their values
NONE, ONLY_A, ONLY_B, BOTH = frozenset(), frozenset({A}), frozenset({B}), frozenset({A, B})


@pytest.mark.parametrize(("times", "errors", "budget", "chosen", "final"), [
    # both faster alone and together, within the budget: both
    ({NONE: 1.0, ONLY_A: 0.8, ONLY_B: 0.9, BOTH: 0.7}, {NONE: 0.0, BOTH: 0.03}, 0.05, BOTH, 0.7),
    # one no faster alone: the other
    ({NONE: 1.0, ONLY_A: 0.8, ONLY_B: 1.0}, {NONE: 0.0, ONLY_A: 0.03}, 0.05, ONLY_A, 0.8),
    # both faster, together past the budget: the one gaining least dropped
    ({NONE: 1.0, ONLY_A: 0.8, ONLY_B: 0.9, BOTH: 0.7}, {NONE: 0.0, BOTH: 0.08, ONLY_A: 0.04},
     0.05, ONLY_A, 0.8),
    # an error that is not a number is past any budget
    ({NONE: 1.0, ONLY_A: 0.8, ONLY_B: 0.9, BOTH: 0.7},
     {NONE: 0.0, BOTH: float("nan"), ONLY_A: 0.01}, 0.05, ONLY_A, 0.8),
    # each faster alone, together slower than fp16: none (never slower than fp16)
    ({NONE: 1.0, ONLY_A: 0.95, ONLY_B: 0.97, BOTH: 1.02}, {NONE: 0.0, BOTH: 0.01}, 0.05, NONE,
     1.0),
    # together faster, but within the noise a tuned plan must beat (3%): none
    ({NONE: 1.0, ONLY_A: 0.95, ONLY_B: 0.97, BOTH: 0.98}, {NONE: 0.0, BOTH: 0.01}, 0.05, NONE,
     1.0),
    # a model that does not build with an op in fp8 measures infinitely slow: not chosen
    ({NONE: 1.0, ONLY_A: 0.8, ONLY_B: float("inf")}, {NONE: 0.0, ONLY_A: 0.01}, 0.05, ONLY_A,
     0.8),
    # the fp16 model alone past the budget: fp8 can only add to it, none
    ({NONE: 1.0, ONLY_A: 0.8, ONLY_B: 0.9}, {NONE: 0.06}, 0.05, NONE, 1.0),
    # none faster: nothing measured together, no error asked
    ({NONE: 1.0, ONLY_A: 1.1, ONLY_B: 1.2}, {}, 0.05, NONE, 1.0),
])
def test_the_ops_kept_are_faster_within_the_budget_and_never_slower_together(
        times: dict, errors: dict, budget: float, chosen: frozenset, final: float) -> None:
    measure, _ = _times(times)
    d = decide([B, A], measure, lambda s: errors[s], budget)
    assert d.chosen == chosen and d.ms == final and d.fp16_ms == 1.0
    assert d.error == (errors[chosen] if chosen else 0.0)
    assert [o.op for o in d.ops] == [A, B]  # in name order, each measured alone
    assert len(d.table()) == 4 and "in fp8, against 1.0000 ms in fp16" in d.table()[-1]


def test_each_op_says_why_it_was_kept_or_not() -> None:
    measure, calls = _times({NONE: 1.0, ONLY_A: 0.8, ONLY_B: 0.9, BOTH: 0.7})
    errors: list[frozenset[str]] = []

    def error_of(s: frozenset[str]) -> float:
        errors.append(s)
        return {NONE: 0.001, BOTH: 0.08, ONLY_A: 0.04}[s]

    d = decide([A, B], measure, error_of, 0.05)
    assert calls == [NONE, ONLY_A, ONLY_B, ONLY_A]  # fp16, each alone, the set kept
    assert errors == [NONE, BOTH, ONLY_A]  # the model's own, the faster set, one dropped
    assert {o.op: o.why for o in d.ops} == {A: "faster",
                                            B: "faster, but the error with it was 8.00e-02"}
    assert d.reason(B).startswith("fp8 measured: the model 0.9000 ms with this op in fp8, "
                                  "1.0000 ms in fp16: fp16 (faster, but the error")
    assert "with the 1 chosen 0.8000 ms, error 4.00e-02" in d.reason(A)


def test_an_op_faster_alone_says_the_set_was_within_the_noise() -> None:
    measure, _ = _times({NONE: 1.0, ONLY_A: 0.95, ONLY_B: 0.97, BOTH: 0.98})
    d = decide([A, B], measure, lambda s: 0.0, 0.05)
    assert not d.chosen
    assert all("not 3% faster than fp16" in o.why for o in d.ops)


def test_a_model_lowered_with_a_subset_quantises_only_those_ops(tmp_path: Path) -> None:
    model = check_source(MLP, tmp_path).model
    assert set(requested(model.graph)) == {A, B}
    for chosen in (NONE, ONLY_A, BOTH):
        lowered, _ = lower_and_fuse(model.__class__(**{**model.__dict__,
                                                       "graph": only(model.graph, chosen)}))
        fp8 = {n.name for n in lowered.nodes if n.attrs.get("precision") == "f8e4m3"}
        assert fp8 == set(chosen)
        assert not any(n.attrs.get("precision") == "f8e4m3" for n in only(model.graph, chosen).nodes
                       if n.name not in chosen)


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> _Fp8Bench:
    """The MLP compiled deviceless for the H200 profile (the error needs no GPU), its weights
    and three sample runs."""
    from dslc.diag.diagnostic import Sink
    from dslc.pipeline import Options, front_end

    tmp = tmp_path_factory.mktemp("fp8auto")
    (tmp / "mlp8.cgraph").write_text(MLP)
    front = front_end(tmp / "mlp8.cgraph", Options(), Sink())
    assert front.model is not None
    weights = {k: np.asarray(v) for k, v in random_weights(front.model.params, 4).items()}
    samples = {"x": rng("fp8 auto samples").standard_normal((3, 16, 64)).astype(np.float16)}
    return _Fp8Bench(front, Options(), load_target("h200"), weights, samples, tmp, None, None)


def test_the_error_is_fp8s_own_against_the_f32_model_without_it(bench: _Fp8Bench) -> None:
    """rms(difference) / rms(f32 model): a few percent with both matmuls in fp8 (e4m3 keeps 3
    mantissa bits), less with one, and each calibrated bundle kept for its timing."""
    one, both = bench.error(ONLY_B), bench.error(BOTH)
    assert 1e-3 < one < both < 0.08
    x, w1, w2 = (np.asarray(a, np.float64) for a in
                 (bench.samples["x"], bench.tensors["w1"], bench.tensors["w2"]))
    exact = np.maximum(x @ w1, 0) @ w2  # the f32 model, written out
    assert all(np.allclose(e["y"], want, rtol=1e-4, atol=1e-4)
               for e, want in zip(bench.exact or [], exact, strict=True))
    built = bench.built[BOTH]
    assert built is not None
    path, program = built
    assert path.exists() and program.bundle.calibration is not None


def test_the_built_bundle_says_what_was_measured_and_is_calibrated(tmp_path: Path,
                                                                   bench: _Fp8Bench) -> None:
    from dslc.cli.fp8_choice import record
    from dslc.runtime.bundle import load

    built = bench._bundle(ONLY_A)
    assert built is not None
    path, _ = built
    target = tmp_path / "m.bundle"
    target.write_bytes(path.read_bytes())
    d = Decision(1.0, [OpTime(A, 0.8, True, "faster"), OpTime(B, 1.1, False, "no faster")],
                 0.8, 0.02, 0.05)
    record(target, d, bench.tensors, bench.samples)
    bundle = load(target)
    assert bundle.calibration is not None and set(bundle.calibration.amax)
    said = {s.name: s.reason for s in bundle.steps if "fp8 measured" in s.reason}
    assert len(said) == 2
    assert any("0.8000 ms with this op in fp8, 1.0000 ms in fp16: fp8 (faster)" in r
               for r in said.values())
    assert any("fp16 (no faster)" in r for r in said.values())


def test_fp8_front_end_subset_keeps_the_front_ends_program(tmp_path: Path) -> None:
    from dslc.diag.diagnostic import Sink
    from dslc.pipeline import Options, front_end

    (tmp_path / "m.cgraph").write_text(MLP)
    front = front_end(tmp_path / "m.cgraph", Options(), Sink())
    sub = with_fp8(front, ONLY_A)
    assert sub.program is front.program and sub.model is not None
    assert set(requested(sub.model.graph)) == {A}


@pytest.mark.parametrize(("extra", "said"), [
    ([], "`--fp8 auto` times each fp8 op on this GPU, and the target is `h200`"),
    (["--max-error", "nan"], "`--max-error` is a relative error, a number of 0 or more"),
    (["--max-error", "-0.1"], "`--max-error` is a relative error, a number of 0 or more"),
    (["--data", "s.npz"], "`--fp8 auto` times each fp8 op on this GPU"),
])
def test_fp8_auto_without_a_gpu_is_a_usage_error_said_first(extra: list[str], said: str,
                                                            tmp_path: Path) -> None:
    (tmp_path / "m.cgraph").write_text(MLP)
    run = run_cli("compile", str(tmp_path / "m.cgraph"), "-o", str(tmp_path / "out"),
                  "--fp8", "auto", *extra)
    assert run.code == 2 and said in run.stderr and "Traceback" not in run.stderr


def test_data_without_fp8_auto_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "m.cgraph").write_text(MLP)
    run = run_cli("compile", str(tmp_path / "m.cgraph"), "-o", str(tmp_path / "out"),
                  "--data", "s.npz")
    assert run.code == 2 and "`--data` goes with `--fp8 auto`" in run.stderr


def test_ops_alike_are_one_candidate_measured_and_kept_together() -> None:
    """A repeated block's projections: one of several moves the model's time less than the
    noise of timing it, all of one kind do not. Kept or dropped whole, said per op."""
    q = frozenset({"b0.q", "b1.q"})
    o = frozenset({"b0.o", "b1.o"})
    times = {NONE: 1.0, q: 0.9, o: 1.01, q | o: 0.91}
    measure, calls = _times(times)
    d = decide([o, q], measure, lambda s: 0.01, 0.05)
    assert calls == [NONE, o, q, q]  # fp16, each kind alone (by its first op's name), the set
    assert d.chosen == q and d.measured == q | o and d.ms == 0.9
    assert [(t.op, t.ops) for t in d.ops] == [("b0.o", o), ("b0.q", q)]
    assert d.table()[2].startswith("b0.q and 1 alike")
    assert d.table()[-1].startswith("model: 0.9000 ms with 2 of 4 ops in fp8")
    assert d.reason("b1.q").startswith("fp8 measured: the model 0.9000 ms with this op and 1 "
                                       "alike in fp8")


def test_a_repeated_blocks_projections_are_four_kinds_of_four(tmp_path: Path) -> None:
    from dslc.pipeline import fp8_kinds
    from tests.conftest import ROOT

    gpt = check_source((ROOT / "models" / "gpt_block.cgraph").read_text(), tmp_path,
                       "gpt_block.cgraph").model
    kinds = sorted(sorted(k) for k in fp8_kinds(gpt.graph))
    assert [len(k) for k in kinds] == [4, 4, 4, 4]
    assert [k[0] for k in kinds] == ["h.0.attn.c_attn.matmul", "h.0.attn.c_proj.matmul",
                                     "h.0.mlp.c_fc.matmul", "h.0.mlp.c_proj.matmul"]
    assert all({n.split(".", 2)[2] for n in k} == {k[0].split(".", 2)[2]} for k in kinds)
    mlp = check_source(MLP, tmp_path, "mlp8.cgraph").model  # two shapes: two kinds of one
    assert sorted(fp8_kinds(mlp.graph), key=min) == [ONLY_A, ONLY_B]


def test_every_op_of_a_kind_says_what_was_measured(tmp_path: Path, bench: _Fp8Bench) -> None:
    """A kind is named for its first op; its other ops' steps say the choice too (the H200
    run of the GPT blocks found 4 of 16 steps saying it)."""
    from dslc.cli.fp8_choice import record
    from dslc.runtime.bundle import load

    built = bench._bundle(NONE)
    assert built is not None
    target = tmp_path / "m.bundle"
    target.write_bytes(built[0].read_bytes())
    d = Decision(1.0, [OpTime(A, 1.1, False, "no faster", alike=ONLY_A | ONLY_B)], 1.0, 0.0, 0.05)
    record(target, d, bench.tensors, bench.samples)
    said = [s.reason for s in load(target).steps if "fp8 measured" in s.reason]
    assert len(said) == 2 and all("with this op and 1 alike in fp8" in r for r in said)
