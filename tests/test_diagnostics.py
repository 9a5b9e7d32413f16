"""Golden ("UI") tests of diagnostics: each `tests/diagnostics/<CODE>_<case>.cgraph` is checked,
and the human and JSON renderings must equal the `.stderr` and `.json` files beside it
(`pytest --bless` rewrites them). A `#~ CODE` comment marks each line where a diagnostic of
that code must start, so the expectation sits next to its cause."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dslc.diag.codes import CODES, RETIRED
from tests.conftest import ROOT
from tests.helpers import run_cli

CASE_DIR = ROOT / "tests" / "diagnostics"
CASES = sorted(CASE_DIR.glob("*.cgraph"))
MARK = re.compile(r"#~\s*((?:[EW]\d{4}\s*)+)")


def _golden(path: Path, actual: str, bless: bool) -> None:
    if bless:
        path.write_text(actual)
        return
    assert path.exists(), f"missing {path.name}: run `pytest --bless` to create it"
    assert actual == path.read_text(), f"{path.name} differs (update with `pytest --bless`)"


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.stem)
def test_diagnostic_golden(case: Path, bless: bool) -> None:
    rel = case.relative_to(ROOT).as_posix()
    human = run_cli("check", "--color", "never", "-I", "tests/diagnostics/lib", rel)
    js = run_cli("check", "--error-format", "json", "-I", "tests/diagnostics/lib", rel)
    assert human.code == js.code
    _golden(case.with_suffix(".stderr"), human.stderr, bless)
    _golden(case.with_suffix(".json"), js.stdout, bless)
    marks = set()
    for lineno, line in enumerate(case.read_text().splitlines(), start=1):
        m = MARK.search(line)
        if m:
            marks.update((lineno, code) for code in m.group(1).split())
    found = {(d["span"]["line"], d["code"]) for d in js.json_lines()  # type: ignore[index]
             if d["span"]["file"] == rel}  # type: ignore[index]
    assert found == marks, f"diagnostics at (line, code) {sorted(found)}, marked {sorted(marks)}"
    expected_code = case.stem.split("_")[0]
    assert any(d["code"] == expected_code for d in js.json_lines()), (
        f"{case.name} is named for {expected_code} but does not report it")


def test_every_front_end_code_has_a_golden_case() -> None:
    covered = {p.stem.split("_")[0] for p in CASES}
    # W0202 and W0203 are about a weight file, not the source: tests/test_weight_checks.py and
    # tests/test_weights.py; E09 about an ONNX model: tests/test_diagnostics_onnx.py
    wanted = {c for c in CODES if c[0] in "EW" and not c.startswith(("E08", "E09"))
              and c not in ("W0202", "W0203")}
    wanted -= RETIRED
    assert wanted - covered == set(), f"codes without a golden case: {sorted(wanted - covered)}"


def test_rendered_diagnostics_show_no_traceback_or_internal_path() -> None:
    package = str(ROOT / "dslc")
    rendered = sorted(CASE_DIR.glob("*.stderr"))
    assert len(rendered) == len(CASES)
    for expected in rendered:
        text = expected.read_text() + expected.with_suffix(".json").read_text()
        assert "Traceback" not in text, expected.name
        assert package not in text and "site-packages" not in text, expected.name
        assert "/dslc/" not in text, expected.name
