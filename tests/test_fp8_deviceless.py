"""fp8 through the real cuDNN frontend without a GPU: the four GPT blocks asking for fp8 matmuls
(models/gpt_block.cgraph) become one validated cuDNN graph per step for the H200 profile, none
split: each matmul reads e4m3 operands and writes its result unscaled. Asked for fp8 attention
too, the attention is cuDNN's fp8 attention (its operands e4m3, its output f16), a graph cuDNN
9.19 runs on Blackwell only: on the H200 no engine takes it (so the model file leaves it f16)."""

from __future__ import annotations

import json
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

from dslc.backend.target import load_target
from dslc.compile.stage import NORM_FP8, Compiled, compile_model
from dslc.diag.diagnostic import Sink
from dslc.pipeline import Options, front_end, lower_and_fuse
from tests.conftest import ROOT


@cache
def compiled(attention: bool = False) -> Compiled:
    path = ROOT / "models" / "gpt_block.cgraph"
    if attention:
        path = Path(tempfile.mkdtemp()) / "gpt_block.cgraph"
        source = (ROOT / "models" / "gpt_block.cgraph").read_text()
        path.write_text(source.replace("matmul=f8e4m3", "matmul=f8e4m3, sdpa=f8e4m3"))
    result = front_end(path, Options(), Sink())
    assert result.model is not None
    lowered, plan = lower_and_fuse(result.model)
    return compile_model(result.model, lowered, plan, load_target("h200"),
                         buckets=[{"B": 1, "S": 128}])


def _graphs(attention: bool = False) -> list[dict[str, Any]]:
    return [json.loads(str(b.graph)) for b in compiled(attention).builds.values()]


def _kind(node: dict[str, Any]) -> str:
    """A node's kind: a primitive's tag (MATMUL, POINTWISE), or a composite op's type."""
    return str(node.get("tag") or node.get("type"))


def _dtypes(g: dict[str, Any], refs: set[Any]) -> set[str]:
    """The data types of the tensors a node names: by uid in a primitive graph's list of
    tensors, by name in a composite one's (which writes `data_type.HALF`)."""
    if isinstance(g["tensors"], dict):
        return {str(t["dtype"]).removeprefix("data_type.") for name, t in g["tensors"].items()
                if name in refs}
    return {t["data_type"] for t in g["tensors"] if t["uid"] in refs}


def test_the_fp8_gpt_block_is_cudnn_graphs_its_norms_apart_from_their_casts_deviceless() -> None:
    """Every step a cuDNN graph; each of the 8 layer norms compiles apart from the multiply and
    cast that quantise its result (fused, cuDNN's plan made an illegal memory access on the
    H200: compile/stage.py, NORM_FP8)."""
    c = compiled()
    assert all(s.kind == "graph" for s in c.steps)
    nodes = c.graph.by_name()
    apart = [[nodes[n].op for n in s.group.nodes] for s in c.steps if s.reason == NORM_FP8]
    assert apart == [["layernorm"], ["mul", "max", "min", "cast"]] * 8  # e4m3 saturates
    assert len(c.steps) == len(c.plan.groups) + 8


def test_its_matmuls_read_e4m3_and_descale_in_the_epilogue() -> None:
    matmuls = [g for g in _graphs() if _kind(g["nodes"][0]) == "MATMUL"]
    assert len(matmuls) == 4  # c_attn, c_proj, c_fc, mlp.c_proj: the same in every block
    for g in matmuls:
        a, b = g["nodes"][0]["inputs"]["A"], g["nodes"][0]["inputs"]["B"]
        assert _dtypes(g, {a, b}) == {"FP8_E4M3"}
        # the descale multiply (a vector per output channel) is the first epilogue op
        assert _kind(g["nodes"][1]) == "POINTWISE" and g["nodes"][1]["mode"] == "MUL"


def test_the_activations_are_quantised_where_they_are_computed() -> None:
    c = compiled()
    nodes = c.graph.by_name()
    quantising = [s for s in c.steps if nodes[s.group.nodes[-1]].op == "cast"]
    # per block: ln_1, the attention's result, ln_2, gelu (what the four matmuls read)
    assert len(quantising) == 4 * 4
    assert all(nodes[s.group.nodes[-1]].type.dtype == "f8e4m3" for s in quantising)


def test_its_attention_is_cudnns_fp8_attention() -> None:
    assert all(s.kind == "graph" for s in compiled(True).steps)
    attention = [g for g in _graphs(True) if any(_kind(n) == "SDPA_FP8" for n in g["nodes"])]
    assert len(attention) == 1  # one graph, run by each block
    node = next(n for n in attention[0]["nodes"] if _kind(n) == "SDPA_FP8")
    q, o = node["inputs"]["q"], node["outputs"]["O"]
    assert _dtypes(attention[0], {q}) == {"FP8_E4M3"} and _dtypes(attention[0], {o}) == {"HALF"}


FP8_CONV = """
model m {
  precision io=f32, intermediate=f32, compute=f32
  input x: [2, 16, 8, 4]
  param w: [16, 16, 3, 3]
  output y = conv(x * 2.0, w, stride=1, pad=1, dilation=1, groups=1, precision=f8e4m3)
}
"""


def test_a_quantised_activations_copy_falls_back_to_a_kernel_a_conv_does_not(
        tmp_path: Path) -> None:
    """cuDNN on the H200 has no engine for an fp8 identity (the e4m3 activation copied into
    the channels-last order its conv reads: generated program seed 29 #82 ended in E0801):
    the fallback copies its bytes as stored. An fp8 op that computes is no copy: still refused."""
    from dslc.compile.stage import CompileFailure, _kernel

    path = tmp_path / "m.cgraph"
    path.write_text(FP8_CONV)
    result = front_end(path, Options(), Sink())
    assert result.model is not None
    lowered, plan = lower_and_fuse(result.model)
    c = compile_model(result.model, lowered, plan, load_target("h200"), buckets=[{}])
    nodes = c.graph.by_name()
    copies = [s.group for s in c.steps if [nodes[n].op for n in s.group.nodes] == ["contiguous"]
              and nodes[s.group.nodes[0]].type.dtype == "f8e4m3"]
    assert len(copies) == 1
    assert _kernel(c, copies[0], "rejected", " (no engine)").kind == "kernel"
    conv = next(s.group for s in c.steps if nodes[s.group.nodes[0]].op == "conv")
    try:
        _kernel(c, conv, "rejected", " (no engine)")
    except CompileFailure as err:
        assert "take no f8e4m3" in str(err)
    else:
        raise AssertionError("an fp8 conv ran as a fallback kernel")
