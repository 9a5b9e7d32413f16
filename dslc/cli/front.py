"""The front-end commands: `check`, `params`, `explain`; and what all commands share: their
parsers (`command`), diagnostic options and output."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path
from typing import Any, TextIO

from dslc.cli.progress import Progress
from dslc.core.types import DTYPES, PrecisionSpec
from dslc.diag import codes
from dslc.diag.diagnostic import Sink
from dslc.diag.render import render
from dslc.diag.span import SourceMap, printable
from dslc.pipeline import FrontEnd, Options, front_end

EXIT_OK, EXIT_ERRORS, EXIT_USAGE, EXIT_BACKEND, EXIT_INTERNAL = 0, 1, 2, 3, 4


class Output:
    """Where diagnostics and results go, in the chosen format."""

    def __init__(self, fmt: str, color: str, quiet: bool = False) -> None:
        self.fmt = fmt
        self.quiet = quiet
        self.progress = Progress(quiet)  # long work's progress line, erased before any output
        self.stream: TextIO = sys.stderr if fmt == "human" else sys.stdout
        if color == "auto":
            self.color = fmt == "human" and sys.stderr.isatty() and "NO_COLOR" not in os.environ
        else:
            self.color = color == "always"

    def diagnostics(self, sink: Sink, sources: SourceMap) -> None:
        """In source order within each file; files in the order they were first reported."""
        files: dict[str, int] = {}
        for d in sink.diagnostics:
            files.setdefault(d.span.file, len(files))
        ordered = sorted(sink.diagnostics,
                         key=lambda d: (files[d.span.file], d.span.line, d.span.col))
        if ordered:
            self.progress.clear()
        self.stream.write(render(ordered, self.fmt, sources, self.color))

    def summary(self, sink: Sink, what: str) -> None:
        if self.fmt != "human" or not sink.error_count:
            return
        warn = sink.warning_count
        tail = f", {warn} warning{'s' if warn != 1 else ''}" if warn else ""
        n = sink.error_count
        self.progress.clear()
        sys.stderr.write(f"error: could not {what}: {n} error{'s' if n != 1 else ''}{tail}\n")

    def info(self, text: str) -> None:
        """A result line: stdout for humans; stderr when stdout carries json or github records."""
        if not self.quiet:  # printable: a file name given in bytes that are not UTF-8
            self.progress.clear()
            print(printable(text), file=sys.stdout if self.fmt == "human" else sys.stderr)


DEBUG_HELP = "show the traceback of an internal error (a bug in dslc)"


def command(sub: Any, name: str, help: str) -> argparse.ArgumentParser:
    """A command's parser (`sub` is the parent's subparsers). Every command takes `--debug`
    too, so that it may come after the command's name (`dslc compile --debug ...`) as well as
    before it; left unset here, it keeps the value given before the name."""
    p: argparse.ArgumentParser = sub.add_parser(name, help=help,
                                                description=help[:1].upper() + help[1:] + ".")
    p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=DEBUG_HELP)
    return p


def add_render_options(p: argparse.ArgumentParser) -> None:
    """How diagnostics are written."""
    p.add_argument("--error-format", choices=("human", "json", "github"), default="human",
                   help="diagnostics for people (stderr), as JSON lines or as GitHub "
                        "annotations (stdout); default human")
    p.add_argument("--color", choices=("auto", "always", "never"), default="auto",
                   help="colour in human diagnostics; auto: on a terminal, unless NO_COLOR is set")


def add_diag_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("-I", dest="include", action="append", default=[], metavar="DIR",
                   type=Path, help="also look for imports in DIR")
    add_render_options(p)
    p.add_argument("--deny-warnings", action="store_true", help="treat warnings as errors")
    p.add_argument("--allow", action="append", default=[], metavar="CODE",
                   help="silence a warning code, e.g. --allow W0301")
    p.add_argument("--max-errors", type=int, default=50, metavar="N",
                   help="stop after N errors (default 50)")


def make_sink(args: argparse.Namespace) -> Sink:
    return Sink(max_errors=max(args.max_errors, 1), allow=frozenset(a.upper() for a in args.allow),
                deny_warnings=args.deny_warnings)


def options(args: argparse.Namespace) -> Options:
    precision = getattr(args, "precision", None)
    backend = getattr(args, "backend", "cudnn")
    fp8 = getattr(args, "fp8", "source") != "off"
    return Options(include_dirs=list(args.include), precision=precision, backend=backend, fp8=fp8)


def front(path: Path, args: argparse.Namespace, sink: Sink) -> FrontEnd:
    return front_end(path, options(args), sink)


def cmd_check(args: argparse.Namespace) -> int:
    out = Output(args.error_format, args.color, args.quiet)
    status = EXIT_OK
    for path in args.files:
        sink = make_sink(args)
        result = front(path, args, sink)
        out.diagnostics(sink, result.program.sources)
        if sink.error_count:
            out.summary(sink, f"check `{printable(path)}`")
            status = EXIT_ERRORS
            continue
        if result.model is None:
            n = len(result.module.defs) if result.module else 0
            out.info(f"ok: {printable(path)}: library, {n} def{'s' if n != 1 else ''}")
            continue
        m = result.model
        ops = sum(1 for n in m.graph.nodes if n.op not in ("input", "param"))
        out.info(f"ok: {printable(path)}: model `{m.name}`, {ops} ops, {len(m.params)} params, "
                 f"{len(m.buckets)} bucket{'s' if len(m.buckets) != 1 else ''}")
    return status


def checked(args: argparse.Namespace, out: Output, action: str = "compile") -> FrontEnd | None:
    """The checked model of `args.file`, or None once its errors are reported."""
    sink = make_sink(args)
    result = front(args.file, args, sink)
    out.diagnostics(sink, result.program.sources)
    if sink.error_count:
        out.summary(sink, f"{action} `{printable(args.file)}`")
        return None
    if result.model is None:
        print(f"error: `{printable(args.file)}` declares no model (it is a library of defs)", file=sys.stderr)
        return None
    return result


def cmd_params(args: argparse.Namespace) -> int:
    out = Output(args.error_format, args.color)
    result = checked(args, out, "check")
    if result is None or result.model is None:
        return EXIT_ERRORS
    params = result.model.params
    if args.format == "json":
        print(json.dumps({p.path: {"dtype": p.dtype, "shape": list(p.shape)} for p in params},
                         indent=2))
        return EXIT_OK
    rows = [(p.path, p.dtype, f"[{', '.join(map(str, p.shape))}]", math.prod(p.shape))
            for p in params]
    head = ("path", "dtype", "shape", "values")
    widths = [max([len(head[i]), *(len(str(r[i]) if i < 3 else f"{r[i]:,}") for r in rows)])
              for i in range(4)]
    print(f"{head[0]:<{widths[0]}}  {head[1]:<{widths[1]}}  {head[2]:<{widths[2]}}  "
          f"{head[3]:>{widths[3]}}")
    for path, dtype, shape, count in rows:
        print(f"{path:<{widths[0]}}  {dtype:<{widths[1]}}  {shape:<{widths[2]}}  "
              f"{count:>{widths[3]},}")
    total = sum(r[3] for r in rows)
    print(f"{len(params)} param{'s' if len(params) != 1 else ''}, {total:,} values")
    return EXIT_OK


def cmd_explain(args: argparse.Namespace) -> int:
    entry = codes.lookup(args.code)
    if entry is None:
        print(f"error: `{args.code}` is not a dslc diagnostic code", file=sys.stderr)
        print("codes: " + ", ".join(codes.CODES), file=sys.stderr)
        return EXIT_USAGE
    text = codes.explanation(entry.code)
    print(text if text else f"{entry.code}: {entry.title}\n")
    return EXIT_OK


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


def sources(result: FrontEnd) -> list[Path]:
    """The `.cgraph` files a model was read from (its imports too): inputs no output may replace."""
    return [Path(p) for p in result.program.modules]
