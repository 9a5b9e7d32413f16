"""Helpers for tests: check a `.cgraph` snippet in memory, run the CLI in-process."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path

from dslc.check.checker import CheckedModel
from dslc.cli import main
from dslc.diag.diagnostic import Diagnostic, Sink
from dslc.pipeline import FrontEnd, Options, front_end


@dataclass
class Checked:
    result: FrontEnd
    diagnostics: list[Diagnostic]

    @property
    def model(self) -> CheckedModel:
        assert self.result.model is not None, [d.message for d in self.diagnostics]
        return self.result.model

    @property
    def codes(self) -> list[str]:
        return [d.code for d in self.diagnostics]


def check_source(text: str, tmp_path: Path, name: str = "snippet.cgraph") -> Checked:
    """Check `text` as a file in `tmp_path` (imports resolve next to it, then in std/)."""
    path = tmp_path / name
    path.write_text(text)
    sink = Sink()
    result = front_end(path, Options(), sink)
    return Checked(result, list(sink.diagnostics))


def model_snippet(body: str, header: str = "", precision: str = "io=f32") -> str:
    """A model with `body` as its statements (and `header` before it: imports, defs)."""
    return f'{header}\nmodel m {{\n  precision {precision}\n{body}\n}}\n'


@dataclass
class Run:
    code: int
    stdout: str
    stderr: str

    def json_lines(self) -> list[dict[str, object]]:
        return [json.loads(line) for line in self.stdout.splitlines() if line.strip()]


def run_cli(*args: str) -> Run:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(list(args))
    return Run(code, out.getvalue(), err.getvalue())
