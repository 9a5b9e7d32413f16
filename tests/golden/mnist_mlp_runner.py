"""Runner for the model `mnist_mlp`, compiled by dslc 0.1.0 from `models/mlp.cgraph`.

Generated code: do not edit. Recompile with `dslc compile models/mlp.cgraph`.

    from mnist_mlp_runner import MnistMlpRunner
    model = MnistMlpRunner("weights.safetensors")
    outputs = model(x=...)

Inputs (torch tensors, CuPy arrays, or any DLPack / CUDA-array-interface objects, on the GPU):
    x: f16[N, 784]

Outputs (a dict; torch tensors when the inputs are torch tensors, else CuPy arrays):
    logits: f32[N, 10]

Dynamic dims:
    N: 1..256
    buckets: N=1, N=16, N=64, N=256
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dslc.runtime import Model

BUNDLE = Path(__file__).with_name('mnist_mlp.bundle')
WEIGHTS = Path(__file__).with_name('mnist_mlp.safetensors')  # used when no weights are given


class MnistMlpRunner(Model):
    """`mnist_mlp` (3 steps: 3 cuDNN graphs, 0 fallback kernels)."""

    def __init__(self, weights: str | Path | None = None, *, bundle: str | Path = BUNDLE,
                 **options: Any) -> None:
        if weights is None and WEIGHTS.exists():
            weights = WEIGHTS
        super().__init__(bundle, weights, **options)

    def __call__(self, x: Any) -> dict[str, Any]:
        """Run the model.

        x: f16[N, 784]
        """
        return self.run({'x': x})

    # The schedule, step by step, as `run` executes it:
    #     1. w1+b1+relu: matmul -> bias_add -> relu [cuDNN graph]
    #     2. w2+b2+gelu: matmul -> bias_add -> gelu [cuDNN graph]
    #     3. w3+b3: matmul -> bias_add [cuDNN graph]

