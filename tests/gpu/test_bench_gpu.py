"""`dslc bench` on the GPU: ResNet-50 at batch 32 and the BERT front (a transformer) against
PyTorch (eager, CUDA graph, torch.compile in its default mode) on random inputs and weights, with
every output within its dtype's tolerance of PyTorch's; a bundle on its own with CuPy inputs.
About 3 minutes on an H200, most of it torch.compile."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import run_cli

pytestmark = pytest.mark.gpu


def bench_json(*args: str) -> dict[str, Any]:
    r = run_cli("bench", *args, "--format", "json", "--repeats", "10", "--profile-repeats", "3",
                "-q")
    assert r.code == 0, r.stderr
    print(r.stderr)
    return dict(json.loads(r.stdout))


@pytest.mark.parametrize(("model", "size"), [("resnet50", "N=32"), ("bert", "B=8,S=128")])
def test_bench_against_torch_agrees_and_times_every_way(model: str, size: str,
                                                        tmp_path: Path) -> None:
    """The bundle compiled here (the heuristics' plans), its steps read back by `inspect`: the
    roofline profiles each of them once (what this GPU's engines split is its own count)."""
    assert run_cli("compile", f"models/{model}.cgraph", "--target", "device", "-o",
                   str(tmp_path), "--bucket", size, "-q").code == 0
    [bundle] = tmp_path.glob("*.bundle")
    shown = run_cli("inspect", str(bundle), "--format", "json")
    assert shown.code == 0, shown.stderr
    steps = [s["name"] for s in json.loads(shown.stdout)["steps"]]
    doc = bench_json(str(bundle), "--size", size, "--against", "torch", "--kernels",
                     "--plot", str(tmp_path / "bench.png"))
    [row] = doc["sizes"]
    print(json.dumps({k: row[k] for k in ("dims", "dslc", "torch", "outputs")}, indent=1))
    for out in row["outputs"]:
        assert out["within"], out  # dslc against PyTorch eager and torch.compile
    d, t = row["dslc"], row["torch"]
    assert d["plain_ms"] > 0 and d["activation_bytes"] > 0
    print(f"dslc plain {d['plain_ms']:.4f} ms, step by step {d['steps_ms']:.4f} ms, "
          f"graph {d['graph_ms']} ms")
    if d["graph_ms"]:  # a plain call replays the graph: its inputs and outputs copied besides
        assert d["plain_ms"] <= 1.2 * d["graph_ms"] + 0.03
    # ResNet-50 runs on cuDNN graphs and CuPy kernels that capture; BERT's gathers run on the
    # ops' references over CuPy, which may refuse capture (R0803, reported, not a failure)
    assert (d["graph_ms"] or 0) > 0 or (model == "bert" and d["graph_error"]), d["graph_error"]
    assert t["eager_ms"] > 0 and (t["graph_ms"] or 0) > 0, t["graph_error"]
    assert t["compile_ms"] is not None and t["compile_ms"] > 0, t["compile_error"]
    roof = row["roofline"]
    assert sorted(s["step"] for s in roof["steps"]) == sorted(steps)
    assert roof["totals"]["bound_ms"] > 0
    lost = [s["lost_ms"] for s in roof["steps"]]
    assert lost == sorted(lost, reverse=True)
    # Tensor cores cannot beat their peak (memory can look faster: repeated runs hit the L2)
    for s in roof["steps"]:
        if s["bound_by"] == "compute":
            assert s["fraction"] <= 1.05, s
    # Each step is timed inside a CUDA graph (its launch not counted), so the steps add up to
    # about the model's graph; timed one launch at a time they added up to 1.9x it.
    if d["graph_ms"]:
        assert 0.6 * d["graph_ms"] <= roof["totals"]["ms"] <= 1.4 * d["graph_ms"] + 0.01, \
            (roof["totals"]["ms"], d["graph_ms"])
    # --kernels: each side's kernels of one replay, the longest first, about its replay's time
    for listed, ms in ((d.get("kernels"), d["graph_ms"]), (t.get("compile_kernels"),
                                                            t["compile_ms"])):
        if ms:
            assert listed and [k["us"] for k in listed] == sorted((k["us"] for k in listed),
                                                                   reverse=True)
            assert 0.3 * ms <= sum(k["us"] for k in listed) / 1e3 <= 3 * ms, (listed[:3], ms)
    if model == "resnet50":  # 4.1 GMACs an image (its paper's count) x 32 images x 2
        assert roof["totals"]["flops"] == pytest.approx(32 * 2 * 4.1e9, rel=0.05)


def test_bench_of_a_bundle_alone_with_cupy_inputs(tmp_path: Path) -> None:
    assert run_cli("compile", "models/mlp.cgraph", "--target", "device", "-o", str(tmp_path),
                   "--bucket", "N=16", "-q").code == 0
    assert run_cli("weights", "random", "models/mlp.cgraph", "-o",
                   str(tmp_path / "mnist_mlp.safetensors")).code == 0
    doc = bench_json(str(tmp_path / "mnist_mlp.bundle"), "--size", "N=16", "--size", "N=24")
    assert [r["dims"] for r in doc["sizes"]] == [{"N": 16}, {"N": 24}]
    for row in doc["sizes"]:
        assert row["torch"] is None and row["dslc"]["graph_ms"] > 0
        assert [s["kind"] for s in row["roofline"]["steps"]] == ["graph"] * 3
    table = run_cli("bench", str(tmp_path / "mnist_mlp.bundle"), "--size", "N=16", "-q")
    assert table.code == 0 and "roofline at N=16: 3 steps" in table.stdout
