"""The example models check clean, and their parameter manifests are what PyTorch expects."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.helpers import run_cli

MODELS = sorted((ROOT / "models").glob("*.cgraph"))
TORCHVISION_COPY = ROOT / "tests" / "data" / "torchvision-state-dicts.json"


@pytest.mark.parametrize("model", MODELS, ids=lambda p: p.stem)
def test_example_model_checks_clean(model: Path) -> None:
    run = run_cli("check", "--deny-warnings", model.relative_to(ROOT).as_posix())
    assert run.code == 0, run.stderr
    assert run.stderr == ""


@pytest.mark.parametrize("name", ["resnet18", "resnet50"])
def test_resnet_manifest_equals_torchvision_state_dict(name: str) -> None:
    """Keys and shapes of torchvision's `state_dict()` (read off torchvision on the GPU machine),
    less `num_batches_tracked`, in the same order."""
    reference = json.loads(TORCHVISION_COPY.read_text())[name]
    expected = {k: v[1] for k, v in reference.items() if not k.endswith("num_batches_tracked")}
    run = run_cli("params", f"models/{name}.cgraph", "--format", "json")
    assert run.code == 0, run.stderr
    ours = {k: v["shape"] for k, v in json.loads(run.stdout).items()}
    assert list(ours) == list(expected)
    assert ours == expected


def test_params_table_lists_every_param_and_the_total() -> None:
    run = run_cli("params", "models/mlp.cgraph")
    assert run.code == 0
    lines = run.stdout.splitlines()
    assert lines[0].split() == ["path", "dtype", "shape", "values"]
    assert "w1    f16    [784, 512]  401,408" in run.stdout
    assert lines[-1] == "6 params, 669,706 values"


def test_encoder_instances_share_paths_by_layer() -> None:
    run = run_cli("params", "models/encoder.cgraph", "--format", "json")
    params = json.loads(run.stdout)
    assert "encoder.layer.11.ffn.fc2.weight" in params
    assert params["encoder.layer.0.attn.q_proj.weight"] == {"dtype": "bf16", "shape": [768, 768]}
    assert len(params) == 12 * 16 + 2
