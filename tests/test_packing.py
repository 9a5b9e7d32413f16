"""Sibling projections packed into one matmul (dslc/lower/packing.py): q, k and v of one
activation become one matmul by weights joined at load time, each a view of its result, and
compute what three separate projections compute (numpy, written out here, through the arena
oracle that lays memory out as the runtime does); projections whose result a pointwise op reads
keep their own matmul, and so do ones of different activations or depths."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dslc.fuzz import arena
from dslc.fuzz.oracle import relative_error
from dslc.ir import interp
from dslc.pipeline import lower_and_fuse
from dslc.weights import random_weights
from tests.helpers import check_source, deviceless_program, rng

HEAD = 'import "std/nn.cgraph"\nmodel m {\n  input x: [2, 6, 16]\n'
QKV = HEAD + """  let q = linear(x, out=16) as "q"
  let k = linear(x, out=8) as "k"
  let v = linear(x, out=8, has_bias=false) as "v"
  output y = reshape(q, [2, 6, 2, 8])
  output z = transpose(k, [0, 2, 1])
  output w = v
}
"""


def _matmuls(text: str, tmp_path: Path) -> list[tuple[str, tuple[object, ...]]]:
    lowered, _ = lower_and_fuse(check_source(text, tmp_path).model)
    nodes = lowered.by_name()
    return [(n.name, nodes[n.inputs[1]].type.shape) for n in lowered.nodes if n.op == "matmul"]


def test_projections_of_one_activation_become_one_matmul_per_kind_of_bias(
        tmp_path: Path) -> None:
    # q and k (both with a bias) pack into [16, 24]; v, without one, stays apart
    assert sorted(shape for _, shape in _matmuls(QKV, tmp_path)) == [(16, 8), (16, 24)]


def test_a_packed_projection_computes_what_the_three_compute(tmp_path: Path) -> None:
    model, program = deviceless_program(QKV, tmp_path)
    assert sum(n.op == "matmul" for n in program.graph.nodes) == 2  # q and k packed
    x = rng("packed projections").standard_normal((2, 6, 16)).astype(np.float32)
    w = random_weights(model.params, 5)
    got = arena.run(program, {}, {"x": x}, w)
    q = x @ w["q.weight"].T + w["q.bias"]
    k = x @ w["k.weight"].T + w["k.bias"]
    want = {"y": q.reshape(2, 6, 2, 8), "z": k.transpose(0, 2, 1), "w": x @ w["v.weight"].T}
    for name, value in want.items():
        assert got[name].shape == value.shape and relative_error(got[name], value) < 1e-6, name


_LINEAR_WEIGHTS = {  # how each weight is declared and read -> whether the packed one is K-contiguous
    "both transposed": ("""  param a: [16, 24]
  param b: [8, 24]
  output y = reshape(matmul(x, transpose(a, [1, 0])), [12, 16])
  output z = reshape(matmul(x, transpose(b, [1, 0])), [12, 8])
""", True),
    "both as they are": ("""  param a: [24, 16]
  param b: [24, 8]
  output y = reshape(matmul(x, a), [12, 16])
  output z = reshape(matmul(x, b), [12, 8])
""", False),
    # the joined weight is laid out as its first part is read (`lower.views`)
    "the first transposed": ("""  param a: [16, 24]
  param b: [24, 8]
  output y = reshape(matmul(x, transpose(a, [1, 0])), [12, 16])
  output z = reshape(matmul(x, b), [12, 8])
