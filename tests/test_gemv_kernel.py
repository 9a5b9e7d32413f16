"""The few-row matmul kernel with its epilogue (`backend.gemv`) on the CPU: which steps it
computes and how (input, weight, the epilogue's operands; the matmul's value as the reference
holds it), that the tuner offers a decoder's projections to it and not a matmul of many rows or of a weight
whose N is contiguous,
that a bundle whose step is that kernel reads back valid, and that every kernel compiles with
NVRTC for the H200 without a warning or a spill. Its numbers are checked on the H200
(tests/gpu/test_gemv_gpu.py)."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from dslc.backend import gemv
from dslc.runtime.records import Bundle
from dslc.tune.fusion import KernelMeasured, kernel_steps, with_fusion
from tests.helpers import deviceless_program, nvrtc_compile

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


@pytest.mark.parametrize(("rows", "offered"), [(1, True), (8, True), (16, False)])
def test_the_tuner_offers_projections_of_at_most_8_rows_to_the_kernel(
        rows: int, offered: bool, tmp_path: Path) -> None:
    program = _program(tmp_path, rows=rows, most=16)
    matmuls = set(_matmul_steps(program))
    found = {s.name for s in kernel_steps(program)} & matmuls
    assert ROW_MAJOR in matmuls and len(matmuls) == 4
    assert found == (matmuls - {ROW_MAJOR} if offered else set())


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
    measured = []
    for step in kernel_steps(program):
        m = KernelMeasured(step)
        for bucket in program.bundle.buckets:
            m.graph_ms[bucket.key], m.kernel_ms[bucket.key] = 0.010, 0.004
        measured.append(m)
    out = Bundle.from_data(with_fusion(program.bundle, [], measured).to_data())
    kinds = {s.name: s.kind for s in out.steps}
    assert {name: kinds[name] for name in _matmul_steps(program)} == {
        name: "graph" if name == ROW_MAJOR else "kernel" for name in _matmul_steps(program)}


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
        for rows in (1, gemv.MOST_ROWS):
            source, name = gemv._kernel.__wrapped__(g, rows)
            ok, log = nvrtc_compile(source)
            assert ok and "warning" not in log and name in source, (step.name, log[:2000])
            spilled = [int(n) for n in re.findall(r"(\d+) bytes spill stores", log)]
            assert spilled and max(spilled) == 0, (step.name, rows, log[:2000])
