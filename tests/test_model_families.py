"""The model families of models/ (MobileNetV3, ConvNeXt, ViT, BERT, Stable Diffusion, YOLO,
Llama, Whisper's encoder) end to end on the CPU, against the independent PyTorch modules of
tests/torch_conv_families.py and tests/torch_attention_families.py:
- the params manifest is the PyTorch module's state_dict, keys and shapes in order, at the sizes
  the .cgraph file declares (the modules built on the meta device: no memory);
- dslc's reference executor (checked, lowered, fused, batchnorm folded) equals PyTorch in f32
  within 1e-5 on random weights and inputs, and at the model's storage precision (f16 or
  bf16) PyTorch in that dtype within `precision_tolerance`, at small sizes: the file as written
  with some of its static dims bound to smaller values (`dim D = 768` read as `dim D = 64`);
- each compiles deviceless for the H200 profile (at those small sizes, one bucket), with the
  fallback kernels expected of it.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from dslc.backend.target import load_target
from dslc.check.checker import CheckedModel
from dslc.compile.stage import compile_model
from dslc.core.types import PrecisionSpec
from dslc.diag.diagnostic import Sink
from dslc.ir import interp
from dslc.pipeline import Options, front_end, lower_and_fuse
from dslc.weights import random_weights
from tests import torch_attention_families as attn
from tests import torch_conv_families as conv
from tests.conftest import ROOT
from tests.helpers import (
    note_seed,
    precision_tolerance,
    rel_error,
    rng,
    rounding_depth,
    run_cli,
)

F32 = PrecisionSpec("f32", "f32", "f32")
TORCH_DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
Inputs = Callable[[np.random.Generator], dict[str, np.ndarray]]


def _named(**makers: Callable[[np.random.Generator], np.ndarray]) -> Inputs:
    return lambda g: {name: make(g) for name, make in makers.items()}


def _f32(*shape: int) -> Callable[[np.random.Generator], np.ndarray]:
    return lambda g: g.standard_normal(shape).astype(np.float32)


@dataclass(frozen=True)
class Family:
    """A model of models/, its PyTorch module, and the small sizes of the numeric test: static
    dims of the .cgraph file bound smaller (`dims`), the module built for them (`kwargs`), and
    inputs for them (their dynamic dims read off the input shapes)."""

    module: Callable[..., nn.Module]
    inputs: Inputs
    dims: dict[str, int] = field(default_factory=dict)
    kwargs: dict[str, int] = field(default_factory=dict)


FAMILIES = {
    "mobilenet_v3": Family(conv.MobileNetV3Blocks, _named(features=_f32(2, 80, 7, 9))),
    "convnext": Family(conv.ConvNeXtStage1, _named(features=_f32(2, 32, 9, 8)), {"C": 32},
                       {"dim": 32}),
    "vit_front": Family(attn.ViTFront, _named(image=_f32(2, 3, 32, 32)),
                        {"IMAGE": 32, "D": 64, "HEADS": 2, "MLP": 96},
                        {"image": 32, "d": 64, "heads": 2, "mlp": 96}),
    "bert": Family(attn.BertFront, lambda g: attn.bert_inputs(g, vocab=100, batch=3, seq=10),
                   {"VOCAB": 100, "POSITIONS": 16, "D": 64, "HEADS": 4, "FFN": 96},
                   {"vocab": 100, "positions": 16, "d": 64, "heads": 4, "ffn": 96}),
    "sd_down_block": Family(
        attn.SDDownBlock1, _named(sample=_f32(2, 16, 8, 10), temb=_f32(2, 48),
                                  encoder_hidden_states=_f32(2, 7, 40)),
        {"T": 7, "CIN": 16, "COUT": 64, "TEMB": 48, "CONTEXT": 40, "HEADS": 2, "GROUPS": 8},
        {"cin": 16, "cout": 64, "temb": 48, "context": 40, "heads": 2, "groups": 8}),
    "yolo_sppf": Family(conv.YoloSPPF, _named(features=_f32(2, 32, 9, 13)), {"C": 32},
                        {"c": 32}),
    "llama_layer": Family(attn.LlamaLayer, _named(hidden_states=_f32(2, 48, 128)),
                          {"D": 128, "HEADS": 4, "KV_HEADS": 2, "FFN": 192},
                          {"d": 128, "heads": 4, "kv_heads": 2, "ffn": 192}),
    "whisper_encoder": Family(attn.WhisperAudioEncoder, _named(input_features=_f32(2, 16, 36)),
                              {"MELS": 16, "S": 18, "D": 64, "HEADS": 2, "FFN": 96,
                               "LAYERS": 2},
                              {"mels": 16, "positions": 18, "d": 64, "heads": 2, "ffn": 96,
                               "layers": 2}),
}


@pytest.fixture(autouse=True, scope="module")
def _torch_threads() -> Iterator[None]:
    """Two threads at most: the CPU is shared with the rest of the suite (restored after)."""
    before = torch.get_num_threads()
    torch.set_num_threads(min(before, 2))
    yield
    torch.set_num_threads(before)


def bound_source(name: str, dims: dict[str, int]) -> str:
    """models/<name>.cgraph with each `dim NAME = ...` of `dims` declared as the given size."""
    text = (ROOT / "models" / f"{name}.cgraph").read_text()
    for dim, size in dims.items():
        text, found = re.subn(rf"^(\s*dim {dim} = )[^\s#]+", rf"\g<1>{size}", text, flags=re.M)
        assert found == 1, f"models/{name}.cgraph declares no static `dim {dim}`"
    return text


def _checked(name: str, tmp_path: Path, precision: PrecisionSpec | None) -> CheckedModel:
    path = tmp_path / f"{name}.cgraph"
    path.write_text(bound_source(name, FAMILIES[name].dims))
    sink = Sink()
    options = Options(include_dirs=[ROOT / "models"], precision=precision,
                      backend="reference" if precision else "cudnn")
    model = front_end(path, options, sink).model
    assert model is not None, [d.message for d in sink.diagnostics]
    return model


def _module(name: str, state: dict[str, torch.Tensor] | None = None) -> nn.Module:
    """The PyTorch module at the declared sizes, without storage (meta), or at the test's sizes
    holding `state` (built on the CPU: the buffers it computes, such as rotary frequencies and
    position ids, are not in a state_dict)."""
    family = FAMILIES[name]
    if state is None:
        with torch.device("meta"):
            return family.module().eval()
    module = family.module(**family.kwargs)
    # assign: each param takes the dtype of its tensor (batchnorm statistics stay f32)
    missing, unexpected = module.load_state_dict(state, strict=False, assign=True)
    assert not unexpected, unexpected
    assert all(k.endswith("num_batches_tracked") for k in missing), missing
    return module.eval()


@pytest.mark.parametrize("name", FAMILIES)
def test_params_manifest_is_the_pytorch_state_dict(name: str) -> None:
    run = run_cli("params", f"models/{name}.cgraph", "--format", "json")
    assert run.code == 0, run.stderr
    ours = [(k, v["shape"]) for k, v in json.loads(run.stdout).items()]
    theirs = [(k, list(v.shape)) for k, v in _module(name).state_dict().items()
              if not k.endswith("num_batches_tracked")]
    assert ours == theirs


@pytest.mark.parametrize("name", FAMILIES)
def test_reference_executor_equals_pytorch_in_f32(name: str, tmp_path: Path) -> None:
    model = _checked(name, tmp_path, F32)
    weights = {k: np.asarray(v, np.float32) for k, v in
               random_weights(model.params, seed=note_seed(f"{name} weights", 5)).items()}
    inputs = FAMILIES[name].inputs(rng("model families", name))
    assert list(inputs) == [i.name for i in model.inputs]
    lowered, plan = lower_and_fuse(model)
    [ours] = interp.run(lowered, inputs, weights, model.env, virtual=plan.virtual()).values()

    module = _module(name, {k: torch.from_numpy(v) for k, v in weights.items()})
    with torch.no_grad():
        theirs = module(**{k: torch.from_numpy(v) for k, v in inputs.items()}).numpy()
    assert ours.dtype == np.float32 and ours.shape == theirs.shape
    err = rel_error(ours, theirs)
    print(f"{name}: relative error {err:.2e} in f32")
    assert np.isfinite(theirs).all() and np.abs(theirs).max() > 0
    assert err <= 1e-5, f"{name}: relative error {err:.2e} in f32"


def _torch_inputs(inputs: dict[str, np.ndarray], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Float inputs in `dtype` (from their f32 values), integer ones as they are."""
    return {k: torch.from_numpy(v) if v.dtype.kind in "iu" else
            torch.from_numpy(np.asarray(v, np.float32)).to(dtype) for k, v in inputs.items()}


