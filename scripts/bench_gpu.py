"""GPU benchmark (not a test): ResNet-50 fp16 NHWC through dslc's runner, with and without a CUDA
graph, against PyTorch eager (channels_last, cudnn.benchmark=True) and PyTorch with CUDA graphs,
in the same process, at batch 1, 32 and 256. Medians of CUDA-event timings; peak memory of both.

Run on a GPU machine: python scripts/bench_gpu.py [--bundle DIR] [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def timed(fn: Any, iters: int, warmup: int = 5) -> float:
    """Median milliseconds of `fn()` over `iters` runs, timed with CUDA events."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end))
    return statistics.median(samples)


def torch_cuda_graph(net: Any, x: Any) -> Any:
    """`net(x)` recorded as a CUDA graph (after warm-up on a side stream); returns a function
    that copies its argument into the static input and replays."""
    import torch

    static_x = x.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.no_grad():
        for _ in range(3):
            net(static_x)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.no_grad():
        net(static_x)

    def replay(x: Any = x) -> None:
        static_x.copy_(x)
        graph.replay()

    return replay


def compile_resnet50(outdir: Path, batches: list[int]) -> tuple[Path, float]:
    from tests.gpu.common import compile_file

    start = time.perf_counter()
    bundle = compile_file(ROOT / "models" / "resnet50.cgraph", outdir, None)
    return bundle, time.perf_counter() - start


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--bundle", type=Path, help="a compiled resnet50 bundle (else compile now)")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/dslc-bench"))
    ap.add_argument("--batches", default="1,32,256")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()

    import torch
    import torchvision
    from safetensors.numpy import load_file

    from dslc.runtime import Model

    batches = [int(b) for b in args.batches.split(",")]
    build_s = None
    bundle = args.bundle
    if bundle is None:
        bundle, build_s = compile_resnet50(args.workdir, batches)
        print(f"compiled resnet50 (buckets 1, 32, 256) in {build_s:.1f} s")
    weights = bundle.with_suffix(".safetensors")

    torch.backends.cudnn.benchmark = True
    net = torchvision.models.resnet50()
    state = {k: torch.from_numpy(v.astype(np.float32)) for k, v in load_file(str(weights)).items()}
    net.load_state_dict(state, strict=False)
    net = net.eval().cuda().half().to(memory_format=torch.channels_last)

    t0 = time.perf_counter()
    model = Model(bundle, weights)
    load_s = time.perf_counter() - t0
    rows = []
    for batch in batches:
        x = torch.randn(batch, 3, 224, 224, device="cuda").half().to(
            memory_format=torch.channels_last)
        t0 = time.perf_counter()
        ours = model.run({"image": x})["logits"]
        torch.cuda.synchronize()
        first_s = time.perf_counter() - t0
        with torch.no_grad():
            theirs = net(x)
        err = float((ours.float() - theirs.float()).abs().max() / theirs.float().abs().max())

        ms_ours = timed(lambda x=x: model.run({"image": x}), args.iters)
        captured = model.capture({"image": x})
        ms_ours_graph = timed(lambda x=x, c=captured: c({"image": x}), args.iters)

        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        with torch.no_grad():
            ms_torch = timed(lambda x=x: net(x), args.iters)
        torch_peak = torch.cuda.max_memory_allocated() - base
        ms_torch_graph = timed(torch_cuda_graph(net, x), args.iters)
        exe = model.executable({"N": batch})
        # Activation memory of both (weights excluded: torch's were allocated before the reset).
        ours_bytes = exe.memory.arena + int(exe.workspace.nbytes) + batch * 1000 * 4
        rows.append({"batch": batch, "dslc_ms": ms_ours, "dslc_graph_ms": ms_ours_graph,
                     "torch_ms": ms_torch, "torch_graph_ms": ms_torch_graph,
                     "dslc_first_call_s": first_s, "rel_error_vs_torch": err,
                     "dslc_bytes": ours_bytes, "torch_peak_bytes": int(torch_peak)})
    weights_bytes = sum(int(w.nbytes) for w in (model._weights or {}).values())
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "dslc_weights_bytes": weights_bytes,
              "build_s": build_s, "load_s": load_s, "startup": model.startup[:3],
              "rows": rows}
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))
    print(f"\nresnet50 fp16 NHWC on {result['device']} (torch {torch.__version__}); median of "
          f"{args.iters} runs, CUDA events; bundle load {load_s:.3f} s")
    print(f"{'batch':>5} {'dslc ms':>9} {'dslc+graph':>10} {'torch ms':>9} {'torch+graph':>11} "
          f"{'x eager':>8} {'x graph':>8} {'img/s dslc':>11} {'img/s torch':>11} {'MiB dslc':>9} "
          f"{'MiB torch':>9} {'rel err':>8}")
    for r in rows:
        best = min(r["dslc_ms"], r["dslc_graph_ms"])
        print(f"{r['batch']:>5} {r['dslc_ms']:>9.3f} {r['dslc_graph_ms']:>10.3f} "
              f"{r['torch_ms']:>9.3f} {r['torch_graph_ms']:>11.3f} "
              f"{r['torch_ms'] / best:>8.2f} {r['torch_graph_ms'] / r['dslc_graph_ms']:>8.2f} "
              f"{r['batch'] / best * 1000:>11.0f} {r['batch'] / r['torch_ms'] * 1000:>11.0f} "
              f"{r['dslc_bytes'] / 2**20:>9.0f} {r['torch_peak_bytes'] / 2**20:>9.0f} "
              f"{r['rel_error_vs_torch']:>8.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
