"""The documentation stays true: every `cgraph` example in docs/ checks clean and is in the
canonical layout (`dslc fmt`), and the grammar printed in docs/LANGUAGE.md is the grammar dslc
uses."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dslc.diag.diagnostic import Sink
from dslc.parse.fmt import format_text
from dslc.parse.grammar import grammar_text
from dslc.pipeline import Options, front_end
from tests.conftest import ROOT

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"```cgraph\n(.*?)```", re.S)
EXAMPLES = [(doc, i, text) for doc in DOCS for i, text in enumerate(BLOCK.findall(doc.read_text()))]


@pytest.mark.parametrize("doc, index, text", EXAMPLES,
                         ids=[f"{d.name}-{i}" for d, i, _ in EXAMPLES])
def test_cgraph_example_checks_clean(doc: Path, index: int, text: str, tmp_path: Path) -> None:
    path = tmp_path / f"example{index}.cgraph"
    path.write_text(text)
    sink = Sink()
    front_end(path, Options(include_dirs=[ROOT / "models"]), sink)
    assert not sink.diagnostics, f"{doc.name} example {index}: {[d.message for d in sink.diagnostics]}"


def test_the_docs_have_examples_to_check() -> None:
    assert len({doc for doc, _, _ in EXAMPLES}) >= 2  # README.md and docs/LANGUAGE.md at least


def test_language_doc_prints_the_real_grammar() -> None:
    doc = (ROOT / "docs" / "LANGUAGE.md").read_text()
    assert grammar_text() in doc


@pytest.mark.parametrize("doc, index, text", EXAMPLES,
                         ids=[f"{d.name}-{i}" for d, i, _ in EXAMPLES])
def test_cgraph_example_is_in_the_canonical_layout(doc: Path, index: int, text: str) -> None:
    sink = Sink()
    assert format_text(text, f"{doc.name} example {index}", sink) == text, sink.diagnostics
