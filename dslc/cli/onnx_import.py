"""`dslc import MODEL.onnx`: an ONNX model as a `.cgraph` file and its weights (`dslc.importer`,
which needs the `onnx` extra). The file written is checked first, and its weights against it:
a model the importer made that does not check is a bug in dslc, never written."""

from __future__ import annotations

import argparse
import re
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from dslc import fsutil, weights
from dslc.cli import paths
from dslc.cli.front import EXIT_ERRORS, EXIT_OK, Output, add_render_options, command
from dslc.cli.paths import UsageError
from dslc.diag.diagnostic import Sink
from dslc.diag.span import SourceMap, display_name, printable
from dslc.parse.loader import STD_ROOT
from dslc.pipeline import Options, front_end

_DIM = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=(?:(\d+)\.\.(\d+)|(\d+))")
_BUCKETS = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=(\d+(?:,\d+)*)")


class ImportedModelInvalid(Exception):
    """The model the importer wrote does not check: a bug in dslc (exit code 4)."""


def dim_option(text: str) -> tuple[str, tuple[int, int] | int]:
    """`N=1..256` (a range) or `N=8` (a static size)."""
    m = _DIM.fullmatch(text.strip())
    if m is None:
        raise argparse.ArgumentTypeError(f"`{text}`: write NAME=LO..HI or NAME=SIZE")
    if m.group(4) is not None:
        size = int(m.group(4))
        if size < 1:
            raise argparse.ArgumentTypeError(f"`{text}`: a size is at least 1")
        return m.group(1), size
    lo, hi = int(m.group(2)), int(m.group(3))
    if not 1 <= lo <= hi:
        raise argparse.ArgumentTypeError(f"`{text}`: the range must be 1 <= LO <= HI")
    return m.group(1), (lo, hi)


def buckets_option(text: str) -> tuple[str, list[int]]:
    """`N=1,32,256`: the sizes a dim is tuned at."""
    m = _BUCKETS.fullmatch(text.strip())
    if m is None:
        raise argparse.ArgumentTypeError(f"`{text}`: write NAME=SIZE,SIZE,...")
    return m.group(1), sorted({int(v) for v in m.group(2).split(",")})


def cmd_import(args: argparse.Namespace) -> int:
    from dslc.importer import OnnxReadError, import_onnx  # needs the `onnx` extra

    source: Path = args.file
    out_file: Path = args.output or source.with_suffix(".cgraph")
    weights_file: Path = args.weights_out or out_file.with_suffix(".safetensors")
    if out_file.suffix != ".cgraph":
        raise UsageError(f"`-o {out_file}`: name a .cgraph file to write")
    if paths.same_file(out_file, weights_file):
        raise UsageError(f"`--weights-out {weights_file}` is the `-o` file: name another")
    paths.output_file(out_file, [source])
    paths.output_file(weights_file, [source], "--weights-out")
    options = _options(args, out_file)
    out = Output(args.error_format, args.color, args.quiet)
    sink = Sink(max_errors=max(args.max_errors, 1))
    name = display_name(source, STD_ROOT)
    try:
        imported = import_onnx(source, name, options, sink)
    except OnnxReadError as err:
        raise UsageError(str(err)) from err
    out.diagnostics(sink, SourceMap())
    if imported is None:
        out.summary(sink, f"import `{name}`")
        return EXIT_ERRORS
    model = _checked(imported.text, imported.weights, out_file, out)
    text = imported.text
    # the model and its weights together: a failed write leaves neither replaced
    with paths.writing(out_file):
        fsutil.replace_together([
            (out_file, lambda tmp: Path(tmp).write_text(text, encoding="utf-8")),
            (weights_file, weights.writer(imported.weights, {"source": name}))])
    ops, params = model
    out.info(f"wrote {printable(out_file)} (model `{imported.name}`, {ops} ops, {params} "
             f"param{'s' if params != 1 else ''}) and {printable(weights_file)}")
    return EXIT_OK


