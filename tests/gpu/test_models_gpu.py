"""Every example model end to end on the GPU: against the reference executor; ResNets against
torchvision, the encoder and the model families (MobileNetV3, ConvNeXt, ViT, BERT, Stable
Diffusion, YOLO, Llama) against PyTorch, fed the same random weights; a bundle reloaded by a
fresh process gives the same outputs without building plans; CUDA-graph replay equals the plain
runner."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests import torch_attention_families as attn
from tests import torch_conv_families as conv
from tests.conftest import ROOT
from tests.gpu.common import (
    TOLERANCE,
    compile_file,
    output_dtype,
    random_inputs,
    reference,
    rel_error,
    to_device,
    to_host,
)

pytestmark = pytest.mark.gpu

# model -> the bucket compiled for the test (small, to keep plan builds few).
MODELS = {"mlp": {"N": 16}, "resnet18": {"N": 32}, "resnet50": {"N": 32},
          "encoder": {"B": 8, "S": 200}, "unet": {"N": 1, "H": 256, "W": 256},
          "mobilenet_v3": {"N": 32, "H": 14, "W": 14}, "convnext": {"N": 32, "H": 56, "W": 56},
          "vit_front": {"N": 8}, "bert": {"B": 8, "S": 128}, "sd_down_block": {"B": 2, "H": 32, "W": 32},
          "yolo_sppf": {"N": 16, "H": 20, "W": 20}, "llama_layer": {"B": 1, "S": 128},
          "whisper_encoder": {"B": 8}}
# The model families' PyTorch modules (at the sizes the .cgraph files declare), and the
# largest relative error allowed against them in the model's storage dtype.
FAMILIES = {"mobilenet_v3": conv.MobileNetV3Blocks, "convnext": conv.ConvNeXtStage1,
            "vit_front": attn.ViTFront, "bert": attn.BertFront,
            "sd_down_block": attn.SDDownBlock1, "yolo_sppf": conv.YoloSPPF,
            "llama_layer": attn.LlamaLayer, "whisper_encoder": attn.WhisperAudioEncoder}
AGAINST_PYTORCH = {"f16": 2e-2, "bf16": 5e-2}


def _inputs(name: str, bundle: Path, seed: int) -> dict[str, np.ndarray]:
    """Random inputs at the test's bucket; BERT's as a tokenizer makes them (ids in the
    vocabulary, segment ids 0 and 1, a 0/1 padding mask)."""
    if name == "bert":
        dims = MODELS[name]
        return attn.bert_inputs(np.random.default_rng(seed), vocab=30522, batch=dims["B"],
                                seq=dims["S"])
    return random_inputs(bundle, MODELS[name], seed=seed)


class _Bundles(dict[str, Path]):
    """Each model compiled the first time a test asks for it, so `-k convnext` compiles one."""

    def __init__(self, root: Path) -> None:
        super().__init__()
        self.root = root

    def __missing__(self, name: str) -> Path:
        bucket = MODELS[name]
        start = time.perf_counter()
        self[name] = compile_file(ROOT / "models" / f"{name}.cgraph", self.root / name, bucket)
        print(f"compiled {name} at {bucket} in {time.perf_counter() - start:.1f} s")
        return self[name]


@pytest.fixture(scope="module")
def bundles(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return _Bundles(tmp_path_factory.mktemp("models"))


def _run(bundle: Path, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    from dslc.runtime import Model

    model = Model(bundle, bundle.with_suffix(".safetensors"))
    return to_host(model.run(to_device(inputs, bundle)))


@pytest.mark.parametrize("name", MODELS)
def test_model_matches_reference_executor(name: str, bundles: dict[str, Path]) -> None:
    bundle = bundles[name]
    inputs = _inputs(name, bundle, seed=1)
    ours = _run(bundle, inputs)
    want = reference(bundle, inputs)
    for out, value in want.items():
        err = rel_error(ours[out], value)
        print(f"{name}.{out}: relative error {err:.2e} against the reference executor")
        assert err <= TOLERANCE[output_dtype(bundle, out)]


@pytest.mark.parametrize("name", ["resnet18", "resnet50"])
def test_resnet_matches_torchvision(name: str, bundles: dict[str, Path]) -> None:
    import torch
    import torchvision
    from safetensors.numpy import load_file

    bundle = bundles[name]
    inputs = random_inputs(bundle, MODELS[name], seed=2)
    ours = _run(bundle, inputs)["logits"]
    net = getattr(torchvision.models, name)()
    state = {k: torch.from_numpy(v.astype(np.float32)) for k, v in
             load_file(str(bundle.with_suffix(".safetensors"))).items()}
    missing, unexpected = net.load_state_dict(state, strict=False)
    assert not unexpected and all(k.endswith("num_batches_tracked") for k in missing), \
        (missing, unexpected)  # every weight torchvision uses came from our file
    net = net.eval().cuda().half().to(memory_format=torch.channels_last)
    image = torch.from_numpy(inputs["image"].astype(np.float32)).cuda().half()
    with torch.no_grad():
        theirs = net(image.to(memory_format=torch.channels_last)).float().cpu().numpy()
    err = rel_error(ours, theirs)
    print(f"{name}: relative error {err:.2e} against torchvision (fp16)")
    assert err <= 2e-2


def test_a_deviceless_resnet50_matches_the_reference_on_this_gpu(tmp_path: Path) -> None:
    """Compiled as a CI machine compiles it, from this GPU's profile (plans nobody ran), then
    started here: its residual groups' restored plans run once at start-up."""
    from dslc.runtime import Model

    bundle = compile_file(ROOT / "models" / "resnet50.cgraph", tmp_path, MODELS["resnet50"],
                          deviceless=True)
    inputs = random_inputs(bundle, MODELS["resnet50"], seed=4)
    model = Model(bundle, bundle.with_suffix(".safetensors"), plan_cache=None, tuning_db=None)
    ours = to_host(model.run(to_device(inputs, bundle)))["logits"]
    err = rel_error(ours, reference(bundle, inputs)["logits"])
    print(f"resnet50 (deviceless): relative error {err:.2e} against the reference executor")
    assert err <= TOLERANCE["f16"]


