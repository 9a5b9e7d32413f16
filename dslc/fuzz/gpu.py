"""The GPU oracles for a generated program (needs CuPy, PyTorch with CUDA and cuDNN):

- the program compiled for this GPU (the heuristics' plans, no tuning), run by the runtime at its
  declared precision at the generator's sizes (a size between buckets is built on first use),
  equals the reference executor at the per-dtype tolerance;
- a CUDA-graph replay of it equals the plain run, bit for bit;
- a bundle written and read back runs the same plans: the reloaded model's outputs equal the
  first run's, bit for bit;
- the deviceless compile for the H200 profile makes the same fusion plan and the same groups;
- the program with every step a fallback kernel also computes made that kernel (attention over
  a long cache, pointwise groups; matmuls with their epilogues, a few rows on dslc's kernel and
  more on cuBLASLt: `tune.joins.every_kernel`, what tuning may choose) equals the reference too;
- the program compiled deviceless from this GPU's own profile (as a CI machine compiles it: no
  plan run) and started here equals the reference too: start-up runs the plans no device ran
  where a conv adds a residual, and a group none of whose plans runs here runs its kernels or is
  split (`runtime.split`).
"""

from __future__ import annotations

import dataclasses
import tempfile
import traceback
from collections.abc import Set
from pathlib import Path
from typing import Any

import numpy as np

from dslc.fuzz.oracle import (
    Failure,
    Outcome,
    _checked,
    _lower,
    make_inputs,
    make_weights,
    narrowest,
    relative_error,
)
from dslc.fuzz.program import Program
from dslc.ir import interp
from dslc.pipeline import Options

# max|gpu - reference| / max(max|reference|, 1e-2), by the narrowest dtype the program stores.
# f32: cuDNN's conv and matmul engines may compute f32 with TF32 operands (10-bit mantissas):
# three linear + layer-norm blocks measured 5.1e-3 off the exact reference (program 374 of seed 14).
TOLERANCE = {"f32": 1e-2, "f16": 2e-2, "bf16": 6e-2, "f8": 0.1}


_TARGET: Any = None  # one device target (one cuDNN handle) per process


def run(prog: Program, seed: int, localize: bool = True) -> Outcome:
    outcome = _run(prog, seed)
    if outcome.status == "mismatch" and outcome.stage == "run" and localize:
        outcome.detail += "\n" + _first_divergence(prog, seed)
    return outcome


def _prepared(prog: Program, seed: int, tmp: Path) -> tuple[Any, dict[str, np.ndarray],
                                                             dict[str, np.ndarray]]:
    """The program checked as declared, with its inputs and weights."""
    path = tmp / "fuzz.cgraph"
    path.write_text(prog.source())
    model = _checked(path, Options())
    return (model, make_inputs(model.inputs, prog.run_dims, model, seed, prog.index_bounds),
            make_weights(model.params, prog.roles(), seed))


def _run(prog: Program, seed: int) -> Outcome:
    with tempfile.TemporaryDirectory(prefix="dslc-fuzz-gpu-") as tmp:
        stage = "check"
        try:
            model, inputs, weights = _prepared(prog, seed, Path(tmp))
            stage = "compile"
            bundle, steps = _compile(model, Path(tmp))
            stage = "deviceless"
            _same_groups(model, steps)
            stage = "run"
            return _compare(bundle, Path(tmp), inputs, weights, model)
        except Failure as f:
            f.outcome.stage = f.outcome.stage or stage
            return f.outcome
        except Exception as err:
            return Outcome("crash", stage, f"{type(err).__name__}: {err}\n"
                                           f"{''.join(traceback.format_exc(limit=-4))}")


def _compile(model: Any, tmp: Path) -> tuple[Path, list[tuple[str, tuple[str, ...]]]]:
    from dslc.backend.target import load_target
    from dslc.compile.stage import compile_model
    from dslc.emit import bundle as emit_bundle

    global _TARGET
    if _TARGET is None:
        _TARGET = load_target("device")
    lowered, plan = _lower(model.graph, model.env)
    compiled = compile_model(model, lowered, plan, _TARGET)
    path = tmp / "fuzz.bundle"
    emit_bundle.write(path, emit_bundle.payload(compiled))
    return path, [(s.group.signature, s.group.nodes) for s in compiled.steps]


def _same_groups(model: Any, steps: list[tuple[str, tuple[str, ...]]]) -> None:
    """Deviceless for the H200 profile: the same groups, except where the GPU split a group that
    got no plan there (the deviceless build cannot know; each half must still be a group's
    part)."""
    from dslc.backend.target import load_target
    from dslc.compile.stage import compile_model

    lowered, plan = _lower(model.graph, model.env)
    deviceless = compile_model(model, lowered, plan, load_target("h200"))
    groups = {s.group.nodes for s in deviceless.steps}
    for _, nodes in steps:
        if nodes not in groups and not any(set(nodes) <= set(g) for g in groups):
            raise Failure(Outcome("fusion", "deviceless", f"the GPU ran the group {list(nodes)}, "
                                                          "which no deviceless group holds"))


