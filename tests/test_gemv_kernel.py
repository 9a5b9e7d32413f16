"""The few-row matmul kernel with its epilogue (`backend.gemv`) on the CPU: which steps it
computes and how (input, weight, the epilogue's operands; the matmul's value as the reference
holds it), that the tuner offers a decoder's projections to it and not a matmul of many rows or of a weight
whose N is contiguous,
that a bundle whose step is that kernel reads back valid, and that every kernel compiles with
NVRTC for the H200 without a warning or a spill. Its numbers are checked on the H200
(tests/gpu/test_gemv_gpu.py)."""

from __future__ import annotations

import itertools
import re
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from dslc.backend import gemv
from dslc.backend.spec import group_spec
from dslc.fuzz import arena
from dslc.fuzz.oracle import ARENA_TOLERANCE, relative_error
from dslc.runtime.records import Bundle
from dslc.runtime.schedule import Schedule
from dslc.tune.fusion import (
    KernelMeasured,
    kernel_steps,
    takes_many_rows,
    takes_matmul_kernel,
    with_fusion,
)
from dslc.tune.joins import Joined, every_kernel, join_group, joined, norms, pairs, with_joins
from dslc.weights import random_weights
from tests.helpers import check_source, deviceless_program, nvrtc_compile, rng

DECODER = """
model m {{
  precision io={io}
  dim B = 1..{most} tune [{rows}]
  input x: [B, 1, 256]
  input h: [B, 1, 512]
  param w: [512, 256]
  param gate: [512, 256]
  param up: [512, 256]
  param v: [256, 512]
  let a = matmul(x, transpose(w, [1, 0]))
  let o = h + a
  let g = matmul(x, transpose(gate, [1, 0]))
  output y = o
  output z = silu(g) * matmul(x, transpose(up, [1, 0]))
  output r = matmul(x, v)
}}
"""
ROW_MAJOR = "v"  # its weight [K, N] with N contiguous: the kernel reads K-contiguous rows


def _program(tmp_path: Path, io: str = "bf16", rows: int = 1, most: int = 8) -> Any:
    return deviceless_program(DECODER.format(io=io, rows=rows, most=most), tmp_path)[1]


def _matmul_steps(program: Any) -> dict[str, list[str]]:
    return {s.name: [program.nodes[n].op for n in s.nodes] for s in program.steps
            if program.nodes[s.nodes[0]].op == "matmul"}


def test_a_matmul_and_its_epilogue_are_one_kernel_over_its_operands(
        tmp_path: Path) -> None:
    program = _program(tmp_path)
    plans = {s.name: program.matmul_kernel(s) for s in program.steps
             if program.nodes[s.nodes[0]].op == "matmul"}
    assert sorted(_matmul_steps(program).values()) == [
        ["matmul"], ["matmul"], ["matmul", "add"], ["matmul", "silu", "mul"]]
    assert all(isinstance(g, gemv.Gemv) for g in plans.values())
    for name, g in plans.items():
        assert g is not None
        ops = _matmul_steps(program)[name]
        x, w = program.nodes[program.steps[[s.name for s in program.steps].index(name)]
                             .nodes[0]].inputs
        assert (g.x, g.w) == (x, w) and g.dtype == "bf16"
        assert g.epilogue.operands[g.anchor].dtype == "f32"  # the accumulator, not a load
        if ops == ["matmul"]:  # stored as the output's dtype; the epilogue only stores
            assert g.held == "bf16" and len(g.operands) == 2
        else:  # held in the intermediate dtype inside the step
            assert g.held == "f32" and len(g.operands) == 3
        if ops == ["matmul", "add"]:
            assert g.operands[2] == "h"


def test_a_matmul_of_f32_or_of_a_3d_weight_has_no_kernel(tmp_path: Path) -> None:
    program = _program(tmp_path, io="f32")
    assert all(program.matmul_kernel(s) is None for s in program.steps)
    assert "no f16 or bf16" in str(gemv.plan_of(program.nodes, program.steps[0].nodes,
                                                program.steps[0].inputs,
                                                program.steps[0].outputs))


