"""Benchmark of the middle end (not a test): lowering and fusion of the generated ~2,000-op model
of bench_check.py, and a reference-executor run of ResNet-50 at batch 1.

Run: python scripts/bench_middle.py [--runs 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from bench_check import generate  # noqa: E402

from dslc.diag.diagnostic import Sink  # noqa: E402
from dslc.fuse import fuse  # noqa: E402
from dslc.ir import interp  # noqa: E402
from dslc.lower import lower  # noqa: E402
from dslc.pipeline import Options, front_end, lower_and_fuse  # noqa: E402
from dslc.weights import random_weights  # noqa: E402


def _median_ms(samples: list[float]) -> str:
    return f"{statistics.median(samples) * 1000:8.0f} ms   (" + " ".join(
        f"{s * 1000:.0f}" for s in samples) + ")"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--resnet-runs", type=int, default=3)
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.cgraph"
        path.write_text(generate(250, 34))
        model = front_end(path, Options(), Sink()).model
    assert model is not None
    ops = sum(1 for n in model.graph.nodes if n.op not in ("input", "param"))
    lower_s, fuse_s = [], []
    for _ in range(args.runs):
        t0 = time.perf_counter()
        lowered = lower(model.graph)
        t1 = time.perf_counter()
        plan = fuse(lowered)
        t2 = time.perf_counter()
        lower_s.append(t1 - t0)
        fuse_s.append(t2 - t1)
    both = [a + b for a, b in zip(lower_s, fuse_s, strict=True)]

    resnet = front_end(ROOT / "models" / "resnet50.cgraph", Options(), Sink()).model
    assert resnet is not None
    graph, rplan = lower_and_fuse(resnet)
    weights = random_weights(resnet.params, seed=0)
    image = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float16)
    run_s = []
    for _ in range(args.resnet_runs):
        t0 = time.perf_counter()
        interp.run(graph, {"image": image}, weights, resnet.env, virtual=rplan.virtual())
        run_s.append(time.perf_counter() - t0)

    print(f"generated model: {ops} ops -> {len(plan.groups)} fused groups "
          f"({len(plan.shared_signatures())} distinct)")
    print(f"lower             {_median_ms(lower_s)}")
    print(f"fuse              {_median_ms(fuse_s)}")
    print(f"lower + fuse      {_median_ms(both)}   target < 1 s")
    print(f"reference run, resnet50 fp16 batch 1 (incl. load-time folding) {_median_ms(run_s)}")
    print("reproduce: python scripts/bench_middle.py")
    return 0


if __name__ == "__main__":
    sys.exit(main())