""", True),
}


@pytest.mark.parametrize("case", list(_LINEAR_WEIGHTS))
def test_packed_linear_weights_keep_k_contiguous(case: str, tmp_path: Path) -> None:
    """PyTorch linears' [N, K] weights, read transposed, are joined along N and stay
    K-contiguous, as each branch read its own (what the few-row matmul kernel takes). Weights
    given as [K, N] are joined along N as they are."""
    body, contiguous_k = _LINEAR_WEIGHTS[case]
    text = "model m {\n  input x: [2, 6, 24]\n" + body + "}\n"
    model, program = deviceless_program(text, tmp_path)
    [m] = [n for n in program.graph.nodes if n.op == "matmul"]
    w = program.storage(m.inputs[1], dict(program.bundle.buckets[0].dims))
    assert w.shape == (24, 24) and (w.strides[0] == 1) == contiguous_k
    x = rng("packed linears").standard_normal((2, 6, 24)).astype(np.float32)
    weights = random_weights(model.params, 3)
    got = arena.run(program, {}, {"x": x}, weights)
    a, b = (weights[k].T if weights[k].shape[0] != 24 else weights[k] for k in ("a", "b"))
    for name, value in (("y", (x @ a).reshape(12, 16)), ("z", (x @ b).reshape(12, 8))):
        assert relative_error(got[name], value) < 1e-6, name


def test_a_projection_a_pointwise_op_reads_keeps_its_epilogue(tmp_path: Path) -> None:
    text = HEAD + """  let a = linear(x, out=16) as "a"
  let b = linear(x, out=16) as "b"
  let c = linear(x, out=16) as "c"
  output y = gelu(a) + b
  output z = c
}
"""
    # GELU reads a (its epilogue), an add reads b: each stays fused with its matmul; c alone
    assert len(_matmuls(text, tmp_path)) == 3


def test_a_pointwise_op_after_a_view_does_not_keep_a_projection_apart(tmp_path: Path) -> None:
    text = HEAD + """  let a = linear(x, out=16) as "a"
  let b = linear(x, out=16) as "b"
  output y = relu(reshape(a, [12, 16]))
  output z = reshape(b, [12, 16])
}
"""
    # fusion never extends an epilogue through a view: the relu runs apart either way
    assert [shape for _, shape in _matmuls(text, tmp_path)] == [(16, 32)]


def test_a_projection_without_a_bias_joins_with_zeros_for_its_bias(tmp_path: Path) -> None:
    """Whisper's k_proj has no bias, its q_proj and v_proj have: the three are one matmul, k's
    part of the joined bias zeros (made when the weights load), and each computes what it did."""
    text = HEAD + """  let q = linear(x, out=16) as "q"
  let k = linear(x, out=8, has_bias=false) as "k"
  let v = linear(x, out=8) as "v"
  output y = reshape(q, [12, 16])
  output z = transpose(k, [0, 2, 1])
  output w = reshape(v, [12, 8])
}
"""
    model, program = deviceless_program(text, tmp_path)
    [m] = [n for n in program.graph.nodes if n.op == "matmul"]
    assert m.type.shape == (2, 6, 32) and m.path == "q|k|v"
    x = rng("zero bias").standard_normal((2, 6, 16)).astype(np.float32)
    w = random_weights(model.params, 11)
    got = arena.run(program, {}, {"x": x}, w)
    want = {"y": (x @ w["q.weight"].T + w["q.bias"]).reshape(12, 16),
            "z": (x @ w["k.weight"].T).transpose(0, 2, 1),
            "w": (x @ w["v.weight"].T + w["v.bias"]).reshape(12, 8)}
    for name, value in want.items():
        assert got[name].shape == value.shape and relative_error(got[name], value) < 1e-6, name


def test_projections_whose_biases_differ_in_dtype_stay_apart(tmp_path: Path) -> None:
    """An f32 bias beside an f16 one: joined, one of them would be read as the other's dtype.
    The projection without a bias joins a family whose result has its dtype."""
    text = """model m {
  precision io=f16
  input x: [2, 6, 16]
  param a: [16, 16]
  param b: [16, 8]
  param c: [16, 8]
  param ba: f32[16]
  param bb: [8]
  output y = reshape(bias_add(matmul(x, a), ba, axis=2), [12, 16])
  output z = reshape(bias_add(matmul(x, b), bb, axis=2), [12, 8])
  output w = reshape(matmul(x, c), [12, 8])
}
"""
    model, program = deviceless_program(text, tmp_path)
    widths = sorted(n.type.shape[-1] for n in program.graph.nodes if n.op == "matmul")
    assert widths == [8, 24]  # a and b apart; c (no bias) joined with the first, a
    x = rng("bias dtypes").standard_normal((2, 6, 16)).astype(np.float16)
    w = random_weights(model.params, 13)
    got = arena.run(program, {}, {"x": x}, w)
    f = {k: v.astype(np.float32) for k, v in w.items()}
    xf = x.astype(np.float32)
    want = {"y": (xf @ f["a"] + f["ba"]).reshape(12, 16),
            "z": (xf @ f["b"] + f["bb"]).reshape(12, 8), "w": (xf @ f["c"]).reshape(12, 8)}
    for name, value in want.items():
        assert relative_error(got[name].astype(np.float32), value) < 2e-3, name


def test_projections_of_other_activations_or_depths_stay_apart(tmp_path: Path) -> None:
    text = HEAD + """  input u: [2, 6, 8]
  let a = linear(x, out=16) as "a"
  let b = linear(u, out=16) as "b"
  let c = linear(reshape(x, [2, 12, 8]), out=16) as "c"
  output y = reshape(a, [12, 16])
  output z = reshape(b, [12, 16])
  output t = reshape(c, [24, 16])
}
"""
    assert len(_matmuls(text, tmp_path)) == 3


def test_readers_of_an_early_projection_come_after_the_packed_matmul(tmp_path: Path) -> None:
    text = HEAD + """  let q = linear(x, out=8) as "q"
  let s = reduce_sum(q, axes=[2])
  let k = linear(x, out=8) as "k"
  output y = s
  output z = reduce_max(k, axes=[2])
}
"""
    lowered, _ = lower_and_fuse(check_source(text, tmp_path).model)
    order = [n.name for n in lowered.nodes]
    [packed] = [n for n in lowered.nodes if n.op == "matmul"]
    assert all(order.index(i) < order.index(n.name) for n in lowered.nodes for i in n.inputs)
    reduce_q = next(n.name for n in lowered.nodes if n.op == "reduce_sum")
    assert order.index(packed.name) < order.index(reduce_q)


def test_a_family_whose_activation_another_family_packed_reads_its_slice(tmp_path: Path) -> None:
    """Generated program 182 of seed 60: v10 is packed with v6, and is the activation of the
    q/k/v family packed next."""
    text = HEAD + """  param p5: [16, 16]
  param p9: [16, 16]
  param p24: [16, 8]
  param p26: [16, 8]
  let v6 = matmul(x, p5)
  let v10 = matmul(x, p9)
  output a = reshape(v6, [12, 16])
  output b = reshape(matmul(v10, p24), [12, 8])
  output c = reshape(matmul(v10, p26), [12, 8])
}
"""
    model = check_source(text, tmp_path).model
    lowered, _ = lower_and_fuse(model)
    assert sorted(s for _, s in _matmuls(text, tmp_path)) == [(16, 16), (16, 32)]
    x = rng("two packed families").standard_normal((2, 6, 16)).astype(np.float32)
    w = random_weights(model.params, 6)
    got = interp.run(lowered, {"x": x}, w, model.env)
    v10 = x @ w["p9"]
    want = {"a": (x @ w["p5"]).reshape(12, 16), "b": (v10 @ w["p24"]).reshape(12, 8),
            "c": (v10 @ w["p26"]).reshape(12, 8)}
    for name, value in want.items():
        assert relative_error(got[name], value) < 1e-6, name


def test_three_projections_pack_at_their_offsets_and_compute_what_they_compute(
        tmp_path: Path) -> None:
    """Three widths (16, 8, 4) of a depth of 12: each slice starts where the last ended (a
    family of two cannot tell an offset from a width), the packed weight is depth x total."""
    text = """import "std/nn.cgraph"