def test_encoder_matches_pytorch(bundles: dict[str, Path]) -> None:
    import torch
    from safetensors.numpy import load_file

    from tests.torch_models import Encoder

    bundle = bundles["encoder"]
    inputs = random_inputs(bundle, MODELS["encoder"], seed=3)
    ours = _run(bundle, inputs)["hidden"]
    net = Encoder()
    state = {k: torch.from_numpy(v.astype(np.float32)) for k, v in
             load_file(str(bundle.with_suffix(".safetensors"))).items()}
    net.load_state_dict(state)
    net = net.eval().cuda().to(torch.bfloat16)
    tokens = torch.from_numpy(inputs["tokens"].astype(np.float32)).cuda().to(torch.bfloat16)
    with torch.no_grad():
        theirs = net(tokens).float().cpu().numpy()
    err = rel_error(ours, theirs)
    print(f"encoder: relative error {err:.2e} against PyTorch (bf16)")
    assert err <= 5e-2



@pytest.mark.parametrize("name", FAMILIES)
def test_family_matches_pytorch(name: str, bundles: dict[str, Path]) -> None:
    """The hand-written PyTorch module (tests/torch_*_families.py) on the GPU in the model's
    storage dtype, loaded from the bundle's weight file by name."""
    import torch
    from safetensors.numpy import load_file

    bundle = bundles[name]
    inputs = _inputs(name, bundle, seed=2)
    [(out, ours)] = _run(bundle, inputs).items()
    dtype = output_dtype(bundle, out)
    torch_dtype = {"f16": torch.float16, "bf16": torch.bfloat16}[dtype]
    net = FAMILIES[name]()
    state = {k: torch.from_numpy(v.astype(np.float32)).to(torch_dtype) for k, v in
             load_file(str(bundle.with_suffix(".safetensors"))).items()}
    # assign: the params take the storage dtype, the buffers the module computes stay as they
    # are (Llama's rotary frequencies in f32, as Hugging Face keeps them)
    missing, unexpected = net.load_state_dict(state, strict=False, assign=True)
    assert not unexpected and all(k.endswith("num_batches_tracked") for k in missing), \
        (missing, unexpected)
    net = net.eval().cuda()
    xs = {k: torch.from_numpy(v).cuda() if v.dtype.kind in "iu" else
          torch.from_numpy(v.astype(np.float32)).cuda().to(torch_dtype) for k, v in inputs.items()}
    with torch.no_grad():
        theirs = net(**xs).float().cpu().numpy()
    err = rel_error(ours, theirs)
    print(f"{name}: relative error {err:.2e} against PyTorch ({dtype})")
    assert err <= AGAINST_PYTORCH[dtype]

def test_an_input_in_another_layout_is_r0501(bundles: dict[str, Path]) -> None:
    """The UNet declares its image NHWC: a row-major (NCHW) tensor is refused, not misread."""
    import torch

    from dslc.runtime import Model, RunnerError

    bundle = bundles["unet"]
    model = Model(bundle, bundle.with_suffix(".safetensors"))
    n, h, w = (MODELS["unet"][k] for k in ("N", "H", "W"))
    image = torch.zeros(n, 3, h, w, dtype=torch.float16, device="cuda")
    with pytest.raises(RunnerError) as err:
        model.run({"image": image})
    assert err.value.code == "R0501" and "make it contiguous in that layout" in str(err.value)
    out = model.run({"image": image.contiguous(memory_format=torch.channels_last)})
    assert set(out) == {"mask"}