def _options(args: argparse.Namespace, out_file: Path) -> Any:
    from dslc.importer import ImportOptions

    ranges: dict[str, tuple[int, int]] = {}
    static: dict[str, int] = {}
    for dim, value in args.dim:
        if isinstance(value, int):
            static[dim] = value
        else:
            ranges[dim] = value
    buckets = dict(args.buckets)
    for dim, sizes in buckets.items():
        if dim in static:
            raise UsageError(f"`--buckets {dim}=...`: `{dim}` is made static by `--dim`")
        lo, hi = ranges.get(dim, (1, 1 << 62))
        outside = [s for s in sizes if not lo <= s <= hi]
        if outside:
            raise UsageError(f"`--buckets {dim}=...`: {outside[0]} is outside `{dim}`'s range "
                             f"{lo}..{hi}")
    return ImportOptions(args.name or out_file.stem, ranges, static, buckets)


def _checked(text: str, tensors: dict[str, Any], out_file: Path, out: Output) -> tuple[int, int]:
    """The model's op and param counts, once it checks and its weights match it; the warnings
    it has (an f32 attention, say) are shown as of the file to be written. A model that does
    not check is a bug in dslc."""
    with tempfile.TemporaryDirectory(prefix="dslc-import-") as tmp:
        path = Path(tmp) / out_file.name
        path.write_text(text, encoding="utf-8")
        sink = Sink(max_errors=10)
        result = front_end(path, Options(), sink)
        problems = [d for d in sink.diagnostics if d.is_error]
        if result.model is None or problems:
            first = problems[0].message if problems else "it declares no model"
            raise ImportedModelInvalid(f"the imported model does not check: {first}")
        check = Sink()
        weights.validate(tensors, result.model.params, check, "the imported weights",
                         finite=False)
        if check.error_count:
            raise ImportedModelInvalid(f"the imported weights do not match the model: "
                                       f"{check.diagnostics[0].message}")
        out.diagnostics(*_as_written(sink, text, display_name(path, STD_ROOT),
                                     display_name(out_file, STD_ROOT)))
        model = result.model
        ops = sum(1 for n in model.graph.nodes if n.op not in ("input", "param"))
        return ops, len(model.params)


def _as_written(sink: Sink, text: str, checked_as: str, written: str) -> tuple[Sink, SourceMap]:
    """The checker's warnings about the temporary copy, as of the file that is written."""
    shown = Sink()
    for d in sink.diagnostics:
        span = replace(d.span, file=written) if d.span.file == checked_as else d.span
        shown.report(replace(d, span=span))
    sources = SourceMap()
    sources.add(written, text)
    return shown, sources


def add_commands(sub: Any) -> None:
    p = command(sub, "import", "write an ONNX model as a .cgraph file and its weights")
    p.add_argument("file", type=Path, metavar="MODEL.onnx", help="the ONNX model")
    p.add_argument("-o", "--output", type=Path, metavar="FILE.cgraph",
                   help="the .cgraph file to write (default: MODEL.cgraph beside the model)")
    p.add_argument("--weights-out", type=Path, metavar="W.safetensors",
                   help="where the weights go, named by param path (default: beside -o)")
    p.add_argument("--dim", type=dim_option, action="append", default=[],
                   metavar="N=LO..HI",
                   help="the range of a symbolic ONNX dim (default 1..256), or N=SIZE to make "
                        "it static")
    p.add_argument("--buckets", type=buckets_option, action="append", default=[],
                   metavar="N=1,32,256", help="the sizes a dim is tuned at (its `tune` list)")
    p.add_argument("--name", metavar="NAME", help="the model's name (default: the -o file's)")
    p.add_argument("-q", "--quiet", action="store_true", help="print nothing on success")
    p.add_argument("--max-errors", type=int, default=50, metavar="N",
                   help="stop after N errors (default 50)")
    add_render_options(p)
    p.set_defaults(run=cmd_import)

