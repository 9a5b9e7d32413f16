"""Run one generated program through the compiler and compare it with independent oracles.

Stages, each of which can fail the program:
- check: the program must check clean as declared (it is well-typed by construction: a rejection
  is a generator or checker bug);
- reference: checked in f32 for the reference backend, lowered (the IR verifier after every pass),
  fused, and run by the numpy interpreter reading every view through its planned strides
  (`check_views`);
- torch: the checked graph translated op by op to PyTorch (`dslc.ir.to_torch`, which never calls
  the numpy references) on the same inputs and weights: outputs equal within tolerance;
- compile: at its declared precision, compiled deviceless for the H200 profile, the bundle written
  and read back: the bundle's graph prints as the compiled one, and the reference run of the
  bundle equals the reference run of the compiled graph bit for bit.
"""

from __future__ import annotations

import math
import tempfile
import traceback
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dslc.check.context import ParamSpec
from dslc.core.types import FP8, PrecisionSpec
from dslc.diag.diagnostic import Sink
from dslc.fuzz.program import Program
from dslc.ir import interp
from dslc.ir.graph import Graph
from dslc.ir.interp import NUMPY_DTYPES
from dslc.ir.verify import verify
from dslc.pipeline import Options, front_end
from dslc.weights import random_weights

F32 = PrecisionSpec("f32", "f32", "f32")
# max|ours - theirs| / max|theirs| per output, by the narrowest float dtype the f32 run stores.
# fp8: e4m3 holds 3 mantissa bits; the two sides round one value a step apart where the value
# before quantising differs in its last f32 bits (about 6% of that value, once).
TOLERANCE = {"f32": 2e-4, "f16": 2e-2, "bf16": 8e-2, "f8": 0.1}


@dataclass
class Outcome:
    status: str  # ok | rejected | crash | view | verify | mismatch | roundtrip
    stage: str = ""
    detail: str = ""
    errors: dict[str, float] = field(default_factory=dict)
    skipped: str = ""  # an oracle that could not apply, and why (counted, not a failure)

    @property
    def failed(self) -> bool:
        return self.status != "ok"

    @property
    def signature(self) -> tuple[str, str, str]:
        """What makes two failures the same bug, for shrinking: kind, stage, and the exception
        type or the first words of the message."""
        head = self.detail.split(":", 1)[0] if self.status == "crash" else ""
        return self.status, self.stage, head


class Failure(Exception):
    def __init__(self, outcome: Outcome) -> None:
        super().__init__(outcome.detail)
        self.outcome = outcome


@dataclass
class Case:
    """A program as the oracles take it: its source, where its dims are bound, and its inputs and
    weights (drawn from `seed` when not given; a saved regression case gives them)."""

    source: str
    run_dims: dict[str, int]
    roles: dict[str, str] = field(default_factory=dict)
    seed: int = 0
    bounds: dict[str, int] = field(default_factory=dict)  # index inputs: values in [0, bound)
    inputs: dict[str, np.ndarray] | None = None
    weights: dict[str, np.ndarray] | None = None
    expected: dict[str, np.ndarray] | None = None  # PyTorch's outputs, when saved

    @staticmethod
    def of(prog: Program, seed: int) -> Case:
        return Case(prog.source(), dict(prog.run_dims), prog.roles(), seed,
                    bounds=dict(prog.index_bounds))


def run(prog: Program, seed: int = 0, torch_oracle: bool = True, compile: bool = True) -> Outcome:
    return run_case(Case.of(prog, seed), torch_oracle, compile)


