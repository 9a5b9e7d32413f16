"""ONNX -> `.cgraph` (`import_onnx`): a front end above the compiler, as the command line is.

read (the file, its opset) -> translate (each node to `.cgraph` operations, constants and sizes
worked out at import time) -> recognise (the standard library's layers, attention, blocks
that repeat as defs) -> emit (source in the canonical layout, and the weights by param path).
Needs the `onnx` package (`pip install 'dslc[onnx]'`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from dslc.diag.diagnostic import Diagnostic, Sink
from dslc.diag.span import Span
from dslc.importer.blocks import find_blocks
from dslc.importer.emit import DimDecl, Emitted, emit
from dslc.importer.names import identifier
from dslc.importer.read import DTYPES, MIN_OPSET, OnnxModel, OnnxReadError, read
from dslc.importer.recognise import recognise
from dslc.importer.translate import translate
from dslc.parse.fmt import format_text

__all__ = ["DEFAULT_RANGE", "ImportOptions", "OnnxReadError", "import_onnx"]

DEFAULT_RANGE = (1, 256)  # a symbolic dim's range where `--dim` gives none


@dataclass
class ImportOptions:
    name: str  # the model's name
    ranges: dict[str, tuple[int, int]] = field(default_factory=dict)  # by dim name (--dim)
    static: dict[str, int] = field(default_factory=dict)  # dims made static (--dim N=8)
    buckets: dict[str, list[int]] = field(default_factory=dict)  # tune buckets (--buckets)


def import_onnx(path: Path, source: str, options: ImportOptions, sink: Sink) -> Emitted | None:
    """The `.cgraph` text of the ONNX model at `path` (named `source` in diagnostics) and its
    weights; None once its errors are reported. OnnxReadError: not a readable ONNX file."""
    from onnx import defs as onnx_defs

    model = read(path, source)
    span = Span(source, 0, 0, 0, 0)
    newest = onnx_defs.onnx_opset_version()
    if model.opset is None or not MIN_OPSET <= model.opset <= newest:
        if model.opset is None:
            found = "imports no opset of ONNX's own operations"
        elif model.opset < MIN_OPSET:
            found = f"is at opset {model.opset}; dslc imports opset {MIN_OPSET} and newer"
        else:  # the operations' meanings come from the onnx package's own definitions
            found = (f"is at opset {model.opset}, newer than the installed onnx package knows "
                     f"({newest})")
        sink.report(Diagnostic(
            "E0902", f"`{source}` {found}", span,
            help=("convert it with `onnx.version_converter.convert_version(model, 17)`, or "
                  "export it again at a newer opset",)))
        return None
    dim_names = _dims(model, options, sink, span)
    if dim_names is None:
        return None
    ranges = {name: options.ranges.get(onnx_name, options.ranges.get(name, DEFAULT_RANGE))
              for onnx_name, name in dim_names.items()}
    translated = translate(model, dim_names, options.static, ranges, sink)
    if translated is None:
        return None
    decls = [DimDecl(name, *ranges[name], tuple(options.buckets.get(onnx_name,
                                                                    options.buckets.get(name, ()))))
             for onnx_name, name in dim_names.items()]
    outputs, defs = find_blocks(recognise(translated.outputs, translated.env), translated.env)
    header = [f"Imported from {source} (ONNX opset {model.opset}) by `dslc import`."]
    emitted = emit(identifier(options.name, "model"), header, decls, translated.inputs,
                   outputs, translated.env, [d.lines for d in defs])
    formatted = format_text(emitted.text, source, Sink())
    if formatted is None:
        raise AssertionError(f"the imported model does not parse:\n{emitted.text}")
    emitted.text = formatted
    return emitted


def _dims(model: OnnxModel, options: ImportOptions, sink: Sink, span: Span
          ) -> dict[str, str] | None:
    """Each symbolic size of the inputs, named in `.cgraph` (static ones given by `--dim N=8`
    are replaced by their size); None once an input the language cannot declare is reported."""
    names: dict[str, str] = {}
    ok = True
    for info in model.inputs:
        if info.elem_type not in DTYPES or info.dims is None or None in info.dims:
            why = (f"its type {info.type_name} is not one of the language's" if
                   info.elem_type not in DTYPES else "its rank is not given" if info.dims is None
                   else "one of its sizes has neither a value nor a name")
            sink.report(Diagnostic("E0902", f"the input `{info.name}` of `{model.source}` "
                                   f"cannot be declared: {why}", span,
                                   help=("export the model with typed inputs whose sizes are "
                                         "numbers or named dynamic dims",)))
            ok = False
            continue
        for d in info.dims:
            if isinstance(d, str) and d not in names:
                names[d] = identifier(d, "D")
    if not ok:
        return None
    for onnx_name in options.static:
        names.pop(onnx_name, None)
    return names
