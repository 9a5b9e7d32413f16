"""`dslc fmt`: the canonical layout (docs/LANGUAGE.md §2.7) is idempotent, keeps comments and
blank-line groups, never changes the program (the syntax tree reads the same), and `--check`
exits as documented."""

from __future__ import annotations

import os
import random
import stat
from pathlib import Path

import pytest

from dslc.diag.diagnostic import Sink
from dslc.fuzz.choices import Choices
from dslc.fuzz.generate import generate
from dslc.parse import fmt
from dslc.parse.dump import format_module
from dslc.parse.fmt import FormatError, format_text
from dslc.parse.lalr import Tok
from dslc.parse.parser import parse_text
from tests.conftest import ROOT
from tests.helpers import note_seed, run_cli

SHIPPED = [*sorted((ROOT / "models").glob("*.cgraph")), ROOT / "dslc" / "std" / "nn.cgraph"]


def _fmt(text: str) -> str:
    sink = Sink()
    out = format_text(text, "t.cgraph", sink)
    assert out is not None, [d.message for d in sink.diagnostics]
    return out


def _tree(text: str) -> str:
    """The syntax tree without source positions, docs included."""
    sink = Sink()
    module = parse_text(text, "t.cgraph", sink)
    assert module is not None, [d.message for d in sink.diagnostics]
    return format_module(module, positions=False)


@pytest.mark.parametrize("path", SHIPPED, ids=[p.name for p in SHIPPED])
def test_shipped_sources_are_in_the_canonical_layout(path: Path) -> None:
    text = path.read_text()
    assert _fmt(text) == text


MESSY = """cgraph   0.1
# the file's comment
import "std/nn.cgraph"   as nn # trailing on an import
# doc of f
def f(x : [ * L , D ] , k : int = 1 ,
  y: f16 [N,D]@NHWC) -> [ *L , D ]{ return x+ -y [0 : 2 ,:]
}
def g(x: [N]) -> [N] {


  # first in the block

  let a=x*2   # one
  let bbb = a+1 # two
  let (s,ss)=genstats(x)
  let c: f16 = -a if true else a
  let d = foo(a,
      b, # inside
      c)
  let e = bar(
      a,
        # a line of its own
      b
  )
  return nn.linear( x , out = 3 )[ : , 1 : ]

  # last in the block

}
model m(version = "1") { precision io=f16,intermediate=f32 dim N = 1 .. 64 align 8 tune [1,8,]
input x:[N] let
  y = repeat 3 g(x) as "g.{i}" when not (1 == 2) and true
output z = y }
# the end
"""

CANONICAL = """cgraph 0.1
# the file's comment
import "std/nn.cgraph" as nn                  # trailing on an import

# doc of f
def f(x: [*L, D], k: int = 1,
      y: f16[N, D] @NHWC) -> [*L, D] {
  return x + -y[0:2, :]
}

def g(x: [N]) -> [N] {
  # first in the block

  let a   = x * 2                             # one
  let bbb = a + 1                             # two
  let (s, ss) = genstats(x)
  let c: f16 = -a if true else a
  let d = foo(a,
              b,                              # inside
              c)
  let e = bar(
      a,
      # a line of its own
      b
  )
  return nn.linear(x, out=3)[:, 1:]

  # last in the block
}

model m(version="1") {
  precision io=f16, intermediate=f32
  dim N = 1..64 align 8 tune [1, 8]
  input x: [N]
  let y = repeat 3 g(x) as "g.{i}" when not (1 == 2) and true
  output z = y
}

# the end
"""


def test_messy_source_takes_the_canonical_layout() -> None:
    assert _fmt(MESSY) == CANONICAL


def test_formatting_is_idempotent_and_keeps_the_tree() -> None:
    assert _fmt(CANONICAL) == CANONICAL
    assert _tree(CANONICAL) == _tree(MESSY)