def _compare(bundle: Path, tmp: Path, inputs: dict[str, np.ndarray],
             weights: dict[str, np.ndarray], checked: Any = None) -> Outcome:
    """`checked`: the checked model, to run its deviceless compile too (`_deviceless_equal`)."""
    from dslc.core.errors import RunnerError
    from dslc.runtime import Model
    from dslc.runtime.bundle import read
    from dslc.runtime.schedule import Schedule
    from dslc.weights import save

    save(tmp / "fuzz.safetensors", weights)
    amax = _calibrated(bundle, inputs, weights)
    model = Model(bundle, tmp / "fuzz.safetensors", plan_cache=None)
    device_inputs = to_device(inputs, model.program)
    plain = to_host(model.run(device_inputs))
    program = Schedule(read(bundle))
    virtual = program.virtual()
    want = interp.run(program.graph, inputs, weights, program.env, virtual=virtual, amax=amax)
    dtype = narrowest(program.graph)
    errors = {}
    for name, value in want.items():
        a, b = np.asarray(plain[name], np.float64), np.asarray(value, np.float64)
        if a.shape != b.shape or not np.isfinite(a).all():
            raise Failure(Outcome("mismatch", "run", f"output {name}: shape {a.shape} or "
                                                     f"values not finite"))
        if value.dtype.kind in "biu" and not np.array_equal(plain[name], value):
            raise Failure(Outcome("mismatch", "run", f"output {name}: integers differ at "
                                                     f"{int((a != b).sum())} of {a.size}"))
        errors[name] = relative_error(a, b)
        if errors[name] > TOLERANCE[dtype]:
            raise Failure(Outcome("mismatch", "run", f"output {name}: relative error "
                                                     f"{errors[name]:.3e} > {TOLERANCE[dtype]} "
                                                     f"({dtype})", errors))
    # A plan whose bits vary from run to run (a reduction that adds with atomics) cannot be held
    # to bit equality: outputs computed from a reduction, or seen to vary between two plain
    # runs, are held to the dtype's tolerance in replays and reloads instead.
    second = to_host(model.run(device_inputs))
    varies = {n for n in plain if plain[n].tobytes() != second[n].tobytes()}
    varies |= _after_a_reduction(program)
    skipped = f"bits vary run to run: {sorted(varies)}" if varies else ""
    try:
        replayed = to_host(model.capture(device_inputs)(device_inputs))
        _identical(plain, replayed, "replay", "a CUDA-graph replay differs from the plain run",
                   varies, TOLERANCE[dtype])
    except RunnerError as err:
        if err.code != "R0803":
            raise
        skipped = "; ".join(filter(None, [skipped, "capture: a fallback kernel CuPy cannot "
                                                   "capture (R0803)"]))
    model.close()
    reloaded = Model(bundle, tmp / "fuzz.safetensors", plan_cache=None)
    again = to_host(reloaded.run(device_inputs))
    reloaded.close()
    _identical(plain, again, "reload", "a model reloaded from the bundle computes other bits",
               varies, TOLERANCE[dtype])
    _kernels_equal(bundle, tmp, device_inputs, want, TOLERANCE[dtype])
    if checked is not None and amax is None:  # fp8: the deviceless bundle is not calibrated
        _deviceless_equal(checked, tmp, device_inputs, want, TOLERANCE[dtype])
    return Outcome("ok", errors=errors, skipped=skipped)


def _deviceless_equal(checked: Any, tmp: Path, device_inputs: dict[str, Any],
                      want: dict[str, np.ndarray], tolerance: float) -> None:
    """The program compiled deviceless from this GPU's profile, started here, computes the
    reference's values."""
    from dslc.backend.target import Target, capture
    from dslc.compile.stage import compile_model
    from dslc.emit import bundle as emit_bundle

    lowered, plan = _lower(checked.graph, checked.env)
    compiled = compile_model(checked, lowered, plan, Target("this-gpu", capture()))
    path = tmp / "deviceless.bundle"
    emit_bundle.write(path, emit_bundle.payload(compiled))
    _runs_the_reference(path, tmp, device_inputs, want, tolerance, "deviceless",
                        "compiled deviceless and started here")


def _runs_the_reference(path: Path, tmp: Path, device_inputs: dict[str, Any],
                        want: dict[str, np.ndarray], tolerance: float, stage: str,
                        how: str) -> None:
    """The bundle at `path`, started here (no plan cache, no tuning database), computes the
    reference's values within `tolerance`."""
    from dslc.runtime import Model

    model = Model(path, tmp / "fuzz.safetensors", plan_cache=None, tuning_db=None)
    got = to_host(model.run(device_inputs))
    model.close()
    for name, value in want.items():
        err = relative_error(np.asarray(got[name], np.float64), np.asarray(value, np.float64))
        if not err <= tolerance:
            raise Failure(Outcome("mismatch", stage, f"output {name}: {how}, relative error "
                                                     f"{err:.3e} > {tolerance}"))


