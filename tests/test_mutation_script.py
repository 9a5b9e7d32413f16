"""scripts/mutation.py's guard for runs elsewhere: the digest a device call compares with the one
made with its mutants (a source or test edit in between cost session 20 its device calls)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest


def _script() -> ModuleType:
    path = Path(__file__).resolve().parents[1] / "scripts" / "mutation.py"
    spec = importlib.util.spec_from_file_location("mutation_script", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("edited", ["dslc/ops/a.py", "tests/test_a.py", "grammar/g.lark"])
def test_the_carried_code_digest_changes_with_the_code_the_grammar_and_the_tests(
        edited: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mutation = _script()
    monkeypatch.setattr(mutation, "ROOT", tmp_path)
    for name in ("dslc/ops/a.py", "tests/test_a.py", "grammar/g.lark", "docs/x.md"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("one\n")
    before = mutation.code_digest()
    (tmp_path / "dslc/ops/__pycache__").mkdir()
    (tmp_path / "dslc/ops/__pycache__/a.pyc").write_bytes(b"\0")  # compiled: not the code
    (tmp_path / "docs/x.md").write_text("two\n")  # not what a run reads
    assert mutation.code_digest() == before
    (tmp_path / edited).write_text("two\n")
    assert mutation.code_digest() != before


def test_every_group_s_modules_are_among_those_mutmut_may_mutate() -> None:
    """A group's module missing from pyproject's `only_mutate` would be skipped without a word
    (or, a group's only one, leave mutmut mutating every module: session 32's first run)."""
    mutation = _script()
    _, files = mutation.scope()
    for group, (globs, _) in mutation.GROUPS.items():
        assert mutation.unlisted(globs, files) == [], group
    assert mutation.unlisted(["dslc/runtime/schedule.py", "dslc/nowhere.py"],
                             files) == ["dslc/nowhere.py"]
