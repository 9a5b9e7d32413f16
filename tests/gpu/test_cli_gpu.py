"""The backend from the command line on a GPU: compile for this device, run the bundle on cuDNN
and on the reference backend, capture the device profile."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.gpu.common import rel_error
from tests.helpers import rng, run_cli

pytestmark = pytest.mark.gpu


def test_compile_run_cudnn_equals_reference(tmp_path: Path) -> None:
    assert run_cli("compile", "models/mlp.cgraph", "--target", "device", "-o", str(tmp_path),
                   "--bucket", "N=16", "-q").code == 0
    bundle = tmp_path / "mnist_mlp.bundle"
    weights = tmp_path / "w.safetensors"
    assert run_cli("weights", "random", "models/mlp.cgraph", "-o", str(weights)).code == 0
    x = tmp_path / "x.npy"
    np.save(x, rng(0).standard_normal((16, 784)).astype(np.float16))
    for backend in ("cudnn", "reference"):
        run = run_cli("run", str(bundle), "--backend", backend, "--weights", str(weights),
                      "--input", f"x={x}", "-o", str(tmp_path / f"{backend}.npz"))
        assert run.code == 0, run.stderr
    ours = np.load(tmp_path / "cudnn.npz")["logits"]
    ref = np.load(tmp_path / "reference.npz")["logits"]
    assert rel_error(ours, ref) < 1e-2
    inspect = run_cli("inspect", str(bundle))
    assert inspect.code == 0 and "engine" in inspect.stdout


def test_target_capture_writes_this_gpu(tmp_path: Path) -> None:
    out = tmp_path / "gpu.json"
    assert run_cli("target", "capture", "-o", str(out)).code == 0
    info = json.loads(out.read_text())
    assert info["multiProcessorCount"] > 0 and "deviceName" in info