def run_case(case: Case, torch_oracle: bool = True, compile: bool = True) -> Outcome:
    """The program through every stage; the first failure, or ok with the errors measured."""
    with tempfile.TemporaryDirectory(prefix="dslc-fuzz-") as tmp:
        path = Path(tmp) / "fuzz.cgraph"
        path.write_text(case.source)
        stage = "check"
        try:
            declared = _checked(path, Options())
            stage = "reference"
            model = _in_f32(path, declared)
            if case.inputs is None:
                case.inputs = make_inputs(model.inputs, case.run_dims, declared, case.seed,
                                          case.bounds)
            if case.weights is None:
                case.weights = make_weights(declared.params, case.roles, case.seed)
            lowered, plan = _lower(model.graph, model.env)
            # An op computing in fp8 reads each activation's amax: here that of the run
            # itself (as a calibration on these inputs records it; PyTorch's side does the same).
            ours = interp.run(lowered, case.inputs, case.weights, model.env,
                              virtual=plan.virtual(), check_views=True, observe={})
            errors: dict[str, float] = {}
            if torch_oracle or case.expected is not None:
                stage = "torch"
                if case.expected is None:
                    case.expected = torch_outputs(model.graph, model.env, case.run_dims,
                                                  case.inputs, case.weights)
                errors = compare(ours, case.expected, narrowest(model.graph))
            if compile:
                stage = "compile"
                roundtrip(declared, Path(tmp), case.inputs, case.weights, case.run_dims, ours)
        except Failure as f:
            f.outcome.stage = f.outcome.stage or stage
            return f.outcome
        except interp.ViewError as err:
            return Outcome("view", stage, str(err))
        except Exception as err:  # a crash anywhere is a bug: name it and where it happened
            return Outcome("crash", stage, f"{type(err).__name__}: {err}\n"
                                           f"{''.join(traceback.format_exc(limit=-4))}")
    return Outcome("ok", errors=errors)


def _checked(path: Path, options: Options) -> Any:
    sink = Sink()
    result = front_end(path, options, sink)
    errors = [d for d in sink.diagnostics if d.is_error]
    if result.model is None or errors:
        first = errors[0] if errors else None
        text = f"{first.code} {first.message} (line {first.span.line})" if first else "no model"
        raise Failure(Outcome("rejected", "", text))
    return result.model


def _in_f32(path: Path, declared: Any) -> Any:
    """The model checked in f32 for the reference backend (`--precision f32`); where the dtypes
    written on its values make it ill-typed in f32 (a `cast(x, f16)` feeding a conv whose
    weights become f32), the model as declared: the oracles then compare at its precision."""
    try:
        return _checked(path, Options(precision=F32, backend="reference"))
    except Failure as f:
        if f.outcome.detail.startswith("E04"):
            return declared
        raise


def _lower(graph: Graph, env: Any) -> tuple[Graph, Any]:
    from dslc.fuse import fuse
    from dslc.lower import lower

    def after(name: str, g: Graph) -> None:
        problems = verify(g, env)
        if problems:
            raise Failure(Outcome("verify", "reference", f"after {name}: {problems[0]}"))

    lowered = lower(graph, after_each=after, env=env)
    needs_met(lowered)
    return lowered, fuse(lowered)


def needs_met(graph: Graph) -> None:
    """Every op's memory-order need (`OpDef.needs`) holds in the lowered graph."""
    from dslc.ir.verify import effective_type
    from dslc.ops import OPS
    from dslc.ops.opdef import Kind

    types: dict[str, Any] = {}
    for node in graph.nodes:
        types[node.name] = effective_type(node, types)
        op = OPS.get(node.op)
        if op is None or op.needs is None:
            continue
        names = node.attrs.get("operands") or tuple(p.name for p in op.tensor_params
                                                    if p.kind is Kind.TENSOR)
        reason = op.needs(dict(zip(names, (types[i] for i in node.inputs), strict=True)))
        if reason is not None:
            raise Failure(Outcome("verify", "reference", f"%{node.name} ({node.op}): {reason}"))


def make_inputs(specs: Any, run_dims: dict[str, int], declared: Any, seed: int,
                bounds: Mapping[str, int] | None = None) -> dict[str, np.ndarray]:
    """Normal random inputs in each input's declared dtype (so the f32 run and the declared run
    read the same values); a mask is true where its normal draw is positive; an index input
    (in `bounds`) is uniform in [0, bound)."""
    from dslc.core import dims

    rng = np.random.default_rng(seed)
    dtypes = {i.name: i.type.dtype for i in declared.inputs}
    out = {}
    for spec in specs:
        shape = tuple(dims.evaluate(d, run_dims, declared.env) for d in spec.type.shape)
        x = rng.standard_normal(shape)
        if bounds and spec.name in bounds:
            out[spec.name] = rng.integers(0, bounds[spec.name], shape).astype(
                NUMPY_DTYPES[dtypes[spec.name]])
        else:
            out[spec.name] = x > 0 if dtypes[spec.name] == "bool" else \
                x.astype(NUMPY_DTYPES[dtypes[spec.name]])
    return out


