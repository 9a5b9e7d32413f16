"""Steps are named after what they run (dslc/ir/naming.py): the anchor's parameter path plus the
ops fused into it, so the runner, `dslc inspect` and profiles read like the model; and a name is
used once in a schedule."""

from __future__ import annotations

from pathlib import Path

import pytest

from dslc.backend.target import load_target
from dslc.compile.stage import compile_model
from dslc.diag.diagnostic import Sink
from dslc.fuzz.choices import Choices
from dslc.fuzz.generate import generate
from dslc.pipeline import Options, front_end, lower_and_fuse
from tests.conftest import ROOT
from tests.helpers import check_source, note_seed, run_cli


def _names(name: str) -> list[str]:
    result = front_end(ROOT / "models" / f"{name}.cgraph", Options(), Sink())
    assert result.model is not None
    _, plan = lower_and_fuse(result.model)
    return [g.name for g in plan.groups]


def test_resnet50_steps_are_named_after_their_layers() -> None:
    names = _names("resnet50")
    assert names[:6] == ["conv1+bn1+relu", "stem", "layer1.0.conv1+bn1+relu",
                         "layer1.0.conv2+bn2+relu", "layer1.0.downsample.0+downsample.1",
                         "layer1.0.conv3+add+bn3+relu"]  # the residual before the bias
    assert names[-2:] == ["pooled", "fc+bias_add+cast"]
    assert len(set(names)) == len(names) == 56


def test_the_unets_upsamples_are_named_by_their_kernel_rows() -> None:
    # one matmul per kernel row (lower/upconv.py): each step names its row, not `#2`
    names = _names("unet")
    assert [n for n in names if "upconv" in n] == [
        "up1.upconv.row0+bias_add", "up1.upconv.row1+bias_add", "up1.upconv.rows_out",
        "up2.upconv.row0+bias_add", "up2.upconv.row1+bias_add", "up2.upconv.rows_out"]
    assert not [n for n in names if "#" in n] and len(set(names)) == len(names)


def test_encoder_steps_name_their_projections_and_attention() -> None:
    # q, k and v packed into one matmul (lower/packing.py): one step names the three
    assert _names("encoder")[:7] == [
        "encoder.layer.0.ln1", "encoder.layer.0.attn.q_proj|k_proj|v_proj+bias_add",
        "encoder.layer.0.attn.ctx", "encoder.layer.0.attn.out_proj+bias_add+add",
        "encoder.layer.0.ln2", "encoder.layer.0.ffn.fc1+bias_add+gelu",
        "encoder.layer.0.ffn.fc2+bias_add+add"]


def test_a_defs_dotted_params_name_their_blocks() -> None:
    """A def declaring its sub-blocks' params by dotted names (Hugging Face's layers, written
    as one def): each projection's step is named by its weight's block, not the def's instance."""
    assert _names("llama_layer")[15:19] == [
        "model.layers.0.self_attn.o_proj+add", "model.layers.0.post_attention_layernorm",
        "model.layers.0.mlp.up_proj", "model.layers.0.mlp.gate_proj+silu+mul"]
    assert _names("whisper_encoder")[4:10] == [
        "encoder.layers.0.self_attn_layer_norm",
        "encoder.layers.0.self_attn.q_proj|k_proj|v_proj+bias_add", "encoder.layers.0.ctx",
        "encoder.layers.0.self_attn.out_proj+bias_add+add", "encoder.layers.0.final_layer_norm",
        "encoder.layers.0.fc1+bias_add+gelu"]


def test_model_level_params_name_the_step() -> None:
    assert _names("mlp") == ["w1+b1+relu", "w2+b2+gelu", "w3+b3"]


TWO_CONVS = """def block(x: [N, C, H, W]) -> [N, C, H, W] {
  param w1: [C, C, 3, 3]
  param w2: [C, C, 3, 3]
  let a = relu(conv(x, w1, pad=1))
  return relu(conv(a, w2, pad=1))
}

model m {
  input x: [1, 8, 4, 4] @NHWC
  let b = block(x) as "blk"
  output y: [1, 8, 4, 4] @NHWC = b
}
"""


def test_two_steps_of_one_instance_get_a_name_each(tmp_path: Path) -> None:
    model = check_source(TWO_CONVS, tmp_path).model
    lowered, plan = lower_and_fuse(model)
    assert [g.name for g in plan.groups] == ["blk+relu", "blk+relu#2"]
    c = compile_model(model, lowered, plan, load_target("h200"))
    assert [s.group.name for s in c.steps] == ["blk+relu", "blk+relu#2"]


@pytest.mark.parametrize("seed", range(0, 200, 7))
def test_generated_programs_name_each_step_once(seed: int, tmp_path: Path) -> None:
    source = generate(Choices(note_seed("program", seed))).source()
    model = check_source(source, tmp_path).model
    _, plan = lower_and_fuse(model)
    names = [g.name for g in plan.groups]
    assert len(set(names)) == len(names), names


def test_inspect_and_the_runner_show_the_step_names(tmp_path: Path) -> None:
    out = tmp_path / "mlp"
    assert run_cli("compile", "models/mlp.cgraph", "-o", str(out), "-q").code == 0
    runner = (out / "mnist_mlp_runner.py").read_text()
    assert "#     1. w1+b1+relu: matmul -> bias_add -> relu [cuDNN graph]" in runner
    shown = run_cli("inspect", str(out / "mnist_mlp.bundle"))
    assert "   1. w1+b1+relu  [matmul -> bias_add -> relu]  cuDNN" in shown.stdout
