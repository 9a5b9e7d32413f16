"""The grammar of `.cgraph` (grammar/cgraph.lark) and what Lark compiles from it: the Lark
parser (for its terminals' spellings and lexer) and the LALR(1) tables `parse.lalr` runs."""

from __future__ import annotations

from functools import cache
from importlib import resources
from pathlib import Path

from lark import Lark

from dslc.parse.lalr import Tables

GRAMMAR_NAME = "cgraph.lark"


def grammar_text() -> str:
    """The grammar: packaged inside the wheel as `dslc/grammar/`, or `grammar/` in a checkout."""
    packaged = resources.files("dslc").joinpath("grammar", GRAMMAR_NAME)
    if packaged.is_file():
        return packaged.read_text(encoding="utf-8")
    return (Path(__file__).resolve().parents[2] / "grammar" / GRAMMAR_NAME).read_text(encoding="utf-8")


@cache
def lark_parser() -> Lark:
    # cache=True keeps the LALR tables in the temp folder: building them costs ~0.2 s a process.
    return Lark(grammar_text(), parser="lalr", lexer="contextual", maybe_placeholders=True,
                cache=True)


@cache
def tables() -> Tables:
    return Tables.from_lark(lark_parser())


@cache
def keywords() -> frozenset[str]:
    """The words an identifier cannot be (`let`, `input`, the dtypes, ...)."""
    return frozenset(tables().keywords["NAME"])