def make_weights(params: tuple[ParamSpec, ...], roles: dict[str, str], seed: int,
                 ) -> dict[str, np.ndarray]:
    """Weights in their declared dtypes: the generator's params by the role it gave them, the
    standard library's by their names (batchnorm variances positive, weights scaled by fan-in)."""
    out = random_weights(params, seed)
    rng = np.random.default_rng(seed + 1)
    for p in params:
        role = roles.get(p.path)
        if role is not None:
            out[p.path] = _draw(rng, role, p.shape).astype(NUMPY_DTYPES[p.dtype])
    return out


def _draw(rng: np.random.Generator, role: str, shape: tuple[int, ...]) -> np.ndarray:
    if role == "var":
        return rng.uniform(0.5, 1.5, shape)
    if role == "mean":
        return rng.normal(0.0, 0.1, shape)
    if role == "scale":
        return rng.uniform(0.8, 1.2, shape) * rng.choice([-1.0, 1.0], shape)
    if role == "shift":
        return rng.normal(0.0, 0.3, shape)
    fan_in = math.prod(shape[1:]) if len(shape) >= 2 else 1
    return rng.normal(0.0, 1.0 / math.sqrt(fan_in), shape)


def narrowest(graph: Graph) -> str:
    """The narrowest float a graph holds values in: "f8" where an op computes in fp8 (asked
    for on the op, or its operands quantised already)."""
    dtypes = {n.type.dtype for n in graph.nodes}
    if dtypes & set(FP8) or any(n.attrs.get("precision") in FP8 for n in graph.nodes):
        return "f8"
    return "bf16" if "bf16" in dtypes else "f16" if "f16" in dtypes else "f32"


def torch_outputs(graph: Graph, env: Any, run_dims: dict[str, int],
                  inputs: dict[str, np.ndarray], weights: dict[str, np.ndarray],
                  ) -> dict[str, np.ndarray]:
    """The checked graph translated to PyTorch, each value in the dtype the graph stores it in
    (f32 after the override, except casts and dtypes written on values)."""
    import torch

    from dslc.ir import to_torch

    torch.set_num_threads(1)  # small ops: threads cost more than they give
    program = to_torch.to_torch(graph, run_dims, "declared", env)
    program.load_weights(weights)
    return to_torch.run(program, inputs)


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    """max|got - want| relative to the output's magnitude, with a floor: a value that cancels to
    ~0 in both (x - x, a mean of x and -x) differs by rounding noise that is not an error."""
    a, b = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-2)) if a.size else 0.0


def compare(ours: dict[str, np.ndarray], theirs: dict[str, np.ndarray], dtype: str,
            ) -> dict[str, float]:
    tol = TOLERANCE[dtype]
    errors = {}
    for name, want in theirs.items():
        got = ours[name]
        if got.shape != want.shape:
            raise Failure(Outcome("mismatch", "torch", f"output {name}: shape {got.shape} against "
                                                       f"PyTorch's {want.shape}"))
        a, b = np.asarray(got, np.float64), np.asarray(want, np.float64)
        if not (np.isfinite(a).all() and np.isfinite(b).all()):
            bad = "ours" if not np.isfinite(a).all() else "PyTorch's"
            raise Failure(Outcome("mismatch", "torch", f"output {name}: {bad} not finite"))
        err = relative_error(a, b)
        errors[name] = err
        if err > tol:
            raise Failure(Outcome("mismatch", "torch", f"output {name}: relative error {err:.3e} "
                                                       f"> {tol} ({dtype})", errors))
    return errors


# The arena run against the reference: the same ops in the same dtypes, only the order of a
# reduction's additions may differ (numpy sums a strided and a contiguous array differently).
ARENA_TOLERANCE = {"f32": 1e-5, "f16": 4e-3, "bf16": 3e-2, "f8": 7e-2}


