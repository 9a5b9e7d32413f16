"""gather (numpy take: an embedding lookup) and arange (position ids): their type rules, the
references against PyTorch's own embedding and index_select, NaN for an index outside the table
(written out by hand), the std `embedding` named as torch.nn.Embedding, and their compile: both
run as fallback kernels (cuDNN's graph API has neither)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from dslc.backend.target import load_target
from dslc.compile.stage import compile_model
from dslc.ir import interp
from dslc.ir.to_torch import to_torch
from dslc.ir.verify import verify
from dslc.pipeline import lower_and_fuse
from tests.helpers import check_source, rng

EMBED = """import "std/nn.cgraph"
model m {
  dim B = 1..8 tune [2]
  dim S = 1..16 tune [5]
  input ids: i64[B, S]
  let tokens = embedding(ids, num=50, dim=8) as "tok"
  let positions = embedding(arange(S), num=16, dim=8) as "pos"
  output y = tokens + positions
}
"""


def _run(text: str, tmp_path: Path, inputs: dict[str, np.ndarray],
         weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    model = check_source(text, tmp_path).model
    lowered, _ = lower_and_fuse(model)
    # sound IR too: a slice whose ends disagree with its type reads the same through its
    # strides, so the values alone would not show it
    assert not verify(lowered, model.env), verify(lowered, model.env)[:3]
    return interp.run(lowered, inputs, weights, model.env)


def test_token_and_position_embeddings_equal_pytorch(tmp_path: Path) -> None:
    r = rng("gather", "embed")
    ids = r.integers(0, 50, (3, 5))
    tok = r.standard_normal((50, 8)).astype(np.float32)
    pos = r.standard_normal((16, 8)).astype(np.float32)
    got = _run(EMBED, tmp_path, {"ids": ids}, {"tok.weight": tok, "pos.weight": pos})
    t = torch.nn.Embedding(50, 8)
    p = torch.nn.Embedding(16, 8)
    with torch.no_grad():
        t.weight.copy_(torch.from_numpy(tok))
        p.weight.copy_(torch.from_numpy(pos))
        want = t(torch.from_numpy(ids)) + p(torch.arange(5))
    np.testing.assert_allclose(got["y"], want.numpy(), rtol=0, atol=0)


@pytest.mark.parametrize("axis", [0, 1, 2, -1])
def test_gather_along_any_axis_equals_index_select(axis: int, tmp_path: Path) -> None:
    r = rng("gather", axis)
    x = r.standard_normal((4, 5, 6)).astype(np.float32)
    size = x.shape[axis]
    idx = r.integers(0, size, (2, 3))
    got = _run(f"model m {{\n  input x: [4, 5, 6]\n  input i: i64[2, 3]\n"
               f"  output y = gather(x, i, axis={axis})\n}}\n", tmp_path, {"x": x, "i": idx}, {})
    a = axis % 3
    want = torch.index_select(torch.from_numpy(x), a, torch.from_numpy(idx).reshape(-1))
    want = want.reshape(*x.shape[:a], 2, 3, *x.shape[a + 1:])
    np.testing.assert_array_equal(got["y"], want.numpy())


def test_an_index_outside_the_table_gives_a_row_of_nan(tmp_path: Path) -> None:
    table = np.arange(12, dtype=np.float32).reshape(4, 3)
    got = _run("model m {\n  input i: i32[5]\n  param t: [4, 3]\n  output y = gather(t, i)\n}\n",
               tmp_path, {"i": np.array([3, 4, -1, 0, 2], np.int32)}, {"t": table})
    y = got["y"]
    np.testing.assert_array_equal(y[[0, 3, 4]], [[9, 10, 11], [0, 1, 2], [6, 7, 8]])
    assert np.isnan(y[[1, 2]]).all()


def test_the_pytorch_translation_gives_the_same_nan_rows(tmp_path: Path) -> None:
    model = check_source("model m {\n  input i: i64[4]\n  param t: [3, 2]\n"
                         "  output y = gather(t, i)\n}\n", tmp_path).model
    module = to_torch(model.graph, {}, "f32", model.env)
    table = np.array([[1, 2], [3, 4], [5, 6]], np.float32)
    module.load_weights({"t": table})
    y = module(i=torch.tensor([2, 3, 0, -2]))["y"].numpy()
    np.testing.assert_array_equal(y[[0, 2]], [[5, 6], [1, 2]])
    assert np.isnan(y[[1, 3]]).all()


def test_arange_counts_to_a_dynamic_dim(tmp_path: Path) -> None:
    got = _run("model m {\n  dim S = 1..9 tune [4]\n  input x: [S, 2]\n"
               "  output y = cast(arange(S), f32) + x[:, 0]\n}\n", tmp_path,
               {"x": np.zeros((7, 2), np.float32) + 0.5}, {})
    np.testing.assert_array_equal(got["y"], torch.arange(7).float().numpy() + 0.5)


@pytest.mark.parametrize(("body", "code"), [
    ("  input t: i32[4, 3]\n  input i: i64[2]\n  output y = gather(t, i)", "E0401"),
    ("  input t: [4, 3]\n  input i: [2]\n  output y = gather(t, i)", "E0401"),
    ("  input t: [4, 3]\n  input i: i64[2]\n  output y = gather(t, i, axis=2)", "E0305"),
    ("  input t: [4, 3]\n  output y = cast(arange(0), f32)", "E0305"),
    ("  input t: [4, 3]\n  output y = arange(3, dtype=f32)", "E0401"),
    ("  input t: [4, 3]\n  input i: i64[2, 2]\n  output y = gather(t, i, axis=-1)", None),
])
def test_the_type_rules(body: str, code: str | None, tmp_path: Path) -> None:
    assert check_source(f"model m {{\n{body}\n}}\n", tmp_path).codes == ([code] if code else [])


def test_both_run_as_fallback_kernels_with_the_reason(tmp_path: Path) -> None:
    """Positions past the table (S up to 20 rows of 16) keep their arange (else a slice)."""
    model = check_source(EMBED.replace("dim S = 1..16", "dim S = 1..20"), tmp_path).model
    lowered, plan = lower_and_fuse(model)
    c = compile_model(model, lowered, plan, load_target("h200"))
    nodes = c.graph.by_name()
    kernels = {nodes[s.group.nodes[0]].op: s.reason for s in c.steps if s.kind == "kernel"}
    assert set(kernels) == {"gather", "arange"}
    assert "no gather" in kernels["gather"] and "a fallback kernel" in kernels["arange"]


def _lowered_ops(text: str, tmp_path: Path) -> list[str]:
    model = check_source(text, tmp_path).model
    lowered, _ = lower_and_fuse(model)
    return [n.op for n in lowered.nodes]


def test_positions_picked_by_arange_read_the_table_in_place(tmp_path: Path) -> None:
    """S never exceeds the table's 16 rows: the position embeddings are its slice [0:S], a view
    (no gather, no arange left to run), equal to PyTorch's at S = 16, the last row read."""
    ops = _lowered_ops(EMBED, tmp_path)
    assert "arange" not in ops and ops.count("gather") == 1, ops  # the token lookup stays
    r = rng("gather", "in place")
    ids = r.integers(0, 50, (2, 16))
    tok = r.standard_normal((50, 8)).astype(np.float32)
    pos = r.standard_normal((16, 8)).astype(np.float32)
    got = _run(EMBED, tmp_path, {"ids": ids}, {"tok.weight": tok, "pos.weight": pos})
    np.testing.assert_array_equal(got["y"], tok[ids] + pos[None])