model m {
  input x: [2, 6, 12]
  let q = linear(x, out=16) as "q"
  let k = linear(x, out=8) as "k"
  let v = linear(x, out=4) as "v"
  output y = q
  output z = k
  output w = v
}
"""
    [(name, shape)] = _matmuls(text, tmp_path)
    assert shape == (12, 28) and name.startswith("q") and name.endswith(".packed")  # the first's
    model, program = deviceless_program(text, tmp_path)
    x = rng("three packed projections").standard_normal((2, 6, 12)).astype(np.float32)
    w = random_weights(model.params, 6)
    got = arena.run(program, {}, {"x": x}, w)
    for out, name in (("y", "q"), ("z", "k"), ("w", "v")):
        want = x @ w[f"{name}.weight"].T + w[f"{name}.bias"]
        assert got[out].shape == want.shape and relative_error(got[out], want) < 1e-6, name


def test_a_packed_projection_is_named_by_its_common_block_and_each_branch() -> None:
    from dslc.lower.packing import _joined_path

    assert _joined_path(["encoder.layer.0.attn.q_proj", "encoder.layer.0.attn.k_proj",
                         "encoder.layer.0.attn.v_proj"]) == "encoder.layer.0.attn.q_proj|k_proj|v_proj"
    assert _joined_path(["mlp.gate", "mlp.up"]) == "mlp.gate|up"
    assert _joined_path(["a.0.q", "a.1.q"]) == "a.0.q|1.q"  # they part in the middle
    assert _joined_path(["q", "k"]) == "q|k"  # no common block
    # a gated MLP's gate and up weights, params of one def: one block, each keeps its last part
    assert _joined_path(["layers.0.mlp", "layers.0.mlp"]) == "layers.0.mlp|mlp"


def test_a_packed_result_keeps_the_memory_order_of_its_branches(tmp_path: Path) -> None:
    """In an NHWC model a projection's biased rank-4 result takes the model's memory order: so
    does the packed one whose views stand for the projections."""
    head = """import "std/nn.cgraph"
