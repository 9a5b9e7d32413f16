"""End to end on the CPU: dslc's reference executor (checked, lowered, fused, batchnorm folded)
against independent PyTorch implementations of the example models (tests/torch_models.py) fed the
same weights and inputs:
- in f32 (the precision forced to f32), within 1e-5;
- at each model's declared precision (f16 or bf16 storage, f32 compute; the encoder's MLP keeps
  bf16 inside its groups) against PyTorch running in that storage dtype, each param in its
  declared dtype (batchnorm statistics stay f32), within `precision_tolerance(dtype, depth)`
  (tests/helpers.py): LAMBDA * sqrt(depth) * u, u the storage dtype's unit roundoff and depth
  the most roundings on a path through the model's op graph, counted from the graph.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from dslc.check.checker import CheckedModel
from dslc.core.types import PrecisionSpec
from dslc.diag.diagnostic import Sink
from dslc.ir import interp
from dslc.pipeline import Options, front_end, lower_and_fuse
from dslc.weights import random_weights
from tests import torch_models
from tests.helpers import note_seed, precision_tolerance, rel_error, rng, rounding_depth

F32 = PrecisionSpec("f32", "f32", "f32")
TORCH_DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
# model -> (PyTorch module, input shapes); small sizes: the ResNets take 224 x 224 only.
CASES: dict[str, tuple[Callable[[], torch.nn.Module], dict[str, tuple[int, ...]]]] = {
    "mlp": (torch_models.MLP, {"x": (3, 784)}),
    "resnet18": (torch_models.resnet18, {"image": (1, 3, 224, 224)}),
    "resnet50": (torch_models.resnet50, {"image": (1, 3, 224, 224)}),
    "encoder": (torch_models.Encoder, {"tokens": (2, 8, 768)}),
    "unet": (torch_models.UNet, {"image": (1, 3, 64, 64)}),
}


@pytest.fixture(autouse=True, scope="module")
def _torch_threads() -> Any:
    """Two threads at most: the CPU is shared with the rest of the suite (restored after)."""
    before = torch.get_num_threads()
    torch.set_num_threads(min(before, 2))
    yield
    torch.set_num_threads(before)


def _checked(name: str, precision: PrecisionSpec | None) -> CheckedModel:
    sink = Sink()
    options = Options(precision=precision, backend="reference" if precision else "cudnn")
    result = front_end(Path(f"models/{name}.cgraph"), options, sink)
    assert result.model is not None, [d.message for d in sink.diagnostics]
    return result.model


@cache
def _weights(name: str) -> dict[str, np.ndarray]:
    """Random weights in the model's declared dtypes (the f32 run reads the same values)."""
    return random_weights(_checked(name, None).params, seed=note_seed(f"{name} weights", 1))


def _inputs(model: CheckedModel, name: str) -> dict[str, np.ndarray]:
    """Standard normal inputs in each input's declared dtype."""
    g = rng("end-to-end inputs", name)
    return {i.name: g.standard_normal(CASES[name][1][i.name]).astype(
        interp.NUMPY_DTYPES[i.type.dtype]) for i in model.inputs}


def _ours(model: CheckedModel, inputs: Mapping[str, np.ndarray],
          weights: Mapping[str, np.ndarray]) -> np.ndarray:
    lowered, plan = lower_and_fuse(model)
    [out] = interp.run(lowered, inputs, weights, model.env, virtual=plan.virtual()).values()
    return out


def _torch_module(name: str, state: dict[str, torch.Tensor]) -> torch.nn.Module:
    """The PyTorch model holding exactly `state` (each tensor in its own dtype): built without
    storage, then given the tensors; only PyTorch's batch counters may be left out."""
    with torch.device("meta"):
        module = CASES[name][0]()
    missing, unexpected = module.load_state_dict(state, strict=False, assign=True)
    assert not unexpected, unexpected
    assert all(k.endswith("num_batches_tracked") for k in missing), missing
    return module.eval()


def _theirs(name: str, state: dict[str, torch.Tensor], inputs: Mapping[str, np.ndarray],
            dtype: torch.dtype) -> np.ndarray:
    module = _torch_module(name, state)
    xs = [torch.from_numpy(np.asarray(v, np.float32)).to(dtype) for v in inputs.values()]
    if xs[0].dim() == 4:  # same numbers; PyTorch's CPU convolutions are faster channels-last
        module = module.to(memory_format=torch.channels_last)
        xs = [x.contiguous(memory_format=torch.channels_last) for x in xs]
    with torch.no_grad():
        return module(*xs).float().numpy()


@pytest.mark.parametrize("name", CASES)
def test_reference_executor_equals_pytorch_in_f32(name: str) -> None:
    model = _checked(name, F32)
    weights = {k: np.asarray(v, np.float32) for k, v in _weights(name).items()}
    inputs = {k: np.asarray(v, np.float32) for k, v in _inputs(model, name).items()}
    ours = _ours(model, inputs, weights)
    state = {k: torch.from_numpy(v) for k, v in weights.items()}
    theirs = _theirs(name, state, inputs, torch.float32)
    assert ours.dtype == np.float32 and ours.shape == theirs.shape
    err = rel_error(ours, theirs)
    assert err <= 1e-5, f"{name}: relative error {err:.2e} in f32"


@pytest.mark.parametrize("name", CASES)
def test_reference_executor_equals_pytorch_at_the_declared_precision(name: str) -> None:
    model = _checked(name, None)
    storage = model.precision.io
    assert storage in ("f16", "bf16") and model.precision.compute == "f32"
    weights = _weights(name)
    inputs = _inputs(model, name)
    ours = _ours(model, inputs, weights)
    [output] = model.outputs
    assert ours.dtype == np.dtype(interp.NUMPY_DTYPES[output.type.dtype])
    state = {k: torch.from_numpy(np.asarray(v, np.float32)).to(TORCH_DTYPES[p.dtype])
             for p in model.params for k, v in [(p.path, weights[p.path])]}
    theirs = _theirs(name, state, inputs, TORCH_DTYPES[storage])
    assert ours.shape == theirs.shape
    depth = rounding_depth(model.graph)
    tolerance = precision_tolerance(storage, depth)
    err = rel_error(ours, theirs)
    print(f"{name}: {storage}, {depth} roundings deep: relative error {err:.2e}, "
          f"tolerance {tolerance:.2e}")
    assert err <= tolerance, f"{name}: relative error {err:.2e} > {tolerance:.2e} ({storage})"
    assert np.abs(np.asarray(theirs, np.float64)).max() > 0
