"""The command line as users expect it: `--version`, `--debug` after the command, help on every
option, the README's synopsis true to the parser, `--format json` documents, the standard
library in `dslc ops`, one exit code for "no GPU", aligned tables, progress only on a
terminal."""

from __future__ import annotations

import argparse
import io
import json
import re
from pathlib import Path
from typing import Any

import pytest

from dslc import __version__
from dslc.backend.target import live_device_available
from dslc.cli import build_parser
from dslc.cli.progress import Progress
from dslc.ops import OPS
from tests.conftest import ROOT
from tests.helpers import run_cli

NO_PARAMS = "model noparams {\n  input x: [4, 8]\n  output y = relu(x) * 2.0\n}\n"


def _parsers(parser: argparse.ArgumentParser, path: str = "dslc") -> list[tuple[str, Any]]:
    """Every (sub)command's parser, by its command line."""
    out = [(path, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out += _parsers(sub, f"{path} {name}")
    return out


def _commands(parser: argparse.ArgumentParser) -> list[str]:
    return [path for path, p in _parsers(parser)
            if not any(isinstance(a, argparse._SubParsersAction) for a in p._actions)]


def _option(parser: argparse.ArgumentParser, flag: str) -> argparse.Action | None:
    return next((a for a in parser._actions if flag in a.option_strings), None)


def _json(*args: str) -> Any:
    r = run_cli(*args)
    assert r.code == 0, r.stderr
    return json.loads(r.stdout)  # the whole of stdout is one document


@pytest.fixture(scope="module")
def mlp_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("mlp")
    assert run_cli("compile", "models/mlp.cgraph", "-o", str(out), "-q").code == 0
    return out / "mnist_mlp.bundle"


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        build_parser().parse_args(["--version"])
    assert stop.value.code == 0
    assert capsys.readouterr().out == f"dslc {__version__}\n"


def test_every_option_and_argument_has_help() -> None:
    missing = [f"{path}: {a.option_strings or a.dest}" for path, p in _parsers(build_parser())
               for a in p._actions
               if not isinstance(a, argparse._SubParsersAction) and not a.help]
    assert missing == []


def test_every_command_takes_debug_after_its_name() -> None:
    parser = build_parser()
    for path, p in _parsers(parser)[1:]:
        assert _option(p, "--debug") is not None, path
    args = parser.parse_args(["check", "--debug", "models/mlp.cgraph"])
    assert args.debug is True
    assert parser.parse_args(["--debug", "check", "models/mlp.cgraph"]).debug is True
    assert parser.parse_args(["check", "models/mlp.cgraph"]).debug is False


def test_debug_after_the_command_shows_the_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    import dslc.cli

    def boom(*args: object, **kwargs: object) -> None:
        raise RuntimeError("simulated")

    monkeypatch.setattr(dslc.cli.front, "front_end", boom)
    r = run_cli("check", "--debug", "models/mlp.cgraph")
    assert r.code == 4 and "Traceback" in r.stderr and "RuntimeError: simulated" in r.stderr


def _synopses() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    return re.findall(r"^\| `(dslc [^`]+)` \|", readme, re.M)


def test_the_readme_synopsis_is_the_parser() -> None:
    """Each README row names a command; every option it shows exists, and every option the
    parser requires is shown."""
    parser = build_parser()
    by_path = dict(_parsers(parser))
    rows = _synopses()
    covered = set()
    for row in rows:
        words = row.replace("\\|", "|").split()
        path = " ".join(w for w in words[:3] if re.fullmatch(r"[a-z-]+", w) and w != "dslc")
        sub = by_path[f"dslc {path}"]
        covered.add(f"dslc {path}")
        shown = set(re.findall(r"(?<![\w-])(--?[a-z][a-z-]*)", row))
        for flag in shown:
            assert _option(sub, flag) is not None, f"{row}: `dslc {path}` has no {flag}"
        for a in sub._actions:
            if a.required and a.option_strings:
                assert set(a.option_strings) & shown, f"{row}: {a.option_strings[0]} is required"
    assert covered == set(_commands(parser))


def test_run_needs_no_weights_for_a_model_without_params(tmp_path: Path) -> None:
    import numpy as np

    src, x = tmp_path / "np.cgraph", tmp_path / "x.npy"
    src.write_text(NO_PARAMS)
    np.save(x, np.ones((4, 8), np.float32))
    r = run_cli("run", str(src), "--input", f"x={x}")
    assert r.code == 0 and r.stdout == "y: f32[4, 8]  min 2  max 2  mean 2\n" and r.stderr == ""
    written = tmp_path / "out.npz"
    doc = _json("run", str(src), "--input", f"x={x}", "-o", str(written), "--format", "json")
    assert doc == {"backend": "reference", "written": str(written),
                   "outputs": {"y": {"dtype": "f32", "shape": [4, 8], "min": 2.0, "max": 2.0,
                                     "mean": 2.0}}}
    assert np.load(written)["y"].shape == (4, 8)


def test_run_json_writes_non_finite_numbers_as_strings(tmp_path: Path) -> None:
    import numpy as np

    src, x = tmp_path / "nan.cgraph", tmp_path / "x.npy"
    src.write_text("model m {\n  input x: [2]\n  output y = sqrt(x - 3.0)\n  output z = log(x - x)\n}\n")
    np.save(x, np.ones(2, np.float32))
    doc = _json("run", str(src), "--input", f"x={x}", "--format", "json")
    assert doc["outputs"]["y"]["min"] == "nan" and doc["outputs"]["z"]["max"] == "-inf"


def test_ops_lists_the_standard_library_with_signatures() -> None:
    r = run_cli("ops", "--family", "std")
    assert r.code == 0
    assert 'std (import "std/nn.cgraph"):' in r.stdout
    assert "  linear(x: [*L, K], out: int, has_bias: bool = true) -> [*L, out]\n" in r.stdout
    assert "      torch.nn.Linear: y = x W^T + b" in r.stdout
    assert "  conv(" not in r.stdout
    assert "  conv2d(x: [N, C, H, W], out: int, k: int" in run_cli("ops").stdout


def test_ops_json_has_every_op_and_def() -> None:
    doc = _json("ops", "--format", "json")
    assert set(doc) == {"ops", "defs"}
    assert {o["name"] for o in doc["ops"]} == set(OPS)
    assert all(set(o) == {"name", "family", "signature", "summary"} for o in doc["ops"])
    names = [d["name"] for d in doc["defs"]]
    assert names[:3] == ["linear", "conv2d", "conv_transpose2d"] and "softmax" in names
    assert all(set(d) == {"name", "import", "signature", "summary"} and d["import"] ==
               "std/nn.cgraph" for d in doc["defs"])
    assert _json("ops", "--family", "conv", "--format", "json")["defs"] == []


def test_an_unknown_family_is_a_usage_error_naming_the_known_ones(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        build_parser().parse_args(["ops", "--family", "convolution"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'convolution'" in err
    assert all(f"'{f}'" in err for f in ("attention", "conv", "pointwise", "std"))


def test_inspect_json(mlp_bundle: Path) -> None:
    doc = _json("inspect", str(mlp_bundle), "--format", "json")
    assert set(doc) == {"model", "source", "dslc_version", "created", "target", "environment",
                        "buckets", "steps", "fp8"}
    assert doc["fp8"] == {"ops": [], "calibration": None}  # no fp8 asked for
    assert (doc["model"], doc["source"], doc["target"]) == ("mnist_mlp", "models/mlp.cgraph",
                                                             "h200")
    assert [b["key"] for b in doc["buckets"]] == ["N=1", "N=16", "N=64", "N=256"]
    assert [s["name"] for s in doc["steps"]] == ["w1+b1+relu", "w2+b2+gelu", "w3+b3"]
    first = doc["steps"][0]
    assert set(first) == {"index", "name", "kind", "runs_on", "pattern", "ops", "nodes",
                          "signature", "reason", "plans", "in_place", "launch"}
    assert first["in_place"] == {"writes": {}, "concat_copies": {}, "why_copied": {}}
    assert first["launch"] == {}
    assert first["ops"] == ["matmul", "bias_add", "relu"] and first["runs_on"] == "cuDNN"
    assert set(first["plans"]) == {"N=1", "N=16", "N=64", "N=256"}
    assert "serialized" not in first["plans"]["N=1"] and "saved" in first["plans"]["N=1"]


def test_inspect_env_json(mlp_bundle: Path) -> None:
    doc = _json("inspect", "--env", str(mlp_bundle), "--format", "json")
    assert set(doc) == {"recorded", "this_machine", "fields", "policy", "startup", "error"}
    assert doc["recorded"]["device_name"] == "NVIDIA H200" and doc["policy"] == "retune"
    gpu = live_device_available()
    assert (doc["this_machine"] is None) == (not gpu)
    assert ("R0801" in (doc["error"] or "")) == (not gpu)


def test_compile_json_is_the_only_thing_on_stdout(tmp_path: Path) -> None:
    doc = _json("compile", "models/mlp.cgraph", "-o", str(tmp_path), "--dump", "fused",
                "--format", "json")
    assert set(doc) == {"source", "model", "target", "bundle", "runner", "weights", "steps",
                        "cudnn_graphs", "fallback_kernels", "split", "graphs", "buckets",
                        "compiled_buckets", "plans_built", "tuned", "dumps", "fp8_seconds",
                        "seconds"}
    assert (doc["steps"], doc["cudnn_graphs"], doc["fallback_kernels"]) == (3, 3, 0)
    assert (doc["graphs"], doc["buckets"], doc["weights"], doc["tuned"]) == (12, 4, None, None)
    assert doc["fp8_seconds"] is None and 0 < doc["seconds"] < 60
    assert Path(doc["bundle"]).is_file() and Path(doc["runner"]).is_file()
    assert doc["dumps"] == [str(tmp_path / "4.fused.txt")]
    assert (tmp_path / "4.fused.txt").read_text().startswith("# 3 groups")


def test_the_summary_counts_the_time_fp8_auto_spent_measuring() -> None:
    """`--fp8 auto` builds and times the model once per kind of fp8 request before the bundle
    is built: the line says the whole time and that part of it (a ResNet-50 said "in 0.5 s"
    after 305 s of measuring)."""
    from dslc.cli.compile import _summary_text

    s = {"source": "r.cgraph", "target": "device", "steps": 56, "cudnn_graphs": 54,
         "fallback_kernels": 2, "split": 0, "graphs": 25, "buckets": 3, "plans_built": 25,
         "seconds": 305.3, "fp8_seconds": 304.8, "bundle": "out/r.bundle"}
    assert _summary_text(s).endswith("in 305.3 s (304.8 s of it measuring fp8) -> out/")
    assert "25 graphs over 3 buckets, 25 plans" in _summary_text(s)
    assert "25 graphs over 1 bucket (of 3), 25 plans" in _summary_text({**s, "compiled_buckets": 1})
    assert _summary_text({**s, "fp8_seconds": None, "seconds": 0.5}).endswith("in 0.5 s -> out/")


def test_a_missing_target_file_says_so(tmp_path: Path) -> None:
    r = run_cli("compile", "models/mlp.cgraph", "-o", str(tmp_path), "--target",
                str(tmp_path / "h100.json"))
    assert r.code == 2 and "no such file" in r.stderr and "h100.json" in r.stderr
    assert not (tmp_path / "mnist_mlp.bundle").exists()
    assert "unknown target `h100`" in run_cli("compile", "models/mlp.cgraph", "--target",
                                              "h100").stderr


@pytest.mark.parametrize("args", [
    ("compile", "models/mlp.cgraph", "--target", "device"),
    ("target", "capture", "-o", "{tmp}/t.json"),
    ("run", "{tmp}/np.cgraph", "--backend", "cudnn", "--input", "x={tmp}/x.npy"),
], ids=["compile --target device", "target capture", "run --backend cudnn"])
def test_no_gpu_is_exit_code_3_everywhere(args: tuple[str, ...], tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    import numpy as np

    monkeypatch.setattr("dslc.backend.target.live_device_available", lambda: False)
    (tmp_path / "np.cgraph").write_text(NO_PARAMS)
    np.save(tmp_path / "x.npy", np.ones((4, 8), np.float32))
    r = run_cli(*(a.format(tmp=tmp_path) for a in args))
    assert r.code == 3, r.stderr
    assert r.stderr.startswith("error[R0801]: ") and "needs a GPU" in r.stderr


def test_a_runtime_without_a_gpu_is_exit_code_3(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A bundle run on cuDNN: the runtime's R0801 (its CuPy or its device missing)."""
    import numpy as np

    from dslc.core.errors import RunnerError

    def no_gpu() -> Any:
        raise RunnerError("R0801", "running a compiled model needs a CUDA GPU, and none is "
                          "visible")

    (tmp_path / "np.cgraph").write_text(NO_PARAMS)
    np.save(tmp_path / "x.npy", np.ones((4, 8), np.float32))
    assert run_cli("compile", str(tmp_path / "np.cgraph"), "-o", str(tmp_path), "-q").code == 0
    monkeypatch.setattr("dslc.backend.device.require", no_gpu)
    r = run_cli("run", str(tmp_path / "noparams.bundle"), "--backend", "cudnn", "--input",
                f"x={tmp_path / 'x.npy'}")
    assert r.code == 3 and r.stderr.startswith("error[R0801]: ")


def test_params_table_columns_line_up() -> None:
    r = run_cli("params", "models/encoder.cgraph")
    lines = r.stdout.splitlines()
    head, rows = lines[0], lines[1:-1]
    assert head.split() == ["path", "dtype", "shape", "values"]
    dtype, shape = head.index("dtype"), head.index("shape")
    for row in rows:
        assert row[dtype - 2:dtype] == "  " and row[dtype] != " ", row
        assert row[shape - 2:shape] == "  " and row[shape] == "[", row
        assert len(row) == len(head), row  # the values column ends where its heading does
    assert lines[-1] == "194 params, 85,056,000 values"


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_is_a_line_rewritten_on_a_terminal_only(monkeypatch: pytest.MonkeyPatch) -> None:
    terminal = _Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    progress = Progress(quiet=False)
    progress("compiling [1/3] w1+b1+relu")
    progress("compiling [2/3] w2+b2+gelu")
    progress.clear()
    text = terminal.getvalue()
    assert text.count("\r\x1b[K") == 3 and "s  compiling [2/3] w2+b2+gelu" in text
    assert text.endswith("\r\x1b[K")
    quiet = _Terminal()
    monkeypatch.setattr("sys.stderr", quiet)
    Progress(quiet=True)("compiling")
    assert quiet.getvalue() == ""
    log = io.StringIO()  # not a terminal
    monkeypatch.setattr("sys.stderr", log)
    Progress(quiet=False)("compiling")
    assert log.getvalue() == ""


def test_compile_to_a_log_shows_no_progress(tmp_path: Path) -> None:
    r = run_cli("compile", "models/mlp.cgraph", "-o", str(tmp_path))
    assert r.code == 0 and "\r" not in r.stderr and r.stderr == ""
    assert r.stdout.startswith("compiled models/mlp.cgraph for h200: 3 steps")


@pytest.mark.parametrize("args", [("inspect", "models/mlp.cgraph"), ("tune", "models/mlp.cgraph"),
                                  ("weights", "prepare", "models/mlp.cgraph", "w.safetensors",
                                   "-o", "{tmp}/p.safetensors")],
                         ids=["inspect", "tune", "weights prepare"])
def test_a_source_file_given_for_a_bundle_says_so(args: tuple[str, ...], tmp_path: Path) -> None:
    r = run_cli(*(a.format(tmp=tmp_path) for a in args))
    assert r.code == 2
    assert r.stderr == ("error: `models/mlp.cgraph` is .cgraph source, not a bundle: compile it "
                        "first (`dslc compile models/mlp.cgraph`)\n")


@pytest.mark.parametrize(("bucket", "says"), [
    ("N=3", "is not a bucket of `dyn` (N=1; N=8); a model's buckets are its dims' `tune [...]`"),
    ("N=eight", "`--bucket N=eight`: write DIM=VALUE[,DIM=VALUE...]"),
])
def test_a_bucket_the_model_lacks_is_a_usage_error_naming_its_buckets(
        bucket: str, says: str, tmp_path: Path) -> None:
    source = tmp_path / "dyn.cgraph"
    source.write_text("model dyn {\n  dim N = 1..8 tune [1, 8]\n  input x: [N, 4]\n"
                      "  output y = relu(x)\n}\n")
    r = run_cli("compile", str(source), "-o", str(tmp_path / "out"), "--bucket", bucket, "-q")
    assert r.code == 2 and says in r.stderr and not (tmp_path / "out").exists(), r.stderr
