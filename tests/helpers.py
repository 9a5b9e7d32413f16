"""Helpers for tests: check a `.cgraph` snippet in memory, run the CLI in-process, and random
inputs from seeds that are the same in every process and are printed when a test fails."""

from __future__ import annotations

import io
import json
import zlib
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path

import numpy as np

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


# The seeds the running test drew random inputs from; conftest prints them under a failure and
# clears the list after each test.
SEEDS: list[str] = []


def seed_of(*key: object) -> int:
    """A seed for `key` that is the same in every process (Python's `hash()` of a string is
    salted per process, so it cannot seed reproducible inputs)."""
    text = repr(key)
    assert " at 0x" not in text, f"a seed key must not hold an object address: {text}"
    return zlib.crc32(text.encode())


def note_seed(what: str, seed: int) -> int:
    """Record a seed used outside `rng` (e.g. `random_weights(..., seed)`), so a failure names it."""
    SEEDS.append(f"{what}: seed {seed}")
    return seed


def rng(*key: object) -> np.random.Generator:
    """A numpy generator seeded from `key` (one int is used as the seed itself); the seed is
    reported with any failure of the test: `np.random.default_rng(SEED)` reproduces the inputs."""
    seed = key[0] if len(key) == 1 and isinstance(key[0], int) else seed_of(*key)
    note_seed(f"np.random.default_rng for {key!r}", seed)
    return np.random.default_rng(seed)