model m {
  layout NHWC
  input x: [2, 16, 4, 4]
  let h = transpose(x, [0, 2, 3, 1])
  let q = linear(h, out=16) as "q"
  output y = q
"""

    def last(text: str, op: str) -> list[Any]:
        lowered, _ = lower_and_fuse(check_source(text, tmp_path).model)
        return [n.type.layout for n in lowered.nodes if n.op == op]

    [alone] = last(head + "}\n", "bias_add")
    [packed] = last(head + '  let k = linear(h, out=8) as "k"\n  output z = k\n}\n', "bias_add")
    assert alone is not None and packed == alone


def test_a_reader_held_back_by_two_families_does_not_hold_back_the_next(tmp_path: Path) -> None:
    """r1 reads a projection of x and one of u, r2 one of x only; both come before x's family
    is packed, and u's is packed after x's: when x's slices are placed r1 still waits on u's,
    r2 is placed at once, and every node is kept."""
    text = """import "std/nn.cgraph"
model m {
  input x: [2, 6, 16]
  input u: [2, 6, 16]
  let q1 = linear(x, out=8) as "q1"
  let q2 = linear(u, out=8) as "q2"
  let r1 = concat([q1, q2], axis=2)
  let r2 = reduce_sum(q1, axes=[2])
  let k1 = linear(x, out=8) as "k1"
  let k2 = linear(u, out=8) as "k2"
  output a = r1
  output b = r2
  output c = reduce_max(k1, axes=[2])
  output d = reduce_max(k2, axes=[2])
}
"""
    assert sorted(s for _, s in _matmuls(text, tmp_path)) == [(16, 16), (16, 16)]
    model = check_source(text, tmp_path).model
    lowered, _ = lower_and_fuse(model)
    x, u = (rng("held back readers", n).standard_normal((2, 6, 16)).astype(np.float32)
            for n in "xu")
    w = random_weights(model.params, 7)
    got = interp.run(lowered, {"x": x, "u": u}, w, model.env)

    def lin(t: np.ndarray, name: str) -> np.ndarray:
        return t @ w[f"{name}.weight"].T + w[f"{name}.bias"]

    want = {"a": np.concatenate([lin(x, "q1"), lin(u, "q2")], axis=2),
            "b": lin(x, "q1").sum(axis=2), "c": lin(x, "k1").max(2), "d": lin(u, "k2").max(2)}
    for name, value in want.items():
        assert got[name].shape == value.shape and relative_error(got[name], value) < 1e-6, name


@pytest.mark.parametrize(("body", "count"), [
    # second operands that are activations, not weights: nothing to join at load time
    ("  input p: [16, 8]\n  input r: [16, 8]\n"
     "  output y = reshape(matmul(x, p), [12, 8])\n  output z = reshape(matmul(x, r), [12, 8])",
     2),
    # a projection that is itself an output keeps its own result
    ("  param p: [16, 8]\n  param r: [16, 8]\n"
     "  output y = matmul(x, p)\n  output z = reshape(matmul(x, r), [12, 8])", 2),
    # batched (rank-3) weights
    ("  param p: [2, 16, 8]\n  param r: [2, 16, 8]\n"
     "  output y = reshape(matmul(x, p), [12, 8])\n  output z = reshape(matmul(x, r), [12, 8])",
     2),
    # a matmul that cannot pack, first in the program, does not stop the family after it
    ("  input u: [16, 8]\n  param p: [16, 8]\n  param r: [16, 8]\n"
     "  output t = reshape(matmul(x, u), [12, 8])\n"
     "  output y = reshape(matmul(x, p), [12, 8])\n  output z = reshape(matmul(x, r), [12, 8])",
     2),
    # nor does a projection the model outputs, first in the program
    ("  param e: [16, 8]\n  param p: [16, 8]\n  param r: [16, 8]\n  output t = matmul(x, e)\n"
     "  output y = reshape(matmul(x, p), [12, 8])\n  output z = reshape(matmul(x, r), [12, 8])",
     2),
])
def test_what_packs_and_what_stays_apart(body: str, count: int, tmp_path: Path) -> None:
    assert len(_matmuls(HEAD + body + "\n}\n", tmp_path)) == count


def test_a_packed_step_is_named_by_its_weights_blocks_else_by_its_matmuls(
        tmp_path: Path) -> None:
    """A def's params with dotted paths (Hugging Face's `self_attn.q_proj.weight`, read
    transposed as a linear reads them): the block is the weight's path, not the def instance's
    (`layers.0`); model-level params without a dot: the matmuls' own names."""
    text = """cgraph 0.1
def attn(x: [2, 6, 16]) -> [2, 6, 16] {
  param self_attn.q_proj.weight: [8, 16]
  param self_attn.k_proj.weight: [8, 16]
  let q = matmul(x, transpose(self_attn.q_proj.weight, [1, 0]))
  let k = matmul(x, transpose(self_attn.k_proj.weight, [1, 0]))
  return concat([q, k], axis=2)
}
model m {
  input x: [2, 6, 16]
  input u: [2, 6, 16]
  param p: [16, 8]
  param r: [16, 8]
  output y = attn(x) as "layers.0"
  output z = concat([matmul(u, p), matmul(u, r)], axis=2)
}
"""
    lowered, _ = lower_and_fuse(check_source(text, tmp_path).model)
    paths = {n.inputs[0]: n.path for n in lowered.nodes if n.op == "matmul"}
    assert paths == {"x": "layers.0.self_attn.q_proj|k_proj", "u": "z.matmul|matmul_1"}


def test_a_copy_the_source_asks_for_of_a_packed_projection_is_kept(tmp_path: Path) -> None:
    """k became a view of the packed matmul's result: the `contiguous` written of it is still
    made (genstats reads a dense copy, as the source asked), not folded into the view."""
    lowered, _ = lower_and_fuse(check_source(HEAD + """  let q = linear(x, out=16) as "q"
  let k = linear(x, out=16) as "k"
  let (m, s) = genstats(contiguous(k))
  output y = q
  output a = m
  output b = s
}
""", tmp_path).model)
    nodes = lowered.by_name()
    assert len([n for n in lowered.nodes if n.op == "matmul"]) == 1  # packed
    [copy] = [n for n in lowered.nodes if n.op == "contiguous"]
    assert nodes[copy.inputs[0]].op == "view"
    assert {n.inputs[0] for n in lowered.nodes if n.op == "genstats"} == {copy.name}
