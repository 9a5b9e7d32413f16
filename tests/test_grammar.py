"""The grammar is LALR(1) without conflicts, and the parser keeps what the language needs."""

from __future__ import annotations

from pathlib import Path

import pytest
from lark import Lark

from dslc.diag.diagnostic import Sink
from dslc.parse import ast
from dslc.parse.grammar import grammar_text
from dslc.parse.parser import parse_text
from dslc.parse.syntax import CATALOGUE


def test_grammar_builds_in_strict_mode() -> None:
    # strict=True turns silent shift/reduce resolutions and terminal collisions into errors.
    Lark(grammar_text(), parser="lalr", lexer="contextual", strict=True)


def _parse(text: str) -> tuple[ast.Module | None, Sink]:
    sink = Sink()
    return parse_text(text, "t.cgraph", sink), sink


def test_dtype_keyword_prefix_stays_one_identifier() -> None:
    module, sink = _parse("model m { input f16_x: f16[4]\n output y = relu(f16_x) }")
    assert module is not None and not sink.diagnostics
    stmt = module.models[0].body[0]
    assert isinstance(stmt, ast.Input) and stmt.name.name == "f16_x"


def test_range_lexes_with_two_dots() -> None:
    module, _ = _parse("model m { dim N = 1..64 align 8 tune [8, 64] }")
    assert module is not None
    dim = module.models[0].body[0]
    assert isinstance(dim, ast.DimRange)
    assert (dim.lo.value, dim.hi.value, dim.align.value if dim.align else None) == (1, 64, 8)


def test_spans_are_one_based_and_end_exclusive() -> None:
    module, _ = _parse("model m {\n  input xy: [4]\n}")
    assert module is not None
    stmt = module.models[0].body[0]
    assert isinstance(stmt, ast.Input)
    assert (stmt.name.span.line, stmt.name.span.col, stmt.name.span.end_col) == (2, 9, 11)


def test_comment_block_above_a_def_is_its_doc() -> None:
    module, _ = _parse("# first line\n# second line\ndef f(x: [N]) -> [N] { return x }\n")
    assert module is not None and module.defs[0].doc == "first line\nsecond line"


def test_trailing_commas_are_accepted() -> None:
    module, sink = _parse("def f(x: [N,], k: int = 1,) { return x }\n"
                          "model m { dim N = 1..4 tune [1, 4,]\n input x: [N,]\n"
                          " output y = f(x, k=2,) }")
    assert module is not None and not sink.diagnostics


@pytest.mark.parametrize("mistake", CATALOGUE, ids=lambda m: m.name)
def test_each_catalogued_mistake_gets_its_curated_message(mistake) -> None:  # type: ignore[no-untyped-def]
    module, sink = _parse(mistake.example)
    assert module is None
    [diag] = sink.diagnostics
    assert diag.code == mistake.code
    assert diag.help, mistake.name


def test_every_example_model_parses() -> None:
    root = Path(__file__).resolve().parents[1]
    for path in [*root.glob("models/*.cgraph"), root / "dslc/std/nn.cgraph"]:
        module, sink = _parse(path.read_text())
        assert module is not None, (path, [d.message for d in sink.diagnostics])
