"""The `weights` commands (random test weights, PyTorch checkpoints, prepared weights), and the
weights any command is given: checked against the model (R0202, W0202) and converted to a
`--precision` override."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

from dslc import weights
from dslc.cli import paths
from dslc.cli.front import (
    EXIT_ERRORS,
    EXIT_OK,
    Output,
    add_diag_options,
    checked,
    command,
    make_sink,
    sources,
)
from dslc.cli.paths import UsageError
from dslc.core.errors import RunnerError
from dslc.core.types import PrecisionSpec
from dslc.diag.diagnostic import Failed
from dslc.diag.span import printable
from dslc.pipeline import FrontEnd
from dslc.runtime import params
from dslc.runtime.bundle import read
from dslc.runtime.schedule import Schedule


def missing_weights(name: str, params: list[str]) -> UsageError:
    """No `--weights` for a model that loads some: the error names them."""
    shown = ", ".join(f"`{p}`" for p in params[:3]) + (", ..." if len(params) > 3 else "")
    return UsageError(f"`{name}` loads {len(params)} weight{'s' if len(params) != 1 else ''} "
                      f"({shown}): give them with `--weights W.safetensors`")


def bundle_weights(args: argparse.Namespace, manifest: Any) -> dict[str, np.ndarray]:
    """The weights a bundle loads, from `--weights` (its W0202 sentence as `runtime_warn` says);
    none for a bundle that loads none, `missing_weights` for one that does."""
    if args.weights is None:
        if manifest.params:
            raise missing_weights(manifest.model, [p.name for p in manifest.params])
        return {}
    return params.read(args.weights, manifest, runtime_warn(args))


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
            pair = (weights.dtype_name(given[name]), weights.dtype_name(a))
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
                                tensors=weights.from_torch(args.checkpoint, args.prefix),
                                source=args.checkpoint)
        if found is None:
            return EXIT_ERRORS
        tensors = found
    with paths.writing(args.output):
        weights.save(args.output, tensors, {"model": model.name, "source": str(args.file)})
    total = sum(int(a.size) for a in tensors.values())
    print(f"wrote {printable(args.output)}: {len(tensors)} tensors, {total:,} values",
          file=sys.stderr)
    return EXIT_OK


def cmd_weights_prepare(args: argparse.Namespace) -> int:
    """The load-time values of a bundle (batchnorm folding, layouts) computed once and saved, so
    start-up uploads them as they are."""
    paths.output_file(args.output, [args.bundle, args.weights])
    program = Schedule(read(paths.bundle_file(args.bundle)))
    try:
        tensors = params.read(args.weights, program.bundle.manifest, runtime_warn(args))
    except RunnerError as err:
        print(err, file=sys.stderr)
        return EXIT_ERRORS
    data = params.prepare(program, tensors)
    with paths.writing(args.output):
        params.save_prepared(args.output, program, data, source=str(args.weights))
    total = sum(int(a.nbytes) for a in data.values())
    print(f"wrote {printable(args.output)}: {len(data)} values prepared for "
          f"`{printable(args.bundle)}`, "
          f"{total / 2**20:,.1f} MiB", file=sys.stderr)
    return EXIT_OK


def add_commands(sub: Any) -> None:
    p = command(sub, "weights", "make or convert weight files")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    r = command(actions, "random", "random weights with realistic scales, for a model's params")
    r.add_argument("file", type=Path, metavar="FILE", help="the model's .cgraph file")
    r.add_argument("-o", "--output", type=Path, required=True, metavar="W.safetensors",
                   help="the weight file to write")
    r.add_argument("--seed", type=int, default=0, help="the random seed (default 0)")
    add_diag_options(r)
    r.set_defaults(run=cmd_weights)
    t = command(actions, "from-torch", "a PyTorch state_dict, checked and converted")
    t.add_argument("checkpoint", type=Path, metavar="CKPT",
                   help="a PyTorch checkpoint holding a state_dict (read with weights_only)")
    t.add_argument("--model", dest="file", type=Path, required=True, metavar="FILE",
                   help="the model's .cgraph file, whose params the checkpoint must match")
    t.add_argument("-o", "--output", type=Path, required=True, metavar="W.safetensors",
                   help="the weight file to write")
    t.add_argument("--prefix", default="", metavar="P",
                   help="read only the checkpoint's keys under P, without it (e.g. `bert.`)")
    add_diag_options(t)
    t.set_defaults(run=cmd_weights)
    w = command(actions, "prepare", "a bundle's load-time values from these weights, for the "
                "fastest start-up (the runner takes either file)")
    w.add_argument("bundle", type=Path, metavar="BUNDLE", help="a bundle made by `dslc compile`")
    w.add_argument("weights", type=Path, metavar="W.safetensors", help="the model's weights")
    w.add_argument("-o", "--output", type=Path, required=True, metavar="OUT.safetensors",
                   help="the prepared weight file to write")
    w.set_defaults(run=cmd_weights_prepare)
