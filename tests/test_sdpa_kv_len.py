"""`sdpa(..., kv_len=L)`: keys at or after L[b] are masked and a bottom-right diagonal aligns to
L[b]. The reference against attention over each row's valid keys written out by hand and
against PyTorch's own attention over the sliced keys; the PyTorch translation against the
reference; lowering's `q_len` (Sq per row, shared, load-time where static); and the cuDNN
graph with the padding mask built deviceless."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from dslc.backend.target import load_target
from dslc.compile.stage import compile_model
from dslc.core.dims import format_dim
from dslc.fuzz import arena
from dslc.ir import interp
from dslc.ir.to_torch import run as run_torch
from dslc.ir.to_torch import to_torch
from dslc.ir.verify import verify
from dslc.lower import lower
from dslc.pipeline import lower_and_fuse
from tests.helpers import check_source, deviceless_program, rng

SRC = """
model m {{
  precision io={io}
  dim B = 1..4 tune [2]
  dim S = 1..8 tune [3]
  input q: [B, 4, S, 16]
  input k: [B, 2, 12, 16]
  input v: [B, 2, 12, 16]
  input lens: i32[B]
  output y = sdpa(q, k, v{mask}, kv_len=lens)
}}
"""
MASKS = {"none": "", "top_left": ", causal=true", "bottom_right": ', causal=true, align="bottom_right"'}


def _inputs(key: str) -> dict[str, np.ndarray]:
    r = rng("sdpa kv_len", key)
    return {"q": r.standard_normal((2, 4, 3, 16)).astype(np.float32),
            "k": r.standard_normal((2, 2, 12, 16)).astype(np.float32),
            "v": r.standard_normal((2, 2, 12, 16)).astype(np.float32),
            "lens": np.array([5, 12], dtype=np.int32)}


def _by_hand(x: dict[str, np.ndarray], mask: str) -> np.ndarray:
    """Row b attends to its first L[b] keys only; query i of Sq stands at key i (top-left) or
    at L[b] - Sq + i (bottom-right): attention written out in float64, a loop per row/head."""
    q, k, v, lens = (x[n].astype(np.float64) for n in ("q", "k", "v", "lens"))
    out = np.zeros(q.shape)
    for b in range(q.shape[0]):
        n = int(lens[b])
        for h in range(q.shape[1]):
            kh, vh = k[b, h // 2, :n], v[b, h // 2, :n]
            for i in range(q.shape[2]):
                place = {"none": n - 1, "top_left": i, "bottom_right": n - q.shape[2] + i}[mask]
                s = kh[: place + 1] @ q[b, h, i] / math.sqrt(16)
                p = np.exp(s - s.max())
                out[b, h, i] = (p / p.sum()) @ vh[: place + 1]
    return out


def _reference(tmp_path: Path, mask: str, x: dict[str, np.ndarray]) -> np.ndarray:
    model = check_source(SRC.format(io="f32", mask=MASKS[mask]), tmp_path).model
    lowered, _ = lower_and_fuse(model)
    return interp.run(lowered, x, {}, model.env)["y"]


@pytest.mark.parametrize("mask", list(MASKS))
def test_reference_attends_to_each_rows_valid_keys(mask: str, tmp_path: Path) -> None:
    x = _inputs(mask)
    np.testing.assert_allclose(_reference(tmp_path, mask, x), _by_hand(x, mask), rtol=1e-5,
                               atol=1e-6)


def test_bottom_right_equals_pytorch_over_the_sliced_keys(tmp_path: Path) -> None:
    """Row b: PyTorch's attention over keys [0, L[b]) with a bottom-right causal mask."""
    x = _inputs("torch")
    got = _reference(tmp_path, "bottom_right", x)
    for b, n in enumerate(x["lens"]):
        q = torch.from_numpy(x["q"][b:b + 1])
        k = torch.from_numpy(x["k"][b:b + 1, :, :n]).repeat_interleave(2, dim=1)
        v = torch.from_numpy(x["v"][b:b + 1, :, :n]).repeat_interleave(2, dim=1)
        keep = torch.ones(3, int(n), dtype=torch.bool).tril(diagonal=int(n) - 3)
        want = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
        np.testing.assert_allclose(got[b:b + 1], want.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mask", list(MASKS))
def test_pytorch_translation_equals_the_reference(mask: str, tmp_path: Path) -> None:
    x = _inputs(f"translation {mask}")
    model = check_source(SRC.format(io="f32", mask=MASKS[mask]), tmp_path).model
    program = to_torch(model.graph, {"B": 2, "S": 3}, env=model.env)
    np.testing.assert_allclose(run_torch(program, x)["y"], _reference(tmp_path, mask, x),
                               rtol=1e-5, atol=1e-6)


TWO_LAYERS = """
model m {{
  precision io=f16
  dim B = {batch}
  dim S = 1..8 tune [1]
  input q: [B, 4, S, 16]
  input k: [B, 4, 32, 16]
  input v: [B, 4, 32, 16]
  input lens: i32[B]
  let a = sdpa(q, k, v, causal=true, align="bottom_right", kv_len=lens)
  output y = sdpa(a, k, v, causal=true, align="bottom_right", kv_len=lens)
}}
"""


@pytest.mark.parametrize("batch", ["1..4 tune [2]", "2"])
def test_lowering_gives_every_sdpa_its_query_lengths(batch: str, tmp_path: Path) -> None:
    """One `full([B], S)` serves both attentions; it is computed at each size (S is dynamic)."""
    model = check_source(TWO_LAYERS.format(batch=batch), tmp_path).model
    seen: list[str] = []
    lowered = lower(model.graph, lambda name, g: seen.extend(verify(g, model.env)))
    assert seen == []
    nodes = lowered.by_name()
    attentions = [n for n in lowered.nodes if n.op == "sdpa"]
    assert all(n.attrs["operands"][-2:] == ("kv_len", "q_len") for n in attentions)
    [q_len] = {n.inputs[-1] for n in attentions}  # one for both
    fill = nodes[q_len]
    assert fill.op == "full" and fill.type.dtype == "i32" and format_dim(fill.attrs["value"]) == "S"
    assert [format_dim(d) for d in fill.attrs["shape"]] == ["B" if "tune" in batch else "2"]
    # the key lengths cuDNN reads: min(lens, 32), contiguous and never past the 32 keys
    [kv_len] = {n.inputs[-2] for n in attentions}
    clamp = nodes[kv_len]
    assert clamp.op == "min" and clamp.inputs[0] == "lens"
    assert nodes[clamp.inputs[1]].op == "full" and nodes[clamp.inputs[1]].attrs["value"] == 32
    _, plan = lower_and_fuse(model)
    assert q_len not in plan.load_time  # S varies: filled at each call


def test_static_query_lengths_are_load_time(tmp_path: Path) -> None:
    src = TWO_LAYERS.format(batch="2").replace("dim S = 1..8 tune [1]", "dim S = 1")
    model = check_source(src, tmp_path).model
    lowered, plan = lower_and_fuse(model)
    fills = [n.name for n in lowered.nodes if n.op == "full"]  # q_len, and 32 for the clamp
    assert len(fills) == 2 and all(f in plan.load_time for f in fills)
    got = interp.run(lowered, {"q": np.zeros((2, 4, 1, 16), np.float16),
                               "k": np.zeros((2, 4, 32, 16), np.float16),
                               "v": np.ones((2, 4, 32, 16), np.float16),
                               "lens": np.array([1, 32], np.int32)}, {}, model.env)
    np.testing.assert_array_equal(got["y"], np.ones((2, 4, 1, 16), np.float16))


def test_padding_mask_graph_builds_deviceless(tmp_path: Path) -> None:
    """The sdpa graph reads both lengths as [B, 1, 1, 1] i32 and cuDNN validates it and makes
    its operation graph for the H200 profile; the query lengths are a fallback kernel's fill,
    the key lengths the clamp of the caller's."""
    model = check_source(TWO_LAYERS.format(batch="1..4 tune [2]"), tmp_path).model
    lowered, plan = lower_and_fuse(model)
    c = compile_model(model, lowered, plan, load_target("h200"))
    nodes = c.graph.by_name()
    kinds = [(s.kind, nodes[s.group.nodes[0]].op) for s in c.steps]
    # the query lengths, the key count and min(lens, it) are fallback kernels (B varies)
    assert kinds == [("kernel", "full"), ("kernel", "full"), ("kernel", "min"), ("graph", "sdpa"),
                     ("graph", "sdpa")]
    assert len(c.builds) == len({s.group.signature for s in c.steps if s.kind == "graph"})
    for spec in c.specs.values():
        lengths = [t for t in spec.tensors if t.dtype == "i32"]
        assert [(t.dims, t.strides, t.role) for t in lengths] == [
            ((2, 1, 1, 1), (1, 1, 1, 1), "input")] * 2
    for built in c.builds.values():
        text = str(built.graph)
        assert "'use_padding_mask': True" in text and '"seq_len_kv": "a.kv_len"' in text


def test_key_lengths_past_the_keys_or_strided_are_what_cudnn_reads_clamped_and_copied(
        tmp_path: Path) -> None:
    """cuDNN reads the key lengths as contiguous [B, 1, 1, 1] and would read past the keys for
    a length beyond them: it is given min(kv_len, Skv), computed into a buffer of its own. A
    strided view of the caller's lengths (every other column) and a length of 40 for 32 keys,
    through the arena oracle, which reads memory as cuDNN would, against the reference."""
    src = """model m {
  precision io=f16, intermediate=f32, compute=f32
  input q: [4, 2, 1, 16]
  input k: [4, 2, 32, 16]
  input v: [4, 2, 32, 16]
  input lens2: i32[4, 2]
  let kv_len = reshape(lens2[:, 0:1], [4])
  output o = sdpa(q, k, v, causal=true, align="bottom_right", kv_len=kv_len)
}
"""
    model, program = deviceless_program(src, tmp_path)
    g = rng("strided kv_len")
    x = {n: g.standard_normal(s).astype(np.float16)
         for n, s in (("q", (4, 2, 1, 16)), ("k", (4, 2, 32, 16)), ("v", (4, 2, 32, 16)))}
    x["lens2"] = np.array([[3, 30], [5, 31], [40, 29], [9, 28]], np.int32)
    lowered, _ = lower_and_fuse(model)
    want = interp.run(lowered, x, {}, model.env)["o"]
    got = arena.run(program, {}, x, {})["o"]
    assert np.abs(got.astype(np.float32) - want.astype(np.float32)).max() < 1e-3
    # the third row's 40 keys are its 32: every key, as in the reference
    k, v, q = (x[n].astype(np.float32) for n in ("k", "v", "q"))
    scores = q[2] @ k[2].transpose(0, 2, 1) / 4.0
    p = np.exp(scores - scores.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    assert np.abs(got[2].astype(np.float32) - p @ v[2]).max() < 2e-2
