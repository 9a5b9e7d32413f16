"""Weights: safetensors files matched against the parameter manifest, random weights, and
PyTorch checkpoints converted through the CLI."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from dslc import weights
from dslc.diag.diagnostic import Sink
from dslc.pipeline import Options, front_end
from tests.conftest import ROOT
from tests.helpers import run_cli


def _mlp_params():  # type: ignore[no-untyped-def]
    result = front_end(ROOT / "models" / "mlp.cgraph", Options(), Sink())
    assert result.model is not None
    return result.model.params


def test_random_weights_match_the_manifest_and_round_trip(tmp_path: Path) -> None:
    params = _mlp_params()
    tensors = weights.random_weights(params, seed=7)
    path = tmp_path / "w.safetensors"
    weights.save(path, tensors)
    loaded = weights.load(path)
    sink = Sink()
    checked = weights.validate(loaded, params, sink, "w")
    assert not sink.diagnostics
    for p in params:
        assert checked[p.path].shape == p.shape and checked[p.path].dtype == np.float16
        np.testing.assert_array_equal(checked[p.path], tensors[p.path])


def test_each_mismatch_is_reported_with_the_parameter_path(tmp_path: Path) -> None:
    params = _mlp_params()
    tensors = weights.random_weights(params)
    del tensors["b2"]                                            # missing
    tensors["w1"] = tensors["w1"][:100]                          # wrong shape
    tensors["w3"] = tensors["w3"].astype(np.float32)             # wrong dtype
    tensors["layer9.weight"] = np.zeros(3, np.float16)           # unexpected
    sink = Sink()
    weights.validate(tensors, params, sink, "`w.safetensors`")
    messages = sorted((d.code, d.message) for d in sink.diagnostics)
    assert messages == sorted([
        ("R0202", "weight `b2` is missing from `w.safetensors`"),
        ("R0202", "weight `w1` has shape [100, 512] in `w.safetensors`, but the model declares "
                  "[784, 512]"),
        ("R0202", "weight `w3` is f32 in `w.safetensors`, but the model declares f16"),
        ("W0203", "`w.safetensors` holds 1 weight the model does not declare: `layer9.weight`"),
    ])
    missing = next(d for d in sink.diagnostics if "missing" in d.message)
    assert missing.span.file == "models/mlp.cgraph" and missing.span.line == 12


def test_a_failed_save_keeps_the_previous_file(tmp_path: Path) -> None:
    path = tmp_path / "w.safetensors"
    weights.save(path, {"a": np.ones(2, np.float32)})
    with pytest.raises(Exception):  # noqa: B017 - any failure of the writer will do
        weights.save(path, {"a": object()})  # type: ignore[dict-item]
    assert set(weights.load(path)) == {"a"}
    assert [p.name for p in tmp_path.iterdir()] == ["w.safetensors"]


def test_cli_random_and_from_torch(tmp_path: Path) -> None:
    out = tmp_path / "r.safetensors"
    run = run_cli("weights", "random", "models/resnet18.cgraph", "-o", str(out), "--seed", "3")
    assert run.code == 0, run.stderr
    assert len(weights.load(out)) == 102

    state = {k: torch.from_numpy(v.astype(np.float32)) for k, v in weights.load(out).items()}
    state["bn1.num_batches_tracked"] = torch.tensor(5)  # PyTorch bookkeeping: ignored
    ckpt = tmp_path / "model.pt"
    torch.save({"state_dict": state}, ckpt)
    converted = tmp_path / "c.safetensors"
    run = run_cli("weights", "from-torch", str(ckpt), "--model", "models/resnet18.cgraph",
                  "-o", str(converted))
    assert run.code == 0, run.stderr
    loaded = weights.load(converted)
    assert loaded["conv1.weight"].dtype == np.float16  # converted to the declared dtype
    assert loaded["bn1.running_var"].dtype == np.float32


def test_cli_from_torch_names_the_wrong_key(tmp_path: Path) -> None:
    state = {"w1": torch.zeros(784, 512), "bias1": torch.zeros(512)}
    ckpt = tmp_path / "bad.pt"
    torch.save(state, ckpt)
    run = run_cli("weights", "from-torch", str(ckpt), "--model", "models/mlp.cgraph", "-o",
                  str(tmp_path / "x.safetensors"))
    assert run.code == 1
    assert "error[R0202]: weight `b1` is missing" in run.stderr
    assert "warning[W0203]: `" in run.stderr and "does not declare: `bias1`" in run.stderr
    assert not (tmp_path / "x.safetensors").exists()


def test_cli_from_torch_reads_a_larger_checkpoint_under_a_prefix(tmp_path: Path) -> None:
    """A classifier's checkpoint: the model's weights under `net.`, a head beside them. The
    head is said once (W0203), the rest written under the model's names."""
    w = weights.random_weights(_mlp_params(), seed=2)
    state = {f"net.{k}": torch.from_numpy(v.astype(np.float32)) for k, v in w.items()}
    state.update({f"head.{i}.weight": torch.zeros(3, 10) for i in range(5)})
    ckpt = tmp_path / "classifier.pt"
    torch.save(state, ckpt)
    out = tmp_path / "w.safetensors"
    run = run_cli("weights", "from-torch", str(ckpt), "--model", "models/mlp.cgraph", "-o",
                  str(out), "--prefix", "net.")
    assert run.code == 0, run.stderr
    loaded = weights.load(out)
    assert sorted(loaded) == sorted(w)
    np.testing.assert_array_equal(loaded["w1"], w["w1"])
    plain = run_cli("weights", "from-torch", str(ckpt), "--model", "models/mlp.cgraph", "-o",
                    str(tmp_path / "x.safetensors"))
    assert plain.code == 1 and "holds 11 weights the model does not declare: `net.w1`, " \
        "`net.b1`, `net.w2` and 8 more" in plain.stderr
    assert "look to be under `net.`: read them with `dslc weights from-torch --prefix net.`" \
        in plain.stderr
