"""The `run` command: a `.cgraph` file or a bundle on given inputs, on the reference backend (the
numpy interpreter of the IR) or on cuDNN (a `.cgraph` file is compiled for this GPU first)."""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from dslc import fsutil, weights
from dslc.backend.target import load_target
from dslc.cli import paths
from dslc.cli.front import (
    EXIT_BACKEND,
    EXIT_ERRORS,
    EXIT_OK,
    Output,
    add_diag_options,
    checked,
    command,
    parse_precision,
    sources,
)
from dslc.cli.paths import UsageError
from dslc.cli.weights import bundle_weights, checked_weights, missing_weights
from dslc.core.errors import RunnerError
from dslc.emit.manifest import manifest_record
from dslc.ir import interp
from dslc.pipeline import BuildOptions, Built, FrontEnd, WriteFailed, build, lower_and_fuse
from dslc.runtime import Model
from dslc.runtime.bundle import read
from dslc.runtime.calibration import quantised
from dslc.runtime.inputs import bind_inputs
from dslc.runtime.params import amaxes, check_calibrated_with
from dslc.runtime.schedule import Schedule


def _input_paths(specs: list[str]) -> list[Path]:
    return [Path(spec.partition("=")[2]) for spec in specs if "=" in spec]


def _inputs(specs: list[str]) -> dict[str, np.ndarray]:
    arrays = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep:
            raise UsageError(f"`--input {spec}`: write NAME=FILE.npy")
        try:
            arrays[name] = np.load(path, allow_pickle=False)
        except (OSError, ValueError, EOFError) as err:  # EOFError: an empty file
            raise UsageError(f"cannot read input `{name}` from `{path}`: "
                             f"{err or 'the file is empty'}") from err
    return arrays


def cmd_run(args: argparse.Namespace) -> int:
    """A `.cgraph` file or a bundle, on the reference backend (numpy) or on cuDNN."""
    bundle = args.file.suffix == ".bundle"
    if bundle and args.precision is not None:
        raise UsageError(f"`--precision` applies to a .cgraph file; `{args.file}` was compiled "
                         "at its precision (compile it again with `--precision`)")
    if bundle and args.fp8 != "source":
        raise UsageError(f"`--fp8` applies to a .cgraph file; `{args.file}` was compiled with "
                         "its fp8 choice (compile it again with `--fp8 off`)")
    if args.output is not None:
        paths.output_file(args.output, [args.file, args.weights, *_input_paths(args.input)])
    args.inputs = _inputs(args.input)
    args.weights_file = args.weights
    out = Output(args.error_format, args.color)
    if bundle:
        if args.backend == "cudnn":
            return cmd_run_cudnn(args, None)
        return _run_reference_bundle(args)
    result = checked(args, out, "run")
    if result is None or result.model is None:
        return EXIT_ERRORS
    if args.output is not None:
        paths.output_file(args.output, sources(result))
    if args.backend == "cudnn":
        return cmd_run_cudnn(args, result)
    model = result.model
    lowered, plan = lower_and_fuse(model)
    params = checked_weights(args, out, result, convert=args.precision is not None)
    if params is None:
        return EXIT_ERRORS
    manifest = manifest_record(model, lowered)
    try:
        bind_inputs(manifest, {k: (tuple(v.shape), weights.dtype_name(v)) for k, v in args.inputs.items()})
    except RunnerError as err:
        print(err, file=sys.stderr)
        return EXIT_ERRORS
    # fp8: with no calibration, each quantised tensor is scaled by its own range on these inputs
    # (what calibrating on them would record).
    observe: dict[str, float] | None = {} if quantised(lowered) else None
    outputs = interp.run(lowered, args.inputs, params, model.env, virtual=plan.virtual(),
                         observe=observe)
    return _report(args, outputs)


def _run_reference_bundle(args: argparse.Namespace) -> int:
    program = Schedule(read(args.file))
    manifest = program.bundle.manifest
    try:
        bind_inputs(manifest, {k: (tuple(v.shape), weights.dtype_name(v)) for k, v in args.inputs.items()})
        tensors = bundle_weights(args, manifest)
        if args.weights is not None:
            check_calibrated_with(program, tensors, args.weights)
        amax = amaxes(program)
    except RunnerError as err:
        print(err, file=sys.stderr)
        return EXIT_ERRORS
    virtual = program.virtual()
    outputs = interp.run(program.graph, args.inputs, tensors, program.env, virtual=virtual,
                         amax=amax)
    return _report(args, outputs)


