"""The commands that make bundles: `compile` (bundle + runner, and the stage dumps), `tune
BUNDLE`, `target capture`."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from dslc import fsutil
from dslc.backend.device import device_count, require
from dslc.backend.target import Target, capture, load_target, require_device
from dslc.cli import fp8_choice, paths
from dslc.cli.calibrate import read_samples
from dslc.cli.front import (
    EXIT_BACKEND,
    EXIT_ERRORS,
    EXIT_OK,
    Output,
    checked,
    command,
    parse_precision,
    sources,
)
from dslc.cli.paths import UsageError
from dslc.cli.progress import Progress
from dslc.cli.weights import checked_weights
from dslc.diag.span import printable
from dslc.pipeline import (
    STAGES,
    BuildOptions,
    Built,
    FrontEnd,
    TuneOptions,
    WriteFailed,
    build,
)
from dslc.runtime.bundle import load
from dslc.runtime.tuningdb import SpecError, is_file, open_store
from dslc.tune import format_report, group_measurer, kernel_measurer, tune, tuned_bundle
from dslc.tune.fusion import KernelMeasured, Measured, measure_kernels, measure_splits, with_fusion
from dslc.tune.gpus import SpreadError, across, parse_gpus
from dslc.tune.joins import Joined, join_measured


def compile_to(result: FrontEnd, args: argparse.Namespace, target: Target, outdir: Path,
               out: Output) -> int:
    """Front end done: build into `outdir` (`pipeline.build`) and say what was made."""
    assert result.model is not None
    model = result.model
    started = time.monotonic()
    checked = None
    if args.weights is not None:
        checked = checked_weights(args, out, result, convert=args.precision is not None)
        if checked is None:
            return EXIT_ERRORS
    decision = None
    fp8_seconds = None
    if args.fp8 == "auto":
        assert checked is not None  # --fp8 auto asks for --weights (`fp8_choice.usage`)
        result, decision = fp8_choice.choose(result, args, target, checked,
                                             _buckets(args.bucket, model), out.progress)
        fp8_seconds = time.monotonic() - started
    wanted = frozenset(STAGES) if "all" in args.dump else frozenset(args.dump)
    as_json = args.format == "json"  # stdout holds the one JSON document: dumps go to files
    show = None if as_json else _show_dump if len(wanted) > 1 else _show_text
    options = BuildOptions(target, outdir, _buckets(args.bucket, model), wanted,
                           _tune_options_of(args) if target.live and args.tune else None,
                           checked, out.progress, show, verify=args.verify)
    try:
        built = build(result, options)
    except WriteFailed as err:
        raise UsageError(f"cannot write `{err.path}`: {paths.describe(err.error)}") from err
    except SpreadError as err:  # tuning across GPUs: a worker failed, or two kinds of GPU
        print(f"error: {err}", file=sys.stderr)
        return EXIT_BACKEND
    finally:
        out.progress.clear()
    if built.compiled is None:
        out.diagnostics(built.diagnostics, result.program.sources)
        return EXIT_BACKEND
    if built.tuning is not None and not args.quiet:
        print(format_report(built.tuning), file=sys.stderr)
    if decision is not None:
        assert built.bundle is not None and checked is not None
        fp8_choice.record(built.bundle, decision, checked, read_samples(args.data))
        if not args.quiet:
            print("\n".join(decision.table()), file=sys.stderr)
    summary = compile_summary(args.file, built, len(model.buckets), sorted(wanted),
                              checked is not None, fp8_seconds)
    if as_json:
        print(json.dumps(summary, indent=2))
    else:
        out.info(_summary_text(summary))
    return EXIT_OK


def _show_dump(name: str, text: str) -> None:
    print(f"==> {name} <==")
    print(text, end="")


def _show_text(name: str, text: str) -> None:
    print(text, end="")


def compile_summary(source: Path, built: Built, buckets: int, dumps: list[str],
                    weights: bool, fp8_seconds: float | None = None) -> dict[str, Any]:
    """What `dslc compile` made (its `--format json` document); `weights`: whether the weights
    were written beside the bundle; `fp8_seconds`: the time `--fp8 auto` spent measuring (the
    command's `seconds` count it too)."""
    compiled = built.compiled
    assert compiled is not None and built.bundle is not None
    graphs = sum(1 for s in compiled.steps if s.kind == "graph")
    name, folder = compiled.model.name, built.bundle.parent
    tuning = built.tuning
    return {
        "source": str(source), "model": name, "target": compiled.target.name,
        "bundle": str(built.bundle), "runner": str(folder / f"{name}_runner.py"),
        "weights": str(folder / f"{name}.safetensors") if weights else None,
        "steps": len(compiled.steps), "cudnn_graphs": graphs,
        "fallback_kernels": len(compiled.steps) - graphs,
        "split": sum(1 for s in compiled.steps if s.reason.startswith("split")),
        "graphs": len(compiled.builds), "buckets": buckets,
        "compiled_buckets": len(compiled.buckets),
        "plans_built": sum(1 for b in compiled.builds.values() if b.has_plan),
        "tuned": None if tuning is None else {"graphs": len(tuning.rows),
                                              "seconds": round(tuning.seconds, 3),
                                              "geomean_speedup": tuning.geomean_speedup()},
        "dumps": [str(folder / f"{STAGES.index(d) + 1}.{d}.txt") for d in dumps],
        "fp8_seconds": None if fp8_seconds is None else round(fp8_seconds, 3),
        "seconds": round(built.seconds + (fp8_seconds or 0.0), 3),
    }


def _summary_text(s: dict[str, Any]) -> str:
    kernels = s["fallback_kernels"]
    plural = "" if kernels == 1 else "s"
    splits = f", {s['split']} split" if s["split"] else ""
    return (f"compiled {s['source']} for {s['target']}: {s['steps']} steps ({s['cudnn_graphs']} "
            f"cuDNN graphs, {kernels} fallback kernel{plural}{splits}), {s['graphs']} graphs over "
            f"{_buckets_text(s)}, {s['plans_built']} plans built, in {s['seconds']:.1f} s"
            + (f" ({s['fp8_seconds']:.1f} s of it measuring fp8)" if s.get("fp8_seconds") else "")
            + f" -> {Path(s['bundle']).parent}/")


def _buckets_text(s: dict[str, Any]) -> str:
    """The buckets compiled: all of the model's, or those `--bucket` chose of them."""
    done, of = s.get("compiled_buckets", s["buckets"]), s["buckets"]
    return f"{done} bucket{'' if done == 1 else 's'}" + ("" if done == of else f" (of {of})")


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
            raise UsageError(f"`--bucket {spec}` is not a bucket of `{model.name}` ({known}); a "
                             "model's buckets are its dims' `tune [...]` lists or its `buckets` "
                             "line (docs/LANGUAGE.md 2.4)")
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
    records = load(paths.bundle_file(args.bundle))
    if args.fusion == "measure" and args.gpus is not None:
        raise UsageError("`--fusion measure` measures on one GPU: leave out `--gpus`")
    how = _tune_options_of(args)
    progress = Progress(args.quiet)
    try:
        if how.gpus is not None:
            tuned = across(records, how.gpus, how.db, how.budget_s, how.model_budget_s,
                           how.search)
        else:
            tuned = tune(records, how.db, how.budget_s, how.model_budget_s, how.search,
                         lambda text: progress(f"tuning {text}"))
    except SpreadError as err:  # a worker failed, or the GPUs are of two kinds
        print(f"error: {err}", file=sys.stderr)
        return EXIT_BACKEND
    finally:
        progress.clear()
    result = tuned_bundle(records, tuned)
    measured: list[Measured] = []
    kernels: list[KernelMeasured] = []
    joined: list[Joined] = []
    if args.fusion == "measure":
        try:
            measured = measure_splits(result, tuned.plans,
                                      group_measurer(result, how.db, how.budget_s, how.search),
                                      lambda text: progress(f"measuring {text}"))
            kernels = measure_kernels(result, tuned.plans, kernel_measurer(result),
                                      lambda text: progress(f"measuring {text}"))
            result, joined = join_measured(with_fusion(result, measured, kernels), kernels,
                                           kernel_measurer,
                                           lambda text: progress(f"measuring {text}"))
        finally:
            progress.clear()
    with paths.writing(target):
        emit_bundle.write(target, result)
    print(format_report(tuned.report))
    for m in measured:
        print(f"{m.split.step.name}: {m.summary()}: {'split' if m.chosen else 'kept fused'}")
    for k in kernels:
        print(f"{k.step.name}: {k.summary()}: {'one kernel' if k.chosen else 'kept the graph'}")
    for j in joined:
        print(f"{', '.join(r.name for r in j.readers)}: {j.summary()}: "
              f"{'one kernel' if j.chosen else 'kept apart'}")
    split = sum(m.chosen and len(m.parts) == len(records.buckets) for m in measured)
    if split or any(j.chosen for j in joined):
        print(f"note: {split} groups split and {sum(j.chosen for j in joined)} steps joined "
              "with their readers by measurement; the runner beside the bundle runs the new schedule, its "
              "comments list the compiled one", file=sys.stderr)
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
    target = load_target(args.target)  # a wrong target stops here, before any work
    fp8_choice.usage(args, target)
    out = Output(args.error_format, args.color, args.quiet)
    out.progress(f"checking {printable(args.file)}")
    try:
        result = checked(args, out)
    finally:
        out.progress.clear()
    if result is None or result.model is None:
        return EXIT_ERRORS
    outdir: Path = args.output or Path("build") / result.model.name
    paths.output_dir(outdir)
    paths.outputs_in(outdir, _artifact_names(result.model.name, args),
                     [args.file, args.weights, _target_file(args.target), _tuning_db(args),
                      *sources(result)])
    return compile_to(result, args, target, outdir, out)


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


def cmd_target(args: argparse.Namespace) -> int:
    paths.output_file(args.output)
    require_device("`dslc target capture`")
    with paths.writing(args.output):
        fsutil.write_text(args.output, capture())
    print(f"wrote {args.output}", file=sys.stderr)
    return EXIT_OK


def add_commands(sub: Any, diag_options: Any) -> None:
    p = command(sub, "compile", "compile a model into a bundle and a runner")
    p.add_argument("file", type=Path, metavar="FILE", help="the model's .cgraph file")
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
    p.add_argument("--fp8", choices=("source", "off", "auto"), default="source",
                   help="source: the ops the model asks to compute in fp8 do (default); off: "
                        "none does (the model without its fp8 requests: its fp16 baseline); "
                        "auto: on a GPU, those that make the model faster here, within "
                        "--max-error on --data, calibrated on it")
    p.add_argument("--max-error", type=float, default=0.05, metavar="E",
                   help="with --fp8 auto: the largest error allowed, rms of the difference "
                        "over rms of the f32 model's outputs without fp8 (default 0.05)")
    p.add_argument("--data", type=Path, metavar="SAMPLES.npz",
                   help="with --fp8 auto: representative inputs, one array per model input "
                        "(runs stacked on a first axis), as `dslc calibrate` takes them")
    p.add_argument("--no-tune", dest="tune", action="store_false",
                   help="on a GPU, keep the heuristics' plans (tune later with `dslc tune`)")
    _tune_options(p)
    p.add_argument("--verify", action="store_true",
                   help="run the IR verifier on the checked graph and after every lowering pass; "
                        "a failure names the pass (a bug in dslc, exit 4)")
    p.add_argument("--format", choices=("text", "json"), default="text",
                   help="the summary as a line for people (default), or as one JSON document on "
                        "stdout (a stage `--dump` is then only written to its file)")
    p.add_argument("-q", "--quiet", action="store_true",
                   help="no progress, summary or tuning report; errors and warnings still")
    diag_options(p)
    p.set_defaults(run=cmd_compile)

    p = command(sub, "tune", "measure and pick the fastest plans of a bundle on this GPU")
    p.add_argument("bundle", type=Path, metavar="BUNDLE", help="the bundle to tune")
    p.add_argument("-o", "--output", type=Path, metavar="BUNDLE",
                   help="write the tuned bundle here (default: in place)")
    _tune_options(p)
    p.add_argument("--fusion", choices=("keep", "measure"), default="keep",
                   help="keep: the compiled partition (default); measure: also time each conv "
                        "or matmul group split after its bias, and each graph of pointwise ops "
                        "(or attention of few queries over many keys, or a matmul with its "
                        "epilogue: a few rows on dslc's kernel, more on cuBLASLt) as one "
                        "fallback kernel, "
                        "and keep what is faster over the buckets (the "
                        "bundle's schedule is rewritten)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress line")
    p.set_defaults(run=cmd_tune)

    p = command(sub, "target", "device profiles for deviceless compiles")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    c = command(actions, "capture", "write this GPU's profile as JSON")
    c.add_argument("-o", "--output", type=Path, required=True, metavar="FILE.json",
                   help="the profile to write, for `--target FILE.json` elsewhere")
    c.set_defaults(run=cmd_target)
