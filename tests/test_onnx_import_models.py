"""`dslc import` of whole models exported from PyTorch on the CPU (ResNet-18/50 with torchvision's
names, torchvision's MobileNetV2 layout, a BERT encoder layer, a GPT-2 block), by the
torch.export-based exporter unoptimised and optimised (batchnorm folded) and by the legacy one:
each imports to a model that checks, the unoptimised export keeps the state dict's names, the
reference executor equals onnxruntime on the same inputs, and the model compiles deviceless."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")  # the torch.export-based exporter's
torch = pytest.importorskip("torch")

from tests import torch_attention_families as attn  # noqa: E402
from tests import torch_models, torch_onnx_models  # noqa: E402
from tests.helpers import rel_error, rng, run_cli  # noqa: E402
from tests.onnx_helpers import (  # noqa: E402
    Imported,
    export,
    import_file,
    run_onnxruntime,
    run_reference,
)


@dataclass(frozen=True)
class Case:
    module: Callable[[], torch.nn.Module]
    inputs: dict[str, tuple[int, ...]]  # f32 inputs by name, at the export's sizes
    exports: tuple[str, ...] = ("dynamo", "dynamo-optimized", "legacy")
    dims: dict[str, dict[int, str]] = field(default_factory=dict)  # dynamic axes


CASES = {
    "resnet18": Case(torch_models.resnet18, {"x": (1, 3, 32, 32)}),
    "resnet50": Case(torch_models.resnet50, {"x": (1, 3, 32, 32)}, ("dynamo",)),
    "mobilenet_v2": Case(lambda: torch_onnx_models.MobileNetV2(width=0.5), {"x": (1, 3, 32, 32)}),
    "bert_layer": Case(lambda: attn.BertLayer(64, 4, 128),
                       {"x": (2, 10, 64), "mask": (2, 1, 1, 10)}),
    "gpt2_block": Case(torch_onnx_models.GPT2Block, {"x": (2, 12, 64)}),
}
PAIRS = [(name, how) for name, case in CASES.items() for how in case.exports]


@pytest.fixture(autouse=True, scope="module")
def _torch_threads() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(min(before, 2))  # the CPU is shared with the rest of the suite
    yield
    torch.set_num_threads(before)


def _module(name: str) -> torch.nn.Module:
    """The model with weights drawn from a seed, batchnorm statistics away from 0 and 1 (so a
    batchnorm imported wrongly shows)."""
    torch.manual_seed(len(name))
    module = CASES[name].module().eval()
    for m in module.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            with torch.no_grad():
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 1.5)
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.2, 0.2)
    return module


def _inputs(name: str) -> dict[str, np.ndarray]:
    g = rng("onnx import", name)
    return {k: g.standard_normal(shape).astype(np.float32)
            for k, shape in CASES[name].inputs.items()}


class Exports:
    """Each model exported and imported once per session (the exports take seconds)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.done: dict[tuple[str, str], tuple[Path, Imported]] = {}

    def get(self, name: str, how: str) -> tuple[Path, Imported]:
        if (name, how) not in self.done:
            folder = self.root / f"{name}-{how}"
            folder.mkdir()
            args = tuple(torch.from_numpy(v) for v in _inputs(name).values())
            onnx_file = export(_module(name), args, folder / f"{name}.onnx", how,
                               list(CASES[name].inputs))
            self.done[name, how] = onnx_file, import_file(onnx_file, folder)
        return self.done[name, how]


@pytest.fixture(scope="session")
def exports(tmp_path_factory: pytest.TempPathFactory) -> Exports:
    return Exports(tmp_path_factory.mktemp("onnx-exports"))


@pytest.mark.parametrize("name", CASES)
def test_unoptimised_export_is_imported_with_the_state_dict_names(name: str,
                                                                  exports: Exports) -> None:
    _, imported = exports.get(name, "dynamo")
    ours = sorted(p.path for p in imported.model.params)
    theirs = sorted(k for k in _module(name).state_dict() if not k.endswith("num_batches_tracked"))
    assert ours == theirs
    assert sorted(imported.weights) == theirs