def test_positions_past_the_table_stay_a_gather_of_nan_rows(tmp_path: Path) -> None:
    """S may reach 20 against a table of 16 rows: a slice could not give the rows past it, so
    the gather stays, NaN there as for any index outside the table."""
    text = EMBED.replace("dim S = 1..16", "dim S = 1..20")
    assert "arange" in _lowered_ops(text, tmp_path)
    r = rng("gather", "past")
    pos = r.standard_normal((16, 8)).astype(np.float32)
    got = _run(text, tmp_path, {"ids": r.integers(0, 50, (1, 18))},
               {"tok.weight": np.zeros((50, 8), np.float32), "pos.weight": pos})
    np.testing.assert_array_equal(got["y"][0, :16], pos)
    assert np.isnan(got["y"][0, 16:]).all()


def test_an_arange_along_an_inner_axis_is_a_slice_of_that_axis(tmp_path: Path) -> None:
    text = ("model m {\n  dim S = 1..6 tune [4]\n  input x: [3, 6, 2]\n  input s: [S]\n"
            "  output y = gather(x, arange(S), axis=1) + 0.5\n}\n")
    ops = _lowered_ops(text, tmp_path)
    assert "gather" not in ops and "view" in ops, ops  # the slice, read in place
    x = rng("gather", "inner").standard_normal((3, 6, 2)).astype(np.float32)
    got = _run(text, tmp_path, {"x": x, "s": np.zeros(4, np.float32)}, {})
    want = torch.index_select(torch.from_numpy(x), 1, torch.arange(4)) + 0.5
    np.testing.assert_array_equal(got["y"], want.numpy())
