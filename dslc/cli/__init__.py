"""`dslc`: the command line. Exit codes: 0 success, 1 diagnostics with at least one error (or a
file `fmt --check` would change), 2 usage or I/O error, 3 backend failure (no usable GPU where
one is needed, R0801 from any command; the cuDNN backend missing or unusable), 4 internal error
(a bug in dslc: please report it).

Human diagnostics go to stderr; `--error-format json|github` write to stdout, where tools and
GitHub Actions read them.
"""

from __future__ import annotations

import argparse
import logging
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

from dslc import __version__
from dslc.backend.target import TargetError
from dslc.cli import bench as bench_commands
from dslc.cli import calibrate as calibrate_commands
from dslc.cli import compile as compile_commands
from dslc.cli import fmt as fmt_commands
from dslc.cli import inspect as inspect_commands
from dslc.cli import onnx_import as import_commands
from dslc.cli import run as run_commands
from dslc.cli import weights as weights_commands
from dslc.cli.front import (
    DEBUG_HELP,
    EXIT_BACKEND,
    EXIT_ERRORS,
    EXIT_INTERNAL,
    EXIT_OK,
    EXIT_USAGE,
    add_diag_options,
    cmd_check,
    cmd_explain,
    cmd_params,
    command,
)
from dslc.cli.ops import cmd_ops, op_families
from dslc.cli.paths import UsageError, describe
from dslc.core.errors import RunnerError
from dslc.diag.diagnostic import Failed
from dslc.parse.loader import ReadError
from dslc.pipeline import front_end
from dslc.runtime.bundle import BundleError
from dslc.weights import WeightError

__all__ = ["front_end", "main"]

# Optional packages a command may need, and the extra of dslc that installs them.
EXTRAS = {"cudnn": ("the cuDNN frontend", "cudnn"), "cupy": ("CuPy", "gpu"),
          "onnx": ("the onnx package", "onnx")}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dslc", description="Compile .cgraph models into tuned "
                                     "cuDNN artifacts.")
    parser.add_argument("--version", action="version", version=f"dslc {__version__}",
                        help="print dslc's version and exit")
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = command(sub, "check", "parse and type-check .cgraph files")
    p.add_argument("files", nargs="+", type=Path, metavar="FILE", help="the .cgraph files")
    p.add_argument("-q", "--quiet", action="store_true", help="print nothing on success")
    add_diag_options(p)
    p.set_defaults(run=cmd_check)

    p = command(sub, "params", "list the parameters a model loads")
    p.add_argument("file", type=Path, metavar="FILE", help="the model's .cgraph file")
    p.add_argument("--format", choices=("table", "json"), default="table",
                   help="a table for people (default), or one JSON document")
    add_diag_options(p)
    p.set_defaults(run=cmd_params)

    p = command(sub, "explain", "explain a diagnostic code, e.g. E0301")
    p.add_argument("code", metavar="CODE", help="a code such as E0301, W0201 or R0601")
    p.set_defaults(run=cmd_explain)

    p = command(sub, "ops", "list the built-in operations and the standard library's defs")
    p.add_argument("--family", choices=op_families(), metavar="FAMILY",
                   help=f"only this family: {', '.join(op_families())}")
    p.add_argument("--format", choices=("text", "json"), default="text",
                   help="text for people (default), or one JSON document")
    p.set_defaults(run=cmd_ops)
    fmt_commands.add_commands(sub)
    run_commands.add_commands(sub)
    weights_commands.add_commands(sub)
    compile_commands.add_commands(sub, add_diag_options)
    calibrate_commands.add_commands(sub)
    inspect_commands.add_commands(sub)
    bench_commands.add_commands(sub)
    import_commands.add_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    run: Callable[[argparse.Namespace], int] = args.run
    _configure_logging(args.debug)
    try:
        return run(args)
    except (ReadError, WeightError, UsageError, TargetError, BundleError) as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_USAGE
    except RunnerError as err:
        print(err, file=sys.stderr)
        return EXIT_ERRORS if err.code != "R0801" else EXIT_BACKEND
    except ModuleNotFoundError as err:
        if err.name not in EXTRAS:
            return _internal(err, args.debug)
        what, extra = EXTRAS[err.name]
        print(f"error: `dslc {args.command}` needs {what}, which is not installed here: "
              f"`pip install 'dslc[{extra}]'`", file=sys.stderr)
        return EXIT_BACKEND
    except Failed:  # every stage reports before it stops; the limit must not read as a bug
        print("error: stopped at the error limit (`--max-errors`)", file=sys.stderr)
        return EXIT_ERRORS
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return EXIT_OK
    except OSError as err:  # a read or write the commands did not foresee: still an I/O error
        where = f" `{err.filename}`" if err.filename else ""
        print(f"error: cannot access{where}: {describe(err)}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as err:  # a bug in dslc; never show a traceback for the user's input
        return _internal(err, args.debug)


def _internal(err: Exception, debug: bool) -> int:
    if debug:
        traceback.print_exc()
    print(f"error: internal error in dslc ({type(err).__name__}: {err})", file=sys.stderr)
    print("note: this is a bug in dslc, not in your model; rerun with --debug and report it",
          file=sys.stderr)
    return EXIT_INTERNAL


def _configure_logging(debug: bool) -> None:
    """dslc's own warnings to stderr; with --debug, everything down to INFO. The cuDNN frontend's
    logger stays quiet without --debug: deviceless, it warns about every graph the backend is not
    asked to build, which `dslc compile` already reports in its own terms."""
    logging.basicConfig(level=logging.INFO if debug else logging.WARNING,
                        format="%(levelname)s: %(name)s: %(message)s")
    if not debug:
        logging.getLogger("cudnn").setLevel(logging.ERROR)


if __name__ == "__main__":
    sys.exit(main())
