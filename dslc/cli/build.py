"""The build commands: `run` (the reference backend, or cuDNN), `weights` (random test weights,
PyTorch checkpoints)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

from dslc import fsutil, weights
from dslc.check.types import DTYPES, PrecisionSpec
from dslc.cli.front import EXIT_ERRORS, EXIT_OK, Output, add_diag_options, checked
from dslc.diag.diagnostic import Sink
from dslc.emit.manifest import build_manifest
from dslc.ir import interp
from dslc.pipeline import middle_end
from dslc.runtime.errors import RunnerError
from dslc.runtime.inputs import bind_inputs

STAGES = ("ast", "types", "ir", "fused")


class UsageError(Exception):
    """A wrong command line (exit code 2)."""


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
    args.inputs = _inputs(args.input)
    args.weights_file = args.weights
    out = Output(args.error_format, args.color)
    if args.file.suffix == ".bundle":
        if args.backend == "cudnn":
            from dslc.cli.backend import cmd_run_cudnn

            return cmd_run_cudnn(args, None)
        return _run_reference_bundle(args)
    result = checked(args, out)
    if result is None or result.model is None:
        return EXIT_ERRORS
    if args.backend == "cudnn":
        from dslc.cli.backend import cmd_run_cudnn

        return cmd_run_cudnn(args, result)
    model = result.model
    lowered, plan = middle_end(model)
    sink = Sink()
    params = weights.validate(weights.load(args.weights), model.params, sink, f"`{args.weights}`")
    out.diagnostics(sink, result.program.sources)
    if sink.error_count:
        out.summary(sink, f"load the weights of `{model.name}`")
        return EXIT_ERRORS
    manifest = build_manifest(model)
    try:
        bind_inputs(manifest, {k: (tuple(v.shape), _dtype(v)) for k, v in args.inputs.items()})
    except RunnerError as err:
        print(err, file=sys.stderr)
        return EXIT_ERRORS
    outputs = interp.run(lowered, args.inputs, params, model.env, virtual=plan.virtual())
    return _write_outputs(args.output, outputs)


def _run_reference_bundle(args: argparse.Namespace) -> int:
    from dslc.runtime.bundle import read
    from dslc.runtime.params import read as read_weights
    from dslc.runtime.schedule import Program

    program = Program(read(args.file))
    manifest = program.payload["manifest"]
    try:
        bind_inputs(manifest, {k: (tuple(v.shape), _dtype(v)) for k, v in args.inputs.items()})
        tensors = read_weights(args.weights, manifest)
    except RunnerError as err:
        print(err, file=sys.stderr)
        return EXIT_ERRORS
    virtual = {n for s in program.steps if s.kind == "graph" for n in s.nodes
               if n not in s.outputs}
    outputs = interp.run(program.graph, args.inputs, tensors, program.env, virtual=virtual)
    return _write_outputs(args.output, outputs)


def _write_outputs(target: Path, outputs: dict[str, np.ndarray]) -> int:
    fsutil.atomic_write(target, lambda tmp: _savez(tmp, outputs))
    for name, value in outputs.items():
        v = value.astype(np.float64)
        print(f"{name}: {_dtype(value)}{list(value.shape)}  min {v.min():.6g}  max {v.max():.6g}"
              f"  mean {v.mean():.6g}")
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
    out = Output(args.error_format, args.color)
    result = checked(args, out)
    if result is None or result.model is None:
        return EXIT_ERRORS
    model = result.model
    if args.action == "random":
        tensors = weights.random_weights(model.params, args.seed)
    else:
        sink = Sink()
        tensors = weights.validate(weights.from_torch(args.checkpoint), model.params, sink,
                                   f"`{args.checkpoint}`", convert=True)
        out.diagnostics(sink, result.program.sources)
        if sink.error_count:
            out.summary(sink, f"convert `{args.checkpoint}`")
            return EXIT_ERRORS
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

    program = Program(read(args.bundle))
    try:
        tensors = params.read(args.weights, program.payload["manifest"])
    except RunnerError as err:
        print(err, file=sys.stderr)
        return EXIT_ERRORS
    data = params.prepare(program, tensors)
    params.save_prepared(args.output, program, data, source=str(args.weights))
    total = sum(int(a.nbytes) for a in data.values())
    print(f"wrote {args.output}: {len(data)} values prepared for `{args.bundle}`, "
          f"{total / 2**20:,.1f} MiB", file=sys.stderr)
    return EXIT_OK


def add_commands(sub: Any) -> None:
    p = sub.add_parser("run", help="run a model (a .cgraph file or a bundle) on given inputs")
    p.add_argument("file", type=Path, metavar="FILE|BUNDLE")
    p.add_argument("--backend", choices=("reference", "cudnn"), default="reference")
    p.add_argument("--weights", type=Path, required=True, metavar="W.safetensors")
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