def roundtrip(model: Any, tmp: Path, inputs: dict[str, np.ndarray],
              weights: dict[str, np.ndarray], run_dims: Mapping[str, int],
              exact: Mapping[str, np.ndarray] | None = None) -> None:
    """Deviceless compile at the declared precision; the bundle written and read back must hold
    the same graph, running it must give the same bits as running the compiled graph, and the
    schedule run in one arena as the runtime lays memory out (`dslc.fuzz.arena`) must equal
    the reference. An output the f32 run (`exact`) has finite must be finite at the declared
    precision too, with its values rounded as the fused groups hold them: the GPU's oracle
    demands finite outputs, and a value a group holds too narrow overflows here as there (an
    fp8 product held to f16: program 3 of seed 24)."""
    from dslc.backend.target import load_target
    from dslc.compile.stage import compile_model
    from dslc.emit import bundle as emit_bundle
    from dslc.ir.printer import format_graph
    from dslc.runtime.bundle import read
    from dslc.runtime.schedule import Schedule

    lowered, plan = _lower(model.graph, model.env)
    compiled = compile_model(model, lowered, plan, load_target("h200"))
    path = tmp / "fuzz.bundle"
    emit_bundle.write(path, emit_bundle.payload(compiled))
    program = Schedule(read(path))
    if format_graph(program.graph) != format_graph(compiled.graph):
        raise Failure(Outcome("roundtrip", "compile", "the bundle's graph differs from the "
                                                      "compiled one"))
    virtual = program.virtual()
    built = {n for s in compiled.steps for n in s.group.nodes if n not in s.group.outputs}
    if virtual != built:
        raise Failure(Outcome("roundtrip", "compile", "the bundle's fused groups differ"))
    calibration: dict[str, float] = {}  # fp8: the run's own amaxes, then the same for all
    a = interp.run(program.graph, inputs, weights, program.env, virtual=virtual,
                   observe=calibration)
    b = interp.run(compiled.graph, inputs, weights, model.env, virtual=built, amax=calibration)
    for name in b:
        if a[name].tobytes() != b[name].tobytes():
            raise Failure(Outcome("roundtrip", "compile", f"output {name} of the bundle's "
                                                          "reference run differs"))
    for name, value in (exact or {}).items():
        if np.isfinite(value).all() and not np.isfinite(a[name].astype(np.float64)).all():
            raise Failure(Outcome("mismatch", "compile", f"output {name}: finite in f32, not "
                                                         "at the declared precision"))
    _same_in_the_arena(program, dict(run_dims), inputs, weights, a, calibration)
    # the bundle the GPU's oracle also runs: every step a kernel computes made it, the joins
    # made (`tune.joins.every_kernel`): its small steps merged and its cache writes run as
    # their writers as the runtime would, against the reference of its own groups
    from dslc.tune.joins import every_kernel

    forced = Schedule(every_kernel(program.bundle))
    want = interp.run(forced.graph, inputs, weights, forced.env, virtual=forced.virtual(),
                      amax=calibration)
    _same_in_the_arena(forced, dict(run_dims), inputs, weights, want, calibration,
                       "every step a kernel computes made that kernel")


def _same_in_the_arena(program: Any, dims: dict[str, int], inputs: dict[str, np.ndarray],
                       weights: dict[str, np.ndarray], want: dict[str, np.ndarray],
                       amax: Mapping[str, float] | None = None, which: str = "") -> None:
    from dslc.fuzz import arena

    got = arena.run(program, dims, inputs, weights, amax=amax)
    tol = ARENA_TOLERANCE[narrowest(program.graph)]
    for name, w in want.items():
        a, b = np.asarray(got[name], np.float64), np.asarray(w, np.float64)
        same_nan = np.array_equal(np.isnan(a), np.isnan(b))
        err = relative_error(np.where(np.isnan(a), 0, a), np.where(np.isnan(b), 0, b))
        if not same_nan or err > tol:
            raise Failure(Outcome("memory", "compile", f"output {name}: the schedule"
                                  + (f" with {which}" if which else "")
                                  + " run in its memory plan differs from the reference "
                                  f"(relative {err:.2e})"))
