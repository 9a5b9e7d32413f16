"""GPU benchmark (not a test): ResNet-50 fp16 NHWC through `dslc bench --against torch`: dslc's
runner with and without a CUDA graph against PyTorch eager and with CUDA graphs (the model's
PyTorch translation, channels_last, cudnn.benchmark=True, the same weights) in one process, at
batch 1, 32 and 256, with the per-step roofline. `--out` gets the report's rows under the keys
earlier versions of this script wrote (scripts/bench_tune.py reads them) and the whole report.

Run on a GPU machine: python scripts/bench_gpu.py [--bundle B] [--batches 1,32] [--out r.json]
(the same as `dslc bench models/resnet50.cgraph --size N=1 --size N=32 --against torch`).
"""

from __future__ import annotations

import argparse
import io
import json
import sys
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def timed(fn: Any, iters: int, warmup: int = 5) -> float:
    """Median milliseconds of `fn()` over `iters` runs, timed with CUDA events on the default
    stream, torch's and CuPy's alike (scripts/bench_tune.py's encoder layer)."""
    from dslc.backend.timing import median_ms

    return median_ms(fn, iters, warmup)


def torch_cuda_graph(net: Any, x: Any) -> Any:
    """`net(x)` recorded as a CUDA graph; the call copies its argument in and replays."""
    import torch

    from dslc.backend.torch_side import cuda_graph

    static_x = x.clone()

    def call() -> Any:
        with torch.no_grad():
            return net(static_x)

    replay = cuda_graph(call)

    def run(x: Any = x) -> None:
        static_x.copy_(x)
        replay()

    return run


def old_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for r in report["sizes"]:
        d, t = r["dslc"], r["torch"]
        rows.append({"batch": r["dims"]["N"], "dslc_ms": d["plain_ms"],
                     "dslc_graph_ms": d["graph_ms"], "torch_ms": t["eager_ms"],
                     "torch_graph_ms": t["graph_ms"], "dslc_first_call_s": d["first_call_s"],
                     "rel_error_vs_torch": max(o["rel_error_eager"] for o in r["outputs"]),
                     "dslc_bytes": d["activation_bytes"], "torch_peak_bytes": t["peak_bytes"]})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--bundle", type=Path, help="a compiled resnet50 bundle (else compile now)")
    ap.add_argument("--batches", default="1,32,256")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--torch-compile", default="none", choices=("none", "default", "max-autotune"))
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()

    from dslc.cli import main as dslc
    from dslc.cli.bench_report import render_table

    target = args.bundle or ROOT / "models" / "resnet50.cgraph"
    sizes = [a for b in args.batches.split(",") for a in ("--size", f"N={int(b)}")]
    text = io.StringIO()
    with redirect_stdout(text):
        code = dslc(["bench", str(target), *sizes, "--against", "torch", "--torch-compile",
                     args.torch_compile, "--repeats", str(args.iters), "--format", "json"])
    if code:
        return code
    report = json.loads(text.getvalue())
    if args.out:
        args.out.write_text(json.dumps({"rows": old_rows(report), "bench": report}, indent=2))
    print(render_table(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
