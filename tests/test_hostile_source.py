"""Hostile `.cgraph` sources end in a diagnostic at the source (exit 1) or a one-sentence usage
error (exit 2): never a traceback, an internal error (exit 4), a RecursionError, a signal, or
minutes of work. Cases that could take the interpreter down (deep recursion, cuDNN crashes on
high-rank tensors, strict stdout encodings) also run in a subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dslc.check import context
from dslc.check.exprs import MAX_NESTING
from tests.conftest import ROOT
from tests.helpers import Run, run_cli


def _model(body: str, name: str = "m") -> str:
    return f"model {name} {{\n  precision io=f32\n{body}\n}}\n"


def _write(tmp_path: Path, text: str, name: str = "hostile.cgraph") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _check(tmp_path: Path, text: str) -> Run:
    return run_cli("check", "--color", "never", str(_write(tmp_path, text)))


def _subprocess(*args: str, cwd: Path | None = None,
                env: dict[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    environment = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run([sys.executable, "-m", "dslc", *args], cwd=cwd or ROOT, env=environment,
                          capture_output=True, timeout=300, check=False)


def _one_error(run: Run, code: str) -> None:
    assert run.code == 1, (run.code, run.stderr)
    assert f"error[{code}]" in run.stderr, run.stderr
    assert "Traceback" not in run.stderr and "internal error" not in run.stderr


# -- defect 5: ranks cuDNN cannot take ----------------------------------------------------------


@pytest.mark.parametrize("rank", [9, 16, 17, 32, 64])
def test_input_of_rank_above_8_is_E0306_at_its_declaration(tmp_path: Path, rank: int) -> None:
    run = _check(tmp_path, _model(f"  input x: [{', '.join(['1'] * rank)}]\n"
                                  "  output y = relu(x)"))
    _one_error(run, "E0306")
    assert f"has rank {rank}; cuDNN takes tensors of rank 8 at most" in run.stderr
    assert "hostile.cgraph:3:12" in run.stderr


def test_an_op_that_makes_rank_9_is_E0306_at_the_op(tmp_path: Path) -> None:
    run = _check(tmp_path, _model("  input x: [512, 64]\n"
                                  "  let r = reshape(x, [2, 2, 2, 2, 2, 2, 2, 2, 128])\n"
                                  "  output y = relu(r)"))
    _one_error(run, "E0306")
    assert "the result of `reshape` has rank 9" in run.stderr


def test_the_rank_limit_holds_for_the_reference_backend(tmp_path: Path) -> None:
    path = _write(tmp_path, _model(f"  input x: [{', '.join(['2'] * 9)}]\n  output y = relu(x)"))
    run = run_cli("run", str(path), "--backend", "reference", "--weights", str(tmp_path / "w"),
                  "-o", str(tmp_path / "out.npz"))
    _one_error(run, "E0306")


@pytest.mark.parametrize("rank", [16, 32])
def test_compile_of_rank_16_and_32_ends_in_E0306_not_a_crash(tmp_path: Path, rank: int) -> None:
    # Before the check, cuDNN's frontend corrupted the heap (16) or segfaulted (32) here.
    path = _write(tmp_path, _model(f"  input x: [{', '.join(['1'] * rank)}]\n"
                                   "  output y = relu(x)"))
    proc = _subprocess("compile", str(path), "-o", str(tmp_path / "out"))
    assert proc.returncode == 1, (proc.returncode, proc.stderr.decode())
    assert b"error[E0306]" in proc.stderr and b"Traceback" not in proc.stderr
    assert not (tmp_path / "out" / "m.bundle").exists()


def test_rank_8_still_compiles_deviceless(tmp_path: Path) -> None:
    path = _write(tmp_path, _model(f"  input x: [{', '.join(['2'] * 8)}]\n  output y = relu(x)"))
    run = run_cli("compile", str(path), "-o", str(tmp_path / "out"))
    assert run.code == 0, run.stderr
    assert (tmp_path / "out" / "m.bundle").is_file()


# -- defect 6: the input at fault, never exit 4 -------------------------------------------------


@pytest.mark.parametrize("depth", [300, 1000, 10_000])
def test_calls_nested_too_deep_are_E0705(tmp_path: Path, depth: int) -> None:
    run = _check(tmp_path, _model(f"  input x: [4]\n  output y = {'relu(' * depth}x{')' * depth}"))
    _one_error(run, "E0705")
    assert f"nested more than {MAX_NESTING} levels deep" in run.stderr


def test_calls_nested_just_below_the_limit_check(tmp_path: Path) -> None:
    depth = MAX_NESTING - 1
    run = _check(tmp_path, _model(f"  input x: [4]\n  output y = {'relu(' * depth}x{')' * depth}"))
    assert run.code == 0, run.stderr
    assert f"{depth} ops" in run.stdout


def test_lists_nested_too_deep_are_E0705(tmp_path: Path) -> None:
    run = _check(tmp_path, _model(f"  input x: [4]\n  output y = reshape(x, {'[' * 500}4{']' * 500})"))
    _one_error(run, "E0705")


def test_a_def_chain_deeper_than_the_limit_is_E0705_naming_the_calls(tmp_path: Path) -> None:
    lines = ["def g0(x: [N]) -> [N] { return relu(x) }"]
    lines += [f"def g{i}(x: [N]) -> [N] {{ return g{i - 1}(x) }}" for i in range(1, 2000)]
    run = _check(tmp_path, "\n".join(lines) + "\n" + _model("  input x: [4]\n"
                                                            "  output y = g1999(x)"))
    _one_error(run, "E0705")
    assert "in this call to `g" in run.stderr and "more enclosing calls" in run.stderr


@pytest.mark.parametrize("terms", [500, 5000])
def test_long_sums_are_one_level_and_check(tmp_path: Path, terms: int) -> None:
    run = _check(tmp_path, _model(f"  input x: [4]\n  output y = {' + '.join(['x'] * terms)}"))
    assert run.code == 0, run.stderr
    assert f"{terms - 1} ops" in run.stdout


def test_long_sign_and_not_chains_check(tmp_path: Path) -> None:
    run = _check(tmp_path, _model("  dim K = 3\n  input x: [4]\n"
                                  f"  let y = {'-' * 1000}x when {'not ' * 1001}K == 2\n"
                                  "  output z = y"))
    assert run.code == 0, run.stderr
    assert "1000 ops" in run.stdout


def test_a_long_conditional_chain_checks(tmp_path: Path) -> None:
    chain = " ".join(f"relu(x) if K == {i} else" for i in range(3000)) + " x"
    run = _check(tmp_path, _model(f"  dim K = 2999\n  input x: [4]\n  output y = {chain}"))
    assert run.code == 0, run.stderr
    assert "1 ops" in run.stdout


def test_deep_parentheses_parse_without_recursion(tmp_path: Path) -> None:
    run = _check(tmp_path, _model(f"  input x: [4]\n  output y = {'(' * 100_000}x{')' * 100_000}"))
    assert run.code == 0, run.stderr


@pytest.mark.parametrize("literal", ["9" * 4400, "18446744073709551616", "9223372036854775808"])
def test_integer_literals_beyond_int64_are_E0106(tmp_path: Path, literal: str) -> None:
    run = _check(tmp_path, _model(f"  dim D = {literal}\n  input x: [D]\n  output y = relu(x)"))
    _one_error(run, "E0106")
    assert "integer literal too large" in run.stderr


def test_int64_max_is_a_valid_literal_and_a_too_large_tensor(tmp_path: Path) -> None:
    run = _check(tmp_path, _model(f"  dim D = {2**63 - 1}\n  input x: [D]\n  output y = relu(x)"))
    _one_error(run, "E0306")
    assert "this tensor is too large" in run.stderr


def test_an_infinite_float_literal_is_E0106(tmp_path: Path) -> None:
    run = _check(tmp_path, _model("  input x: [4]\n  output y = x * 1e400"))
    _one_error(run, "E0106")


@pytest.mark.parametrize("body", [
    "  dim D = 4294967296 * 4294967296\n  input x: [1, D]\n  output y = relu(x)",
    "  dim D = 1099511627776\n  input x: [D, D]\n  output y = relu(x)",
    "  dim N = 1..9223372036854775807\n  input x: [N, 2]\n  output y = relu(x)",
    "  input a: [4294967296, 1]\n  input b: [1, 4294967296]\n  output y = a + b",
])
def test_sizes_beyond_int64_fail_at_check_not_in_compile(tmp_path: Path, body: str) -> None:
    path = _write(tmp_path, _model(body))
    for command in (("check",), ("compile", "-o", str(tmp_path / "out"))):
        run = run_cli(command[0], str(path), *command[1:])
        assert run.code == 1, (command, run.code, run.stderr)
        assert "error[E0306]" in run.stderr or "error[E0" in run.stderr, run.stderr
        assert "internal error" not in run.stderr


def test_a_model_name_of_250_characters_is_E0106_and_writes_nothing(tmp_path: Path) -> None:
    path = _write(tmp_path, "model " + "m" * 250 + " {\n  input x: [4]\n  output y = relu(x)\n}\n")
    _one_error(run_cli("check", str(path)), "E0106")
    out = tmp_path / "out"
    _one_error(run_cli("compile", str(path), "-o", str(out)), "E0106")
    assert not out.exists() or not any(out.iterdir())


def test_a_model_name_of_128_characters_compiles(tmp_path: Path) -> None:
    name = "m" * 128
    path = _write(tmp_path, f"model {name} {{\n  input x: [4]\n  output y = relu(x)\n}}\n")
    run = run_cli("compile", str(path), "-o", str(tmp_path / "out"))
    assert run.code == 0, run.stderr
    assert (tmp_path / "out" / f"{name}.bundle").is_file()


def _bytes_path(tmp_path: Path, name: bytes, text: str) -> bytes:
    path = os.fsencode(tmp_path) + b"/" + name
    with open(path, "wb") as f:
        f.write(text.encode())
    return path


def test_a_file_name_that_is_not_utf8_checks_and_compiles(tmp_path: Path) -> None:
    good = _bytes_path(tmp_path, b"model\xff\xfe.cgraph", _model("  input x: [4]\n"
                                                                 "  output y = relu(x)"))
    strict = {"PYTHONIOENCODING": "utf-8"}  # a stdout that refuses lone surrogates
    proc = _subprocess("check", os.fsdecode(good), env=strict)
    assert proc.returncode == 0, proc.stderr.decode()
    assert b"model\\xff\\xfe.cgraph" in proc.stdout
    out = tmp_path / "out"
    proc = _subprocess("compile", os.fsdecode(good), "-o", str(out), env=strict)
    assert proc.returncode == 0, proc.stderr.decode()
    assert (out / "m.bundle").is_file()
    weights = os.fsencode(tmp_path) + b"/w\xff.safetensors"
    proc = _subprocess("weights", "random", os.fsdecode(good), "-o", os.fsdecode(weights),
                       env=strict)
    assert proc.returncode == 0, proc.stderr.decode()
    assert os.path.isfile(weights) and b"w\\xff.safetensors" in proc.stderr


def test_a_file_name_that_is_not_utf8_gets_printable_diagnostics(tmp_path: Path) -> None:
    bad = _bytes_path(tmp_path, b"bad\xff.cgraph", _model("  input x: [4]\n  output y = relu(x"))
    for fmt in ("human", "json"):
        proc = _subprocess("check", "--error-format", fmt, os.fsdecode(bad), cwd=tmp_path,
                           env={"PYTHONIOENCODING": "utf-8"})
        assert proc.returncode == 1, proc.stderr.decode()
        if fmt == "json":
            [line] = proc.stdout.decode().splitlines()
            assert json.loads(line)["span"]["file"] == "bad\\xff.cgraph"
        else:
            assert b"--> bad\\xff.cgraph:5:1" in proc.stderr
        assert b"Traceback" not in proc.stderr
    missing = os.fsencode(tmp_path) + b"/missing\xff.cgraph"
    proc = _subprocess("check", os.fsdecode(missing), env={"PYTHONIOENCODING": "utf-8"})
    assert proc.returncode == 2, proc.stderr.decode()
    assert proc.stderr.count(b"\n") == 1 and b"missing\\xff.cgraph" in proc.stderr


def test_keywords_are_whole_words(tmp_path: Path) -> None:
    run = _check(tmp_path, _model("  input x: [4]\n  letter = relu(x)\n  output y = x"))
    _one_error(run, "E0101")
    assert "a binding starts with `let`" in run.stderr
    assert "write `let letter = ...`" in run.stderr


def test_the_crashing_cases_run_clean_in_a_subprocess(tmp_path: Path) -> None:
    """Deep nestings, long chains and a deep def chain in one process of their own: none may
    end in a signal or an internal error."""
    cases = {
        "calls": _model(f"  input x: [4]\n  output y = {'relu(' * 5000}x{')' * 5000}"),
        "sum": _model(f"  input x: [4]\n  output y = {' + '.join(['x'] * 2000)}"),
        "signs": _model(f"  input x: [4]\n  output y = {'-' * 20_000}x"),
        "lists": _model(f"  input x: [4]\n  output y = reshape(x, {'[' * 20_000}4{']' * 20_000})"),
        "defs": "\n".join(["def g0(x: [N]) -> [N] { return relu(x) }"]
                          + [f"def g{i}(x: [N]) -> [N] {{ return g{i - 1}(x) }}"
                             for i in range(1, 3000)])
        + "\n" + _model("  input x: [4]\n  output y = g2999(x)"),
    }
    for name, text in cases.items():
        _write(tmp_path, text, f"{name}.cgraph")
    proc = _subprocess("check", "--color", "never", *sorted(str(p) for p in tmp_path.iterdir()))
    err = proc.stderr.decode()
    assert proc.returncode in (0, 1), (proc.returncode, err[-2000:])
    assert "Traceback" not in err and "internal error" not in err and "RecursionError" not in err


def test_ast_dump_of_a_long_sign_chain(tmp_path: Path) -> None:
    path = _write(tmp_path, _model(f"  input x: [4]\n  output y = {'-' * 3000}x"))
    run = run_cli("compile", str(path), "-o", str(tmp_path / "out"), "--dump", "ast")
    assert run.code == 0, run.stderr
    assert (tmp_path / "out" / "1.ast.txt").read_text().count("Neg @") == 3000


# -- defect 12: bounded work before expanding, linear checking ---------------------------------


def _doubling_defs(n: int) -> str:
    lines = ["def d0(x: [N]) -> [N] { return relu(x) }"]
    lines += [f"def d{i}(x: [N]) -> [N] {{ let a = d{i - 1}(x)\n return d{i - 1}(a) }}"
              for i in range(1, n)]
    return "\n".join(lines) + "\n" + _model(f"  input x: [4]\n  output y = d{n - 1}(x)")


def test_exponentially_nesting_defs_are_refused_before_expanding(tmp_path: Path) -> None:
    # 42 defs, each calling the previous one twice: 170 lines that would expand to 2^41 ops
    # (100 s and 623 MB before the node limit stopped it).
    start = time.process_time()
    run = _check(tmp_path, _doubling_defs(42))
    elapsed = time.process_time() - start
    _one_error(run, "E0705")
    assert "would expand to about 6,597,069,766,655 operations and def instances" in run.stderr
    assert "`d41` calls `d40` 2 times, which calls `d39` 2 times" in run.stderr
    assert elapsed < 20, elapsed  # about a second: nothing is expanded


def test_the_estimate_is_exact_for_plain_def_calls(tmp_path: Path) -> None:
    run = _check(tmp_path, _doubling_defs(19))  # 2^18 relu + 2^19 - 1 instances
    _one_error(run, "E0705")
    assert f"about {2**18 + 2**19 - 1:,} operations" in run.stderr
    run = _check(tmp_path, _doubling_defs(10))
    assert run.code == 0 and f"{2**9} ops" in run.stdout


def test_a_repeat_with_a_count_from_an_argument_is_refused_after_one_instance(
        tmp_path: Path) -> None:
    text = ("def block(x: [N]) -> [N] { return relu(x) + x }\n"
            "def stack(x: [N], n: int) -> [N] {\n"
            "  let s = repeat n block(x)\n  return s\n}\n"
            + _model("  input x: [4]\n  let y = repeat 10000 stack(x, n=10000)\n"
                     "  output z = y"))
    start = time.process_time()
    run = _check(tmp_path, text)
    _one_error(run, "E0705")
    assert time.process_time() - start < 60
    assert "this `repeat` would expand" in run.stderr


def test_the_node_limit_is_the_documented_one() -> None:
    assert context.MAX_NODES == 250_000
    assert "| Expansion | 250,000 operations and def instances" in (
        ROOT / "docs" / "LANGUAGE.md").read_text()


def test_one_statement_of_20000_operations_checks_in_linear_time(tmp_path: Path) -> None:
    # Node names `y.neg`, `y.neg_1`, ...: each new one was searched from `_1` up (80 s here).
    path = _write(tmp_path, _model(f"  input x: [4]\n  output y = {'-' * 20_000}x"))
    start = time.process_time()
    run = run_cli("check", str(path))
    assert run.code == 0 and "20000 ops" in run.stdout, run.stderr
    assert time.process_time() - start < 30


def test_checking_is_linear_enough_for_20000_lets(tmp_path: Path) -> None:
    """A guard against quadratic regressions, with a generous bound: 2x10^4 `let` lines take
    about 3 s of CPU on a loaded 2-core machine (docs/benchmarks.md has the 10^5 figure)."""
    n = 20_000
    lines = ["  input x: [4, 8]", "  let a0 = relu(x)"]
    lines += [f"  let a{i} = relu(a{i - 1})" for i in range(1, n)]
    path = _write(tmp_path, _model("\n".join(lines) + f"\n  output y = a{n - 1}"))
    start = time.process_time()
    run = run_cli("check", str(path))
    elapsed = time.process_time() - start
    assert run.code == 0, run.stderr
    assert f"{n} ops" in run.stdout
    assert elapsed < 40, f"{n} lets took {elapsed:.1f} s of CPU"
