"""Values kept inside a fused group are rounded to the model's `intermediate` dtype, values stored
between groups to their own dtype, in the reference (`dslc run --backend reference`, from the
source and from a bundle): checked on one matmul + add group against values worked out by hand.

The group is `y = matmul(x, w) + b` with x = [1, 1], w = [[1], [d]], so the matmul (kept inside
the group) is exactly 1 + d in f32, and b = -(1 - 2**-24) (f32 holds it exactly):
- intermediate f16, d = 3 * 2**-12: f16 holds 1 and 1 + 2**-10 near 1 (spacing 2**-10), and
  1 + 0.75 * 2**-10 rounds to 1 + 2**-10; then y = 2**-10 + 2**-24 (exact in f32, Sterbenz). Left
  in f32 it would be 3 * 2**-12 + 2**-24; rounded to f16 at the output, 2**-10.
- intermediate bf16, d = 3 * 2**-9: bf16's spacing near 1 is 2**-7, so 1 + d rounds to 1 + 2**-7
  and y = 2**-7 + 2**-24.
- intermediate f32: y = d + 2**-24.
- io f16 (the params too), intermediate f32: b = -1 (f16 has no 1 - 2**-24); the matmul stays
  1 + 3 * 2**-12 in f32, y = 3 * 2**-12 = 1.5 * 2**-11, which f16 holds exactly. Had the matmul
  been stored in f16 like the group's output, y would be 2**-10.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dslc.weights import save
from tests.helpers import run_cli

SOURCE = """model m {{
  precision io={io}, intermediate={intermediate}, compute=f32
  input x: [1, 2]
  param w: [2, 1]
  param b: [1]
  output y = matmul(x, w) + b
}}
"""
# io, intermediate, d, b, y (by hand, above)
CASES = [
    ("f32", "f16", 3 * 2.0**-12, -(1 - 2.0**-24), 2.0**-10 + 2.0**-24),
    ("f32", "bf16", 3 * 2.0**-9, -(1 - 2.0**-24), 2.0**-7 + 2.0**-24),
    ("f32", "f32", 3 * 2.0**-12, -(1 - 2.0**-24), 3 * 2.0**-12 + 2.0**-24),
    ("f16", "f32", 3 * 2.0**-12, -1.0, 3 * 2.0**-12),
]
NP = {"f32": np.float32, "f16": np.float16}


def _files(tmp_path: Path, io: str, intermediate: str, d: float, b: float) -> tuple[Path, ...]:
    src = tmp_path / "m.cgraph"
    src.write_text(SOURCE.format(io=io, intermediate=intermediate))
    dt = NP[io]
    w = np.array([[1.0], [d]], dt)
    bias = np.array([b], dt)
    assert float(w[1, 0]) == d and float(bias[0]) == b  # the inputs are held exactly
    weights = tmp_path / "w.safetensors"
    save(weights, {"w": w, "b": bias})
    x = tmp_path / "x.npy"
    np.save(x, np.ones((1, 2), dt))
    return src, weights, x


def _run(target: Path, weights: Path, x: Path, out: Path) -> np.ndarray:
    run = run_cli("run", str(target), "--backend", "reference", "--weights", str(weights),
                  "--input", f"x={x}", "-o", str(out))
    assert run.code == 0, run.stderr
    return np.load(out)["y"]


@pytest.mark.parametrize("io, intermediate, d, b, want", CASES,
                         ids=[f"io={c[0]}-intermediate={c[1]}" for c in CASES])
def test_fused_intermediate_is_rounded_to_the_intermediate_dtype(
        tmp_path: Path, io: str, intermediate: str, d: float, b: float, want: float) -> None:
    src, weights, x = _files(tmp_path, io, intermediate, d, b)
    y = _run(src, weights, x, tmp_path / "y.npz")
    assert y.dtype == NP[io] and y.shape == (1, 1)
    assert float(y[0, 0]) == want, f"{float(y[0, 0])!r} != {want!r} (by hand)"


@pytest.mark.parametrize("io, intermediate, d, b, want", [CASES[0], CASES[3]],
                         ids=["io=f32-intermediate=f16", "io=f16-intermediate=f32"])
def test_a_bundle_runs_its_groups_with_the_same_rounding(
        tmp_path: Path, io: str, intermediate: str, d: float, b: float, want: float) -> None:
    src, weights, x = _files(tmp_path, io, intermediate, d, b)
    assert run_cli("compile", str(src), "-o", str(tmp_path / "out"), "-q").code == 0
    y = _run(tmp_path / "out" / "m.bundle", weights, x, tmp_path / "y.npz")
    assert y.dtype == NP[io]
    assert float(y[0, 0]) == want, f"{float(y[0, 0])!r} != {want!r} (by hand)"
