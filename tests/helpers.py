"""Helpers for tests: check a `.cgraph` snippet in memory, run the CLI in-process, random inputs
from seeds that are the same in every process and are printed when a test fails, and the
tolerance of two runs of a model at a storage precision."""

from __future__ import annotations

import io
import json
import math
import zlib
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


Said = tuple[str, str, str, str, tuple[tuple[str, str], ...], tuple[str, ...], tuple[str, ...]]


def span_text(source: str, span: Any) -> str:
    """The source text a one-line span covers."""
    assert span.line == span.end_line
    return source.splitlines()[span.line - 1][span.col - 1:span.end_col - 1]


def whole(d: Diagnostic, source: str) -> Said:
    """A diagnostic whole, as a user reads it: code, message, the text it points at, its label,
    the secondary labels as (text, the text each points at), notes and help."""
    return (d.code, d.message, span_text(source, d.span), d.label,
            tuple((label.text, span_text(source, label.span)) for label in d.labels),
            d.notes, d.help)


def deviceless_program(text: str, tmp_path: Path) -> tuple[CheckedModel, Any]:
    """The checked model of `text` and its bundle, compiled deviceless for the H200 profile,
    written and read back as the runtime's `Schedule`."""
    from dslc.backend.target import load_target
    from dslc.compile.stage import compile_model
    from dslc.emit import bundle as emit_bundle
    from dslc.pipeline import lower_and_fuse
    from dslc.runtime.bundle import read
    from dslc.runtime.schedule import Schedule

    model = check_source(text, tmp_path).model
    lowered, plan = lower_and_fuse(model)
    path = tmp_path / "m.bundle"
    emit_bundle.write(path, emit_bundle.payload(compile_model(model, lowered, plan,
                                                              load_target("h200"))))
    return model, Schedule(read(path))


def matmuls_as_kernels(bundle: Any) -> tuple[Any, int]:
    """The bundle with every step a matmul kernel computes (`Schedule.matmul_kernel`: the
    few-row kernel, or cuBLASLt past its rows) made that kernel at every bucket, whatever it
    measures (its graph timed 1.0 ms, the kernel 0.5 here), and how many such steps."""
    from dslc.runtime.schedule import Schedule
    from dslc.tune.fusion import KernelMeasured, with_fusion

    program = Schedule(bundle)
    measured = []
    for step in program.steps:
        if program.matmul_kernel(step) is not None:
            m = KernelMeasured(step)
            for b in bundle.buckets:
                m.graph_ms[b.key], m.kernel_ms[b.key] = 1.0, 0.5
            measured.append(m)
    return with_fusion(bundle, [], measured), len(measured)


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


# -- comparing runs at a storage precision -----------------------------------------------------
# The unit roundoff u of a storage dtype: round to nearest moves a value by at most u relative.
UNIT_ROUNDOFF = {"f32": 2.0**-24, "f16": 2.0**-11, "bf16": 2.0**-8}
# Ops whose result is one of their operands' values (or a rearrangement): they round nothing.
EXACT_OPS = frozenset({"input", "param", "scalar", "view", "reshape", "transpose", "slice",
                       "contiguous", "relu", "maxpool", "concat", "neg", "abs"})
# Higham and Mary's probabilistic bound: n roundings, independent with mean zero, each a relative
# error of at most u, stay within LAMBDA * sqrt(n) * u with probability 1 - 2 * exp(-LAMBDA**2 / 2)
# or more (LAMBDA = 4: 1 - 7e-4).
LAMBDA = 4.0


def rounding_depth(graph: Any) -> int:
    """The most storage roundings on any path from an input to an output of a checked graph when
    each op rounds its result (PyTorch run op by op does; dslc rounds at a subset of those points,
    the outputs of its fused groups)."""
    depth: dict[str, int] = {}
    for node in graph.nodes:
        before = max((depth[i] for i in node.inputs), default=0)
        depth[node.name] = before + (node.op not in EXACT_OPS)
    return max(depth[value] for _, value in graph.outputs)


def precision_tolerance(dtype: str, depth: int) -> float:
    """How far two runs of one model at storage `dtype` may be apart (largest difference over the
    largest value): where both round the same value the same way the errors cancel, so their
    difference is at most the roundings of one of them, `depth`, bounded as above."""
    return LAMBDA * math.sqrt(depth) * UNIT_ROUNDOFF[dtype]


def rel_error(a: Any, b: Any) -> float:
    """Largest |a - b| over largest |b|."""
    a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert a64.shape == b64.shape, (a64.shape, b64.shape)
    return float(np.abs(a64 - b64).max() / max(np.abs(b64).max(), 1e-30))


def nvrtc_compile(source: str, arch: str = "sm_90") -> tuple[bool, str]:
    """A CUDA source compiled by NVRTC for `arch` (no GPU needed) with ptxas's resource report:
    (whether it compiled, the log)."""
    from cuda.bindings import nvrtc

    _, prog = nvrtc.nvrtcCreateProgram(source.encode(), b"kernel.cu", 0, [], [])
    options = [f"--gpu-architecture={arch}".encode(), b"--ptxas-options=-v"]
    (result,) = nvrtc.nvrtcCompileProgram(prog, len(options), options)
    _, size = nvrtc.nvrtcGetProgramLogSize(prog)
    log = b" " * size
    nvrtc.nvrtcGetProgramLog(prog, log)
    nvrtc.nvrtcDestroyProgram(prog)
    return result == nvrtc.nvrtcResult.NVRTC_SUCCESS, log.decode(errors="replace")
