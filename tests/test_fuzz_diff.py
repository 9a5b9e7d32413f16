"""Generated programs against independent oracles (dslc/fuzz): a fixed-seed batch through the
whole compiler on the CPU, every saved regression case, and the generator's own promises
(deterministic, well-typed by construction, every op covered, failures shrink).

A failure names the program and the command that reruns and shrinks it:
`scripts/fuzz_diff.py --seed S --only I --minimize --save tests/fuzz_cases`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dslc.fuzz import oracle
from dslc.fuzz.choices import Choices
from dslc.fuzz.generate import generate
from dslc.fuzz.shrink import load_case, replay, shrink
from dslc.fuzz.state import Stats
from dslc.ops import OPS

SEED = 2026  # CI's batch; scripts/fuzz_diff.py runs any other
BATCH = 240  # programs through check, the f32 reference (views checked) and PyTorch
COMPILED = 24  # of which the first ones also compile deviceless and round-trip their bundle
CASES = sorted(Path(__file__).parent.joinpath("fuzz_cases").glob("*.cgraph"))


def _program(index: int, stats: Stats | None = None):  # type: ignore[no-untyped-def]
    return generate(Choices(SEED * 1_000_000 + index), stats)


@pytest.mark.parametrize("part", range(4))
def test_generated_programs_pass_every_oracle(part: int) -> None:
    failures = []
    for index in range(part, BATCH, 4):
        outcome = oracle.run(_program(index), SEED * 1_000_000 + index,
                             compile=index < COMPILED)
        if outcome.failed:
            failures.append(f"program {index}: {outcome.status} at {outcome.stage}: "
                            f"{outcome.detail.splitlines()[0]}\n  rerun: scripts/fuzz_diff.py "
                            f"--seed {SEED} --only {index} --show --minimize")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("case", CASES, ids=[c.stem for c in CASES])
def test_regression_case_equals_its_expected_outputs(case: Path) -> None:
    outcome = oracle.run_case(load_case(case), torch_oracle=False, compile=True)
    assert not outcome.failed, f"{case.name}: {outcome.status} at {outcome.stage}: {outcome.detail}"


def test_every_op_and_every_feature_is_generated() -> None:
    stats = Stats()
    for index in range(BATCH):
        _program(index, stats)
    missed = sorted(op for op in OPS if not stats.ops[op])
    assert not missed, f"ops the batch never generates: {missed}"
    for feature in ("io=f32", "io=f16", "io=bf16", "layout NHWC", "dynamic dim N", "def",
                    "repeat", "an input declared in a def", "depthwise 5x5 conv", "fp8 matmul",
                    "fp8 conv", "rotary", "gated projections", "rotated and plain values cached",
                    "a key mask read by attentions of two query counts",
                    "transposed conv with kernel = stride"):
        assert stats.features[feature] > 0, feature


def test_the_batch_reaches_the_projection_kernels_joins(tmp_path: Path) -> None:
    """The GPU oracle forces every kernel and every join it can make (`tune.joins.every_kernel`):
    the batch holds programs whose bundle then computes a gated pair and an RMS norm inside the
    few-row matmul kernel (`backend.gemv`), so generated programs check them on the GPU."""
    from dslc.runtime.schedule import Schedule
    from dslc.tune.joins import every_kernel
    from tests.helpers import deviceless_program

    seen = {"pair": 0, "norm": 0}
    for index in range(BATCH):
        stats = Stats()
        program = _program(index, stats)
        if not stats.features["gated projections"] or "io=f32" in stats.features:
            continue
        (tmp_path / str(index)).mkdir()
        schedule = Schedule(every_kernel(deviceless_program(
            program.source(), tmp_path / str(index))[1].bundle))
        kernels = [k for k in map(schedule.matmul_kernel, schedule.steps) if k is not None]
        seen["pair"] += sum(k.sibling is not None for k in kernels)
        seen["norm"] += sum(k.norm is not None for k in kernels)
        if all(seen.values()):
            break
    assert all(seen.values()), seen


def test_the_batch_reaches_steps_run_as_one_launch(tmp_path: Path) -> None:
    """Rotated values and plain ones written into caches (`fuzz.shapes.rotary`): the batch holds
    programs whose schedule runs a cache write and another small step as one launch
    (`runtime.batches`) and a cache write that could run as its value's writers
    (`runtime.cachewrites`), which the arena oracle checks on the CPU and the GPU oracle runs
    (program 149's may not: tests/test_batches.py)."""
    from functools import partial

    from dslc.runtime.batches import plan, small
    from dslc.runtime.cachewrites import recomputed
    from tests.helpers import deviceless_program

    seen = {"merged": 0, "recomputed": 0}
    for index in range(BATCH):
        stats = Stats()
        program = _program(index, stats)
        if not stats.features["rotated and plain values cached"]:
            continue
        (tmp_path / str(index)).mkdir()
        schedule = deviceless_program(program.source(), tmp_path / str(index))[1]
        dims = dict(schedule.bundle.buckets[0].dims) if schedule.bundle.buckets else {}
        memory = schedule.memory_plan(dims)
        merged = [slot for slot in plan(schedule, memory)[0] if len(slot) > 1]
        seen["merged"] += any(schedule.nodes[s.nodes[0]].op == "cache_write"
                              for slot in merged for s in slot)
        seen["recomputed"] += bool(recomputed(schedule, memory,
                                              partial(small, schedule, memory)))
        if all(seen.values()):
            return
    raise AssertionError(f"the batch reaches too little: {seen}")


def test_generated_sources_spell_every_dim() -> None:
    """A dim the checker derived with a floor (a strided conv's output length, shown
    `⌊(L - 1) / 3⌋ + 1`) is no source text: seed 19's program 91 once wrote one into a cache
    input's shape (E0101 where the program should have run)."""
    sources = [generate(Choices(19_000_091)).source(), *(_program(i).source() for i in range(BATCH))]
    assert not [s for s in sources if "⌊" in s]


def test_the_same_choices_give_the_same_program() -> None:
    a, b = Choices(7), Choices(7)
    assert generate(a).source() == generate(b).source()
    replayed, used = replay(a.record)
    assert replayed.source() == generate(Choices(7)).source() and used == a.record


def test_a_failure_shrinks_to_a_small_program() -> None:
    """A stand-in failure (the program holds a conv) shrinks to a program of a few lines."""
    index = next(i for i in range(100) if " conv(" in _program(i).source())
    ch = Choices(SEED * 1_000_000 + index)
    big = generate(ch)

    def test(prog):  # type: ignore[no-untyped-def]
        found = " conv(" in prog.source()
        return oracle.Outcome("mismatch" if found else "ok", "torch")

    best = shrink(ch.record, test, ("mismatch", "torch", ""), budget_s=20)
    small, _ = replay(best)
    assert " conv(" in small.source()
    assert len(small.source().splitlines()) < len(big.source().splitlines())
    assert len(small.source().splitlines()) <= 12, small.source()


def test_the_arena_oracle_also_runs_the_bundle_with_every_kernel_made(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The CPU oracle runs, in its memory plan, the bundle the GPU's oracle runs too (every step
    a kernel computes made that kernel: `tune.joins.every_kernel`): a defect there (here its
    steps run in reverse order) is a "memory" failure that names it."""
    from dataclasses import replace

    from dslc.tune import joins

    real = joins.every_kernel
    monkeypatch.setattr(joins, "every_kernel",
                        lambda b: (lambda out: replace(out, steps=out.steps[1:]))(real(b)))
    index = next(i for i in range(COMPILED) if _steps_of(_program(i)) > 2)
    outcome = oracle.run(_program(index), SEED * 1_000_000 + index, torch_oracle=False)
    assert outcome.status == "memory" and "every step a kernel computes" in outcome.detail


def _steps_of(program) -> int:  # type: ignore[no-untyped-def]
    return sum(line.startswith(("  let ", "  output ")) for line in program.source().splitlines())
