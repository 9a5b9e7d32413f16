"""The few-row matmul kernel with its epilogue (`backend.gemv`) on the H200: a bundle whose
projections all run as the kernel (a residual add, a SiLU gate, a matmul alone) equals the
reference executor at 1 and 3 rows, in bf16 and f16; and `dslc tune --fusion measure` times
each projection as the kernel (checked, a time, not `-`) against cuDNN's graph."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from dslc.emit import bundle as emit_bundle
from dslc.runtime.bundle import load
from dslc.runtime.schedule import Schedule
from dslc.tune.joins import every_kernel, pairs, with_joins
from tests.gpu.common import (
    TOLERANCE,
    compile_source,
    random_inputs,
    reference,
    rel_error,
    to_device,
    to_host,
)
from tests.helpers import matmuls_as_kernels

pytestmark = pytest.mark.gpu

DECODER = """
model m {{
  precision io={io}
  dim B = 1..8 tune [1]
  input x: [B, 1, 2048]
  input h: [B, 1, 1024]
  param w: [1024, 2048]
  param gate: [1536, 2048]
  param up: [1536, 2048]
  param head: [3000, 2048]
  output y = h + matmul(x, transpose(w, [1, 0]))
  output z = silu(matmul(x, transpose(gate, [1, 0]))) * matmul(x, transpose(up, [1, 0]))
  output logits = matmul(x, transpose(head, [1, 0]))
}}
"""


@pytest.mark.parametrize("paired", [False, True])
@pytest.mark.parametrize("io", ["bf16", "f16"])
def test_projections_as_the_kernel_equal_the_reference(
        io: str, paired: bool, tmp_path: Path) -> None:
    """`paired`: z's up projection and its gate's step one kernel (`tune.joins.pairs`)."""
    from dslc.runtime import Model


    bundle = compile_source(DECODER.format(io=io), tmp_path)
    program = Schedule(load(bundle))
    out, count = matmuls_as_kernels(program.bundle)
    # every projection: the source's four matmuls (z's up alone, its gate with the SiLU and
    # the product), each its own step
    matmuls = [s for s in program.steps if any(program.nodes[n].op == "matmul" for n in s.nodes)]
    assert count == len(matmuls) == DECODER.count("matmul(")
    if paired:
        out = with_joins(out, pairs(Schedule(out)), every=True)
        assert [len(s.nodes) for s in out.steps if s.kind == "kernel"].count(4) == 1
    emit_bundle.write(bundle, out)
    model = Model(bundle, bundle.with_suffix(".safetensors"), tuning_db=None)
    for rows in (1, 3):
        inputs = random_inputs(bundle, {"B": rows}, seed=31 + rows)
        got = to_host(model.run(to_device(inputs, bundle)))
        want = reference(bundle, inputs)
        for name in ("y", "z", "logits"):
            err = rel_error(got[name], want[name])
            print(f"gemv {io} rows {rows} paired {paired} {name}: relative error {err:.2e}")
            assert err < TOLERANCE[io] and np.isfinite(got[name]).all()


def test_the_tuner_measures_each_projection_as_the_kernel(
        tmp_path: Path) -> None:
    from tests.helpers import run_cli

    bundle = compile_source(DECODER.format(io="bf16"), tmp_path)
    run = run_cli("tune", str(bundle), "--fusion", "measure", "--budget", "2",
                  "--tuning-db", "none", "-q")
    print(run.stdout)
    assert run.code == 0, run.stderr
    times = re.findall(r"cuDNN graph ([\d.]+) ms, one kernel ([\d.]+) ms", run.stdout)
    assert len(times) >= 3, run.stdout
    # z's up projection and gate measured as one kernel against the two steps
    joined = re.findall(r"apart ([\d.]+) ms, joined ([\d.]+) ms", run.stdout)
    assert len(joined) == 1 and all(float(t) > 0 for t in joined[0]), run.stdout


NORMED = """
model m {{
  precision io={io}
  dim B = 1..8 tune [1]
  input x: [B, 1, {k}]
  input h: [B, 1, 1024]
  param s: [{k}]
  param w: [1024, {k}]
  param gate: [1536, {k}]
  param up: [1536, {k}]
  let n = rmsnorm(x, s, eps=1e-5)
  output y = h + matmul(n, transpose(w, [1, 0]))
  output z = silu(matmul(n, transpose(gate, [1, 0]))) * matmul(n, transpose(up, [1, 0]))
}}
"""


@pytest.mark.parametrize("k", [2048, 12])
@pytest.mark.parametrize("io", ["bf16", "f16"])
def test_an_rms_norm_inside_the_projection_kernels_equals_the_reference(
        io: str, k: int, tmp_path: Path) -> None:
    """The norm computed by each projection kernel as it reads x (`backend.gemv.Norm`): the
    residual projection's and the gate/up pair's; at K=12 (not a multiple of 8) the fallback
    computes them (the norm by its reference: generated programs found it crashing)."""
    from dslc.runtime import Model

    bundle = compile_source(NORMED.format(io=io, k=k), tmp_path)
    out = every_kernel(load(bundle))
    program = Schedule(out)
    normed = [g for g in map(program.matmul_kernel, program.steps) if g and g.norm]
    assert len(normed) == 2 and all(s.kind == "kernel" for s in out.steps)
    emit_bundle.write(bundle, out)
    model = Model(bundle, bundle.with_suffix(".safetensors"), tuning_db=None)
    for rows in (1, 3):
        inputs = random_inputs(bundle, {"B": rows}, seed=41 + rows)
        x = inputs["x"]
        inputs["x"] = (x.astype(np.float32) * 3.0).astype(x.dtype)  # the norm brings it back
        got = to_host(model.run(to_device(inputs, bundle)))
        want = reference(bundle, inputs)
        for name in ("y", "z"):
            err = rel_error(got[name], want[name])
            print(f"normed gemv {io} K {k} rows {rows} {name}: relative error {err:.2e}")
            assert err < TOLERANCE[io] and np.isfinite(got[name]).all()
