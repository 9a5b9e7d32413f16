"""The model families against PyTorch on this GPU (a GPU script, not a test): for each family
model at a deployment-like size (one of its buckets), compiled and tuned at that bucket as a user
would (`dslc compile --target device --bucket SIZE`), then `dslc bench BUNDLE --against torch`
(dslc's plain call and CUDA-graph replay; PyTorch eager, CUDA graph and torch.compile of the same
checked model with the same weights), its JSON report kept under --out, and one Markdown table
of them all printed last.

    python scripts/bench_families.py --out DIR [--only convnext --only bert] [--seconds 120]
                                     [--untuned] [--fusion keep]

Each model's compile and bench run in processes of their own, bounded together by --seconds
(tuning and torch.compile take most of it); one that fails or runs out of time is a row saying
so, and the others still run. --untuned benches the heuristics' plans (`dslc bench FILE`).
Tuned, the fusion choices are measured too (`dslc tune BUNDLE --fusion measure`: splits, and
kernel steps such as matmuls on cuBLASLt) unless `--fusion keep`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

# model -> the size it is measured at (its usual deployment shape, or its file's first bucket)
FAMILIES = {
    "convnext": "N=32,H=56,W=56",
    "mobilenet_v3": "N=32,H=14,W=14",
    "vit_front": "N=8",
    "bert": "B=8,S=128",
    "sd_down_block": "B=2,H=32,W=32",
    "yolo_sppf": "N=16,H=20,W=20",
    "llama_layer": "B=1,S=1024",
    "whisper_encoder": "B=8",
}
HEAD = ("| model | size | dslc ms | dslc graph ms | torch eager ms | torch graph ms | "
        "torch.compile ms | x graph | x compile | rel err | within |")


def row(name: str, size: str, report: dict[str, Any]) -> str:
    r = report["sizes"][0]
    d, t = r["dslc"], r["torch"] or {}
    outs = r["outputs"] or []
    worst = max((o["rel_error_eager"] for o in outs), default=None)
    ours = d["graph_ms"] if d["graph_ms"] is not None else d["plain_ms"]

    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v:.4f}"

    def ratio(theirs: float | None) -> str:
        return "-" if theirs is None or not ours else f"{theirs / ours:.2f}"

    return (f"| {name} | {size} | {ms(d['plain_ms'])} | {ms(d['graph_ms'])} | "
            f"{ms(t.get('eager_ms'))} | {ms(t.get('graph_ms'))} | {ms(t.get('compile_ms'))} | "
            f"{ratio(t.get('graph_ms'))} | {ratio(t.get('compile_ms'))} | "
            f"{'-' if worst is None else f'{worst:.1e}'} | "
            f"{'yes' if outs and all(o['within'] for o in outs) else 'NO'} |")


def _dslc(arguments: list[str], seconds: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dslc", *arguments], capture_output=True,
                          text=True, timeout=max(seconds, 1.0), check=False, cwd=ROOT)


def _failed(name: str, size: str, what: str, run: subprocess.CompletedProcess[str]) -> str:
    last = (run.stderr.strip().splitlines() or ["no message"])[-1][:120]
    return f"| {name} | {size} | {what} failed (exit {run.returncode}): {last} |" + " |" * 8


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--only", action="append", choices=sorted(FAMILIES))
    ap.add_argument("--seconds", type=float, default=120.0, help="per model")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--profile-repeats", type=int, default=10)
    ap.add_argument("--untuned", action="store_true", help="bench the heuristics' plans")
    ap.add_argument("--fusion", choices=("keep", "measure"), default="measure",
                    help="after compiling, `dslc tune --fusion measure` (default) or not")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in args.only or FAMILIES:
        size = FAMILIES[name]
        report = args.out / f"{name}.json"
        source = ROOT / "models" / f"{name}.cgraph"
        start = time.monotonic()
        try:
            with tempfile.TemporaryDirectory() as tmp:
                target = source
                if not args.untuned:
                    built = _dslc(["compile", str(source), "--target", "device", "--bucket", size,
                                   "-o", tmp, "-q"], args.seconds)
                    if built.returncode != 0:
                        rows.append(_failed(name, size, "compile", built))
                        continue
                    [target] = Path(tmp).glob("*.bundle")
                    if args.fusion == "measure":
                        tuned = _dslc(["tune", str(target), "--fusion", "measure", "-q"],
                                      args.seconds - (time.monotonic() - start))
                        if tuned.returncode != 0:
                            rows.append(_failed(name, size, "tune --fusion measure", tuned))
                            continue
                    made = _dslc(["weights", "random", str(source), "-o",
                                  str(target.with_suffix(".safetensors"))], args.seconds)
                    if made.returncode != 0:
                        rows.append(_failed(name, size, "weights", made))
                        continue
                left = args.seconds - (time.monotonic() - start)
                run = _dslc(["bench", str(target), "--size", size, "--against", "torch",
                             "--repeats", str(args.repeats), "--profile-repeats",
                             str(args.profile_repeats), "--format", "json", "-q"], left)
        except subprocess.TimeoutExpired:
            rows.append(f"| {name} | {size} | past {args.seconds:.0f} s |" + " |" * 8)
            continue
        if run.returncode != 0:
            rows.append(_failed(name, size, "bench", run))
            continue
        report.write_text(run.stdout)
        rows.append(row(name, size, json.loads(run.stdout)))
        print(rows[-1], flush=True)
    print("\n" + HEAD + "\n|" + "---|" * 11)
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
