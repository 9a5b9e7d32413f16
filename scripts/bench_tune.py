"""GPU benchmark of tuning and start-up (not a test), one run, results under --out:

1. resnet50 (buckets 1, 32, 256) and encoder compiled with the heuristics' plans, then tuned with
   a fresh tuning database: per-group table (heuristics vs tuned) and geomean speedup;
2. resnet18 tuned next with the same database: how many graphs it reuses;
3. cold start: a fresh process imports CuPy and dslc, loads the tuned resnet50 bundle with
   prepared weights and runs batch 1 (three times; then once on the raw weights), against
   tuning from scratch;
4. resnet50 fp16 through scripts/bench_gpu.py on the tuned bundle (batch 1, 32, 48 (no bucket:
   built on first use), 256) against PyTorch eager and CUDA graphs;
5. one pre-LN encoder layer (d=1024, 16 heads, MLP 4096, seq 512, batch 8: the encoder model's
   layer at those sizes), tuned, against PyTorch bf16 eager and CUDA graphs.

Run on a GPU machine: python scripts/bench_tune.py --out DIR
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from bench_gpu import timed, torch_cuda_graph  # noqa: E402

RESULTS: dict[str, Any] = {}


def section(name: str, fn: Any, *args: Any) -> Any:
    """Run one part; a failure is logged and the others still run."""
    print(f"\n== {name}", flush=True)
    start = time.perf_counter()
    try:
        return fn(*args)
    except Exception:
        traceback.print_exc()
        RESULTS.setdefault("failed", []).append(name)
        return None
    finally:
        print(f"== {name}: {time.perf_counter() - start:.1f} s", flush=True)


def compile_and_tune(source: Path, outdir: Path, bucket: dict[str, int] | None, db: Any,
                     budget_s: float, model_budget_s: float) -> dict[str, Any]:
    """Compile (every bucket, or just `bucket`) with the heuristics' plans, kept under
    `untuned/`, then tune a copy into `tuned/`."""
    from dslc.emit import bundle as emit_bundle
    from dslc.runtime.bundle import load
    from dslc.tune import format_report, tune, tuned_bundle
    from tests.gpu.common import compile_file

    start = time.perf_counter()
    untuned = compile_file(source, outdir / "untuned", bucket)
    compile_s = time.perf_counter() - start
    tuned = outdir / "tuned" / untuned.name
    tuned.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(untuned.with_suffix(".safetensors"), tuned.with_suffix(".safetensors"))
    records = load(untuned)
    done = tune(records, db, budget_s=budget_s, model_budget_s=model_budget_s)
    report = done.report
    emit_bundle.write(tuned, tuned_bundle(records, done))
    table = format_report(report)
    print(table)
    (outdir / "tune_report.txt").write_text(table + "\n")
    sources: dict[str, int] = {}
    for r in report.rows:
        sources[r.source] = sources.get(r.source, 0) + 1
    slower = [r.group for r in report.rows if r.heuristic_ms and r.tuned_ms
              and r.tuned_ms > r.heuristic_ms * 1.03]
    return {"untuned": untuned, "tuned": tuned, "compile_s": compile_s, "tune_s": report.seconds,
            "graphs": len(report.rows), "sources": sources, "slower_than_heuristics": slower,
            "geomean_speedup": report.geomean_speedup()}


COLD = """
import json, sys, time
marks = [('start', time.perf_counter())]
def mark(name):
    marks.append((name, time.perf_counter()))
import cupy
mark('import cupy')
from dslc.runtime import Model
mark('import dslc.runtime')
model = Model(sys.argv[1], sys.argv[2])
mark('read bundle + weights')
model.handle
mark('CUDA context + cuDNN handle')
model.decision()
mark('environment check')
model._device_weights()
mark('upload weights, load-time values')
model.executable({'N': 1})
mark('restore plans, arena')
x = cupy.random.default_rng(0).standard_normal((1, 224, 224, 3), dtype=cupy.float32)
x = x.astype(cupy.float16).transpose(0, 3, 1, 2)  # NCHW logical, NHWC in memory
out = model.run({'image': x})['logits']
cupy.cuda.get_current_stream().synchronize()
mark('first run')
phases = {b[0]: round(b[1] - a[1], 4) for a, b in zip(marks, marks[1:])}
print(json.dumps({'total_s': marks[-1][1] - marks[0][1], 'phases': phases,
                  'how': sorted({s['how'] for s in model.startup}),
                  'finite': bool(cupy.isfinite(out).all())}))
