"""The generated runner: its text (golden), that it imports on a machine without a GPU and
fails to run with one sentence, and that no name from a `.cgraph` file can change its code."""

from __future__ import annotations

import ast
import importlib.util
import shutil
import sys
from pathlib import Path

import pytest

from dslc.core.errors import RunnerError
from tests.conftest import ROOT
from tests.helpers import run_cli

GOLDEN = ROOT / "tests" / "golden" / "mnist_mlp_runner.py"


def _compile(src: Path, out: Path) -> Path:
    run = run_cli("compile", str(src), "-o", str(out), "-q")
    assert run.code == 0, run.stderr
    return out


def test_generated_runner_matches_golden(tmp_path: Path, bless: bool) -> None:
    out = _compile(Path("models/mlp.cgraph"), tmp_path)
    text = (out / "mnist_mlp_runner.py").read_text()
    if bless:
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text(), "the runner changed (update with `pytest --bless`)"


def _import(path: Path):  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_runner_imports_without_gpu_and_a_call_fails_in_one_sentence(tmp_path: Path) -> None:
    out = _compile(Path("models/mlp.cgraph"), tmp_path)
    assert run_cli("weights", "random", "models/mlp.cgraph", "-o",
                   str(out / "mnist_mlp.safetensors")).code == 0
    module = _import(out / "mnist_mlp_runner.py")
    model = module.MnistMlpRunner()  # the weights beside the bundle load (and are checked) here
    with pytest.raises(RunnerError) as err:
        model(x=object())
    assert err.value.code == "R0801"
    assert str(err.value).startswith("error[R0801]: running a compiled model needs")
    assert "\n" not in str(err.value)


def test_runner_module_imports_no_compiler(tmp_path: Path) -> None:
    import subprocess

    out = _compile(Path("models/mlp.cgraph"), tmp_path)
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import mnist_mlp_runner; "
            "print(sorted(m for m in ('lark', 'jinja2', 'cudnn', 'dslc.parse', 'dslc.check.checker')"
            " if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code, str(out)], capture_output=True, text=True,
                          check=True)
    assert proc.stdout.strip() == "[]"


HOSTILE = '''cgraph 0.1
# \"\"\" ); import os; os.system("echo pwned") #
model lambda_(version="1.0\\\"\\\"\\\"\\n import os") {
  input self: [4, 8]
  input lambda: [4, 8]
  input run: [4, 8]
  output print = self + lambda + run
}
'''


def test_hostile_names_cannot_change_the_runner(tmp_path: Path) -> None:
    src = tmp_path / 'evil"""name.cgraph'
    src.write_text(HOSTILE)
    out = _compile(src, tmp_path / "out")
    runner = next(out.glob("*_runner.py"))
    tree = ast.parse(runner.read_text())
    allowed = {"__future__", "pathlib", "typing", "dslc.runtime"}
    for stmt in tree.body:
        if isinstance(stmt, ast.ImportFrom):
            assert stmt.module in allowed
        elif isinstance(stmt, ast.Import):
            pytest.fail("a plain import in the runner")
        else:
            assert isinstance(stmt, (ast.Expr, ast.Assign, ast.ClassDef)), ast.dump(stmt)
    [cls] = [s for s in tree.body if isinstance(s, ast.ClassDef)]
    call = next(f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "__call__")
    assert [a.arg for a in call.args.args] == ["self", "self_", "lambda_", "run"]
    module = _import(runner)
    assert module.__doc__ and "os.system" not in dir(module)
    shutil.rmtree(tmp_path / "out")


def test_run_on_cudnn_without_gpu_says_so_in_one_line(tmp_path: Path) -> None:
    pytest.importorskip("cudnn")
    if importlib.util.find_spec("cupy") is not None:
        pytest.skip("this machine has CuPy; the GPU tests cover `dslc run --backend cudnn`")
    import numpy as np

    bundle = _compile(ROOT / "models" / "mlp.cgraph", tmp_path) / "mnist_mlp.bundle"
    weights = tmp_path / "w.safetensors"
    assert run_cli("weights", "random", "models/mlp.cgraph", "-o", str(weights)).code == 0
    np.save(tmp_path / "x.npy", np.zeros((16, 784), np.float16))
    run = run_cli("run", str(bundle), "--backend", "cudnn", "--weights", str(weights),
                  "--input", f"x={tmp_path / 'x.npy'}", "-o", str(tmp_path / "y.npz"))
    assert run.code == 3
    assert run.stderr.startswith("error[R0801]: running a compiled model needs a CUDA GPU")
    assert not (tmp_path / "y.npz").exists()