def test_comments_and_blank_line_groups_are_kept() -> None:
    text = ("model m {\n  input x: [4]\n  # about a\n  let a = relu(x)\n\n\n\n"
            "  let b = a  # why b\n\n  # before the output\n  output y = b\n}\n")
    assert _fmt(text) == ("model m {\n  input x: [4]\n  # about a\n  let a = relu(x)\n\n"
                          "  let b = a                                   # why b\n\n"
                          "  # before the output\n  output y = b\n}\n")


def test_defs_and_models_are_set_apart_with_their_docs() -> None:
    text = ("def f(x: [N]) -> [N] {\n  return x\n}\n# doc of g\ndef g(x: [N]) -> [N] {\n"
            "  return x\n}\nmodel m {\n  input x: [2]\n  output y = g(x)\n}\n")
    out = _fmt(text)
    assert out == ("def f(x: [N]) -> [N] {\n  return x\n}\n\n# doc of g\ndef g(x: [N]) -> [N] {\n"
                   "  return x\n}\n\nmodel m {\n  input x: [2]\n  output y = g(x)\n}\n")
    assert "doc='doc of g'" in _tree(out)


def test_line_breaks_are_kept_only_where_a_line_may_break() -> None:
    text = ("model m {\n  input x: [4]\n  let\n    a = relu(x\n    ) +\n    x\n"
            "  output y: [4] =\n      a\n}\n")
    assert _fmt(text) == ("model m {\n  input x: [4]\n  let a = relu(x\n  ) +\n      x\n"
                          "  output y: [4] =\n      a\n}\n")


def test_statements_on_one_line_get_a_line_each() -> None:
    assert _fmt("model m { input x: [1] output y = x }") == (
        "model m {\n  input x: [1]\n  output y = x\n}\n")


def test_aligned_lets_stop_at_a_comment_line_or_a_longer_statement() -> None:
    text = ("model m {\n  input x: [4]\n  let a = x\n  let bb = x\n  # gap\n  let ccc = x\n"
            "  let d = foo(x,\n    x)\n  let eeee = x\n  output y = a + bb + ccc + d + eeee\n}\n")
    out = _fmt(text)
    assert "  let a  = x\n  let bb = x\n  # gap\n  let ccc = x\n  let d = foo(x,\n" in out
    assert "              x)\n  let eeee = x\n" in out


def test_a_trailing_comma_goes_unless_the_bracket_has_its_line() -> None:
    text = "model m {\n  dim N = 1..8 tune [1, 8,]\n  input x: [N,]\n  output y = f(\n    x,\n  )\n}\n"
    out = _fmt(text)
    assert "tune [1, 8]" in out and "input x: [N]" in out and "      x,\n  )" in out


def test_crlf_and_tabs_are_normalised() -> None:
    assert _fmt("model m {\r\n\tinput x: [1]\t# c\r\n\toutput y = x\r\n}\r\n") == (
        "model m {\n  input x: [1]                                # c\n  output y = x\n}\n")


def test_an_empty_file_stays_empty() -> None:
    assert _fmt("") == ""
    assert _fmt("\n\n# only a comment\n\n") == "# only a comment\n"


# Separators put between the tokens of a generated program: blanks, line breaks, blank lines,
# comments at the end of a line and on lines of their own.
SEPARATORS = [" ", " ", "  ", "\t", "\n", "\n\n", "\r\n", " # note\n", "\n  # own line\n",
              "\n\n# apart\n\n"]


def _mangled(text: str, rng: random.Random) -> str:
    """The same tokens, with any separator between them. A `def` or `model` keeps starting its
    line, so that the comment lines above it stay its doc."""
    tokens: list[Tok] = []
    assert parse_text(text, "t.cgraph", Sink(), tokens=tokens) is not None
    out = []
    for i, tok in enumerate(tokens):
        nxt = tokens[i + 1][0] if i + 1 < len(tokens) else ""
        choices = [s for s in SEPARATORS if "\n" in s] if nxt in ("DEF", "MODEL") else SEPARATORS
        out.append(tok[1] + rng.choice(choices))
    return "".join(out)