@pytest.mark.parametrize("name", FAMILIES)
def test_reference_executor_equals_pytorch_at_the_declared_precision(name: str,
                                                                    tmp_path: Path) -> None:
    """f16 or bf16 storage, f32 compute, against PyTorch in that storage dtype, within
    `precision_tolerance` (tests/helpers.py), as tests/test_end_to_end.py does for the others."""
    model = _checked(name, tmp_path, None)
    storage = model.precision.io
    assert storage in ("f16", "bf16") and model.precision.compute == "f32"
    weights = random_weights(model.params, seed=note_seed(f"{name} weights", 5))
    drawn = FAMILIES[name].inputs(rng("model families", name))
    inputs = {i.name: drawn[i.name].astype(interp.NUMPY_DTYPES[i.type.dtype])
              for i in model.inputs}
    lowered, plan = lower_and_fuse(model)
    [ours] = interp.run(lowered, inputs, weights, model.env, virtual=plan.virtual()).values()

    module = _module(name, {p.path: torch.from_numpy(np.asarray(weights[p.path], np.float32))
                            .to(TORCH_DTYPES[p.dtype]) for p in model.params})
    with torch.no_grad():
        theirs = module(**_torch_inputs(inputs, TORCH_DTYPES[storage])).float().numpy()
    tolerance = precision_tolerance(storage, rounding_depth(model.graph))
    err = rel_error(np.asarray(ours, np.float32), theirs)
    print(f"{name}: {storage}: relative error {err:.2e}, tolerance {tolerance:.2e}")
    assert np.isfinite(np.asarray(ours, np.float32)).all()
    assert err <= tolerance, f"{name}: relative error {err:.2e} > {tolerance:.2e} ({storage})"