@pytest.mark.parametrize(("name", "how"), [("bert_layer", "dynamo-optimized"),
                                         ("gpt2_block", "dynamo-optimized"),
                                         ("gpt2_block", "legacy")])
def test_optimised_transformer_export_keeps_the_names_of_merged_weights(name: str, how: str,
                                                                        exports: Exports) -> None:
    """The optimiser merges equal initializers (two LayerNorms' ones and zeros): the second
    instance is named after the module its node was exported from."""
    _, imported = exports.get(name, how)
    theirs = sorted(_module(name).state_dict())
    assert sorted(p.path for p in imported.model.params) == theirs


@pytest.mark.parametrize(("name", "how"), PAIRS)
def test_reference_run_of_the_import_equals_onnxruntime(name: str, how: str,
                                                        exports: Exports) -> None:
    onnx_file, imported = exports.get(name, how)
    inputs = _inputs(name)
    ours, theirs = run_reference(imported, inputs), run_onnxruntime(onnx_file, inputs)
    assert len(ours) == len(theirs) == 1
    assert ours[0].shape == theirs[0].shape and np.abs(theirs[0]).max() > 0
    err = rel_error(ours[0], theirs[0])
    print(f"{name} ({how}): relative error {err:.2e} against onnxruntime")
    assert err <= 1e-4


def test_equal_residual_blocks_are_one_def_and_runs_of_them_a_repeat(exports: Exports) -> None:
    """ResNet-50: the bottlenecks after each stage's first are one def per stage (their widths
    differ), stacked with `repeat` at torchvision's paths."""
    _, imported = exports.get("resnet50", "dynamo")
    text = imported.source.read_text()
    assert text.count("\ndef ") == 4
    for stage, n in ((1, 2), (2, 3), (3, 5), (4, 2)):
        assert f'= repeat {n} layer{stage}_block(' in text
        assert f'as "layer{stage}.{{i+1}}"' in text
    body = text.split("def layer1_block(x: [N, C, H, W]) {\n")[1].split("}\n")[0]
    assert body.endswith("  return relu(bn3 + x)\n")


def test_imported_text_is_in_the_canonical_layout(exports: Exports) -> None:
    _, imported = exports.get("resnet18", "dynamo")
    run = run_cli("fmt", "--check", str(imported.source))
    assert run.code == 0, run.stdout + run.stderr


@pytest.mark.parametrize("name", CASES)
def test_import_compiles_deviceless_for_the_h200(name: str, exports: Exports,
                                                 tmp_path: Path) -> None:
    pytest.importorskip("cudnn")
    _, imported = exports.get(name, "dynamo")
    run = run_cli("compile", str(imported.source), "-o", str(tmp_path / "bundle"), "--target",
                  "h200", "--no-tune", "--weights", str(imported.source.with_suffix(".safetensors")),
                  "-q")
    assert run.code == 0, run.stderr
    assert (tmp_path / "bundle").is_dir()


def test_dynamic_axes_become_dims_and_run_at_other_sizes(tmp_path: Path) -> None:
    """batch and seq exported dynamic: `dim` declarations (seq's range from --dim), the inputs
    declared over them, and a run at sizes other than the export's equal to onnxruntime's."""
    module = torch_onnx_models.GPT2Block().eval()
    onnx_file = export(module, (torch.randn(2, 12, 64),), tmp_path / "gpt2.onnx", "dynamo",
                       ["x"], {"x": {0: "batch", 1: "seq"}})
    imported = import_file(onnx_file, tmp_path, "--dim", "seq=1..32", "--buckets",
                           "seq=8,32")
    text = imported.source.read_text()
    assert "dim batch = 1..256\n" in text and "dim seq = 1..32 tune [8, 32]\n" in text
    assert "input x: f32[batch, seq, 64]" in text
    x = rng("onnx import", "gpt2 dynamic").standard_normal((3, 9, 64)).astype(np.float32)
    [ours], [theirs] = run_reference(imported, {"x": x}), run_onnxruntime(onnx_file, {"x": x})
    assert rel_error(ours, theirs) <= 1e-4