def _kernels_equal(bundle: Path, tmp: Path, device_inputs: dict[str, Any],
                   want: dict[str, np.ndarray], tolerance: float) -> None:
    """The bundle with every step its fallback kernel (`tune.joins.every_kernel`) computes
    the reference's values; nothing to run where no step has one."""
    from dslc.emit import bundle as emit_bundle
    from dslc.runtime.bundle import load
    from dslc.tune.joins import every_kernel

    records = load(bundle)
    forced = every_kernel(records)
    if [s.kind for s in forced.steps] == [s.kind for s in records.steps]:
        return
    path = tmp / "kernels.bundle"
    emit_bundle.write(path, forced)
    _runs_the_reference(path, tmp, device_inputs, want, tolerance, "kernels",
                        "with every step a fallback kernel computes made it")


def _calibrated(bundle: Path, inputs: dict[str, np.ndarray],
                weights: dict[str, np.ndarray]) -> dict[str, float] | None:
    """A bundle computing in fp8 calibrated on the inputs it runs (written back, as `dslc
    calibrate` does); its amaxes. None for any other bundle."""
    import dataclasses

    from dslc.runtime import bundle as bundlefile
    from dslc.runtime.calibrate import calibrate
    from dslc.runtime.calibration import quantised
    from dslc.runtime.schedule import Schedule

    program = Schedule(bundlefile.load(bundle))
    if not quantised(program.graph):
        return None
    c = calibrate(program, weights, {k: v[None] for k, v in inputs.items()})
    bundle.write_bytes(bundlefile.pack(dataclasses.replace(program.bundle, calibration=c)))
    return dict(c.amax)


def _first_divergence(prog: Program, seed: int) -> str:
    """The program again with every bound value an output: the first value (in program order)
    whose GPU result differs from the reference, as a line of the program."""
    every = dataclasses.replace(prog, outputs=[(f"d{i}", name, "") for i, s in
                                               enumerate(prog.stmts) for name in s.names[:1]])
    with tempfile.TemporaryDirectory(prefix="dslc-fuzz-gpu-") as tmp:
        try:
            model, inputs, weights = _prepared(every, seed, Path(tmp))
            bundle, _ = _compile(model, Path(tmp))
            _compare(bundle, Path(tmp), inputs, weights)
        except Failure as f:
            name = f.outcome.detail.split(":")[0].removeprefix("output ")
            value = dict((o, v) for o, v, _ in every.outputs).get(name, "?")
            line = next((s.text.strip() for s in every.stmts if value in s.names), "?")
            return f"  first divergence (every value stored): {f.outcome.detail}: {line}"
        except Exception as err:
            return f"  localizing failed: {type(err).__name__}: {err}"
    return "  with every value stored, the GPU agrees (a fused group computes it wrong)"


def _after_a_reduction(program: Any) -> set[str]:
    """The outputs whose value depends on a reduction (its order of additions is the plan's)."""
    reduced: set[str] = set()
    for node in program.graph.nodes:
        if node.op.startswith("reduce_") or node.op == "genstats" or \
                any(i in reduced for i in node.inputs):
            reduced.add(node.name)
    return {name for name, value in program.outputs.items() if value in reduced}


def _identical(a: dict[str, np.ndarray], b: dict[str, np.ndarray], stage: str, what: str,
               varies: Set[str] = frozenset(), tolerance: float = 0.0) -> None:
    """Bit equality, or for the outputs in `varies` equality within `tolerance` (relative)."""
    for name in a:
        x, y = np.asarray(a[name]), np.asarray(b[name])
        if name not in varies and x.tobytes() != y.tobytes():
            raise Failure(Outcome("metamorphic", stage, f"output {name}: {what}"))
        if name in varies and (err := relative_error(y, x)) > tolerance:
            raise Failure(Outcome("metamorphic", stage, f"output {name}: {what} "
                                                        f"(relative {err:.2e})"))


def to_device(arrays: dict[str, np.ndarray], program: Any) -> dict[str, Any]:
    """Torch CUDA tensors in each input's declared dtype and layout (`timing.upload_inputs`)."""
    from dslc.backend.timing import upload_inputs

    return upload_inputs(arrays, program)


def to_host(outputs: dict[str, Any]) -> dict[str, np.ndarray]:
    """Host arrays: floats as f32, integers and booleans as they are (compared exactly)."""
    import torch

    torch.cuda.synchronize()
    return {k: (v.float() if v.is_floating_point() else v).cpu().numpy() if hasattr(v, "cpu")
            else np.asarray(v.get()) for k, v in outputs.items()}