# What runs outside cuDNN, per family: ops the graph API has no node for (gather, arange, pooling,
# concat) and the attention whose bias is broadcast over the heads (a padding mask), which cuDNN
# computed wrongly on the H200 (ops/attention.py).
# Pointwise ops whose cuDNN form exists at the bucket only because N = 1 (or B = 1) run as
# kernels at every size (backend/channels_last.form_holds_at_every_size): squeeze-excite's scale
# [N, C, 1, 1] over NHWC, a group norm's per-channel scale and shift over NCHW.
FALLBACK_KERNELS = {
    "mobilenet_v3": {"mul": 2}, "convnext": {}, "vit_front": {"concat": 1},
    # group norms: a kernel each (backend/groupnorm.py); GEGLU's gelu(gate) * x over two
    # slices laid out unlike its result: one pointwise kernel (backend/fused.py)
    "sd_down_block": {"groupnorm": 3, "gelu": 1},
    # cuDNN's sdpa reads the padding mask at full size (dslc.lower.views): its cast, `(1 - m) *
    # min` and the broadcast are one kernel (fuse.patterns: a chain's expand tail)
    "bert": {"gather": 3, "arange": 1, "cast": 1}, "yolo_sppf": {"maxpool": 3, "concat": 1},
    # rotary positions arange(S) at each size; the frequencies' arange (static) at load time;
    # each rotary's halves (`lower/concat.py`) read x's halves through gapped views, which
    # cuDNN's pointwise graphs are not given (backend/spec.py): a kernel each, written into the
    # concatenation in place (its step copies nothing)
    "llama_layer": {"arange": 1, "concat": 3, "neg": 2, "mul": 2},
    # its 1-d convolutions are cuDNN graphs (2-d over one row: backend.spec)
    "whisper_encoder": {},
}


@pytest.mark.parametrize("name", FAMILIES)
def test_compiles_deviceless_for_the_h200(name: str, tmp_path: Path) -> None:
    """One bucket at the test's sizes: every group is a cuDNN graph the library validates, or
    one of the fallback kernels above."""
    model = _checked(name, tmp_path, None)
    lowered, plan = lower_and_fuse(model)
    compiled = compile_model(model, lowered, plan, load_target("h200"), buckets=[model.buckets[0]])
    nodes = compiled.graph.by_name()
    kernels = Counter(nodes[s.group.nodes[0]].op for s in compiled.steps if s.kind == "kernel")
    assert dict(kernels) == FALLBACK_KERNELS[name]
    assert any(s.kind == "graph" for s in compiled.steps)
