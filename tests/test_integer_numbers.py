"""A number written beside integer tensors is an integer of theirs (`arange(S) + 2`, `ids == 0`,
`max(ids - 1, 0)`), computed exactly: in the reference, in the PyTorch translation, and on the
GPU in a fallback kernel (a cuDNN graph computes in floats). Division, powers and float numbers
still need a cast (E0402). Expected values are written out by hand or come from plain Python
integers, never from the reference's numpy."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from dslc.backend.target import load_target
from dslc.compile.stage import compile_model
from dslc.ir import interp
from dslc.ir.to_torch import to_torch
from dslc.pipeline import lower_and_fuse
from tests.helpers import check_source

POSITIONS = """import "std/nn.cgraph"
model m {
  dim S = 1..64 tune [5]
  input ids: i64[2, S]
  let pos = embedding(arange(S) + 2, num=70, dim=4) as "pos"
  output pad: bool[2, S] = ids == 0
  output clipped: i64[2, S] = max(ids * 3 - 7, 0)
  output big: i64[2, S] = ids + 3000000001
  output y = pos
}
"""

IDS = np.array([[0, 1, 2, 0, 5], [7, 0, 3, 4000000001, 1]], dtype=np.int64)
WEIGHT = np.arange(70 * 4, dtype=np.float32).reshape(70, 4) / 8


def _expected() -> dict[str, list[list[object]]]:
    rows = IDS.tolist()
    return {"pad": [[v == 0 for v in row] for row in rows],
            "clipped": [[max(v * 3 - 7, 0) for v in row] for row in rows],
            "big": [[v + 3000000001 for v in row] for row in rows]}


def test_integer_numbers_type_as_the_tensors_integers(tmp_path: Path) -> None:
    model = check_source(POSITIONS, tmp_path).model
    scalars = {n.name: n.type.dtype for n in model.graph.nodes if n.op == "scalar"}
    assert set(scalars.values()) == {"i64"}, scalars
    add = next(n for n in model.graph.nodes if n.op == "add" and n.name.startswith("pos"))
    assert add.type.dtype == "i64"


def test_reference_computes_integers_exactly(tmp_path: Path) -> None:
    model = check_source(POSITIONS, tmp_path).model
    lowered, _ = lower_and_fuse(model)
    got = interp.run(lowered, {"ids": IDS}, {"pos.weight": WEIGHT}, model.env)
    for name, want in _expected().items():
        assert got[name].tolist() == want, name
    # positions 2..6 pick rows 2..6 of the table: row r holds r*4/8 .. (r*4+3)/8
    assert got["y"].tolist() == [[(r * 4 + c) / 8 for c in range(4)] for r in range(2, 7)]


def test_pytorch_translation_computes_integers_exactly(tmp_path: Path) -> None:
    model = check_source(POSITIONS, tmp_path).model
    lowered, _ = lower_and_fuse(model)
    program = to_torch(lowered, {"S": 5}, "declared", model.env)
    program.load_weights({"pos.weight": torch.from_numpy(WEIGHT)})
    with torch.no_grad():
        got = program(ids=torch.from_numpy(IDS))
    for name, want in _expected().items():
        assert got[name].tolist() == want, name


def test_integer_arithmetic_runs_in_fallback_kernels(tmp_path: Path) -> None:
    model = check_source(POSITIONS, tmp_path).model
    lowered, plan = lower_and_fuse(model)
    out = compile_model(model, lowered, plan, load_target("h200"))
    nodes = lowered.by_name()
    for step in out.steps:
        node = nodes[step.group.nodes[0]]
        if node.op in ("add", "sub", "mul", "max", "cmp_eq"):
            assert step.kind == "kernel", (node.name, step.reason)
            assert "integer arithmetic" in step.reason


@pytest.mark.parametrize("expr", ["ids / 2", "ids + 0.5", "pow(ids, 2)"])
def test_division_powers_and_float_numbers_need_a_cast(expr: str, tmp_path: Path) -> None:
    text = f"model m {{\n  input ids: i64[2, 3]\n  output y = {expr}\n}}\n"
    assert "E0402" in check_source(text, tmp_path).codes


def test_a_float_tensor_keeps_float_numbers(tmp_path: Path) -> None:
    text = "model m {\n  input x: f32[2, 3]\n  output y = x + 2\n}\n"
    model = check_source(text, tmp_path).model
    assert {n.type.dtype for n in model.graph.nodes if n.op == "scalar"} == {"f32"}


def test_an_undeclared_integer_output_keeps_its_dtype_and_a_float_takes_io(
        tmp_path: Path) -> None:
    """`output next = ids + 2049` with no dtype written stays i32: cast to the model's f16 (the
    io default before) it would round 4,096 + 1 to 4,096. A float output still takes io, and a
    mask (0 and 1 exact in f16) too."""
    model = check_source("""model m {
  precision io=f16
  input ids: i32[2, 3]
  input x: f32[2, 3]
  output same = ids
  output next = ids + 2049
  output y = x * 2.0
  output m = x > 0.0
}
""", tmp_path).model
    types = {name: str(model.graph.by_name()[value].type) for name, value in model.graph.outputs}
    assert types == {"same": "i32[2, 3]", "next": "i32[2, 3]", "y": "f16[2, 3]",
                     "m": "f16[2, 3]"}
    ids = np.array([[1, 2, 3], [4, 5, 2048]], dtype=np.int32)
    x = np.ones((2, 3), np.float32)
    got = interp.run(model.graph, {"ids": ids, "x": x}, {}, model.env)
    assert got["same"].tolist() == [[1, 2, 3], [4, 5, 2048]]
    assert got["next"].tolist() == [[2050, 2051, 2052], [2053, 2054, 4097]]
