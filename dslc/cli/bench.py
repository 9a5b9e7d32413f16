"""The `bench` command: a `.cgraph` file (compiled for this GPU first, the heuristics' plans) or a
bundle timed on the GPU at its buckets or the sizes given, against PyTorch with `--against
torch`, with a per-step roofline; a table, one JSON document, and a plot (`--plot`)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from dslc import weights
from dslc.backend.target import load_target, require_device
from dslc.backend.torch_side import COMPILE_MODES
from dslc.bench.measure import BenchOptions, Reference, bench
from dslc.cli import paths
from dslc.cli.bench_report import render_table
from dslc.cli.front import EXIT_BACKEND, EXIT_ERRORS, EXIT_OK, Output, add_diag_options, checked, command
from dslc.cli.paths import UsageError
from dslc.cli.progress import Progress
from dslc.cli.weights import checked_weights
from dslc.pipeline import BuildOptions, FrontEnd, WriteFailed, build
from dslc.runtime import Model
from dslc.runtime.bundle import load as load_bundle
from dslc.runtime.manifest import Manifest


def parse_size(spec: str) -> dict[str, int]:
    """`N=32` or `B=8,S=128` -> {"N": 32} (UsageError otherwise)."""
    out: dict[str, int] = {}
    for part in spec.split(","):
        name, sep, value = part.partition("=")
        if not sep or not name.strip().isidentifier() or not value.strip().isdigit():
            raise UsageError(f"`--size {spec}`: write DIM=VALUE[,DIM=VALUE...], e.g. N=32")
        out[name.strip()] = int(value)
    return out


def chosen_sizes(specs: list[str], manifest: Manifest) -> list[dict[str, int]]:
    """The sizes to measure: those given (each naming every dynamic dim, in its range), else
    every bucket of the model."""
    if not specs:
        return [dict(b) for b in manifest.buckets]
    dynamic = {d.name: d for d in manifest.dims if d.dynamic}
    sizes = []
    for spec in specs:
        size = parse_size(spec)
        unknown = sorted(set(size) - set(dynamic))
        missing = sorted(set(dynamic) - set(size))
        if unknown:
            raise UsageError(f"`--size {spec}`: `{unknown[0]}` is no dynamic dim of "
                             f"`{manifest.model}` (its dims: {', '.join(dynamic) or 'none'})")
        if missing:
            raise UsageError(f"`--size {spec}` gives no value for the dim `{missing[0]}`")
        for name, value in size.items():
            d = dynamic[name]
            if not d.lo <= value <= d.hi:
                raise UsageError(f"`--size {spec}`: `{name}` ranges over {d.lo}..{d.hi}")
        sizes.append(size)
    return sizes


class Lines:
    """Progress: the rewritten line on a terminal, else one line per phase on stderr (a
    benchmark runs for minutes, and a log should say where); nothing with `-q`."""

    def __init__(self, quiet: bool) -> None:
        self.line = Progress(quiet)
        self.quiet = quiet

    def __call__(self, text: str) -> None:
        if self.line.on:
            self.line(text)
        elif not self.quiet:
            print(f"bench: {text}", file=sys.stderr, flush=True)

    def clear(self) -> None:
        self.line.clear()


def cmd_bench(args: argparse.Namespace) -> int:
    if args.plot is not None:
        paths.output_file(args.plot, [args.file, args.weights], option="--plot")
    if args.repeats < 1 or args.warmup < 0:
        raise UsageError("`--repeats` must be at least 1 and `--warmup` at least 0")
    if args.kernels and importlib.util.find_spec("torch") is None:
        raise UsageError("`--kernels` reads the GPU's kernels through PyTorch's profiler "
                         "(CUPTI): install torch, or leave `--kernels` out")
    require_device("`dslc bench`")  # one sentence, exit 3, before any work
    if args.kernels and not _torch_has_cuda():
        raise UsageError("`--kernels` reads the GPU's kernels through PyTorch's profiler "
                         "(CUPTI), and this PyTorch has no CUDA: install a CUDA build of torch, "
                         "or leave `--kernels` out")
    out = Output(args.error_format, args.color)
    is_bundle = args.file.suffix == ".bundle"
    front = None
    if not is_bundle or args.against == "torch":
        source = args.file if not is_bundle else _source_of(args.file)
        front = checked(argparse.Namespace(**{**vars(args), "file": source}), out, "bench")
        if front is None or front.model is None:
            return EXIT_ERRORS
    tmp = Path(tempfile.mkdtemp(prefix="dslc-bench-"))
    progress = Lines(args.quiet)
    try:
        tensors = _weights(args, out, front, tmp)
        if tensors is None:
            return EXIT_ERRORS
        bundle = args.file if is_bundle else _compile(args, front, tmp, progress)
        if bundle is None:
            return EXIT_BACKEND
        weights_file = tmp / "weights.safetensors"
        weights.save(weights_file, tensors)
        model = Model(bundle, weights_file)
        sizes = chosen_sizes(args.size, model.manifest)
        reference = None
        if args.against == "torch":
            assert front is not None and front.model is not None
            reference = Reference(front.model.graph, front.model.env, tensors)
        options = BenchOptions(sizes, args.repeats, args.warmup, args.profile_repeats,
                               None if args.torch_compile == "none" else args.torch_compile,
                               args.seed, args.kernels)
        report = bench(model, options, reference, progress)
    finally:
        progress.clear()
        shutil.rmtree(tmp, ignore_errors=True)
    return _show(args, report)


def _torch_has_cuda() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def _show(args: argparse.Namespace, report: dict[str, Any]) -> int:
    if args.format == "json":
        print(json.dumps(report, indent=2, default=_json_default))
    else:
        print(render_table(report, args.top))
    if args.plot is not None:
        from dslc.cli.bench_plot import plot  # matplotlib: only where a plot is asked for

        written = plot(report, args.plot)
        print(f"wrote {args.plot}" if written else "warning: `--plot` needs matplotlib, which "
              "is not installed here (`pip install matplotlib`); no plot written",
              file=sys.stderr)
    return EXIT_OK


def _json_default(value: Any) -> Any:
    return str(value)


def _source_of(bundle: Path) -> Path:
    """The `.cgraph` file a bundle was compiled from (the PyTorch side is built from it)."""
    source = Path(load_bundle(paths.bundle_file(bundle)).source)
    if not source.is_file():
        raise UsageError(f"`--against torch` builds PyTorch's model from the bundle's source, "
                         f"`{source}`, which is not there; run `dslc bench` on the .cgraph file")
    return source


def _weights(args: argparse.Namespace, out: Output, front: FrontEnd | None,
             tmp: Path) -> dict[str, Any] | None:
    """`--weights`, else the weights beside a bundle, else random ones (seeded) of the model;
    checked against the model where its source is known."""
    given = args.weights
    if given is None and args.file.suffix == ".bundle":
        beside = args.file.with_suffix(".safetensors")
        given = beside if beside.is_file() else None
    if front is None:  # a bundle on its own: the runtime checks them as it loads (R0202)
        if given is None:
            raise UsageError(f"`{args.file}` has no weights beside it: pass `--weights W`")
        return weights.load(given)
    assert front.model is not None
    if given is None:
        return weights.random_weights(front.model.params, seed=args.seed)
    return checked_weights(args, out, front, convert=False, finite=False, source=given)


def _compile(args: argparse.Namespace, front: FrontEnd | None, tmp: Path,
             progress: Lines) -> Path | None:
    """A `.cgraph` file compiled for this GPU at the sizes that are buckets (all without
    `--size`; other sizes are built by the runtime on first use), the heuristics' plans."""
    assert front is not None and front.model is not None
    model = front.model
    buckets = [dict(b) for b in model.buckets]
    wanted = [parse_size(s) for s in args.size]
    chosen = [b for b in buckets if b in wanted] if wanted else buckets
    try:
        built = build(front, BuildOptions(load_target("device"), tmp / "build",
                                          buckets=chosen or buckets[:1],
                                          progress=lambda text: progress(f"compiling: {text}")))
    except WriteFailed as err:
        raise UsageError(f"cannot write `{err.path}`: {paths.describe(err.error)}") from err
    if built.bundle is None:
        Output("human", "never").diagnostics(built.diagnostics, front.program.sources)
        return None
    return built.bundle


