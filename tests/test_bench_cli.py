"""`dslc bench` without a GPU: the one sentence and exit code where there is none, its options
and sizes, the tables and JSON it renders from a report (values worked out by hand below), the
random inputs it feeds, and the generator of docs/benchmarks.md's tables."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dslc.bench.inputs import random_inputs, rel_error
from dslc.cli.bench import chosen_sizes
from dslc.cli.bench_report import render_markdown, render_table
from dslc.cli.paths import UsageError
from dslc.runtime.bundle import load, read
from dslc.runtime.schedule import Schedule
from tests.conftest import ROOT
from tests.helpers import run_cli

sys.path.insert(0, str(ROOT / "scripts"))
from bench_docs import replace_region


def step(name: str, ms: float, bound: float) -> dict[str, Any]:
    return {"step": name, "kind": "graph", "ms": ms, "flops": 10**9, "bytes": 2**20,
            "tflops": 1.0, "gbps": 2.0, "bound_ms": bound, "bound_by": "memory",
            "fraction": bound / ms, "lost_ms": ms - bound}


# dslc: plain 1.5 ms (4.0 step by step), graph 1.25 ms (1.3 with its inputs copied in);
# PyTorch: eager 7.5, graph 2.5, compiled 2.0 ms
REPORT: dict[str, Any] = {
    "model": "resnet50", "bundle": "b", "device": "NVIDIA H200", "repeats": 30,
    "versions": {"cudnn_backend": 91900, "torch": "2.11.0"}, "torch_compile": "default",
    "peaks": {}, "sizes": [{
        "dims": {"N": 32},
        "dslc": {"plain_ms": 1.5, "steps_ms": 4.0, "graph_ms": 1.25, "graph_call_ms": 1.3,
                 "first_call_s": 0.5, "graph_error": None,
                 "activation_bytes": 123 * 2**20},
        "torch": {"eager_ms": 7.5, "graph_ms": 2.5, "compile_ms": 2.0, "compile_s": 40.0,
                  "compile_mode": "default", "peak_bytes": 162 * 2**20, "graph_error": None,
                  "compile_error": None},
        "outputs": [{"name": "logits", "dtype": "f16", "rel_error_eager": 1.0e-3,
                     "rel_error_compile": 1.1e-3, "tolerance": 1.5e-2, "within": True}],
        "roofline": {"steps": [step("conv1+bn1+relu", 0.6, 0.1), step("fc", 0.05, 0.04)],
                     "totals": {"ms": 0.65, "bound_ms": 0.14, "flops": 2 * 10**9,
                                "bytes": 2**21, "fraction": 0.14 / 0.65}}}]}


def test_without_a_gpu_bench_says_so_in_one_sentence_with_exit_code_3(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("dslc.backend.target.live_device_available", lambda: False)
    r = run_cli("bench", "models/mlp.cgraph", "--against", "torch")
    assert r.code == 3 and r.stdout == ""
    assert r.stderr == "error[R0801]: `dslc bench` needs a GPU, and this machine has none\n"


@pytest.fixture(scope="module")
def mlp_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("mlp")
    assert run_cli("compile", "models/mlp.cgraph", "-o", str(out), "-q").code == 0
    assert run_cli("weights", "random", "models/mlp.cgraph", "-o",
                   str(out / "mnist_mlp.safetensors")).code == 0
    return out / "mnist_mlp.bundle"


def test_sizes_default_to_the_buckets_and_are_held_to_the_dims(mlp_bundle: Path) -> None:
    manifest = load(mlp_bundle).manifest  # dim N = 1..256, buckets 1, 16, 64, 256
    assert chosen_sizes([], manifest) == [{"N": 1}, {"N": 16}, {"N": 64}, {"N": 256}]
    assert chosen_sizes(["N=24", "N=256"], manifest) == [{"N": 24}, {"N": 256}]
    for spec, said in [("N=300", "ranges over 1..256"), ("B=2", "`B` is no dynamic dim"),
                       ("N=2,B=3", "`B` is no dynamic dim"), ("N", "write DIM=VALUE"),
                       ("N=-1", "write DIM=VALUE")]:
        with pytest.raises(UsageError, match=said):
            chosen_sizes([spec], manifest)


def test_a_bundle_is_benched_at_the_sizes_given_and_rendered_as_json(
        mlp_bundle: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}

    def fake_bench(model: Any, options: Any, reference: Any, progress: Any) -> dict[str, Any]:
        seen.update(model=model.bundle.model, sizes=options.sizes, repeats=options.repeats,
                    mode=options.torch_compile, reference=reference)
        return REPORT

    monkeypatch.setattr("dslc.cli.bench.require_device", lambda what: None)
    monkeypatch.setattr("dslc.cli.bench.bench", fake_bench)
    r = run_cli("bench", str(mlp_bundle), "--size", "N=24", "--repeats", "7", "--format",
                "json", "-q")
    assert r.code == 0, r.stderr
    assert json.loads(r.stdout) == REPORT
    assert seen == {"model": "mnist_mlp", "sizes": [{"N": 24}], "repeats": 7,
                    "mode": "default", "reference": None}
    bad = run_cli("bench", str(mlp_bundle), "--size", "N=999")
    assert bad.code == 2 and "ranges over 1..256" in bad.stderr


def test_the_table_compares_replays_and_flags_outputs_over_the_tolerance() -> None:
    text = render_table(REPORT)
    head, row = text.splitlines()[2:4]
    assert head.split()[:3] == ["size", "dslc", "ms"]
    # x eager 7.5 / 1.25 = 6.00; x graph 2.5 / 1.25 = 2.00; x compile 2.0 / 1.25 = 1.60
    assert row.split() == ["N=32", "1.500", "4.000", "1.250", "1.300", "7.500", "2.500", "2.000",
                           "6.00", "2.00", "1.60", "123", "162", "1.0e-03", "yes"]
    assert "bound 0.140 ms at the peaks (22%)" in text  # 0.14 / 0.65
    assert text.index("conv1+bn1+relu") < text.index("fc ")  # by time lost: 0.5 before 0.01
    worse = copy.deepcopy(REPORT)
    worse["sizes"][0]["outputs"][0].update(rel_error_eager=0.2, within=False)
    text = render_table(worse)
    assert text.splitlines()[3].split()[-1] == "NO"
    assert "note: N=32: output `logits` (f16) differs from PyTorch by 2.0e-01" in text


def test_docs_tables_replace_their_marked_region_only() -> None:
    body = render_markdown(REPORT)
    assert "| N=32 | 1.500 | 4.000 | 1.250 | 1.300 | 7.500 |" in body
    assert "| conv1+bn1+relu | graph | 0.6000 | 0.1000 | memory |" in body
    doc = "intro\n<!-- bench:r50 -->\nold\n<!-- /bench:r50 -->\ntail\n"
    assert replace_region(doc, "r50", "new") == "intro\n<!-- bench:r50 -->\nnew\n" \
                                                "<!-- /bench:r50 -->\ntail\n"
    with pytest.raises(ValueError, match="found 0"):
        replace_region(doc, "bert", "new")


def test_random_inputs_index_inside_their_tables_and_are_not_zeros(tmp_path: Path) -> None:
    (tmp_path / "g.cgraph").write_text(
        "cgraph 0.1\n\nmodel g {\n  precision io=f32\n  dim N = 1..64\n  input ids: i32[N]\n"
        "  input x: [N, 8]\n  input flag: i32[N, 1]\n  param table: [5, 8]\n"
        "  output y = gather(table, ids) + x * cast(flag, f32)\n}\n")
    assert run_cli("compile", str(tmp_path / "g.cgraph"), "-o", str(tmp_path), "-q").code == 0
    program = Schedule(read(tmp_path / "g.bundle"))
    inputs = random_inputs(program, {"N": 64}, seed=3)
    assert inputs["ids"].dtype == np.int32 and inputs["ids"].shape == (64,)
    assert inputs["ids"].min() >= 0 and inputs["ids"].max() <= 4  # the table has 5 rows
    assert len(set(inputs["ids"].tolist())) > 1
    assert set(inputs["flag"].ravel().tolist()) == {0, 1}  # indexes nothing: a mask's values
    assert inputs["x"].shape == (64, 8) and np.count_nonzero(inputs["x"]) == 64 * 8


def test_rel_error_is_relative_to_the_reference_and_infinite_for_a_wrong_shape() -> None:
    assert rel_error(np.array([1.0, 2.1]), np.array([1.0, 2.0])) == pytest.approx(0.05)
    assert rel_error(np.zeros(3), np.zeros(3)) == 0.0
    assert rel_error(np.zeros(3), np.zeros(4)) == float("inf")


def test_the_plot_is_a_png_where_matplotlib_is_installed(tmp_path: Path) -> None:
    from dslc.cli.bench_plot import plot, totals_of

    # the totals panel: every time of the size and the roofline's bound, nothing invented
    assert totals_of(REPORT["sizes"][0]) == {"dslc": 1.5, "dslc steps": 4.0, "dslc graph": 1.25,
                                             "torch": 7.5,
                                             "torch graph": 2.5, "torch.compile": 2.0,
                                             "roofline": 0.14}
    pytest.importorskip("matplotlib")
    assert plot(REPORT, tmp_path / "b.png")
    assert (tmp_path / "b.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_without_matplotlib_no_plot_is_written(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from dslc.cli.bench_plot import plot

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # an import of it fails
    assert not plot(REPORT, tmp_path / "b.png") and not (tmp_path / "b.png").exists()


def test_with_kernels_each_side_lists_its_kernels_longest_first_with_their_sum() -> None:
    """`dslc bench --kernels`: the kernels of one replay per side, as `torch_side.kernels`
    returns them (the longest first); a side without them (not run, or no `--kernels`) shows
    nothing."""
    report = copy.deepcopy(REPORT)
    row = report["sizes"][0]
    row["dslc"]["kernels"] = [{"name": "sm90_xmma_fprop_implicit_gemm", "us": 30.5, "launches": 3},
                              {"name": "dslc_copy_rows", "us": 2.25, "launches": 2}]
    row["torch"]["compile_kernels"] = [{"name": "triton_poi_fused_relu_0", "us": 4.0,
                                        "launches": 1}]
    text = render_table(report, top=1)
    dslc = text.index("kernels of one dslc graph replay at N=32: 0.0328 ms in 5 launches "
                      "(1 more kernels in --format json)")
    assert "sm90_xmma_fprop_implicit_gemm  30.50         3" in text[dslc:]
    assert "dslc_copy_rows" not in text  # past --top
    assert "kernels of one torch.compile replay at N=32: 0.0040 ms in 1 launches" in text
    assert "torch graph replay" not in text  # no kernels listed for that side
    assert "kernels of one" not in render_table(REPORT)
    row["torch"]["graph_kernels"], row["torch"]["graph_kernels_error"] = None, "RuntimeError: x"
    row["torch"]["compile_kernels"] = []
    text = render_table(report)
    assert "kernels of one torch graph replay at N=32: not listed (RuntimeError: x)" in text
    assert "kernels of one torch.compile replay at N=32: none recorded by CUPTI" in text


def test_kernels_without_pytorch_is_a_usage_error(mlp_bundle: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "torch" else real(name, *a))
    r = run_cli("bench", str(mlp_bundle), "--kernels", "-q")  # before the GPU is looked for
    assert r.code == 2 and "`--kernels` reads the GPU's kernels through PyTorch" in r.stderr
    monkeypatch.setattr(importlib.util, "find_spec", real)
    monkeypatch.setattr("dslc.cli.bench.require_device", lambda what: None)
    monkeypatch.setattr("dslc.cli.bench._torch_has_cuda", lambda: False)
    r = run_cli("bench", str(mlp_bundle), "--kernels", "-q")
    assert r.code == 2 and "this PyTorch has no CUDA" in r.stderr
