"""Dims read off input shapes where a size names a dim another input binds: `b: [P + T]` with T
known from `a: [T]` gives P = size - T, in either declaration order (the reference backend used to
take T's coefficient for its value, and the runner refused the later order)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dslc.emit.manifest import manifest_record
from dslc.ir import interp
from dslc.runtime.inputs import bind_inputs
from tests.helpers import check_source, run_cli

A = "  input a: [T, 4]\n"
B = "  input b: [P + T, 4]\n"


def _source(first: str, second: str) -> str:
    return ("model m {\n  dim T = 1..8\n  dim P = 1..8\n" + first + second +
            "  output y: [T, 4] = relu(a)\n  output z: [P + T, 4] = relu(b)\n}\n")


@pytest.mark.parametrize("order", ["a first", "b first"])
def test_p_plus_t_is_solved_once_t_is_known(order: str, tmp_path: Path) -> None:
    text = _source(A, B) if order == "a first" else _source(B, A)
    model = check_source(text, tmp_path).model
    shapes = {"a": ((2, 4), "f32"), "b": ((7, 4), "f32")}
    assert bind_inputs(manifest_record(model), shapes) == {"T": 2, "P": 5}
    arrays = {"a": np.ones((2, 4), np.float32), "b": np.ones((7, 4), np.float32)}
    assert interp.bind_dims(model.graph, arrays) == {"T": 2, "P": 5}


def test_dslc_run_reads_p_plus_t_in_the_later_order(tmp_path: Path) -> None:
    src = tmp_path / "m.cgraph"
    src.write_text(_source(B, A))
    rng = np.random.default_rng(12)
    a, b = rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal((8, 4)).astype(np.float32)
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", b)
    run = run_cli("run", str(src), "--input", f"a={tmp_path / 'a.npy'}", "--input",
                  f"b={tmp_path / 'b.npy'}", "-o", str(tmp_path / "out.npz"))
    assert run.code == 0, run.stderr
    out = np.load(tmp_path / "out.npz")
    np.testing.assert_array_equal(out["z"], np.maximum(b, 0))  # P = 8 - 3 = 5
