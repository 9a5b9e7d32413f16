"""The floors hold: `lint-imports` keeps the contracts in pyproject.toml (each package imports
only those below it; the runtime none of the compiler; no import circle inside a package), and a
generated runner imports, loads its bundle and weights, derives its plans' specs and memory and
checks inputs in a process where the compiler's packages cannot be imported at all."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT
from tests.helpers import run_cli

COMPILER = ("dslc.parse", "dslc.check", "dslc.lower", "dslc.fuse", "dslc.compile", "dslc.tune",
            "dslc.emit", "dslc.pipeline", "dslc.cli", "dslc.weights", "dslc.importer", "lark", "jinja2")


def test_lint_imports_keeps_the_floor_contracts() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports; "
         "sys.exit(lint_imports(no_cache=True))"],
        cwd=ROOT, capture_output=True, text=True, env={"PYTHONPATH": str(ROOT), "PATH": ""})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "4 kept, 0 broken" in proc.stdout


# Runs in a fresh interpreter: an import of any compiler package raises ImportError.
RUNNER_WITHOUT_COMPILER = '''
import json, sys
from importlib.abc import MetaPathFinder

BLOCKED = tuple(sys.argv[2].split(","))

class Block(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if any(name == b or name.startswith(b + ".") for b in BLOCKED):
            raise ImportError(f"{name} is part of the compiler")
        return None

sys.meta_path.insert(0, Block())
sys.path.insert(0, sys.argv[1])
import mnist_mlp_runner
from dslc.runtime import RunnerError
from dslc.runtime.inputs import bind_inputs

model = mnist_mlp_runner.MnistMlpRunner()  # bundle validated, weights beside it checked
out = {"loaded": sorted(model.buckets)}
step = model.program.steps[0]
bucket = model.buckets["N=16"]
out["spec_equal"] = (model.spec_at(step, {"N": 16}).data()
                     == bucket.graphs[step.signature].spec.to_data())
memory = model.program.memory_plan({"N": 16})
out["arena_equal"] = (memory.arena, memory.offsets) == (bucket.arena_bytes, dict(bucket.offsets))
out["dims"] = bind_inputs(model.manifest, {"x": ((3, 784), "f16")})
codes = []
for given in ({"x": ((3, 785), "f16")}, {"x": ((300, 784), "f16")}, {"x": ((3, 784), "f32")}):
    try:
        bind_inputs(model.manifest, given)
    except RunnerError as err:
        codes.append(err.code)
out["codes"] = codes
try:
    model(x=object())
except RunnerError as err:
    out["call"] = err.code
out["imported"] = sorted(m for m in sys.modules if any(m == b or m.startswith(b + ".")
                                                       for b in BLOCKED))
print(json.dumps(out))
'''


def test_runner_works_with_the_compiler_blocked_from_import(tmp_path: Path) -> None:
    assert run_cli("compile", "models/mlp.cgraph", "-o", str(tmp_path), "-q").code == 0
    assert run_cli("weights", "random", "models/mlp.cgraph", "-o",
                   str(tmp_path / "mnist_mlp.safetensors")).code == 0
    proc = subprocess.run([sys.executable, "-c", RUNNER_WITHOUT_COMPILER, str(tmp_path),
                           ",".join(COMPILER)], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got["loaded"] == ["N=1", "N=16", "N=256", "N=64"]
    assert got["spec_equal"] and got["arena_equal"]
    assert got["dims"] == {"N": 3}  # x: f16[N, 784] given [3, 784]
    # size 785 on a fixed axis, N = 300 past 1..256, f32 given for f16
    assert got["codes"] == ["R0301", "R0601", "R0401"]
    assert got["call"] == "R0801"  # no GPU here: the call says so in one sentence
    assert got["imported"] == []