@pytest.mark.parametrize(("rows", "few"), [(1, True), (8, True), (16, False)])
def test_the_tuner_offers_projections_of_at_most_8_rows_to_the_kernel_and_more_to_cublaslt(
        rows: int, few: bool, tmp_path: Path) -> None:
    """The few-row kernel reads a weight whose K is contiguous; cuBLASLt (past 8 rows) reads
    either layout, so the row-major weight's matmul is offered there too."""
    program = _program(tmp_path, rows=rows, most=16)
    matmuls = set(_matmul_steps(program))
    found = {s.name for s in kernel_steps(program)} & matmuls
    assert ROW_MAJOR in matmuls and len(matmuls) == 4
    assert found == (matmuls - {ROW_MAJOR} if few else matmuls)


def test_a_matmul_step_alone_runs_as_the_kernel(tmp_path: Path) -> None:
    """A matmul without an epilogue (a step of its own, or one cuDNN rejected) is the kernel
    too, storing the product in the output's dtype."""
    program = _program(tmp_path)
    alone = [s for s in program.steps if _matmul_steps(program).get(s.name) == ["matmul"]]
    assert len(alone) == DECODER.count("output r = matmul") + DECODER.count("* matmul(")
    kernels = [program.matmul_kernel(s) for s in alone]
    assert all(g is not None and g.held == "bf16" for g in kernels)


def test_a_bundle_whose_matmul_steps_are_the_kernel_reads_back_valid(tmp_path: Path) -> None:
    program = _program(tmp_path)
    out = Bundle.from_data(_kernels_taken(program)[0].to_data())
    kinds = {s.name: s.kind for s in out.steps}
    assert {name: kinds[name] for name in _matmul_steps(program)} == {
        name: "graph" if name == ROW_MAJOR else "kernel" for name in _matmul_steps(program)}


SIZES = ((2048, 2048), (2048, 5632), (32000, 2048))  # a 1B decoder's o, down and head: the
# cuts differ by split


