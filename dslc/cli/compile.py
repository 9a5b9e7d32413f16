"""The commands that make and read bundles: `compile` (bundle + runner, and the stage dumps),
`tune BUNDLE`, `inspect BUNDLE`, `target capture`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from dslc import fsutil
from dslc.backend import environment
from dslc.backend.device import device_count, require
from dslc.backend.target import capture, live_device_available, load_target
from dslc.cli import paths
from dslc.cli.front import EXIT_BACKEND, EXIT_ERRORS, EXIT_OK, Output, checked, parse_precision, sources
from dslc.cli.paths import UsageError
from dslc.cli.weights import checked_weights
from dslc.core.errors import RunnerError
from dslc.ir.placement import placed_in
from dslc.pipeline import STAGES, BuildOptions, Built, FrontEnd, TuneOptions, WriteFailed, build
from dslc.runtime import startup
from dslc.runtime.bundle import load
from dslc.runtime.records import Environment, StepRecord
from dslc.runtime.schedule import Schedule
from dslc.runtime.tuningdb import SpecError, is_file, open_store
from dslc.tune import format_report, tune, tuned_bundle
from dslc.tune.gpus import SpreadError, across, parse_gpus


def compile_to(result: FrontEnd, args: argparse.Namespace, outdir: Path, out: Output) -> int:
    """Front end done: build into `outdir` (`pipeline.build`) and say what was made."""
    assert result.model is not None
    model = result.model
    checked = None
    if args.weights is not None:
        checked = checked_weights(args, out, result, convert=args.precision is not None)
        if checked is None:
            return EXIT_ERRORS
    quiet = args.quiet

    def progress(text: str) -> None:
        if not quiet and sys.stderr.isatty():
            print(f"\r\x1b[K  {text}", end="", file=sys.stderr, flush=True)

    wanted = frozenset(STAGES) if "all" in args.dump else frozenset(args.dump)
    target = load_target(args.target)
    options = BuildOptions(target, outdir, _buckets(args.bucket, model), wanted,
                           _tune_options_of(args) if target.live and args.tune else None,
                           checked, progress, _show_dump if len(wanted) > 1 else _show_text,
                           verify=args.verify)
    try:
        built = build(result, options)
    except WriteFailed as err:
        raise UsageError(f"cannot write `{err.path}`: {paths.describe(err.error)}") from err
    except SpreadError as err:  # tuning across GPUs: a worker failed, or two kinds of GPU
        print(f"error: {err}", file=sys.stderr)
        return EXIT_BACKEND
    finally:
        if not quiet and sys.stderr.isatty():
            print("\r\x1b[K", end="", file=sys.stderr)
    if built.compiled is None:
        out.diagnostics(built.diagnostics, result.program.sources)
        return EXIT_BACKEND
    if built.tuning is not None and not quiet:
        print(format_report(built.tuning), file=sys.stderr)
    out.info(_summary(args.file, built, len(model.buckets)))
    return EXIT_OK


def _show_dump(name: str, text: str) -> None:
    print(f"==> {name} <==")
    print(text, end="")


def _show_text(name: str, text: str) -> None:
    print(text, end="")


def _summary(source: Path, built: Built, buckets: int) -> str:
    compiled = built.compiled
    assert compiled is not None and built.bundle is not None
    graphs = sum(1 for s in compiled.steps if s.kind == "graph")
    kernels = len(compiled.steps) - graphs
    made = sum(1 for b in compiled.builds.values() if b.has_plan)
    split = sum(1 for s in compiled.steps if s.reason.startswith("split"))
    plural = "" if kernels == 1 else "s"
    splits = f", {split} split" if split else ""
    return (f"compiled {source} for {compiled.target.name}: {len(compiled.steps)} steps ({graphs} "
            f"cuDNN graphs, {kernels} fallback kernel{plural}{splits}), {len(compiled.builds)} "
            f"graphs over {buckets} buckets, {made} plans built, in {built.seconds:.1f} s -> "
            f"{built.bundle.parent}/")


def _buckets(specs: list[str], model: Any) -> list[dict[str, int]] | None:
    """`--bucket N=32` (repeatable): compile these buckets only; each must be a model bucket."""
    if not specs:
        return None
    chosen = []
    for spec in specs:
        try:
            bucket = {k.strip(): int(v) for k, v in (part.split("=") for part in spec.split(","))}
        except ValueError as err:
            raise UsageError(f"`--bucket {spec}`: write DIM=VALUE[,DIM=VALUE...]") from err
        if bucket not in [dict(b) for b in model.buckets]:
            known = "; ".join(",".join(f"{k}={v}" for k, v in b.items()) for b in model.buckets)
            raise UsageError(f"`--bucket {spec}` is not a bucket of `{model.name}` ({known})")
        chosen.append(bucket)
    return chosen


def _tune_options_of(args: argparse.Namespace, on_gpu: bool = True) -> TuneOptions:
    """The tuning options; a `--tuning-db` (or `DSLC_TUNING_DB`) that names no database, or a
    `--gpus` that names no GPUs here, is a usage error, said before any work starts (without a
    GPU, `on_gpu` False, `--gpus` is only read)."""
    count = device_count() if on_gpu and args.gpus is not None else None
    if count == 0:
        require()  # no GPU: R0801 (exit 3), as tuning without --gpus says
    try:
        db = open_store(args.tuning_db)
        gpus = None if args.gpus is None else parse_gpus(args.gpus, count)
    except (SpecError, SpreadError) as err:
        raise UsageError(str(err)) from err
    return TuneOptions(db, args.budget, args.model_budget, args.search, gpus)


def cmd_tune(args: argparse.Namespace) -> int:
    """Tune a bundle (compiled deviceless, or elsewhere) on this GPU; written back atomically."""
    from dslc.emit import bundle as emit_bundle  # imports cudnn: only where tuning runs

    target = args.output or args.bundle  # in place unless told otherwise
    paths.output_file(target, [_tuning_db(args)], option="-o" if args.output else "")
    records = load(args.bundle)
    how = _tune_options_of(args)
    quiet = args.quiet

    def progress(text: str) -> None:
        if not quiet and sys.stderr.isatty():
            print(f"\r\x1b[K  tuning {text}", end="", file=sys.stderr, flush=True)

    try:
        if how.gpus is not None:
            tuned = across(records, how.gpus, how.db, how.budget_s, how.model_budget_s,
                           how.search)
        else:
            tuned = tune(records, how.db, how.budget_s, how.model_budget_s, how.search, progress)
    except SpreadError as err:  # a worker failed, or the GPUs are of two kinds
        print(f"error: {err}", file=sys.stderr)
        return EXIT_BACKEND
    finally:
        if not quiet and sys.stderr.isatty():
            print("\r\x1b[K", end="", file=sys.stderr)
    with paths.writing(target):
        emit_bundle.write(target, tuned_bundle(records, tuned))
    print(format_report(tuned.report))
    print(f"wrote {target}", file=sys.stderr)
    return EXIT_OK


def _tune_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--budget", type=float, default=20.0, metavar="S",
                   help="seconds of measuring per graph (default 20)")
    p.add_argument("--model-budget", type=float, default=900.0, metavar="S",
                   help="seconds for the whole model (default 900); the rest keep their plan")
    p.add_argument("--search", choices=("heuristics", "exhaustive"), default="heuristics",
                   help="candidates: the heuristics' list, or also the engine x knob space")
    p.add_argument("--gpus", metavar="all|0,1",
                   help="tune on these GPUs of this machine, one process each, the distinct "
                        "graphs spread over them (default: one GPU)")
    p.add_argument("--tuning-db", metavar="DB",
                   help="the tuning database: a file (SQLite), redis://HOST:PORT/DB for a fleet, "
                        "or `none` (default: $DSLC_TUNING_DB, else the user cache folder)")


def cmd_compile(args: argparse.Namespace) -> int:
    if args.output is not None:
        paths.output_dir(args.output)
    _tune_options_of(args, on_gpu=False)  # a bad --tuning-db or --gpus: said now, not later
    out = Output(args.error_format, args.color, args.quiet)
    result = checked(args, out)
    if result is None or result.model is None:
        return EXIT_ERRORS
    outdir: Path = args.output or Path("build") / result.model.name
    paths.output_dir(outdir)
    paths.outputs_in(outdir, _artifact_names(result.model.name, args),
                     [args.file, args.weights, _target_file(args.target), _tuning_db(args),
                      *sources(result)])
    return compile_to(result, args, outdir, out)


def _artifact_names(name: str, args: argparse.Namespace) -> list[str]:
    """The files `dslc compile` writes into its folder."""
    dumps = set(STAGES) if "all" in args.dump else set(args.dump)
    return [f"{name}.bundle", f"{name}_runner.py",
            *([f"{name}.safetensors"] if args.weights is not None else []),
            *(f"{n}.{stage}.txt" for n, stage in enumerate(STAGES, start=1) if stage in dumps)]


def _tuning_db(args: argparse.Namespace) -> Path | None:
    return is_file(args.tuning_db)


def _target_file(spec: str | None) -> Path | None:
    """The profile file `--target` names, if it names one."""
    return Path(spec) if spec and Path(spec).is_file() else None


def cmd_inspect(args: argparse.Namespace) -> int:
    bundle = load(args.bundle)  # validated records
    if args.env:
        return _inspect_env(bundle.environment, args.on_mismatch)
    program = Schedule(bundle)
    env = bundle.environment
    print(f"model {bundle.model}  (from {bundle.source}, dslc {bundle.dslc_version}, "
          f"{bundle.created})")
    print(f"compiled for {bundle.target}: {env.device_name} (sm {env.compute_capability}), "
          f"cuDNN {env.cudnn_backend}, frontend {env.cudnn_frontend}")
    for b in bundle.buckets:
        built = sum(1 for g in b.graphs.values() if g.plan.serialized)
        print(f"bucket {b.key}: arena {b.arena_bytes / 2**20:.1f} MiB, "
              f"{len(b.graphs)} graphs, {built} with a saved plan")
    nodes = program.nodes
    print(f"\n{len(program.steps)} steps:")
    for i, step in enumerate(program.steps, start=1):
        ops = " -> ".join(nodes[n].op for n in step.nodes)
        where = "cuDNN" if step.kind == "graph" else "OUTSIDE cuDNN (fallback kernel)"
        print(f"{i:4d}. {step.name}  [{ops}]  {where}")
        if step.kind == "graph":
            for b in bundle.buckets:
                g = b.graphs.get(step.signature)
                if g is None:
                    continue
                plan = g.plan
                state = (f"engine {plan.engine_id} knobs {dict(plan.knobs)}, workspace "
                         f"{plan.workspace} B" if plan.engine_id is not None
                         else f"no plan yet: {plan.note or 'none recorded'}")
                print(f"        {b.key}: {state}")
        if step.reason:
            print(f"        why: {step.reason}")
        for line in _placement_lines(program, step):
            print(f"        {line}")
    return EXIT_OK


def _placement_lines(program: Schedule, step: StepRecord) -> list[str]:
    """Where concat operands are written in place (`dslc.ir.placement`), as inspect says it."""
    lines = [f"writes %{v} in place into its slice of %{program.placement[v][0]} (no copy)"
             for v in step.outputs if v in program.placement]
    for name in step.nodes:
        node = program.nodes[name]
        if node.op == "concat":
            placed = placed_in(program.placement, name)
            copied = [i for i in node.inputs if i not in placed]
            lines.append("copies nothing: every operand was written in place" if not copied else
                         f"copies {len(copied)} of {len(node.inputs)} operands "
                         f"({', '.join('%' + c for c in copied)}); the others were written "
                         "in place")
    return lines


def _inspect_env(recorded: Environment, policy: str) -> int:
    if recorded.live:
        print(f"bundle tuned on: {recorded.device_name}, cuDNN {recorded.cudnn_backend}"
              f" (frontend {recorded.cudnn_frontend}), CUDA {recorded.cuda_runtime}, "
              f"driver {recorded.driver_release or recorded.driver}")
    else:
        print(f"bundle compiled deviceless (untuned) for {recorded.device_name} "
              f"(sm {recorded.compute_capability}), cuDNN {recorded.cudnn_backend}"
              f" (frontend {recorded.cudnn_frontend})")
    if not live_device_available():
        print("this machine: no GPU; start-up would stop with R0801")
        return EXIT_OK
    live = Environment.from_data(environment.live(), "live environment")
    print(f"this machine:    {live.device_name}, cuDNN {live.cudnn_backend} "
          f"(frontend {live.cudnn_frontend}), CUDA {live.cuda_runtime}, driver {live.driver}")
    for name in startup.FIELD_ACTION:
        was, now = getattr(recorded, name), getattr(live, name)
        mark = "same" if str(was) == str(now) else f"changed -> {startup.FIELD_ACTION[name]}"
        print(f"  {name:<20} {was!s:<24} {now!s:<24} {mark}")
    try:
        decision = startup.decide(recorded, live, policy)
    except RunnerError as err:
        print(f"start-up: {err}")
        return EXIT_OK
    print(f"start-up (on_mismatch={policy!r}): {decision.explain()}")
    return EXIT_OK


def cmd_target(args: argparse.Namespace) -> int:
    paths.output_file(args.output)
    if not live_device_available():
        print("error: `dslc target capture` needs a GPU, and this machine has none",
              file=sys.stderr)
        return EXIT_BACKEND
    with paths.writing(args.output):
        fsutil.write_text(args.output, capture())
    print(f"wrote {args.output}", file=sys.stderr)
    return EXIT_OK


def add_commands(sub: Any, diag_options: Any) -> None:
    p = sub.add_parser("compile", help="compile a model into a bundle and a runner")
    p.add_argument("file", type=Path, metavar="FILE")
    p.add_argument("-o", "--output", type=Path, metavar="DIR",
                   help="output folder (default build/<model>)")
    p.add_argument("--target", metavar="T", help="`h200` (default without a GPU), `device` "
                   "(this machine's GPU, the default with one), or a profile JSON")
    p.add_argument("--weights", type=Path, metavar="W.safetensors",
                   help="check these weights against the model and put them beside the bundle")
    p.add_argument("--dump", action="append", default=[], choices=(*STAGES, "all"),
                   help="print a stage's result and write it as N.<stage>.txt")
    p.add_argument("--bucket", action="append", default=[], metavar="N=32",
                   help="compile only this bucket (repeatable); others build on first use")
    p.add_argument("--precision", metavar="P", type=parse_precision,
                   help="override the model's precision: `f32` or `io=..,intermediate=..,compute=..`")
    p.add_argument("--no-tune", dest="tune", action="store_false",
                   help="on a GPU, keep the heuristics' plans (tune later with `dslc tune`)")
    _tune_options(p)
    p.add_argument("--verify", action="store_true",
                   help="run the IR verifier on the checked graph and after every lowering pass; "
                        "a failure names the pass (a bug in dslc, exit 4)")
    p.add_argument("-q", "--quiet", action="store_true")
    diag_options(p)
    p.set_defaults(run=cmd_compile)

    p = sub.add_parser("tune", help="measure and pick the fastest plans of a bundle on this GPU")
    p.add_argument("bundle", type=Path, metavar="BUNDLE")
    p.add_argument("-o", "--output", type=Path, metavar="BUNDLE",
                   help="write the tuned bundle here (default: in place)")
    _tune_options(p)
    p.add_argument("-q", "--quiet", action="store_true")
    p.set_defaults(run=cmd_tune)

    p = sub.add_parser("inspect", help="what a bundle holds: steps, plans, where each runs")
    p.add_argument("bundle", type=Path, metavar="BUNDLE")
    p.add_argument("--env", action="store_true",
                   help="compare the bundle's environment with this machine's: what start-up does")
    p.add_argument("--on-mismatch", choices=("retune", "heuristic", "error"), default="retune")
    p.set_defaults(run=cmd_inspect)

    p = sub.add_parser("target", help="device profiles for deviceless compiles")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    c = actions.add_parser("capture", help="write this GPU's profile as JSON")
    c.add_argument("-o", "--output", type=Path, required=True, metavar="FILE.json")
    c.set_defaults(run=cmd_target)