RELOAD = """
import json, sys, time, numpy as np
t0 = time.perf_counter()
from dslc.runtime import Model
import torch
t1 = time.perf_counter()
model = Model(sys.argv[1], sys.argv[1].replace('.bundle', '.safetensors'))
x = torch.from_numpy(np.load(sys.argv[2])).cuda().half().to(memory_format=torch.channels_last)
out = model.run({'image': x})['logits']
torch.cuda.synchronize()
t2 = time.perf_counter()
np.save(sys.argv[3], out.float().cpu().numpy())
print(json.dumps({'import_s': t1 - t0, 'load_and_first_run_s': t2 - t1,
                  'how': sorted({s['how'] for s in model.startup})}))
"""


def test_fresh_process_loads_the_bundle_without_building_plans(bundles: dict[str, Path],
                                                               tmp_path: Path) -> None:
    bundle = bundles["resnet50"]
    inputs = random_inputs(bundle, MODELS["resnet50"], seed=4)
    np.save(tmp_path / "x.npy", inputs["image"])
    here = _run(bundle, inputs)["logits"]
    script = tmp_path / "reload.py"
    script.write_text(RELOAD)
    proc = subprocess.run([sys.executable, str(script), str(bundle), str(tmp_path / "x.npy"),
                           str(tmp_path / "y.npy")], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"fresh process: {report}")
    assert report["how"] == ["restored"]
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), here)


def test_cuda_graph_replay_equals_plain_runner(bundles: dict[str, Path]) -> None:
    from dslc.runtime import Model

    bundle = bundles["resnet18"]
    model = Model(bundle, bundle.with_suffix(".safetensors"))
    first = to_device(random_inputs(bundle, MODELS["resnet18"], seed=5), bundle)
    second = to_device(random_inputs(bundle, MODELS["resnet18"], seed=6), bundle)
    captured = model.capture(first)
    for inputs in (first, second):
        plain = to_host(model.run(inputs))["logits"]
        replay = to_host(captured(inputs))["logits"]
        np.testing.assert_array_equal(replay, plain)


@pytest.mark.parametrize(("name", "folds"), [("resnet50", True), ("encoder", True)])
def test_load_time_values_on_gpu_equal_the_numpy_ones(name: str, folds: bool,
                                                      bundles: dict[str, Path]) -> None:
    import cupy

    from dslc.runtime import Model, params

    bundle = bundles[name]
    model = Model(bundle)
    tensors = params.read(bundle.with_suffix(".safetensors"), model.manifest)
    wanted = model.program.weights_used()
    gpu = params.upload(model.program, tensors, wanted)
    host = params.load_time_values(model.program, tensors, wanted)
    computed = 0
    for value in wanted:
        node = model.program.nodes[value]
        order = params.memory_order(model.program, value, host[value].ndim)
        want = params.physical(host[value], order)
        got = cupy.asnumpy(gpu[value]).view(want.dtype).reshape(want.shape)
        computed += node.op != "param"
        assert rel_error(got.astype(np.float64), want.astype(np.float64)) <= 1e-3, value
    print(f"{name}: {len(wanted)} load-time values, {computed} computed on the GPU, equal to numpy")
    # resnet50 folds its batchnorms; the encoder joins each layer's q/k/v weights (packed)
    assert (computed > 0) == folds


def test_prepared_weights_run_like_the_raw_ones(bundles: dict[str, Path], tmp_path: Path) -> None:
    from dslc.runtime import Model, params

    bundle = bundles["resnet50"]
    raw = bundle.with_suffix(".safetensors")
    model = Model(bundle, raw)
    prepared = tmp_path / "prepared.safetensors"
    params.save_prepared(prepared, model.program,
                         params.prepare(model.program, params.read(raw, model.manifest)), str(raw))
    inputs = random_inputs(bundle, MODELS["resnet50"], seed=3)
    ours = to_host(model.run(to_device(inputs, bundle)))["logits"]
    fast = Model(bundle, prepared)
    assert fast._prepared
    theirs = to_host(fast.run(to_device(inputs, bundle)))["logits"]
    err = rel_error(theirs, ours)
    print(f"resnet50 prepared weights vs raw: relative error {err:.2e}")
    assert err <= 2e-3  # load-time values from numpy vs the GPU differ by an ulp at most
