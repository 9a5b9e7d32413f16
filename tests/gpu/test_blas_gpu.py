"""Matmul steps of many rows on cuBLASLt (`backend.blas`, `backend.gemv._many_rows`) on the GPU:
products with a bias and an addend equal PyTorch's in f16 and bf16 for both weight layouts; a
transformer MLP whose two matmul steps run as kernel steps (fc1 + bias on cuBLASLt then the
GELU over its result, in bf16; fc2 with its bias and residual on cuBLASLt alone) equals the
reference executor; and `dslc tune --fusion measure` times each such step against its cuDNN graph."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from dslc.backend import blas
from dslc.emit import bundle as emit_bundle
from dslc.runtime.bundle import load
from tests.gpu.common import (
    TOLERANCE,
    as_cupy,
    compile_source,
    random_inputs,
    reference,
    rel_error,
    to_device,
    to_host,
)
from tests.helpers import matmuls_as_kernels

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("extras", ["none", "bias", "bias_and_addend"])
@pytest.mark.parametrize("linear", [True, False], ids=["weight_N_K_transposed", "weight_K_N"])
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_cublaslt_products_equal_pytorch(dtype: str, linear: bool, extras: str) -> None:
    import torch

    g = torch.Generator(device="cuda").manual_seed(5)
    kind = torch.float16 if dtype == "f16" else torch.bfloat16
    m, k, n = 300, 256, 192

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g, device="cuda").to(kind)

    x = rand(m, k + 8)[:, :k]  # rows at a pitch past K
    w = rand(n, k).t() if linear else rand(k, n)
    c = rand(m, n) if extras == "bias_and_addend" else None
    bias = rand(n) if extras != "none" else None
    y = torch.empty(m, n, device="cuda", dtype=kind)
    assert blas.matmul(dtype, as_cupy(x, dtype), as_cupy(w, dtype), as_cupy(y, dtype),
                       None if c is None else as_cupy(c, dtype),
                       None if bias is None else as_cupy(bias, dtype))
    torch.cuda.synchronize()
    want = x.float() @ w.float()
    want += (0 if c is None else c.float()) + (0 if bias is None else bias.float())
    err = rel_error(y.float().cpu().numpy(), want.cpu().numpy())
    print(f"cuBLASLt {dtype} linear={linear} {extras}: relative error {err:.2e}")
    assert err < TOLERANCE[dtype] / 3


@pytest.mark.parametrize("activation", ["relu", "gelu_tanh"])
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_cublaslt_activations_equal_pytorch(dtype: str, activation: str) -> None:
    """cuBLASLt's GELU epilogue against PyTorch's tanh form (the op `gelu_tanh` it serves)."""
    import torch

    g = torch.Generator(device="cuda").manual_seed(6)
    kind = torch.float16 if dtype == "f16" else torch.bfloat16
    x = torch.randn(300, 256, generator=g, device="cuda").to(kind)
    w = torch.randn(192, 256, generator=g, device="cuda").to(kind).t()
    bias = torch.randn(192, generator=g, device="cuda").to(kind)
    y = torch.empty(300, 192, device="cuda", dtype=kind)
    assert blas.matmul(dtype, as_cupy(x, dtype), as_cupy(w, dtype), as_cupy(y, dtype),
                       None, as_cupy(bias, dtype), activation)
    torch.cuda.synchronize()
    z = x.float() @ w.float() + bias.float()
    want = torch.relu(z) if activation == "relu" else \
        torch.nn.functional.gelu(z, approximate="tanh")
    err = rel_error(y.float().cpu().numpy(), want.cpu().numpy())
    print(f"cuBLASLt {dtype} bias + {activation}: relative error {err:.2e}")
    assert err < TOLERANCE[dtype] / 3


MLP = """
model m {{
  precision io={io}, intermediate=f32, compute=f32
  dim T = 64..1024 tune [576]
  input x: [2, T, 256]
  param fc1.weight: [1024, 256]
  param fc1.bias: [1024]
  param fc2.weight: [256, 1024]
  param fc2.bias: [256]
  let h = gelu(matmul(x, transpose(fc1.weight, [1, 0])) + fc1.bias)
  output y: [2, T, 256] = x + (matmul(h, transpose(fc2.weight, [1, 0])) + fc2.bias)
}}
"""


@pytest.mark.parametrize("io", ["bf16", "f16"])
def test_matmul_steps_of_many_rows_on_cublaslt_equal_the_reference(
        io: str, tmp_path: Path) -> None:
    from dslc.runtime import Model

    bundle = compile_source(MLP.format(io=io), tmp_path)
    kernels, count = matmuls_as_kernels(load(bundle))
    assert count == 2
    emit_bundle.write(bundle, kernels)
    model = Model(bundle, bundle.with_suffix(".safetensors"), tuning_db=None)
    before = len(blas._PLANS)
    for t in (576, 200):
        inputs = random_inputs(bundle, {"T": t}, seed=3 + t)
        got = to_host(model.run(to_device(inputs, bundle)))
        want = reference(bundle, inputs)
        err = rel_error(got["y"], want["y"])
        print(f"MLP {io} T={t} on cuBLASLt: relative error {err:.2e}")
        assert err < TOLERANCE[io] and np.isfinite(got["y"]).all()
    # cuBLASLt ran them, not the reference fallback, at both sizes: in bf16 both steps; in f16
    # fc2 alone (fc1's GELU would read f16's rounding of an f32 value: `gemv.rest_reads_exactly`)
    assert len(blas._PLANS) >= before + (4 if io == "bf16" else 2)
    assert all(v is not None for v in blas._PLANS.values())


def test_the_tuner_measures_matmul_steps_of_many_rows_on_cublaslt(tmp_path: Path) -> None:
    from tests.helpers import run_cli

    bundle = compile_source(MLP.format(io="bf16"), tmp_path)
    run = run_cli("tune", str(bundle), "--fusion", "measure", "--budget", "2",
                  "--tuning-db", "none", "-q")
    print(run.stdout)
    assert run.code == 0, run.stderr
    times = re.findall(r"cuDNN graph ([\d.]+) ms, one kernel ([\d.]+) ms", run.stdout)
    assert len(times) >= 2 and all(float(k) > 0 for _, k in times), run.stdout
