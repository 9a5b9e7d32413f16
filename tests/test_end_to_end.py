"""End to end on CPU, f32: dslc's reference executor (checked, lowered, fused, batchnorm folded)
equals an independent PyTorch implementation fed the same state_dict."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from dslc.check.types import PrecisionSpec
from dslc.diag.diagnostic import Sink
from dslc.ir import interp
from dslc.pipeline import Options, front_end, middle_end
from dslc.weights import random_weights
from tests import torch_models

F32 = PrecisionSpec("f32", "f32", "f32")
CASES: dict[str, tuple[Callable[[], torch.nn.Module], dict[str, tuple[int, ...]]]] = {
    "mlp": (torch_models.MLP, {"x": (3, 784)}),
    "resnet18": (torch_models.resnet18, {"image": (2, 3, 224, 224)}),
    "resnet50": (torch_models.resnet50, {"image": (1, 3, 224, 224)}),
    "encoder": (torch_models.Encoder, {"tokens": (2, 16, 768)}),
    "unet": (torch_models.UNet, {"image": (1, 3, 64, 96)}),
}


def rel_error(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a.astype(np.float64) - b).max() / max(np.abs(b).max(), 1e-30))


def _compiled(name: str):  # type: ignore[no-untyped-def]
    sink = Sink()
    options = Options(precision=F32, backend="reference")
    result = front_end(Path(f"models/{name}.cgraph"), options, sink)
    assert result.model is not None, [d.message for d in sink.diagnostics]
    return result.model


@pytest.mark.parametrize("name", CASES)
def test_reference_executor_equals_pytorch(name: str) -> None:
    make, shapes = CASES[name]
    model = _compiled(name)
    lowered, plan = middle_end(model)
    weights = random_weights(model.params, seed=1)
    rng = np.random.default_rng(2)
    inputs = {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}
    ours = interp.run(lowered, inputs, weights, model.env, virtual=plan.virtual())

    torch.manual_seed(0)
    module = make().eval()
    state = {k: torch.from_numpy(np.asarray(v, dtype=np.float32)) for k, v in weights.items()}
    missing, unexpected = module.load_state_dict(state, strict=False)
    assert not unexpected and all(k.endswith("num_batches_tracked") for k in missing)
    with torch.no_grad():
        theirs = module(*(torch.from_numpy(v) for v in inputs.values())).numpy()
    [out] = ours.values()
    assert out.shape == theirs.shape
    err = rel_error(out, theirs)
    assert err <= 1e-5, f"{name}: relative error {err:.2e}"


@pytest.mark.parametrize("name", ["resnet18", "unet"])
def test_batchnorm_folding_matches_the_unfolded_graph(name: str) -> None:
    """The folded, fused graph against the checked graph with its batchnorms as written."""
    model = _compiled(name)
    lowered, plan = middle_end(model)
    assert not any(n.op == "batchnorm" for n in lowered.nodes)
    weights = random_weights(model.params, seed=3)
    shape = CASES[name][1]["image"]
    image = np.random.default_rng(4).standard_normal(shape).astype(np.float32)
    folded = interp.run(lowered, {"image": image}, weights, model.env, virtual=plan.virtual())
    unfolded = interp.run(model.graph, {"image": image}, weights, model.env)
    [a], [b] = folded.values(), unfolded.values()
    err = rel_error(a, b)
    print(f"{name}: batchnorm folding, relative error {err:.2e} (f32)")
    assert err <= 1e-5
