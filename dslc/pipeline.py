"""The spine of the compiler: parse -> check (`front_end`), lower -> fuse (`lower_and_fuse`),
then compile -> tune -> emit (`build`). Each stage is one function named after it in its own
package; this module chains them and returns what each made. The command line parses arguments
and renders these results: it runs no stage itself.

The back end (compile, tune, emit) needs the cuDNN frontend (the `cudnn` extra), so `build`
imports it when it runs: `dslc check` works without it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from dslc import fsutil, weights
from dslc.check.checker import CheckedModel, check
from dslc.check.dump import format_checked
from dslc.core.types import PrecisionSpec
from dslc.diag.diagnostic import Diagnostic, Failed, Sink
from dslc.fuse import FusionPlan, format_plan, fuse
from dslc.ir.graph import Graph
from dslc.ir.printer import format_graph
from dslc.ir.verify import verify as verify_ir
from dslc.lower import lower
from dslc.parse import ast
from dslc.parse.dump import format_module
from dslc.parse.loader import Program, load

if TYPE_CHECKING:
    from dslc.backend.target import Target
    from dslc.compile.stage import Compiled
    from dslc.runtime.tuningdb import TuningStore
    from dslc.tune import Report
    from dslc.tune.precision import Decision

STAGES = ("ast", "types", "ir", "fused")  # what `--dump` writes, as N.<stage>.txt


@dataclass
class Options:
    include_dirs: list[Path] = field(default_factory=list)
    precision: PrecisionSpec | None = None  # overrides the model's precision statements
    backend: str = "cudnn"  # "reference" lifts cuDNN's support limits (any well-typed model runs)
    fp8: bool = True  # False (`--fp8 off`): the model's fp8 requests are not applied


@dataclass
class FrontEnd:
    """What parse and check produced for one file."""

    program: Program
    module: ast.Module | None
    model: CheckedModel | None


def front_end(path: Path, options: Options, sink: Sink) -> FrontEnd:
    """`.cgraph` file -> parsed program and checked model (None for a library, or on errors)."""
    program = Program()
    try:
        return _front_end(path, options, sink, program)
    except Failed:  # --max-errors reached: report what was collected
        return FrontEnd(program, None, None)


def _front_end(path: Path, options: Options, sink: Sink, program: Program) -> FrontEnd:
    _, module = load(path, options.include_dirs, sink, program)
    # A file that did not parse, or an import not found, would make every name it should have
    # provided an error too; other errors (statement placement) still let checking go on, so
    # all errors of the file are reported at once.
    blocking = {"E0101", "E0102", "E0702", "E0703"}
    if module is None or any(d.code in blocking for d in sink.diagnostics):
        return FrontEnd(program, module, None)
    model = check(program, module, sink, options.precision, options.backend, options.fp8)
    return FrontEnd(program, module, model)


class IRVerifyError(Exception):
    """The IR a stage made fails the verifier (`--verify`): a bug in dslc, named by stage."""

    def __init__(self, stage: str, problems: list[str]) -> None:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        super().__init__(f"the IR after {stage} fails the verifier: {problems[0]}{more}")
        self.stage = stage
        self.problems = problems


def lower_and_fuse(model: CheckedModel, verify: bool = False) -> tuple[Graph, FusionPlan]:
    """Checked model -> lowered IR and its fusion plan; with `verify`, the IR verifier runs on
    the checked graph and after every lowering pass, and the first to fail is named
    (IRVerifyError)."""
    def verified(stage: str, graph: Graph) -> None:
        problems = verify_ir(graph, model.env)
        if problems:
            raise IRVerifyError(stage, problems)

    if verify:
        verified("check", model.graph)
    lowered = lower(model.graph, (lambda name, g: verified(f"the lowering pass `{name}`", g))
                    if verify else None, model.env)
    return lowered, fuse(lowered)


@dataclass
class TuneOptions:
    db: TuningStore | None  # the tuning database (None: none)
    budget_s: float = 20.0  # measuring per graph
    model_budget_s: float = 900.0  # for the whole model; the rest keep their plan
    search: str = "heuristics"  # or "exhaustive": also the engine x knob space
    gpus: list[int] | None = None  # one process per GPU of these (None: this process's GPU)


@dataclass
class BuildOptions:
    target: Target
    outdir: Path
    buckets: list[dict[str, int]] | None = None  # None: every bucket of the model
    dumps: frozenset[str] = frozenset()  # stages whose text is written (`STAGES`)
    tune: TuneOptions | None = None  # measure plans on a live target (None: the heuristics')
    weights: Mapping[str, np.ndarray] | None = None  # checked; written beside the bundle
    progress: Callable[[str], None] | None = None  # "lowering and fusing", "compiling [3/9]
    # ...", "tuning ...", "writing ...": what the build is doing now
    show: Callable[[str, str], None] | None = None  # each dump (file name, text) once written
    verify: bool = False  # the IR verifier after every lowering pass (IRVerifyError)


@dataclass
class Built:
    """What `build` made: each stage's result, and where the artifacts are. A group no engine
    and no fallback kernel runs ends the build with E0801 in `diagnostics` (nothing written)."""

    lowered: Graph
    plan: FusionPlan
    diagnostics: Sink = field(default_factory=Sink)
    compiled: Compiled | None = None
    tuning: Report | None = None
    bundle: Path | None = None
    seconds: float = 0.0  # compile, tune and emit


class WriteFailed(Exception):
    """An artifact could not be written (the previous one is kept: writes are atomic)."""

    def __init__(self, path: Path, error: OSError) -> None:
        super().__init__(f"cannot write `{path}`: {error}")
        self.path = path
        self.error = error


def build(front: FrontEnd, options: BuildOptions) -> Built:
    """Checked model -> lowered, fused, compiled, tuned (on a live target, if asked) and emitted:
    the stage dumps asked for, then the bundle, its runner and its weights, written together."""
    from dslc.compile.stage import CompileFailure, compile_model

    assert front.model is not None
    model = front.model
    progress = options.progress
    if progress:
        progress("lowering and fusing")
    lowered, plan = lower_and_fuse(model, options.verify)
    out = Built(lowered, plan)
    _dump(front, out, options)
    started = time.perf_counter()
    try:
        compiled = compile_model(model, lowered, plan, options.target,
                                 progress and (lambda text: progress(f"compiling {text}")),
                                 options.buckets)
    except CompileFailure as err:
        node = lowered.by_name()[err.node]
        out.diagnostics.report(Diagnostic("E0801", f"no cuDNN engine supports `{node.op}` here",
                                          node.span, err.reason,
                                          notes=(f"target: {options.target.name}",)))
        return out
    out.compiled = compiled
    out.bundle = _emit(compiled, out, options)
    out.seconds = time.perf_counter() - started
    return out


def _dump(front: FrontEnd, out: Built, options: BuildOptions) -> None:
    model, module = front.model, front.module
    assert model is not None and module is not None
    texts = {"ast": lambda: format_module(module), "types": lambda: format_checked(model),
             "ir": lambda: format_graph(out.lowered, with_source=True),
             "fused": lambda: format_plan(out.plan)}
    for number, stage in enumerate(STAGES, start=1):
        if stage in options.dumps:
            text, name = texts[stage](), f"{number}.{stage}.txt"
            path = options.outdir / name
            _write(path, fsutil.write_text, path, text)
            if options.show:
                options.show(name, text)


def _emit(compiled: Compiled, out: Built, options: BuildOptions) -> Path:
    """Tune (on a live target, if asked), then write the bundle, runner and weights once."""
    from dslc import tune
    from dslc.emit import bundle as emit_bundle
    from dslc.emit.runner import render
    from dslc.tune.gpus import across

    how, progress = options.tune, options.progress
    if progress:
        progress("assembling the bundle")
    records = emit_bundle.records(compiled)
    if options.target.live and how is not None:
        if how.gpus is not None:
            tuned = across(records, how.gpus, how.db, how.budget_s, how.model_budget_s,
                           how.search)
        else:
            tuned = tune.tune(records, how.db, how.budget_s, how.model_budget_s, how.search,
                              progress and (lambda text: progress(f"tuning {text}")))
        records, out.tuning = tune.tuned_bundle(records, tuned), tuned.report
    name, outdir = compiled.model.name, options.outdir
    if progress:
        progress(f"writing {outdir}/")
    runner = render(compiled, f"{name}.bundle", f"{name}_runner")
    beside: list[tuple[Path, Callable[[str], object]]] = [
        (outdir / f"{name}_runner.py", lambda tmp: Path(tmp).write_text(runner, encoding="utf-8"))]
    if options.weights is not None:
        beside.append((outdir / f"{name}.safetensors", weights.writer(options.weights)))
    # The bundle, its runner and its weights replaced together: a failed build keeps the
    # previous set (the bundle goes last; see fsutil.replace_together for what a crash can do).
    path = outdir / f"{name}.bundle"
    _write(outdir, emit_bundle.write_with, path, records, beside)
    return path


def _write(path: Path, write: Callable[..., object], *args: object) -> None:
    """`write(*args)`; a failure names `path` (WriteFailed)."""
    try:
        write(*args)
    except OSError as err:
        raise WriteFailed(path, err) from err


# -- `--fp8 auto`: which of the model's fp8 requests make it faster here -------------------------

def with_fp8(front: FrontEnd, chosen: frozenset[str]) -> FrontEnd:
    """The front end's model with only the fp8 requests of `chosen` (the others computed as
    written)."""
    from dataclasses import replace

    from dslc.lower.quantize import only

    assert front.model is not None
    return FrontEnd(front.program, front.module,
                    replace(front.model, graph=only(front.model.graph, chosen)))


def choose_fp8(front: FrontEnd, options: Options, target: Target,
               tensors: Mapping[str, np.ndarray], samples: Mapping[str, np.ndarray],
               max_error: float, workdir: Path, buckets: list[dict[str, int]] | None = None,
               progress: Callable[[str], None] | None = None) -> Decision:
    """`--fp8 auto`: each kind of op the model asks to compute in fp8 measured on this GPU
    (`fp8_kinds`; the model timed with it alone in fp8, against the model in fp16, at the
    first sample run's sizes, heuristics' plans), and the error of a chosen set measured on
    the samples against the f32 model without fp8 (the reference executor, rms over rms, the
    worst output and run)
    (`dslc.tune.precision.decide`). `options`: the front end's (its include folders);
    `buckets`: those to compile (None: the model's)."""
    from dslc.tune.precision import decide

    assert front.model is not None
    bench = _Fp8Bench(front, options, target, tensors, samples, workdir, buckets, progress)
    return decide(fp8_kinds(front.model.graph), bench.ms, bench.error, max_error)


def fp8_kinds(graph: Graph) -> list[frozenset[str]]:
    """The ops asking for fp8, by kind: those computing the same op on operands of the same
    types with the same attributes (a repeated block's projections) are decided together."""
    from dslc.lower.quantize import requested

    nodes = graph.by_name()
    kinds: dict[tuple[object, ...], set[str]] = {}
    for name in requested(graph):
        n = nodes[name]
        key = (n.op, n.type, tuple(nodes[i].type for i in n.inputs),
               tuple(sorted((k, repr(v)) for k, v in n.attrs.items())))
        kinds.setdefault(key, set()).add(name)
    return [frozenset(k) for k in kinds.values()]


class _Fp8Bench:
    """The model compiled, calibrated and timed with a subset of its fp8 requests. A subset the
    model does not build with (no engine, no fallback kernel) measures infinitely slow and
    infinitely wrong: `decide` never keeps it. Its error is the reference's: a step a generated
    pointwise kernel runs computes in f32 on the GPU, where the reference computes in the
    model's compute dtype, so the error measured bounds the GPU's from above there."""

    def __init__(self, front: FrontEnd, options: Options, target: Target,
                 tensors: Mapping[str, np.ndarray], samples: Mapping[str, np.ndarray],
                 workdir: Path, buckets: list[dict[str, int]] | None,
                 progress: Callable[[str], None] | None) -> None:
        self.front, self.options, self.target, self.buckets = front, options, target, buckets
        self.tensors, self.samples = tensors, samples
        self.workdir, self.progress = workdir, progress
        self.built: dict[frozenset[str], tuple[Path, Any] | None] = {}
        self.weights = workdir / "weights.safetensors"
        self.times: dict[frozenset[str], float] = {}
        self.exact: list[dict[str, np.ndarray]] | None = None

    def _bundle(self, chosen: frozenset[str]) -> tuple[Path, Any] | None:
        """The model compiled for the target with `chosen` in fp8 (calibrated on the samples),
        written; and its schedule. None where it does not build."""
        from dslc.compile.stage import CompileFailure, compile_model
        from dslc.emit import bundle as emit_bundle
        from dslc.runtime.calibrate import calibrate, calibrated
        from dslc.runtime.schedule import Schedule

        if chosen not in self.built:
            front = with_fp8(self.front, chosen)
            assert front.model is not None
            lowered, plan = lower_and_fuse(front.model)
            try:
                records = emit_bundle.records(compile_model(front.model, lowered, plan,
                                                            self.target, buckets=self.buckets))
            except CompileFailure as failure:
                if self.progress:
                    self.progress(f"fp8 auto: {sorted(chosen)} in fp8 does not build at "
                                  f"`{failure.node}`: {failure.reason}")
                self.built[chosen] = None
                return None
            if chosen:
                records = calibrated(records, calibrate(Schedule(records), self.tensors,
                                                        self.samples))
            path = self.workdir / f"fp8_{len(self.built)}.bundle"
            emit_bundle.write(path, records)
            if not self.weights.exists():
                weights.save(self.weights, dict(self.tensors))
            self.built[chosen] = path, Schedule(records)
        return self.built[chosen]

    def _said(self, chosen: frozenset[str], what: str) -> tuple[Path, Any] | None:
        """The bundle of `_bundle`, with a progress line saying what it is built for."""
        if self.progress:
            self.progress(f"fp8 auto: {what} with {len(chosen)} ops in fp8")
        return self._bundle(chosen)

    def ms(self, chosen: frozenset[str]) -> float:
        """The model's CUDA-graph replay, median of 30, with `chosen` in fp8 (its plain runs
        where it cannot be captured, R0803)."""
        from dslc.backend.timing import median_ms, upload_inputs
        from dslc.core.errors import RunnerError
        from dslc.runtime import Model
        from dslc.runtime.calibrate import runs

        if chosen not in self.times:
            built = self._said(chosen, "timing the model")
            if built is None:
                return float("inf")
            path, program = built
            first = runs(program.bundle.manifest, self.samples)[0]
            model = Model(path, self.weights, tuning_db=None, plan_cache=None)
            inputs = upload_inputs(first, program)
            model.run(inputs)
            try:
                graph = model.capture(inputs)
                self.times[chosen] = median_ms(lambda: graph(inputs), 30)
            except RunnerError as err:
                if err.code != "R0803":
                    raise
                self.times[chosen] = median_ms(lambda: model.run(inputs), 30)
            model.close()
        return self.times[chosen]

    def error(self, chosen: frozenset[str]) -> float:
        """The rms of the difference over the rms of the f32 model's outputs without fp8, the
        worst output of the worst run, with `chosen` in fp8 calibrated on the samples."""
        from dataclasses import replace

        from dslc.core.types import PrecisionSpec
        from dslc.ir import interp
        from dslc.runtime.calibrate import runs

        built = self._said(chosen, "the error")
        if built is None:
            return float("inf")
        _, program = built
        samples = runs(program.bundle.manifest, self.samples)
        if self.exact is None:
            assert self.front.model is not None
            f32 = PrecisionSpec("f32", "f32", "f32")
            exact = front_end(Path(self.front.model.file),
                              replace(self.options, precision=f32, fp8=False,
                                      backend="reference"), Sink())
            assert exact.model is not None, "a model that checks at its precision checks in f32"
            lowered, _ = lower_and_fuse(exact.model)
            wide = {k: np.asarray(v).astype(np.float32) if np.asarray(v).dtype.kind == "f"
                    else np.asarray(v) for k, v in self.tensors.items()}
            self.exact = [interp.run(lowered, run, wide, exact.model.env) for run in samples]
        calibration = program.bundle.calibration
        amax = calibration.amax if calibration is not None else None
        worst = 0.0
        for run, want in zip(samples, self.exact, strict=True):
            got = interp.run(program.graph, run, self.tensors, program.env,
                             virtual=program.virtual(), amax=amax)
            for name, w in want.items():
                w64, g64 = w.astype(np.float64), got[name].astype(np.float64)
                rms = float(np.sqrt(np.mean(w64 ** 2))) or 1.0
                err = float(np.sqrt(np.mean((g64 - w64) ** 2))) / rms
                worst = max(worst, err if err == err else float("inf"))  # NaN: past any budget
        return worst
