"""dslc's LALR loop (`parse.lalr`) against Lark's own parser on the same tables: for every file of
the corpus and a few thousand token-level mutants of it (the fuzzer's mutator, fixed seeds), both
build the same tree, or both stop at the same token with the same accepted terminals. Lark is the
independent oracle; the one known difference is a keyword glued to a word (`letter`), which Lark's
contextual lexer splits where the keyword alone fits, and which dslc reads as one identifier.
"""

from __future__ import annotations

import dataclasses
import re
import zlib
from typing import Any

import pytest
from lark import Lark, Token, Tree, UnexpectedCharacters, UnexpectedInput, UnexpectedToken

from dslc.diag.records import quick_init
from dslc.parse import lalr
from dslc.parse.grammar import grammar_text, tables
from tests.conftest import ROOT
from tests.test_fuzz import Mutator, corpus, corpus_pool

MUTANTS_PER_FILE = 300


class _TreeBuilder:
    """Builds what Lark's tree would be: (rule, children), tokens as (type, text, line, col)."""

    def __getattr__(self, rule: str) -> Any:
        return lambda children: (rule, list(children))


def _from_lark(node: Any) -> Any:
    if isinstance(node, Tree):
        return (str(node.data), [_from_lark(c) for c in node.children])
    assert isinstance(node, Token)
    return (node.type, str(node), node.line, node.column)


@pytest.fixture(scope="module")
def oracle() -> Lark:
    return Lark(grammar_text(), parser="lalr", lexer="contextual", keep_all_tokens=True,
                maybe_placeholders=False)


def _outcome(parse: Any) -> Any:
    try:
        return ("tree", parse())
    except UnexpectedToken as err:
        tok = err.token
        return ("token", tok.type, str(tok), tok.line, tok.column, frozenset(err.accepts or ()))
    except UnexpectedCharacters as err:
        return ("characters", err.line, err.column, frozenset(err.allowed or ()))


def _glued_keyword(ours: Any) -> bool:
    """Whether our outcome is the one accepted difference: we stop at an identifier that starts
    with a keyword (Lark would have split it)."""
    words = {str(t.pattern.value) for t in tables().terminals.values()
             if re.fullmatch(r"[a-z][a-z0-9]*", str(t.pattern.value))}
    return ours[0] == "token" and ours[1] == "NAME" and any(
        ours[2].startswith(w) and ours[2] != w for w in words)


def _cases() -> list[tuple[str, str]]:
    pool = corpus_pool()
    out = []
    for source in [*corpus(), *sorted((ROOT / "tests" / "diagnostics").glob("*.cgraph"))]:
        text = source.read_text()
        out.append((source.name, text))
        if source in corpus():
            mutator = Mutator(text, pool, zlib.crc32(source.name.encode()) + 1)
            out += [(f"{source.name}#{i}", mutator.mutant()[0]) for i in range(MUTANTS_PER_FILE)]
    return out


def test_the_loop_agrees_with_larks_parser(oracle: Lark) -> None:
    differences = []
    cases = _cases()
    for name, text in cases:
        ours = _outcome(lambda t=text: lalr.parse(tables(), t, _TreeBuilder()))
        theirs = _outcome(lambda t=text: _from_lark(oracle.parse(t)))
        if ours != theirs and not _glued_keyword(ours):
            differences.append((name, ours if ours[0] != "tree" else "tree",
                                theirs if theirs[0] != "tree" else "tree"))
    assert not differences, f"{len(differences)} of {len(cases)} differ: {differences[:3]}"
    assert len(cases) > 2000


def test_a_keyword_glued_to_a_word_is_one_identifier() -> None:
    with pytest.raises(UnexpectedInput) as caught:
        lalr.parse(tables(), "model m {\n  letter = relu(x)\n}\n", _TreeBuilder())
    assert isinstance(caught.value, UnexpectedToken)
    assert (caught.value.token.type, str(caught.value.token)) == ("NAME", "letter")


def test_nesting_takes_no_stack() -> None:
    depth = 200_000
    text = f"model m {{ output y = {'-' * depth}{'(' * depth}x{')' * depth} }}"
    tree = lalr.parse(tables(), text, _TreeBuilder())
    assert tree[0] == "start"


@quick_init
@dataclasses.dataclass(frozen=True, slots=True)
class _Point:
    x: int
    y: int = 7


def test_quick_init_keeps_a_frozen_dataclass_frozen() -> None:
    p = _Point(1)
    assert (p.x, p.y) == (1, 7) and p == _Point(1, 7) and hash(p) == hash(_Point(1, 7))
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.x = 2  # type: ignore[misc]
