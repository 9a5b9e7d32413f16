"""The model families against PyTorch on this GPU (a GPU script, not a test): for each family
model at a deployment-like size, `dslc bench --against torch` (dslc's plain call and CUDA-graph
replay; PyTorch eager, CUDA graph and torch.compile of the same checked model with the same
weights), its JSON report kept under --out, and one Markdown table of them all printed last.

    python scripts/bench_families.py --out DIR [--only convnext --only bert] [--seconds 120]

Each model runs in its own `dslc bench` process, bounded by --seconds (torch.compile takes most
of it); one that fails or runs out of time is a row saying so, and the others still run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
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
    "yolo_sppf": "N=8,H=20,W=20",
    "llama_layer": "B=1,S=1024",
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--only", action="append", choices=sorted(FAMILIES))
    ap.add_argument("--seconds", type=float, default=120.0, help="per model")
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in args.only or FAMILIES:
        size = FAMILIES[name]
        report = args.out / f"{name}.json"
        command = [sys.executable, "-m", "dslc", "bench", str(ROOT / "models" / f"{name}.cgraph"),
                   "--size", size, "--against", "torch", "--repeats", str(args.repeats),
                   "--profile-repeats", "2", "--format", "json", "-q"]
        try:
            run = subprocess.run(command, capture_output=True, text=True, timeout=args.seconds,
                                 check=False, cwd=ROOT)
        except subprocess.TimeoutExpired:
            rows.append(f"| {name} | {size} | past {args.seconds:.0f} s |" + " |" * 8)
            continue
        if run.returncode != 0:
            last = (run.stderr.strip().splitlines() or ["no message"])[-1][:120]
            rows.append(f"| {name} | {size} | failed (exit {run.returncode}): {last} |" + " |" * 8)
            continue
        report.write_text(run.stdout)
        rows.append(row(name, size, json.loads(run.stdout)))
        print(rows[-1], flush=True)
    print("\n" + HEAD + "\n|" + "---|" * 11)
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