@pytest.mark.parametrize("io", ["bf16", "f16"])
def test_every_kernel_compiles_without_a_warning_or_a_spill(
        io: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """CuPy is absent on the CPU: a stand-in takes the source `_kernel` builds."""
    monkeypatch.setitem(sys.modules, "cupy",
                        SimpleNamespace(RawKernel=lambda source, name: (source, name)))
    program = _program(tmp_path, io=io)
    for step in program.steps:
        g = program.matmul_kernel(step)
        if g is None:
            continue
        for rows, (n, k) in itertools.product((1, 3, gemv.MOST_ROWS), SIZES):
            shape = gemv.shape_for(rows, n, k)
            source, name = gemv._kernel.__wrapped__(g, rows, shape)
            ok, log = nvrtc_compile(source)
            assert ok and "warning" not in log and name in source, (step.name, log[:2000])
            spilled = [int(n) for n in re.findall(r"(\d+) bytes spill stores", log)]
            assert spilled and max(spilled) == 0, (step.name, rows, shape, log[:2000])


def _kernels_taken(program: Any) -> tuple[Bundle, list[KernelMeasured]]:
    measured = []
    for step in kernel_steps(program):
        m = KernelMeasured(step)
        for bucket in program.bundle.buckets:
            m.graph_ms[bucket.key], m.kernel_ms[bucket.key] = 0.010, 0.004
        measured.append(m)
    return with_fusion(program.bundle, [], measured), measured


def test_a_gated_mlp_up_and_gate_are_one_pair_of_steps(tmp_path: Path) -> None:
    """z = silu(gate) * up: the up projection alone, then the gate's step reading it in its
    epilogue; both of x. Not the residual projection (its value is an output) nor the
    row-major weight's."""
    program = _program(tmp_path)
    found = pairs(program)
    assert [([program.nodes[n].op for n in j.absorbed.nodes],
             [[program.nodes[n].op for n in r.nodes] for r in j.readers])
            for j in found] == [(["matmul"], [["matmul", "silu", "mul"]])]
    [j] = found
    first, (second,) = j.absorbed, j.readers
    step = joined(first, second, program.nodes, "")
    g = gemv.plan_of(program.nodes, step.nodes, step.inputs, step.outputs)
    assert isinstance(g, gemv.Gemv) and g.sibling is not None
    up = program.nodes[first.nodes[0]].inputs[1]
    gate = program.nodes[second.nodes[0]].inputs[1]
    assert (g.w, g.sibling.w) == (gate, up) and g.operands == ("x", gate, up)
    # both products held in the intermediate dtype, as any fused group holds its inner values
    assert g.held == g.sibling.held == "f32"
    assert {g.epilogue.operands[i].name for i in g.computed} == {
        second.nodes[0], first.nodes[0]}
    # the tuner measures it in the buffers of its group's spec, anchored on the second matmul:
    # the first's operands are no epilogue's (a broadcast x would be refused as one)
    group = join_group(program, step)
    assert group.anchor == second.nodes[0]
    spec = group_spec(program.graph, group, dict(program.bundle.buckets[0].dims), program.env,
                      program.placement)
    assert {t.name: t.role for t in spec.tensors} == {
        "x": "input", up: "input", gate: "input", first.nodes[0]: "virtual",
        second.nodes[0]: "virtual", second.nodes[1]: "virtual", second.nodes[2]: "output"}


def test_two_matmuls_of_different_inputs_are_no_pair(tmp_path: Path) -> None:
    source = DECODER.format(io="bf16", rows=1, most=8).replace(
        "output z = silu(g) * matmul(x, transpose(up, [1, 0]))",
        "output z = silu(g) * matmul(h[:, :, 0:256], transpose(up, [1, 0]))")
    program = deviceless_program(source, tmp_path)[1]
    assert pairs(program) == []
    [step] = [s for s in program.steps if [program.nodes[n].op for n in s.nodes]
              == ["matmul", "silu", "mul"]]
    members = [i for i in step.inputs if program.nodes[i].op == "matmul"] + list(step.nodes)
    assert len(members) == 4
    assert "one input" in str(gemv.plan_of(program.nodes, members, step.inputs, step.outputs))


@pytest.mark.parametrize("chosen", [True, False])
def test_a_measured_pair_is_joined_only_where_one_kernel_is_faster(
        chosen: bool, tmp_path: Path) -> None:
    program = _program(tmp_path)
    bundle, _ = _kernels_taken(program)
    [m] = pairs(Schedule(bundle))
    first, (second,) = m.absorbed, m.readers
    for bucket in bundle.buckets:
        m.apart_ms[bucket.key] = 0.010
        m.reader_ms.setdefault(second.name, {})[bucket.key] = 0.006 if chosen else 0.0099
    out = Bundle.from_data(with_joins(bundle, [m]).to_data())  # reads back valid
    names = [s.name for s in out.steps]
    assert (first.name not in names) == chosen
    [after] = [s for s in out.steps if s.name == second.name]
    assert after.nodes == ((*first.nodes, *second.nodes) if chosen else second.nodes)
    assert after.kind == "kernel" and "apart 0.0100 ms" in after.reason
    assert after.reason.endswith("one kernel is faster" if chosen else "kept apart")
    if chosen:  # the up projection's value is no longer stored: no offset in the arena
        assert all(first.nodes[0] not in b.offsets for b in out.buckets)


def test_every_kernel_joins_the_pairs_for_the_generated_programs_check(tmp_path: Path) -> None:
    out = every_kernel(_program(tmp_path).bundle)
    [pair] = [s for s in out.steps if s.kind == "kernel"
              and [out.graph.graph.by_name()[n].op for n in s.nodes][:2] == ["matmul", "matmul"]]
    assert len(pair.nodes) == 4 and pair.reason.endswith("joined with up: one kernel")
    # a step no kernel computes stays a graph (the row-major weight's matmul)
    assert {s.name: s.kind for s in out.steps}[ROW_MAJOR] == "graph"


@pytest.mark.parametrize("rows", [1, 3, gemv.MOST_ROWS])
def test_the_pair_kernel_compiles_without_a_warning_or_a_spill(
        rows: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cupy",
                        SimpleNamespace(RawKernel=lambda source, name: (source, name)))
    program = _program(tmp_path)
    [j] = pairs(program)
    step = joined(j.absorbed, j.readers[0], program.nodes, "")
    g = gemv.plan_of(program.nodes, step.nodes, step.inputs, step.outputs)
    assert isinstance(g, gemv.Gemv)
    shape = gemv.shape_for(rows, 5632, 2048, len(g.weights))
    assert rows * shape.columns * 2 <= 32  # a lane a (row, column) of both weights
    source, _ = gemv._kernel.__wrapped__(g, rows, shape)
    assert "#define PAIR 1" in source
    ok, log = nvrtc_compile(source)
    assert ok and "warning" not in log, log[:2000]
    spilled = [int(n) for n in re.findall(r"(\d+) bytes spill stores", log)]
    assert spilled and max(spilled) == 0, log[:2000]


NORMED = """
model m {{
  precision io={io}
  dim B = 1..8 tune [1]
  input x: [B, 1, 256]
  input h: [B, 1, 512]
  param s: [256]
  param w: [512, 256]
  param gate: [512, 256]
  param up: [512, 256]
  let n = rmsnorm(x, s, eps=1e-5)
  output y = h + matmul(n, transpose(w, [1, 0]))
  output z = silu(matmul(n, transpose(gate, [1, 0]))) * matmul(n, transpose(up, [1, 0])){more}
}}
"""


def _normed(tmp_path: Path, more: str = "", source: str = "") -> Bundle:
    """NORMED's bundle (or `source`'s) with its projections kernels and the pair joined."""
    program = deviceless_program(source or NORMED.format(io="bf16", more=more), tmp_path)[1]
    bundle, _ = _kernels_taken(program)
    return with_joins(bundle, pairs(Schedule(bundle)), every=True)


def test_an_rms_norm_read_by_projection_kernels_alone_joins_each(tmp_path: Path) -> None:
    bundle = _normed(tmp_path)
    program = Schedule(bundle)
    [j] = norms(program)
    [norm] = j.absorbed.nodes
    assert program.nodes[norm].op == "rmsnorm" and len(j.readers) == 2  # o-proj, the pair
    plans = []
    for reader in j.readers:
        step = joined(j.absorbed, reader, program.nodes, "")
        g = gemv.plan_of(program.nodes, step.nodes, step.inputs, step.outputs)
        assert isinstance(g, gemv.Gemv) and g.norm is not None
        assert (g.x, g.norm.scale, g.norm.eps) == ("x", "s", 1e-5)
        assert g.operands[:2] == ("x", "s")  # the norm's input and scale, then the weights
        plans.append(g)
    assert sorted(g.sibling is not None for g in plans) == [False, True]
    out = Bundle.from_data(with_joins(bundle, [j], every=True).to_data())  # reads back valid
    assert all((norm not in s.nodes[1:] and s.nodes[0] != norm) or s.kind == "kernel"
               for s in out.steps)
    assert [s.nodes[0] for s in out.steps].count(norm) == 2
    assert all(norm not in b.offsets for b in out.buckets)  # never stored


def test_a_norm_something_else_reads_stays_its_own_step(tmp_path: Path) -> None:
    assert norms(Schedule(_normed(tmp_path, "\n  output q = n * 2.0"))) == []
    (tmp_path / "out").mkdir()
    assert norms(Schedule(_normed(tmp_path / "out", "\n  output q = n"))) == []


@pytest.mark.parametrize("rows", [1, 3, gemv.MOST_ROWS])
def test_the_normed_pair_kernel_compiles_without_a_warning_or_a_spill(
        rows: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cupy",
                        SimpleNamespace(RawKernel=lambda source, name: (source, name)))
    program = Schedule(every_kernel(deviceless_program(NORMED.format(io="f16", more=""),
                                                       tmp_path)[1].bundle))
    kernels = [program.matmul_kernel(s) for s in program.steps]
    [g] = [k for k in kernels if k is not None and k.sibling is not None]
    assert g.norm is not None
    for shape in (gemv.shape_for(rows, 5632, 2048, 2), gemv.Shape(1, 8, 1, 2)):
        source, _ = gemv._kernel.__wrapped__(g, rows, shape)
        assert "#define NORM 1" in source and "#define PAIR 1" in source
        ok, log = nvrtc_compile(source)
        assert ok and "warning" not in log, log[:2000]
        spilled = [int(n) for n in re.findall(r"(\d+) bytes spill stores", log)]
        assert spilled and max(spilled) == 0, log[:2000]


def test_a_norm_held_in_a_narrower_intermediate_is_not_the_kernels(tmp_path: Path) -> None:
    """The kernel holds the norm's value in f32 (it never rounds it); a model whose intermediate
    dtype is bf16 holds it rounded (the reference does): the norm stays its own step."""
    source = NORMED.format(io="bf16", more="").replace("precision io=bf16",
                                                       "precision io=bf16, intermediate=bf16")
    program = deviceless_program(source, tmp_path)[1]
    bundle, _ = _kernels_taken(program)
    bundle = with_joins(bundle, pairs(Schedule(bundle)), every=True)
    assert norms(Schedule(bundle)) == []
    norm = next(s for s in Schedule(bundle).steps if [*s.nodes] == ["n"])
    reader = next(s for s in Schedule(bundle).steps if "n" in s.inputs)
    step = joined(norm, reader, program.nodes, "")
    assert "narrower intermediate" in str(
        gemv.plan_of(program.nodes, step.nodes, step.inputs, step.outputs))


def test_the_fallbacks_norm_attributes_are_the_ops_reference_s() -> None:
    """Where the arrays do not fit the kernel (K not a multiple of 8: generated programs found
    it), the fallback computes the norm by the op's reference with `norm_attrs`; here against
    the formula written out."""
    from dslc.ops import OPS

    g = rng("fallback norm")
    x, scale = g.standard_normal((3, 10)), g.standard_normal(10)
    reference = OPS["rmsnorm"].reference
    assert reference is not None
    got = reference([x, scale], gemv.norm_attrs(gemv.Norm("n", "s", 1e-5), 2))
    want = x / np.sqrt((x * x).mean(axis=1, keepdims=True) + 1e-5) * scale
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_a_norm_a_view_reads_stays_its_own_step(tmp_path: Path) -> None:
    """A view of the norm's value is no step's input (it reads its base in place): the norm
    must stay stored for it (a join dropped it, and the bundle no longer loaded)."""
    bundle = _normed(tmp_path, "\n  output q = n[:, :, 0:128]")
    assert norms(Schedule(bundle)) == []
    Bundle.from_data(every_kernel(bundle).to_data())  # still loads


def test_a_joined_step_is_timed_in_the_buffers_of_its_own_inputs_and_outputs(
        tmp_path: Path) -> None:
    """Each reader of a norm joined (one with a residual add read at the matmul's shape, one a
    pair) has a spec to be timed in: anchored on its matmul (the norm ahead is no epilogue, so
    `x` at K is not compared with the result at N) and storing its outputs alone (the norm's
    value, which the other reader also computes, is stored by neither)."""
    program = Schedule(with_joins(_normed(tmp_path), norms(Schedule(_normed(tmp_path))),
                                  every=True))
    joined_steps = [s for s in program.steps if s.nodes[0] == "n"]
    assert len(joined_steps) == 2
    for step in joined_steps:
        group = join_group(program, step)
        assert program.nodes[group.anchor].op == "matmul"
        spec = group_spec(program.graph, group, dict(program.bundle.buckets[0].dims),
                          program.env, program.placement)
        roles = {t.name: t.role for t in spec.tensors}
        assert roles["n"] == "virtual" and roles["x"] == roles["s"] == "input"
        assert [t for t, r in roles.items() if r == "output"] == list(step.outputs)


def test_a_pair_whose_epilogue_does_not_read_the_first_matmul_is_refused(
        tmp_path: Path) -> None:
    program = _program(tmp_path)
    [j] = pairs(program)
    up, (gate, silu) = j.absorbed.nodes[0], j.readers[0].nodes[:2]
    why = gemv.plan_of(program.nodes, [up, gate, silu], ["x"], [silu])
    assert why == "its epilogue does not read its first matmul's value"


def _plan_ms(bundle: Bundle, step: str, ms: float) -> Bundle:
    """The bundle with its graph step's plan timed at `ms` in every bucket."""
    from dataclasses import replace

    [sig] = [s.signature for s in bundle.steps if s.name == step]
    buckets = tuple(replace(b, graphs={**b.graphs, sig: replace(
        b.graphs[sig], plan=replace(b.graphs[sig].plan, ms=ms))}) for b in bundle.buckets)
    return replace(bundle, buckets=buckets)


@pytest.mark.parametrize("joined_faster", [True, False])
def test_joins_are_measured_in_two_rounds_and_made_where_faster(
        joined_faster: bool, tmp_path: Path) -> None:
    """`join_measured` with a stand-in for the GPU's timing (the CPU has none; the real one runs
    in tests/gpu/test_gemv_gpu.py): the pair first, timed against the two kernels apart; then
    the norm, timed against its graph plus its readers as the first round left them (the pair's
    joined time where it was joined), each reader timed in the buffers of its own step."""
    from dslc.tune.joins import join_measured

    program = deviceless_program(NORMED.format(io="bf16", more=""), tmp_path)[1]
    bundle, kernels = _kernels_taken(program)  # each kernel step 0.004 ms
    bundle = _plan_ms(bundle, "s", 0.002)  # the norm's graph
    joined_ms = {"gate+silu+mul": 0.005 if joined_faster else 0.009, "w+add": 0.0045,
                 "up": 0.004}
    asked: list[tuple[str, tuple[str, ...]]] = []

    def measurer(b: Bundle) -> Any:
        def measure(step: Any, spec: Any, storage: Any, where: str) -> float:
            asked.append((step.name, tuple(t.name for t in spec.tensors if t.role == "output")))
            ms = joined_ms[step.name]
            return ms + 0.0002 if step.nodes[0] == "n" else ms  # a norm inside: a little more
        return measure

    said: list[str] = []
    out, found = join_measured(bundle, kernels, measurer, said.append)
    Bundle.from_data(out.to_data())  # reads back valid
    assert "[1/1] B=1 gate+silu+mul joined" in said  # the pair, then the norm's readers
    assert [m for m in said if "w+add" in m] == ["[1/1] B=1 w+add joined"]
    [pair, norm] = found
    assert pair.apart_ms == {"B=1": pytest.approx(0.008)}  # up and gate, 0.004 each
    assert pair.chosen == joined_faster
    if joined_faster:  # the norm's graph, the residual projection and the pair as joined
        assert norm.apart_ms == {"B=1": pytest.approx(0.002 + 0.004 + 0.005)}
        assert norm.joined_ms == {"B=1": pytest.approx(0.0047 + 0.0052)}
    else:  # the norm's graph and three kernels apart
        assert norm.apart_ms == {"B=1": pytest.approx(0.002 + 3 * 0.004)}
        assert norm.joined_ms == {"B=1": pytest.approx(0.0047 + 0.0042 + 0.0092)}
    assert norm.chosen == joined_faster
    assert ("s" in [s.name for s in out.steps]) != joined_faster
    assert ("gate+silu+mul", ("z",)) in asked  # timed storing its own output only
    reasons = {s.name: s.reason for s in out.steps}
    assert reasons["gate+silu+mul"].endswith(
        "one kernel is faster" if joined_faster else "kept apart")
    assert ("joined with s measured: B=1: apart" in reasons["w+add"])


def test_a_joins_summary_names_each_bucket_and_a_missing_time() -> None:
    step = SimpleNamespace(name="up")
    j = Joined(step, (SimpleNamespace(name="gate"),),  # type: ignore[arg-type]
               {"B=1": 0.01, "B=8": 0.02}, {"gate": {"B=1": 0.006}})
    assert j.summary() == ("joined with up measured: B=1: apart 0.0100 ms, joined 0.0060 ms; "
                           "B=8: apart 0.0200 ms, joined - ms")
    assert not j.chosen  # a bucket without a time: apart


PAIRS = """
model m {{
  precision io=bf16
  dim B = 1..8 tune [1]
  input x: [B, 1, 256]
  param gate: [{gate}]
  param up: [512, 256]
  let u = matmul(x, transpose(up, [1, 0]))
  output z = silu(matmul(x, {read})) * u{more}
}}
"""


@pytest.mark.parametrize(("gate", "read", "more"), [
    ("512, 256", "transpose(gate, [1, 0])", "\n  output w = u * 2.0"),  # u read elsewhere
    ("256, 512", "gate", ""),  # the gate's weight row-major: no kernel step
])
def test_no_pair_where_the_first_value_is_read_elsewhere_or_one_step_is_no_kernel(
        gate: str, read: str, more: str, tmp_path: Path) -> None:
    program = deviceless_program(PAIRS.format(gate=gate, read=read, more=more), tmp_path)[1]
    assert len([s for s in program.steps if program.nodes[s.nodes[0]].op == "matmul"]) == 2
    assert pairs(program) == []


def test_a_norm_after_other_steps_is_found(tmp_path: Path) -> None:
    source = NORMED.format(io="bf16", more="").replace(
        "let n = rmsnorm(x, s, eps=1e-5)", "let n = rmsnorm(relu(x), s, eps=1e-5)")
    bundle = _normed(tmp_path, "", source)
    program = Schedule(bundle)
    assert program.nodes[program.steps[0].nodes[0]].op == "relu"
    [j] = norms(program)
    assert j.absorbed.nodes == ("n",)


def test_a_joined_group_keeps_its_steps_signature_and_reason(tmp_path: Path) -> None:
    program = Schedule(every_kernel(_normed(tmp_path)))
    [step] = [s for s in program.steps if len(s.nodes) == 5]  # the norm, the pair, its epilogue
    group = join_group(program, step)
    assert (group.signature, group.reason, group.inputs) == (
        step.signature, step.reason, step.inputs)


def test_a_join_whose_step_apart_has_no_time_stays_apart(tmp_path: Path) -> None:
    """A kernel step with no time of its own (cuDNN refused its graph at compile time: never
    measured) leaves the pair's time apart unknown: the join is not made."""
    from dslc.tune.joins import measure_joins

    bundle, kernels = _kernels_taken(_program(tmp_path))
    times = {k.step.name: dict(k.kernel_ms) for k in kernels if k.step.name != "up"}
    [m] = measure_joins(bundle, pairs(Schedule(bundle)), times,
                        lambda b: lambda step, spec, storage, where: 0.001)
    assert m.apart_ms == {"B=1": None} and m.joined_ms == {"B=1": 0.001} and not m.chosen


def _kept_at_b4(tmp_path: Path) -> tuple[Bundle, list[KernelMeasured]]:
    """The decoder's steps at B=1 and B=4, tuned: each kernel step a kernel at B=1 (0.004 ms
    against its graph's 0.010) that keeps its graph at B=4 (its kernel 0.020 there)."""
    program = _program(tmp_path, rows="1, 4")  # type: ignore[arg-type]
    measured = []
    for step in kernel_steps(program):
        m = KernelMeasured(step)
        for bucket in program.bundle.buckets:
            m.graph_ms[bucket.key] = 0.010
            m.kernel_ms[bucket.key] = 0.004 if bucket.key == "B=1" else 0.020
        measured.append(m)
    return with_fusion(program.bundle, [], measured), measured


def test_steps_apart_are_timed_as_each_bucket_runs_them(tmp_path: Path) -> None:
    """The up and gate steps kernels at B=1 that keep their graphs at B=4 (their kernels 0.020
    ms there, the graphs 0.010): apart, B=4 runs the graphs, so the pair apart costs the
    graphs' times there (a join that wins at B=1 is not charged the kernels B=4 never runs)."""
    from dataclasses import replace

    from dslc.tune.joins import measure_joins

    bundle, measured = _kept_at_b4(tmp_path)
    bundle = replace(bundle, buckets=tuple(  # the plans the graphs kept were timed at 0.010
        replace(b, graphs={sig: replace(g, plan=replace(g.plan, ms=0.010))
                           for sig, g in b.graphs.items()}) for b in bundle.buckets))
    times = {m.step.name: dict(m.kernel_ms) for m in measured}
    [j] = measure_joins(bundle, pairs(Schedule(bundle)), times,
                        lambda b: lambda step, spec, storage, where: 0.001)
    assert j.apart_ms == {"B=1": pytest.approx(0.008), "B=4": pytest.approx(0.020)}


def test_every_kernel_runs_a_tuned_step_kept_as_a_graph_at_a_bucket_as_its_kernel_there(
        tmp_path: Path) -> None:
    """A tuned bundle whose steps kept their graphs at B=4 (their kernels slower there): the
    generated programs' check makes them kernels at every bucket, B=4 included."""
    from dslc.tune.joins import every_kernel

    tuned, _ = _kept_at_b4(tmp_path)
    assert any(s.graph_at == ("B=4",) for s in tuned.steps)
    out = Schedule(Bundle.from_data(every_kernel(tuned).to_data()))
    kernels = [s for s in out.steps if s.kind == "kernel"]
    assert kernels and not any(out.runs_graph(s, "B=4") for s in kernels)


def test_rows_are_counted_over_every_axis_but_the_last(tmp_path: Path) -> None:
    """Sixteen tokens of one sequence are 16 rows, past the few-row kernel's 8: offered to
    cuBLASLt, not to it."""
    source = DECODER.format(io="bf16", rows=1, most=8).replace(
        "input x: [B, 1, 256]", "input x: [1, 16, 256]").replace(
        "input h: [B, 1, 512]", "input h: [1, 16, 512]")
    program = deviceless_program(source, tmp_path)[1]
    steps = [s for s in program.steps if s.name in _matmul_steps(program)]
    assert len(steps) == 4 and set(kernel_steps(program)) == set(steps)
    assert not any(takes_matmul_kernel(program, s) for s in steps)
    assert all(takes_many_rows(program, s) for s in steps)


def test_a_join_of_a_step_that_kept_its_graph_at_a_bucket_is_a_kernel_at_every_bucket(
        tmp_path: Path) -> None:
    """The gate's step a kernel at B=1 that keeps its graph at B=4 (measured slower there):
    joined with the up projection, it computes both matmuls, which its graph does not, so the
    joined step has a signature of its own and no bucket runs the old graph for it. Each bucket
    computes what the compiled bundle computes (within bf16's rounding: joined, the up
    projection's value is held in f32, not stored in bf16)."""
    program = _program(tmp_path, rows="1, 4")  # type: ignore[arg-type]  # the compiled one
    bundle, _ = _kept_at_b4(tmp_path)
    [j] = pairs(Schedule(bundle))
    first, (second,) = j.absorbed, j.readers
    assert {b.key: second.signature in b.graphs for b in bundle.buckets} == {"B=1": False,
                                                                             "B=4": True}
    for bucket in bundle.buckets:
        j.apart_ms[bucket.key] = 0.010
        j.reader_ms.setdefault(second.name, {})[bucket.key] = 0.006
    out = Bundle.from_data(with_joins(bundle, [j]).to_data())
    [after] = [s for s in out.steps if s.name == second.name]
    assert after.nodes == (*first.nodes, *second.nodes) and after.signature != second.signature
    assert not any(sig in b.graphs for b in out.buckets
                   for sig in (after.signature, second.signature))
    (tmp_path / "w").mkdir()
    weights = random_weights(check_source(DECODER.format(io="bf16", rows="1, 4", most=8),
                                          tmp_path / "w").model.params, 5)
    for bucket in out.buckets:
        dims = dict(bucket.dims)
        g = rng("joined at a bucket", bucket.key)
        inputs = {"x": g.standard_normal((dims["B"], 1, 256)).astype(np.float32),
                  "h": g.standard_normal((dims["B"], 1, 512)).astype(np.float32)}
        want = arena.run(program, dims, inputs, weights)
        got = arena.run(Schedule(out), dims, inputs, weights)
        for name in ("y", "z", "r"):
            assert relative_error(got[name], want[name]) < ARENA_TOLERANCE["bf16"], \
                (bucket.key, name)


def test_a_joined_step_is_timed_at_a_floored_dims_sizes_writing_into_its_concat(
        tmp_path: Path) -> None:
    """Rows of `B // 2` (a dim only the model's dim environment evaluates: 1 at B=3, 2 at B=5),
    the pair's result written into its slice of a concatenation (a row 1,024 values apart, not
    512): the joined step's spec has the buffers' sizes and strides."""
    from dslc.tune.joins import measure_joins

    source = DECODER.format(io="bf16", rows=1, most=8).replace(
        "dim B = 1..8 tune [1]", "dim B = 2..16 tune [3, 5]").replace("[B, 1,", "[B // 2, 1,").replace(
        "output z = silu(g) * matmul(x, transpose(up, [1, 0]))",
        "output z = concat([silu(g) * matmul(x, transpose(up, [1, 0])), h], axis=2)")
    program = deviceless_program(source, tmp_path)[1]
    assert "z.mul" in program.placement
    bundle, kernels = _kernels_taken(program)
    times = {k.step.name: dict(k.kernel_ms) for k in kernels}
    seen: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {}

    def measurer(b: Bundle) -> Any:
        def measure(step: Any, spec: Any, storage: Any, where: str) -> float:
            [out] = [t for t in spec.tensors if t.role == "output"]
            seen[where] = (out.dims, out.strides)
            return 0.001
        return measure

    [j] = measure_joins(bundle, pairs(Schedule(bundle)), times, measurer)
    assert j.reader_ms == {"gate+silu+mul": {"B=3": 0.001, "B=5": 0.001}}
    assert seen["gate+silu+mul at B=5"] == ((2, 1, 512), (1024, 1024, 1))
    assert seen["gate+silu+mul at B=3"][0] == (1, 1, 512)
