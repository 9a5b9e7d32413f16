"""The command line: exit codes, output formats and the warning switches."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dslc.ops import OPS
from tests.helpers import run_cli

WARNS = """import "std/nn.cgraph"
model m {
  precision io=f16
  input x: f16[1, 64, 64, 64]
  param w: [64, 64, 3, 3]
  param b: [64]
  output y = conv(x, w, pad=1) + b
}
"""
BROKEN = "model m {\n  input x: [4]\n  output y = relu(xx)\n  output z = relu(yy)\n}\n"


def _write(tmp_path: Path, text: str, name: str = "m.cgraph") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_clean_model_exits_zero_and_says_ok() -> None:
    run = run_cli("check", "models/mlp.cgraph")
    assert run.code == 0
    assert run.stdout.startswith("ok: models/mlp.cgraph: model `mnist_mlp`")


def test_quiet_prints_nothing_on_success() -> None:
    run = run_cli("check", "-q", "models/mlp.cgraph")
    assert (run.code, run.stdout, run.stderr) == (0, "", "")


def test_errors_exit_one_and_all_are_reported_once(tmp_path: Path) -> None:
    run = run_cli("check", _write(tmp_path, BROKEN))
    assert run.code == 1
    assert run.stderr.count("error[E0201]") == 2
    assert run.stderr.rstrip().endswith("2 errors")


def test_missing_file_is_a_usage_error(tmp_path: Path) -> None:
    run = run_cli("check", str(tmp_path / "nope.cgraph"))
    assert run.code == 2
    assert "cannot read" in run.stderr and "Traceback" not in run.stderr


def test_a_bundle_given_for_a_source_says_so(tmp_path: Path) -> None:
    bundle = tmp_path / "m.bundle"
    bundle.write_bytes(b"\x84\xa5magic\xab dslc-bundle")
    run = run_cli("weights", "random", str(bundle), "-o", str(tmp_path / "w.safetensors"))
    assert run.code == 2
    assert "it is a compiled bundle; this command takes a .cgraph source file" in run.stderr


def test_json_is_one_object_per_line_on_stdout(tmp_path: Path) -> None:
    run = run_cli("check", "--error-format", "json", _write(tmp_path, BROKEN))
    records = run.json_lines()
    assert [r["code"] for r in records] == ["E0201", "E0201"]
    assert set(records[0]) >= {"severity", "code", "message", "span", "labels", "notes", "help"}
    assert records[0]["span"] == {"file": records[0]["span"]["file"], "line": 3, "col": 19,  # type: ignore[index]
                                  "end_line": 3, "end_col": 21}


def test_github_format_annotates_the_line(tmp_path: Path) -> None:
    run = run_cli("check", "--error-format", "github", _write(tmp_path, BROKEN))
    first = run.stdout.splitlines()[0]
    assert first.startswith("::error file=") and ",line=3,col=19," in first
    assert "title=E0201::cannot find value `xx`" in first


def test_warnings_pass_unless_denied_and_can_be_allowed(tmp_path: Path) -> None:
    path = _write(tmp_path, WARNS)
    plain = run_cli("check", path)
    assert plain.code == 0 and "warning[W0301]" in plain.stderr and "warning[W0501]" in plain.stderr
    denied = run_cli("check", "--deny-warnings", path)
    assert denied.code == 1 and "error[W0301]" in denied.stderr
    allowed = run_cli("check", "--allow", "W0301", "--allow", "w0501", path)
    assert allowed.code == 0 and allowed.stderr == ""


def test_max_errors_stops_early(tmp_path: Path) -> None:
    run = run_cli("check", "--max-errors", "1", _write(tmp_path, BROKEN))
    assert run.code == 1 and run.stderr.count("error[E0201]") == 1


def test_ops_lists_every_builtin_op() -> None:
    run = run_cli("ops")
    assert run.code == 0
    for name in OPS:
        assert f"  {name}(" in run.stdout


def test_internal_error_is_reported_without_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    import dslc.cli

    def boom(*args: object, **kwargs: object) -> None:
        raise RuntimeError("simulated")

    monkeypatch.setattr(dslc.cli.front, "front_end", boom)
    run = run_cli("check", "models/mlp.cgraph")
    assert run.code == 4
    assert "internal error" in run.stderr and "Traceback" not in run.stderr


def test_compile_verify_names_the_lowering_pass_that_broke_the_ir(tmp_path: Path,
                                                                  monkeypatch: Any) -> None:
    from dataclasses import replace

    from dslc import lower as lowering
    from dslc.ir.graph import Graph

    def reads_nowhere(graph: Graph, env: object = None) -> Graph:  # a broken pass: a node
        # reads an undefined value
        nodes = list(graph.nodes)
        nodes[-1] = replace(nodes[-1], inputs=("nowhere", *nodes[-1].inputs[1:]))
        return Graph(tuple(nodes), graph.outputs)

    passes = list(lowering.PASSES)
    passes[[p.__name__ for p in passes].index("bias_from_add")] = reads_nowhere
    monkeypatch.setattr(lowering, "PASSES", passes)
    r = run_cli("compile", "models/mlp.cgraph", "-o", str(tmp_path / "a"), "--verify", "-q")
    assert r.code == 4, r.stderr
    assert "the IR after the lowering pass `reads_nowhere` fails the verifier" in r.stderr
    assert "nowhere" in r.stderr.split("verifier:")[1]
    assert not (tmp_path / "a" / "mnist_mlp.bundle").exists()
