"""The long explanations of `dslc explain CODE` (`dslc/diag/explanations/CODE.md`).

Every registered code has one; it starts with `# CODE: title`; `dslc explain` prints it. Its
```cgraph examples are checked: a block after a line `Erroneous example:` must report the code,
a block after a line `Fixed...:` must check clean (no diagnostic at all). A block may hold several
files, each started by a line `# file: NAME`; the first file is the one checked. Run-time (R) and
backend (E08) codes have no checker path: their examples are ```text blocks and are not run.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import get_args

import pytest

from dslc.diag import codes
from dslc.diag.codes import CODES, RETIRED
from dslc.diag.diagnostic import Diagnostic
from tests.helpers import Checked, check_source, run_cli

EXPLANATIONS = Path(codes.__file__).parent / "explanations"
FENCE = re.compile(r"^```(\S*)\s*$")
FILE_MARK = re.compile(r"^# file: (\S+)\s*$")
ERRONEOUS = "Erroneous example:"


def _prose_only(code: str) -> bool:
    """Codes that `dslc check` cannot report: run-time errors, backend support, models imported
    from ONNX, and warnings about the values in a weight file."""
    return code.startswith(("R", "E08", "E09")) or code in ("W0202", "W0203")


@dataclass(frozen=True)
class Block:
    label: str  # the last non-blank line before the fence
    info: str  # the fence's info string
    text: str
    line: int  # 1-based line of the opening fence

    @property
    def kind(self) -> str:
        if self.label == ERRONEOUS:
            return "erroneous"
        if self.label.startswith("Fixed") and self.label.endswith(":"):
            return "fixed"
        return "other"


def _blocks(text: str) -> list[Block]:
    lines = text.splitlines()
    out: list[Block] = []
    label = ""
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if m is None:
            if lines[i].strip():
                label = lines[i].strip()
            i += 1
            continue
        end = i + 1
        while end < len(lines) and not lines[end].startswith("```"):
            end += 1
        assert end < len(lines), f"unclosed code block at line {i + 1}"
        out.append(Block(label, m.group(1), "\n".join(lines[i + 1 : end]) + "\n", i + 1))
        label = ""
        i = end + 1
    return out


def _files(block: Block) -> list[tuple[str, str]]:
    """The files of an example: (name, text), the checked one first."""
    files: list[tuple[str, list[str]]] = []
    for line in block.text.splitlines():
        m = FILE_MARK.match(line)
        if m is not None:
            files.append((m.group(1), []))
            continue
        if not files:
            files.append(("example.cgraph", []))
        files[-1][1].append(line)
    return [(name, "\n".join(body) + "\n") for name, body in files]


def _text(code: str) -> str:
    path = EXPLANATIONS / f"{code}.md"
    assert path.is_file(), f"no explanation for {code}: write {path.name}"
    return path.read_text(encoding="utf-8")


ALL_CODES = sorted(CODES)
LIVE_CODES = [c for c in ALL_CODES if c not in RETIRED]


@pytest.mark.parametrize("code", ALL_CODES)
def test_explanation_exists_with_title(code: str) -> None:
    text = _text(code)
    first = text.splitlines()[0]
    assert first == f"# {code}: {CODES[code].title}", f"{code}.md starts with {first!r}"
    assert codes.explanation(code) == text


def test_the_code_type_lists_every_registered_code() -> None:
    # mypy checks codes against `CodeId`; the registry's titles must name the same codes.
    table = {line.split(" ", 1)[0] for line in codes._TABLE.strip().splitlines()}
    assert set(get_args(codes.CodeId)) == table == set(CODES)


def test_no_explanation_without_a_code() -> None:
    stray = {p.stem for p in EXPLANATIONS.glob("*.md")} - set(CODES)
    assert not stray, f"explanations for unregistered codes: {sorted(stray)}"


@pytest.mark.parametrize("code", LIVE_CODES)
def test_explanation_has_examples(code: str) -> None:
    blocks = _blocks(_text(code))
    kinds = [b.kind for b in blocks]
    assert "erroneous" in kinds, f"{code}.md has no block after `{ERRONEOUS}`"
    assert "fixed" in kinds, f"{code}.md has no block after a `Fixed:` line"
    for b in blocks:
        if _prose_only(code):
            assert b.info == "text", (
                f"{code}.md line {b.line}: {code} has no checker path, so its examples are "
                "```text blocks")
        else:
            assert b.info == "cgraph", f"{code}.md line {b.line}: examples are ```cgraph blocks"
            assert b.kind != "other", (
                f"{code}.md line {b.line}: a ```cgraph block must follow `{ERRONEOUS}` or "
                f"`Fixed:`, not {b.label!r}")


def _check(block: Block, tmp_path: Path) -> Checked:
    files = _files(block)
    for name, text in files[1:]:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    name, text = files[0]
    return check_source(text, tmp_path, name=name)


def _show(diags: Sequence[Diagnostic]) -> str:
    return "; ".join(f"{d.code} {d.message}" for d in diags) or "no diagnostics"


CHECKED_CODES = [c for c in LIVE_CODES if not _prose_only(c)]


@pytest.mark.parametrize("code", sorted(RETIRED))
def test_retired_code_is_explained_as_retired(code: str) -> None:
    assert "no longer reported" in _text(code)


@pytest.mark.parametrize("code", CHECKED_CODES)
def test_examples_check_as_documented(code: str, tmp_path: Path) -> None:
    blocks = [b for b in _blocks(_text(code)) if b.info == "cgraph"]
    assert {b.kind for b in blocks} >= {"erroneous", "fixed"}, f"{code}.md: nothing to check"
    for n, block in enumerate(blocks):
        where = tmp_path / f"example{n}"
        where.mkdir()
        checked = _check(block, where)
        if block.kind == "erroneous":
            assert code in checked.codes, (
                f"{code}.md line {block.line}: the erroneous example reports "
                f"{_show(checked.diagnostics)}")
            if code.startswith("W"):
                errors = [d for d in checked.diagnostics if d.is_error]
                assert not errors, (
                    f"{code}.md line {block.line}: a warning's example must compile: "
                    f"{_show(errors)}")
        elif block.kind == "fixed":
            assert not checked.diagnostics, (
                f"{code}.md line {block.line}: the fixed example reports "
                f"{_show(checked.diagnostics)}")


def test_explain_prints_the_explanation() -> None:
    run = run_cli("explain", "E0301")
    assert run.code == 0
    assert run.stdout.strip() == _text("E0301").strip()
    assert run.stdout.startswith("# E0301: incompatible shapes")


def test_explain_accepts_lower_case() -> None:
    run = run_cli("explain", "e0301")
    assert run.code == 0
    assert run.stdout.startswith("# E0301: incompatible shapes")


def test_explain_unknown_code() -> None:
    run = run_cli("explain", "E9999")
    assert run.code == 2
    assert run.stdout == ""
    assert "`E9999` is not a dslc diagnostic code" in run.stderr
