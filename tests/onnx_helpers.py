"""What the ONNX import tests share: export a PyTorch module on the CPU, import the file with
`dslc import` (in process), run the result with the reference executor and the ONNX file with
onnxruntime on the same inputs, and compile it deviceless."""

from __future__ import annotations

import io
import warnings
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime
import torch
from safetensors.numpy import load_file
from torch import nn

from dslc.check.checker import CheckedModel
from dslc.core.types import PrecisionSpec
from dslc.diag.diagnostic import Sink
from dslc.ir import interp
from dslc.pipeline import Options, front_end, lower_and_fuse
from tests.helpers import run_cli

F32 = PrecisionSpec("f32", "f32", "f32")
# How a module is exported: the torch.export-based exporter unoptimised (every state-dict name
# an initializer) or with its default optimisation (batchnorm folded), or the legacy one.
EXPORTS = ("dynamo", "dynamo-optimized", "legacy")


def export(module: nn.Module, args: tuple[torch.Tensor, ...], path: Path, how: str,
           input_names: list[str] | None = None,
           dynamic: dict[str, dict[int, str]] | None = None) -> Path:
    """`module` (in eval mode) written to `path` as ONNX, the exporter's chatter silenced."""
    module.eval()
    with warnings.catch_warnings(), redirect_stdout(io.StringIO()), \
            redirect_stderr(io.StringIO()), torch.no_grad():
        warnings.simplefilter("ignore")
        if how == "legacy":
            torch.onnx.export(module, args, str(path), dynamo=False, opset_version=17,
                              input_names=input_names, dynamic_axes=dynamic)
        else:
            shapes = None
            if dynamic:
                names = input_names or []
                shapes = tuple({axis: torch.export.Dim(n, min=1, max=256)
                                for axis, n in dynamic.get(name, {}).items()} or None
                               for name in names)
            torch.onnx.export(module, args, str(path), dynamo=True,
                              optimize=how == "dynamo-optimized", input_names=input_names,
                              dynamic_shapes=shapes)
    return path


@dataclass
class Imported:
    source: Path  # the .cgraph file
    weights: dict[str, np.ndarray]
    model: CheckedModel


def import_file(onnx_file: Path, out_dir: Path, *extra: str) -> Imported:
    """`dslc import` of `onnx_file` into `out_dir`, checked by the reference backend's rules."""
    out = out_dir / (onnx_file.stem + ".cgraph")
    run = run_cli("import", str(onnx_file), "-o", str(out), *extra)
    assert run.code == 0, run.stderr
    sink = Sink()
    model = front_end(out, Options(precision=F32, backend="reference"), sink).model
    assert model is not None and not sink.error_count, [d.message for d in sink.diagnostics]
    return Imported(out, load_file(str(out.with_suffix(".safetensors"))), model)


def run_reference(imported: Imported, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The outputs of the imported model on `inputs` (by the ONNX inputs' order)."""
    model = imported.model
    feeds = dict(zip([i.name for i in model.inputs], inputs.values(), strict=True))
    lowered, plan = lower_and_fuse(model)
    outs = interp.run(lowered, feeds, imported.weights, model.env, virtual=plan.virtual())
    return [np.asarray(v) for v in outs.values()]


def run_onnxruntime(onnx_file: Path, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1  # the CPU is shared with the rest of the suite
    session = onnxruntime.InferenceSession(str(onnx_file), options,
                                           providers=["CPUExecutionProvider"])
    return [np.asarray(o) for o in session.run(None, inputs)]