def _report(args: argparse.Namespace, outputs: dict[str, np.ndarray]) -> int:
    """Write the outputs to `-o` (if given) and describe each: dtype, shape, min, max, mean; as
    lines, or as one JSON document (non-finite numbers as the strings nan, inf, -inf)."""
    target: Path | None = args.output
    if target is not None:
        with paths.writing(target):
            fsutil.atomic_write(target, lambda tmp: _savez(tmp, outputs))
    stats = {name: _stats(value) for name, value in outputs.items()}
    if args.format == "json":
        doc = {"backend": args.backend, "written": str(target) if target is not None else None,
               "outputs": {name: {k: _json_number(v) for k, v in s.items()}
                           for name, s in stats.items()}}
        print(json.dumps(doc, indent=2, allow_nan=False))
    else:
        for name, st in stats.items():
            print(f"{name}: {st['dtype']}{st['shape']}  min {st['min']:.6g}  max {st['max']:.6g}"
                  f"  mean {st['mean']:.6g}")
    if target is not None:
        print(f"wrote {target}", file=sys.stderr)
    return EXIT_OK


def _stats(value: np.ndarray) -> dict[str, Any]:
    v = value.astype(np.float64)
    with np.errstate(all="ignore"):  # NaN or infinite outputs are described as such, unwarned
        return {"dtype": weights.dtype_name(value), "shape": list(value.shape),
                "min": float(v.min()), "max": float(v.max()), "mean": float(v.mean())}


def _json_number(x: Any) -> Any:
    return str(x) if isinstance(x, float) and not math.isfinite(x) else x


def _savez(tmp: str, outputs: dict[str, np.ndarray]) -> None:
    with open(tmp, "wb") as f:
        np.savez(f, **outputs)  # type: ignore[arg-type]


def add_commands(sub: Any) -> None:
    p = command(sub, "run", "run a model (a .cgraph file or a bundle) on given inputs")
    p.add_argument("file", type=Path, metavar="FILE|BUNDLE",
                   help="a .cgraph file, or a bundle made by `dslc compile`")
    p.add_argument("--backend", choices=("reference", "cudnn"), default="reference",
                   help="reference: the numpy interpreter (default, any machine); cudnn: this "
                        "GPU (a .cgraph file is compiled for it first)")
    p.add_argument("--weights", type=Path, metavar="W.safetensors",
                   help="the model's weights (not needed for a model without params)")
    p.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy",
                   help="an input from a .npy file (repeat for each input)")
    p.add_argument("-o", "--output", type=Path, metavar="OUT.npz",
                   help="write the outputs here (without it, they are only described)")
    p.add_argument("--precision", type=parse_precision, metavar="P",
                   help="override a .cgraph file's precision (`f32` or io=..,intermediate=..,"
                        "compute=..); the weights are converted to it")
    p.add_argument("--fp8", choices=("source", "off"), default="source",
                   help="source: the ops the model asks to compute in fp8 do (default); off: "
                        "none does (the model without its fp8 requests: its fp16 baseline)")
    p.add_argument("--format", choices=("text", "json"), default="text",
                   help="describe the outputs as lines (default), or as one JSON document")
    add_diag_options(p)
    p.set_defaults(run=cmd_run)


def cmd_run_cudnn(args: argparse.Namespace, result: FrontEnd | None) -> int:
    """`dslc run --backend cudnn`: a bundle, or a `.cgraph` file compiled for this GPU first."""
    bundle = args.file
    weights_file = args.weights_file
    tmp = Path(tempfile.mkdtemp(prefix="dslc-run-"))
    try:
        if result is not None:
            assert result.model is not None
            found = checked_weights(args, Output(args.error_format, args.color), result,
                                    convert=args.precision is not None, finite=False)
            if found is None:
                return EXIT_ERRORS
            if args.precision is not None and weights_file is not None:
                weights_file = tmp / "weights.safetensors"  # converted to the run's precision
                weights.save(weights_file, found)
            built = _build_for_this_gpu(result, tmp)
            if built.bundle is None:
                Output("human", "never", quiet=True).diagnostics(built.diagnostics,
                                                                  result.program.sources)
                return EXIT_BACKEND
            bundle = built.bundle
        model = Model(bundle, weights_file)  # NaN or infinite weights: logged once (W0202)
        if weights_file is None and model.manifest.params:
            raise missing_weights(model.manifest.model, [p.name for p in model.manifest.params])
        outputs = model.run({k: _to_device(model, k, v) for k, v in args.inputs.items()})
        host = {k: v.get() for k, v in outputs.items()}  # CuPy arrays, as the inputs were
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return _report(args, host)


def _build_for_this_gpu(result: FrontEnd, outdir: Path) -> Built:
    """A `.cgraph` file that `dslc run --backend cudnn` runs: compiled for this GPU, untuned."""
    try:
        return build(result, BuildOptions(load_target("device"), outdir))
    except WriteFailed as err:
        raise UsageError(f"cannot write `{err.path}`: {paths.describe(err.error)}") from err


def _to_device(model: Any, name: str, a: np.ndarray) -> Any:
    """A host array (logical axis order) on the GPU, in the input's declared memory layout."""
    cupy = model.cupy  # R0801 where there is no GPU
    node = model.program.nodes.get(model.program.inputs.get(name, ""), None)
    layout = node.type.layout if node is not None else None
    if layout is None:
        return cupy.asarray(a)
    order = layout.order
    physical = cupy.asarray(np.ascontiguousarray(a.transpose(order)))
    return physical.transpose([order.index(i) for i in range(a.ndim)])
