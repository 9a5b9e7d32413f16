"""scripts/bench_decode.py compares like with like: its PyTorch decode step (a static cache,
the grouped query heads attending as rows of their key/value head, positions past the cache
masked) equals dslc's reference of the benchmark's model, step after step from an empty cache,
at small sizes in f32 on the CPU (the benchmark itself needs a GPU)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from dslc.core.types import PrecisionSpec
from dslc.diag.diagnostic import Sink
from dslc.ir import interp
from dslc.pipeline import Options, front_end, lower_and_fuse
from tests.conftest import ROOT
from tests.helpers import rng

sys.path.insert(0, str(ROOT / "scripts"))
import bench_decode

SMALL = {"MAX": 16, "D": 64, "HEADS": 4, "KV_HEADS": 2, "HEAD_DIM": 16, "FFN": 96, "VOCAB": 50}


def test_the_pytorch_decoder_equals_the_models_reference(monkeypatch: pytest.MonkeyPatch,
                                                         tmp_path: Path) -> None:
    for name, value in SMALL.items():
        monkeypatch.setattr(bench_decode, name, value)
    path = tmp_path / "bench.cgraph"
    path.write_text(bench_decode.model_text(layers=3))
    sink = Sink()
    model = front_end(path, Options(include_dirs=[ROOT / "models"], precision=PrecisionSpec(),
                                    backend="reference"), sink).model
    assert model is not None, [d.message for d in sink.diagnostics]
    graph, _ = lower_and_fuse(model)
    r = rng("bench_decode", "weights")
    weights = {p.path: (1 + 0.05 * r.standard_normal(p.shape) if len(p.shape) == 1 else
                        0.2 * r.standard_normal(p.shape)).astype(np.float32)
               for p in model.params}
    theirs = bench_decode.TorchDecoder({k: torch.from_numpy(v) for k, v in weights.items()},
                                       layers=3, device="cpu", dtype=torch.float32)
    caches = {i.name: np.zeros((1, 2, 16, 16), np.float32) for i in model.inputs
              if i.name.endswith("_cache")}
    assert len(caches) == 6
    for step in range(6):
        x = r.standard_normal((1, 1, 64)).astype(np.float32)
        ours, caches = interp.run_in_place(graph, {"hidden_states": x, "position": np.array(
            [step], np.int32), **caches}, weights, model.env)
        theirs.x.copy_(torch.from_numpy(x))
        theirs.position.fill_(step)
        with torch.no_grad():
            want = theirs.step().numpy()
        err = np.abs(ours["logits"] - want).max() / np.abs(want).max()
        assert err <= 1e-5, (step, err)
    for layer in range(3):  # the rows written so far, and nothing past them
        np.testing.assert_allclose(caches[f"model.layers.{layer}.k_cache"][:, :, :6],
                                   theirs.k[layer][:, :, :6].numpy(), rtol=1e-5, atol=1e-5)
        assert not caches[f"model.layers.{layer}.v_cache"][:, :, 6:].any()
