"""`dslc fmt FILE...`: `.cgraph` files in the canonical layout (`parse.fmt`), each rewritten in
place (atomically, keeping its permissions), or with `--check` only named when it would change.
Folders are searched for `*.cgraph`; `-` formats standard input to standard output."""

from __future__ import annotations

import argparse
import os
import stat
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dslc import fsutil
from dslc.cli import paths
from dslc.cli.front import EXIT_ERRORS, EXIT_OK, EXIT_USAGE, Output, add_render_options, command
from dslc.cli.paths import UsageError
from dslc.diag.diagnostic import Sink
from dslc.diag.span import SourceMap, display_name, printable
from dslc.parse.fmt import format_text
from dslc.parse.loader import STD_ROOT

MAX_SOURCE = 64 << 20  # bytes: a source file larger than this is not read
STDIN = Path("-")


@dataclass
class _Tally:
    changed: int = 0
    unchanged: int = 0
    status: int = EXIT_OK

    def worst(self, code: int) -> None:
        self.status = max(self.status, code)


def sources_in(given: list[Path]) -> list[Path]:
    """The files to format: those named, and the `*.cgraph` files below each folder named
    (sorted, hidden folders left out). A path that is missing, or a folder without a `.cgraph`
    file, is a usage error before anything is read."""
    out: list[Path] = []
    for path in given:
        if path == STDIN or path.is_file():
            out.append(path)
        elif path.is_dir():
            found = sorted(p for p in path.rglob("*.cgraph") if p.is_file() and not any(
                part.startswith(".") for part in p.relative_to(path).parts))
            if not found:
                raise UsageError(f"`{printable(path)}` holds no .cgraph file")
            out.extend(found)
        else:
            raise UsageError(f"`{printable(path)}`: no such file or folder")
    return out


def cmd_fmt(args: argparse.Namespace) -> int:
    out = Output(args.error_format, args.color, args.quiet)
    tally = _Tally()
    files = sources_in(args.files)
    for path in files:
        if path == STDIN:
            _stdin(args, out, tally)
            continue
        try:
            text = fsutil.read_limited(path, MAX_SOURCE).decode("utf-8")
        except (OSError, UnicodeDecodeError) as err:
            why = paths.describe(err) if isinstance(err, OSError) else "it is not UTF-8 text"
            print(f"error: cannot read `{printable(path)}`: {why}", file=sys.stderr)
            tally.worst(EXIT_USAGE)
            continue
        formatted = _formatted(text, display_name(path, STD_ROOT), out, tally)
        if formatted is None:
            continue
        if formatted == text:
            tally.unchanged += 1
            continue
        tally.changed += 1
        if args.check:
            out.info(f"would reformat {printable(path)}")
            tally.worst(EXIT_ERRORS)
            continue
        try:
            _write(path, formatted)
        except UsageError as err:
            print(f"error: {err}", file=sys.stderr)
            tally.worst(EXIT_USAGE)
            continue
        out.info(f"reformatted {printable(path)}")
    if not args.quiet and any(p != STDIN for p in files):  # an editor's `-` wants no chatter
        print(_summary(tally, args.check), file=sys.stderr)
    return tally.status


def _formatted(text: str, name: str, out: Output, tally: _Tally) -> str | None:
    """`text` formatted, or None once its syntax errors are reported (exit code 1)."""
    sink = Sink()
    formatted = format_text(text, name, sink)
    if formatted is None:
        sources = SourceMap()
        sources.add(name, text)
        out.diagnostics(sink, sources)
        out.summary(sink, f"format `{name}`")
        tally.worst(EXIT_ERRORS)
    return formatted


def _stdin(args: argparse.Namespace, out: Output, tally: _Tally) -> None:
    text = sys.stdin.read()
    formatted = _formatted(text, "<stdin>", out, tally)
    if formatted is None:
        return
    if formatted == text:
        tally.unchanged += 1
    else:
        tally.changed += 1
    if args.check:
        if formatted != text:
            out.info("would reformat <stdin>")
            tally.worst(EXIT_ERRORS)
        return
    sys.stdout.write(formatted)


def _write(path: Path, text: str) -> None:
    """Replace the file a path names (through any symlink), keeping its permissions."""
    target = path.resolve()
    with paths.writing(path):
        fsutil.write_text(target, text, mode=stat.S_IMODE(os.stat(target).st_mode))


def _summary(tally: _Tally, check: bool) -> str:
    def files(n: int) -> str:
        return f"{n} file{'s' if n != 1 else ''}"

    changed = (f"{files(tally.changed)} {'would be ' if check else ''}reformatted"
               if tally.changed else "")
    unchanged = f"{files(tally.unchanged)} already formatted" if tally.unchanged else ""
    return ", ".join(p for p in (changed, unchanged) if p) or "no file formatted"


def add_commands(sub: Any) -> None:
    p = command(sub, "fmt", "lay out .cgraph files in the canonical style (docs/LANGUAGE.md "
                            "2.7), comments kept")
    p.add_argument("files", nargs="+", type=Path, metavar="FILE",
                   help="a .cgraph file, a folder (its *.cgraph files, recursively), or `-` for "
                        "standard input to standard output")
    p.add_argument("--check", action="store_true",
                   help="change nothing; name each file that would change and exit 1 if any would")
    p.add_argument("-q", "--quiet", action="store_true",
                   help="print no file names and no summary")
    add_render_options(p)
    p.set_defaults(run=cmd_fmt)