@pytest.mark.parametrize("seed", range(0, 120, 3))
def test_generated_programs_format_idempotently_to_the_same_tree(seed: int) -> None:
    source = generate(Choices(note_seed("program", seed))).source()
    rng = random.Random(seed)
    for text in (source, _mangled(source, rng), _mangled(source, rng)):
        out = _fmt(text)
        assert _fmt(out) == out, text
        assert _tree(out) == _tree(text), text


def test_a_formatter_bug_is_an_internal_error_and_writes_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "m.cgraph"
    path.write_text("model m {input x: [1] output y = x}\n")
    monkeypatch.setattr(fmt._Layout, "render", lambda self: "model m {\n}\n")
    with pytest.raises(FormatError):
        format_text(path.read_text(), "m.cgraph", Sink())
    r = run_cli("fmt", str(path))
    assert r.code == 4 and "internal error" in r.stderr
    assert path.read_text() == "model m {input x: [1] output y = x}\n"


# ---- the command ---------------------------------------------------------------------------


def test_check_passes_on_the_shipped_sources() -> None:
    r = run_cli("fmt", "--check", "models/", "dslc/std/")
    assert r.code == 0, r.stdout + r.stderr
    assert r.stdout == "" and r.stderr == f"{len(SHIPPED)} files already formatted\n"


def test_check_names_each_file_that_would_change_and_changes_none(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    ugly, tidy = tmp_path / "sub" / "ugly.cgraph", tmp_path / "tidy.cgraph"
    ugly.write_text("model m {input x: [1] output y = x}\n")
    tidy.write_text("model m {\n  input x: [1]\n  output y = x\n}\n")
    r = run_cli("fmt", "--check", str(tmp_path))
    assert r.code == 1
    assert r.stdout == f"would reformat {ugly}\n"
    assert "1 file would be reformatted, 1 file already formatted" in r.stderr
    assert ugly.read_text() == "model m {input x: [1] output y = x}\n"


def test_fmt_rewrites_in_place_keeping_the_file_mode(tmp_path: Path) -> None:
    path = tmp_path / "m.cgraph"
    path.write_text("model m {input x: [1] output y = x}\n")
    os.chmod(path, 0o640)
    r = run_cli("fmt", str(path))
    assert r.code == 0 and r.stdout == f"reformatted {path}\n"
    assert path.read_text() == "model m {\n  input x: [1]\n  output y = x\n}\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    assert run_cli("fmt", "--check", str(path)).code == 0


def test_a_syntax_error_is_a_diagnostic_with_its_span_and_exit_one(tmp_path: Path) -> None:
    bad = tmp_path / "bad.cgraph"
    bad.write_text("model m {\n  let x = \n}\n")
    good = tmp_path / "good.cgraph"
    good.write_text("model m {input x: [1] output y = x}\n")
    r = run_cli("fmt", str(bad), str(good))
    assert r.code == 1
    assert "error[E0101]" in r.stderr and f"{bad}:3:1" in r.stderr and "Traceback" not in r.stderr
    assert bad.read_text() == "model m {\n  let x = \n}\n"
    assert good.read_text().startswith("model m {\n  input x")  # the others are still formatted
    json = run_cli("fmt", "--check", "--error-format", "json", str(bad))
    assert json.code == 1 and json.json_lines()[0]["code"] == "E0101"


@pytest.mark.parametrize("make", ["missing", "empty folder", "not utf-8"])
def test_an_unreadable_input_is_a_usage_error(tmp_path: Path, make: str) -> None:
    path = tmp_path / "x.cgraph"
    if make == "empty folder":
        path.mkdir()
    elif make == "not utf-8":
        path.write_bytes(b"model m \xff {}\n")
    r = run_cli("fmt", "--check", str(path))
    assert r.code == 2 and r.stderr.startswith("error: ") and "Traceback" not in r.stderr


def test_standard_input_to_standard_output(monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO("model m {input x: [1] output y = x}"))
    r = run_cli("fmt", "-")
    assert (r.code, r.stdout) == (0, "model m {\n  input x: [1]\n  output y = x\n}\n")
    monkeypatch.setattr("sys.stdin", io.StringIO("model m {input x: [1] output y = x}"))
    assert run_cli("fmt", "--check", "-").code == 1
