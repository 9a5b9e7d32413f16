"""An imported ONNX model on the GPU: ResNet-18 (torchvision's names) exported by the
torch.export-based exporter, imported, compiled for this device, run on cuDNN and compared with
PyTorch on the CPU (f32 storage and compute; cuDNN's f32 convolutions may round through TF32,
hence a tolerance above f32's own)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxscript")
torch = pytest.importorskip("torch")

from tests import torch_models  # noqa: E402
from tests.gpu.common import rel_error  # noqa: E402
from tests.helpers import rng, run_cli  # noqa: E402
from tests.onnx_helpers import export  # noqa: E402

pytestmark = pytest.mark.gpu


def test_imported_resnet18_on_cudnn_equals_pytorch(tmp_path: Path) -> None:
    torch.manual_seed(18)
    module = torch_models.resnet18().eval()
    x = rng("onnx gpu", 18).standard_normal((4, 3, 64, 64)).astype(np.float32)
    onnx_file = export(module, (torch.from_numpy(x),), tmp_path / "resnet18.onnx", "dynamo",
                       ["x"])
    source = tmp_path / "resnet18.cgraph"
    run = run_cli("import", str(onnx_file), "-o", str(source))
    assert run.code == 0, run.stderr
    run = run_cli("compile", str(source), "--target", "device", "-o", str(tmp_path / "build"),
                  "--budget", "60", "-q")
    assert run.code == 0, run.stderr
    np.save(tmp_path / "x.npy", x)
    run = run_cli("run", str(tmp_path / "build" / "resnet18.bundle"), "--backend", "cudnn",
                  "--weights", str(source.with_suffix(".safetensors")), "--input",
                  f"x={tmp_path / 'x.npy'}", "-o", str(tmp_path / "out.npz"))
    assert run.code == 0, run.stderr
    [ours] = np.load(tmp_path / "out.npz").values()
    with torch.no_grad():
        theirs = module(torch.from_numpy(x)).numpy()
    err = rel_error(ours, theirs)
    print(f"imported resnet18 on cuDNN: relative error {err:.2e} against PyTorch")
    assert err < 5e-3