def add_commands(sub: Any) -> None:
    p = command(sub, "bench", "time a model on this GPU, against PyTorch, with a roofline")
    p.add_argument("file", type=Path, metavar="FILE|BUNDLE",
                   help="a .cgraph file (compiled for this GPU first), or a bundle")
    p.add_argument("--size", action="append", default=[], metavar="DIM=V[,DIM=V]",
                   help="measure at these dim values (repeat for more; default: every bucket)")
    p.add_argument("--weights", type=Path, metavar="W.safetensors",
                   help="the weights (default: beside a bundle, else random of the model)")
    p.add_argument("--against", choices=("torch",),
                   help="also run the model in PyTorch (eager, CUDA graph, torch.compile), "
                        "translated from the checked model, and compare the outputs")
    p.add_argument("--torch-compile", choices=(*COMPILE_MODES, "none"), default="default",
                   help="torch.compile's mode with --against torch (default: default; "
                        "max-autotune compiles for minutes)")
    p.add_argument("--repeats", type=int, default=30, metavar="N",
                   help="timed calls per median (default 30)")
    p.add_argument("--warmup", type=int, default=5, metavar="N",
                   help="calls before timing (default 5)")
    p.add_argument("--profile-repeats", type=int, default=10, metavar="N",
                   help="runs of the per-step profile (default 10)")
    p.add_argument("--seed", type=int, default=0, help="of the random inputs and weights")
    p.add_argument("--top", type=int, default=12, metavar="K",
                   help="steps shown per roofline table (default 12; json has every step)")
    p.add_argument("--format", choices=("table", "json"), default="table",
                   help="tables for people (default), or one JSON document")
    p.add_argument("--kernels", action="store_true",
                   help="also list the GPU kernels of one replay by name and time, dslc's and "
                        "(with --against torch) PyTorch's and torch.compile's (needs PyTorch)")
    p.add_argument("--plot", type=Path, metavar="FILE.png",
                   help="also plot each step's time against its roofline bound and the totals")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    add_diag_options(p)
    p.set_defaults(run=cmd_bench)