"""


def cold_start(bundle: Path, tune_s: float, out: Path) -> dict[str, Any]:
    """Three fresh processes on weights prepared for the bundle (`dslc weights prepare`: what a
    deployment ships), then one on the raw weights (load-time values computed at start-up)."""
    raw = bundle.with_suffix(".safetensors")
    prepared = bundle.with_suffix(".prepared.safetensors")
    subprocess.run([sys.executable, "-m", "dslc", "weights", "prepare", str(bundle), str(raw),
                    "-o", str(prepared)], check=True)
    script = out / "cold.py"
    script.write_text(COLD)
    runs = []
    for weights in (prepared, prepared, prepared, raw):
        proc = subprocess.run([sys.executable, str(script), str(bundle), str(weights)],
                              capture_output=True, text=True, check=True)
        runs.append({"weights": weights.name, **json.loads(proc.stdout.strip().splitlines()[-1])})
        print(runs[-1])
    best = min(r["total_s"] for r in runs[:3])
    return {"runs": runs, "tune_s": tune_s, "ratio": tune_s / best, "best_s": best,
            "raw_s": runs[-1]["total_s"]}


def bench_resnet50(bundle: Path, out: Path) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_gpu.py"), "--bundle",
                           str(bundle), "--batches", "1,32,48,256", "--out", str(out / "bench.json")],
                          capture_output=True, text=True, check=False)
    (out / "bench_resnet50.log").write_text(proc.stdout + proc.stderr)
    print(proc.stdout[-3000:], proc.stderr[-3000:])
    return json.loads((out / "bench.json").read_text())


def profile(bundle: Path, batch: int, out: Path) -> list[dict[str, Any]]:
    """Milliseconds per step at `batch`, slowest first (where the time goes)."""
    import cupy

    from dslc.runtime import Model

    model = Model(bundle, bundle.with_suffix(".safetensors"))
    x = cupy.random.default_rng(0).standard_normal((batch, 224, 224, 3), dtype=cupy.float32)
    rows = model.profile({"image": x.astype(cupy.float16).transpose(0, 3, 1, 2)}, repeats=10)
    total = sum(r["ms"] for r in rows)
    by_kind: dict[str, float] = {}
    for r in rows:
        by_kind[r["kind"]] = by_kind.get(r["kind"], 0.0) + r["ms"]
    lines = [f"resnet50 batch {batch}: {len(rows)} steps, {total:.3f} ms in all; by kind: "
             + ", ".join(f"{k} {v:.3f} ms" for k, v in by_kind.items())]
    for r in sorted(rows, key=lambda r: -r["ms"])[:25]:
        lines.append(f"{r['ms']:8.3f} ms {100 * r['ms'] / total:5.1f}%  {r['kind']:<9} "
                     f"{r['pattern'] or '-':<22} {r['step']}")
    text = "\n".join(lines)
    print(text)
    (out / f"profile_resnet50_b{batch}.txt").write_text(text + "\n")
    return rows


def layer_source() -> str:
    """models/encoder.cgraph with one layer at d=1024, 16 heads, batch 8, seq 512."""
    text = (ROOT / "models" / "encoder.cgraph").read_text()
    for pattern, repl in ((r"dim B = .*", "dim B = 8"), (r"dim S = .*", "dim S = 512"),
                          (r"dim D = \d+", "dim D = 1024"), (r"dim HEADS = \d+", "dim HEADS = 16"),
                          (r"dim LAYERS = \d+", "dim LAYERS = 1")):
        text, n = re.subn(pattern, repl, text)
        assert n == 1, pattern
    return text


def bench_layer(out: Path, db: Any, budget_s: float, iters: int) -> dict[str, Any]:
    import torch
    from safetensors.numpy import load_file

    from dslc.runtime import Model
    from tests.torch_models import Encoder

    src = out / "layer" / "encoder_layer.cgraph"
    src.parent.mkdir(parents=True, exist_ok=True)
    src.write_text(layer_source())
    done = compile_and_tune(src, out / "layer", None, db, budget_s, 120.0)
    rows: dict[str, Any] = {}
    torch.manual_seed(0)
    x = torch.randn(8, 512, 1024, device="cuda").to(torch.bfloat16)
    net = Encoder(d=1024, heads=16, layers=1)
    state = {k: torch.from_numpy(v.astype("float32")) for k, v in
             load_file(str(done["tuned"].with_suffix(".safetensors"))).items()}
    net.load_state_dict(state)
    net = net.eval().cuda().to(torch.bfloat16)
    with torch.no_grad():
        want = net(x).float()
        rows["torch_ms"] = timed(lambda: net(x), iters)
        rows["torch_graph_ms"] = timed(torch_cuda_graph(net, x), iters)
    for kind in ("untuned", "tuned"):
        model = Model(done[kind], done[kind].with_suffix(".safetensors"))
        got = model.run({"tokens": x})["hidden"].float()
        rows[f"{kind}_rel_error"] = float((got - want).abs().max() / want.abs().max())
        rows[f"{kind}_ms"] = timed(lambda m=model: m.run({"tokens": x}), iters)
        captured = model.capture({"tokens": x})
        rows[f"{kind}_graph_ms"] = timed(lambda c=captured: c({"tokens": x}), iters)
        if kind == "tuned":
            steps = model.profile({"tokens": x}, repeats=10)
            rows["profile"] = [(r["step"], r["kind"], r["pattern"], round(r["ms"], 4)) for r in steps]
            for r in steps:
                print(f"  {r['ms']:8.4f} ms  {r['kind']:<6} {r['pattern'] or '-':<20} {r['step']}")
    rows["tune"] = {k: v for k, v in done.items() if k not in ("untuned", "tuned")}
    print(rows)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, default=Path("gpu-out"))
    ap.add_argument("--budget", type=float, default=3.0, help="seconds of tuning per graph")
    ap.add_argument("--model-budget", type=float, default=120.0)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--skip", default="", help="comma-separated parts to skip: "
                    "resnet50,encoder,resnet18,cold,profile,bench,layer")
    args = ap.parse_args()
    skip = set(args.skip.split(","))
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path("/tmp/dslc-tune")
    shutil.rmtree(work, ignore_errors=True)
    from dslc.runtime.tuningdb.sqlite import SQLiteStore

    db = SQLiteStore(work / "tuning.db")
    models = ROOT / "models"
    r50 = None
    if "resnet50" not in skip:
        r50 = section("tune resnet50", compile_and_tune, models / "resnet50.cgraph",
                      work / "resnet50", None, db, args.budget, args.model_budget)
        RESULTS["resnet50"] = r50
    if "encoder" not in skip:
        RESULTS["encoder"] = section("tune encoder (B=8, S=200)", compile_and_tune,
                                     models / "encoder.cgraph", work / "encoder",
                                     {"B": 8, "S": 200}, db, args.budget, args.model_budget / 2)
    if "resnet18" not in skip:
        RESULTS["resnet18"] = section("resnet18 after resnet50, same database", compile_and_tune,
                                      models / "resnet18.cgraph", work / "resnet18", None, db,
                                      args.budget, args.model_budget)
    if r50 and "cold" not in skip:
        RESULTS["cold_start"] = section("cold start", cold_start, r50["tuned"], r50["tune_s"],
                                        args.out)
    if r50 and "profile" not in skip:
        section("resnet50 profile at batch 256", profile, r50["tuned"], 256, args.out)
    if r50 and "bench" not in skip:
        RESULTS["bench"] = section("resnet50 benchmark (tuned)", bench_resnet50, r50["tuned"],
                                   args.out)
    if "layer" not in skip:
        RESULTS["layer"] = section("encoder layer benchmark", bench_layer, args.out, db,
                                   args.budget, args.iters)
    for name in ("resnet50", "encoder", "resnet18"):
        if RESULTS.get(name):
            report = work / name / "tune_report.txt"
            if report.exists():
                shutil.copy(report, args.out / f"tune_{name}.txt")
    (args.out / "bench_tune.json").write_text(json.dumps(RESULTS, indent=2, default=str))
    summary(RESULTS)
    return 1 if RESULTS.get("failed") else 0


def summary(r: dict[str, Any]) -> None:
    print("\n== summary")
    for name in ("resnet50", "encoder", "resnet18"):
        t = r.get(name)
        if t:
            print(f"{name:<9} graphs {t['graphs']:>3} {t['sources']}  geomean x{t['geomean_speedup']:.3f}"
                  f"  compile {t['compile_s']:.1f} s  tune {t['tune_s']:.1f} s  slower: "
                  f"{t['slower_than_heuristics'] or 'none'}")
    c = r.get("cold_start")
    if c:
        print(f"cold start (prepared weights) {[round(x['total_s'], 3) for x in c['runs'][:3]]} s, "
              f"raw weights {c['raw_s']:.3f} s ({c['runs'][0]['how']}); tuning {c['tune_s']:.1f} s; "
              f"ratio {c['ratio']:.0f}x; phases: {c['runs'][0]['phases']}")
    b = r.get("bench")
    if b:
        for row in b["rows"]:
            best = min(row["dslc_ms"], row["dslc_graph_ms"])
            print(f"resnet50 b{row['batch']:<4} dslc {row['dslc_ms']:.3f} graph {row['dslc_graph_ms']:.3f}"
                  f" | torch {row['torch_ms']:.3f} graph {row['torch_graph_ms']:.3f} | x eager "
                  f"{row['torch_ms'] / best:.2f} x graph {row['torch_graph_ms'] / row['dslc_graph_ms']:.2f}"
                  f" | first call {row['dslc_first_call_s']:.3f} s err {row['rel_error_vs_torch']:.1e}")
    la = r.get("layer")
    if la:
        print(f"layer: torch {la['torch_ms']:.3f} graph {la['torch_graph_ms']:.3f} | untuned "
              f"{la['untuned_ms']:.3f}/{la['untuned_graph_ms']:.3f} tuned {la['tuned_ms']:.3f}/"
              f"{la['tuned_graph_ms']:.3f} ms | err {la['tuned_rel_error']:.1e}")
    print(f"failed: {r.get('failed', 'none')}")


if __name__ == "__main__":
    sys.exit(main())
