"""The build commands: `run` (the reference backend, or cuDNN), `weights` (random test weights,
PyTorch checkpoints, prepared weights), and the weights a command is given, checked (R0202,
W0202) and converted to a `--precision` override."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

from dslc import fsutil, weights
from dslc.cli import paths
from dslc.cli.front import EXIT_ERRORS, EXIT_OK, Output, add_diag_options, checked, make_sink
from dslc.cli.paths import UsageError
from dslc.core.errors import RunnerError
from dslc.core.types import DTYPES, PrecisionSpec
from dslc.diag.diagnostic import Failed
from dslc.emit.manifest import build_manifest
from dslc.ir import interp
from dslc.pipeline import FrontEnd, lower_and_fuse
from dslc.runtime.inputs import bind_inputs

__all__ = ["UsageError", "checked_weights", "cmd_run", "parse_precision"]
STAGES = ("ast", "types", "ir", "fused")


def parse_precision(text: str) -> PrecisionSpec:
    """`f32` (all three) or `io=f16,intermediate=f32,compute=f32`."""
    if "=" not in text:
        if text not in DTYPES:
            raise argparse.ArgumentTypeError(f"not a dtype: {text}")
        return PrecisionSpec(text, text, text)
    values = {"io": "f32", "intermediate": "f32", "compute": "f32"}
    for part in text.split(","):
        key, _, value = part.partition("=")
        if key.strip() not in values or value.strip() not in DTYPES:
            raise argparse.ArgumentTypeError(f"bad precision setting `{part}`")
        values[key.strip()] = value.strip()
    return PrecisionSpec(**values)


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


def sources(result: FrontEnd) -> list[Path]:
    """The `.cgraph` files a model was read from (its imports too): inputs no output may replace."""
    return [Path(p) for p in result.program.modules]


def cmd_run(args: argparse.Namespace) -> int:
    """A `.cgraph` file or a bundle, on the reference backend (numpy) or on cuDNN."""
    bundle = args.file.suffix == ".bundle"
    if bundle and args.precision is not None:
        raise UsageError(f"`--precision` applies to a .cgraph file; `{args.file}` was compiled "
                         "at its precision (compile it again with `--precision`)")
    paths.output_file(args.output, [args.file, args.weights, *_input_paths(args.input)])
    args.inputs = _inputs(args.input)
    args.weights_file = args.weights
    out = Output(args.error_format, args.color)
    if bundle:
        if args.backend == "cudnn":
            from dslc.cli.compile import cmd_run_cudnn

            return cmd_run_cudnn(args, None)
        return _run_reference_bundle(args)
    result = checked(args, out, "run")
    if result is None or result.model is None:
        return EXIT_ERRORS
    paths.output_file(args.output, sources(result))
    if args.backend == "cudnn":
        from dslc.cli.compile import cmd_run_cudnn

        return cmd_run_cudnn(args, result)
    model = result.model
    lowered, plan = lower_and_fuse(model)
    params = checked_weights(args, out, result, convert=args.precision is not None)
    if params is None:
        return EXIT_ERRORS
    manifest = build_manifest(model)
    try:
        bind_inputs(manifest, {k: (tuple(v.shape), _dtype(v)) for k, v in args.inputs.items()})
    except RunnerError as err:
        print(err, file=sys.stderr)
        return EXIT_ERRORS
    outputs = interp.run(lowered, args.inputs, params, model.env, virtual=plan.virtual())
    return _write_outputs(args.output, outputs)


def missing_weights(name: str, params: list[str]) -> UsageError:
    """No `--weights` for a model that loads some: the error names them."""
    shown = ", ".join(f"`{p}`" for p in params[:3]) + (", ..." if len(params) > 3 else "")
    return UsageError(f"`{name}` loads {len(params)} weight{'s' if len(params) != 1 else ''} "
                      f"({shown}): give them with `--weights W.safetensors`")


def checked_weights(args: argparse.Namespace, out: Output, result: FrontEnd, convert: bool,
                    finite: bool = True, tensors: dict[str, np.ndarray] | None = None,
                    source: Path | None = None) -> dict[str, np.ndarray] | None:
    """The model's weights (`tensors` read from `source`, default `--weights`), checked against
    its params (R0202; NaN and infinities with `finite`: W0202); floats converted to the
    declared dtypes with `convert`. {} for a model without params and no weights; None once
    errors are reported, even at the `--max-errors` limit."""
    model = result.model
    assert model is not None
    source = source or args.weights
    if source is None:
        if model.params:
            raise missing_weights(model.name, [p.path for p in model.params])
        return {}
    given = tensors if tensors is not None else weights.load(source)
    sink = make_sink(args)
    try:
        found = weights.validate(given, model.params, sink, f"`{source}`", convert, finite)
    except Failed:  # the error limit: what was found so far is reported below
        found = {}
    out.diagnostics(sink, result.program.sources)
    if sink.error_count:
        out.summary(sink, f"use the weights `{source}`")
        return None
    precision = getattr(args, "precision", None)
    if convert and precision is not None:
        _note_conversions(given, found, precision)
    return found


def _note_conversions(given: dict[str, np.ndarray], found: dict[str, np.ndarray],
                      precision: PrecisionSpec) -> None:
    """One line saying which weights `--precision` converted."""
    pairs: dict[tuple[str, str], int] = {}
    for name, a in found.items():
        if given[name].dtype != a.dtype:
            pair = (_dtype(given[name]), _dtype(a))
            pairs[pair] = pairs.get(pair, 0) + 1
    if pairs:
        what = ", ".join(f"{n} from {a} to {b}" for (a, b), n in pairs.items())
        print(f"note: weights converted to the dtypes `--precision {_spec(precision)}` declares: "
              f"{what}", file=sys.stderr)


def _spec(p: PrecisionSpec) -> str:
    if p.io == p.intermediate == p.compute:
        return p.io
    return f"io={p.io},intermediate={p.intermediate},compute={p.compute}"


def runtime_warn(args: argparse.Namespace) -> Any:
    """Where the runtime's W0202 sentence goes in a command: stderr, honouring `--allow` and
    `--deny-warnings` (an error then, exit code 1)."""
    allow = {a.upper() for a in getattr(args, "allow", [])}

    def warn(text: str) -> None:
        if "W0202" in allow:
            return
        if getattr(args, "deny_warnings", False):
            raise RunnerError("W0202", text)
        print(f"warning[W0202]: {text}", file=sys.stderr)

    return warn


def _run_reference_bundle(args: argparse.Namespace) -> int:
    from dslc.runtime.bundle import read
    from dslc.runtime.params import read as read_weights
    from dslc.runtime.schedule import Program

    program = Program(read(args.file))
    manifest = program.payload["manifest"]
    try:
        bind_inputs(manifest, {k: (tuple(v.shape), _dtype(v)) for k, v in args.inputs.items()})
        if args.weights is None:
            if manifest["params"]:
                raise missing_weights(manifest["model"], [p["path"] for p in manifest["params"]])
            tensors = {}
        else:
            tensors = read_weights(args.weights, manifest, runtime_warn(args))
    except RunnerError as err:
        print(err, file=sys.stderr)
        return EXIT_ERRORS
    virtual = {n for s in program.steps if s.kind == "graph" for n in s.nodes
               if n not in s.outputs}
    outputs = interp.run(program.graph, args.inputs, tensors, program.env, virtual=virtual)
    return _write_outputs(args.output, outputs)


def _write_outputs(target: Path, outputs: dict[str, np.ndarray]) -> int:
    with paths.writing(target):
        fsutil.atomic_write(target, lambda tmp: _savez(tmp, outputs))
    for name, value in outputs.items():
        v = value.astype(np.float64)
        with np.errstate(all="ignore"):  # NaN or infinite outputs print as such, unwarned
            mean = v.mean()
        print(f"{name}: {_dtype(value)}{list(value.shape)}  min {v.min():.6g}  max {v.max():.6g}"
              f"  mean {mean:.6g}")
    print(f"wrote {target}", file=sys.stderr)
    return EXIT_OK


def _savez(tmp: str, outputs: dict[str, np.ndarray]) -> None:
    with open(tmp, "wb") as f:
        np.savez(f, **outputs)  # type: ignore[arg-type]


def _dtype(a: np.ndarray) -> str:
    for name, dt in interp.NUMPY_DTYPES.items():
        if a.dtype == np.dtype(dt):
            return name
    return str(a.dtype)


def cmd_weights(args: argparse.Namespace) -> int:
    checkpoint = getattr(args, "checkpoint", None)
    paths.output_file(args.output, [args.file, checkpoint])
    out = Output(args.error_format, args.color)
    result = checked(args, out)
    if result is None or result.model is None:
        return EXIT_ERRORS
    paths.output_file(args.output, sources(result))
    model = result.model
    if args.action == "random":
        tensors = weights.random_weights(model.params, args.seed)
    else:
        found = checked_weights(args, out, result, convert=True,
                                tensors=weights.from_torch(args.checkpoint), source=args.checkpoint)
        if found is None:
            return EXIT_ERRORS
        tensors = found
    with paths.writing(args.output):
        weights.save(args.output, tensors, {"model": model.name, "source": str(args.file)})
    total = sum(int(a.size) for a in tensors.values())
    print(f"wrote {args.output}: {len(tensors)} tensors, {total:,} values", file=sys.stderr)
    return EXIT_OK


def cmd_weights_prepare(args: argparse.Namespace) -> int:
    """The load-time values of a bundle (batchnorm folding, layouts) computed once and saved, so
    start-up uploads them as they are."""
    from dslc.runtime import params
    from dslc.runtime.bundle import read
    from dslc.runtime.schedule import Program

    paths.output_file(args.output, [args.bundle, args.weights])
    program = Program(read(args.bundle))
    try:
        tensors = params.read(args.weights, program.payload["manifest"], runtime_warn(args))
    except RunnerError as err:
        print(err, file=sys.stderr)
        return EXIT_ERRORS
    data = params.prepare(program, tensors)
    with paths.writing(args.output):
        params.save_prepared(args.output, program, data, source=str(args.weights))
    total = sum(int(a.nbytes) for a in data.values())
    print(f"wrote {args.output}: {len(data)} values prepared for `{args.bundle}`, "
          f"{total / 2**20:,.1f} MiB", file=sys.stderr)
    return EXIT_OK


def add_commands(sub: Any) -> None:
    p = sub.add_parser("run", help="run a model (a .cgraph file or a bundle) on given inputs")
    p.add_argument("file", type=Path, metavar="FILE|BUNDLE")
    p.add_argument("--backend", choices=("reference", "cudnn"), default="reference")
    p.add_argument("--weights", type=Path, metavar="W.safetensors",
                   help="the model's weights (not needed for a model without params)")
    p.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy")
    p.add_argument("-o", "--output", type=Path, required=True, metavar="OUT.npz")
    p.add_argument("--precision", type=parse_precision, metavar="P")
    add_diag_options(p)
    p.set_defaults(run=cmd_run)

    p = sub.add_parser("weights", help="make or convert weight files")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    r = actions.add_parser("random", help="random weights with realistic scales")
    r.add_argument("file", type=Path, metavar="FILE")
    r.add_argument("-o", "--output", type=Path, required=True, metavar="W.safetensors")
    r.add_argument("--seed", type=int, default=0)
    add_diag_options(r)
    r.set_defaults(run=cmd_weights)
    t = actions.add_parser("from-torch", help="a PyTorch state_dict, checked and converted")
    t.add_argument("checkpoint", type=Path, metavar="CKPT")
    t.add_argument("--model", dest="file", type=Path, required=True, metavar="FILE")
    t.add_argument("-o", "--output", type=Path, required=True, metavar="W.safetensors")
    add_diag_options(t)
    t.set_defaults(run=cmd_weights)
    w = actions.add_parser("prepare", help="a bundle's load-time values from these weights, for "
                           "the fastest start-up (the runner takes either file)")
    w.add_argument("bundle", type=Path, metavar="BUNDLE")
    w.add_argument("weights", type=Path, metavar="W.safetensors")
    w.add_argument("-o", "--output", type=Path, required=True, metavar="OUT.safetensors")
    w.set_defaults(run=cmd_weights_prepare)
