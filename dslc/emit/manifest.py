"""The model manifest as plain data (msgpack- and JSON-friendly): inputs, outputs, params, dims,
each with its source span, so the runtime can check what it is given without the compiler and
point its errors at the `.cgraph` source; `manifest_record` gives it as the runtime's record."""

from __future__ import annotations

from typing import Any

from dslc.check.checker import CheckedModel
from dslc.core.types import TensorType
from dslc.diag.span import Span
from dslc.ir.graph import Graph
from dslc.ir.serial import dim_data
from dslc.runtime.irdata import GraphRecord
from dslc.runtime.manifest import Manifest, written_inputs


def span_data(s: Span) -> dict[str, Any]:
    return {"file": s.file, "line": s.line, "col": s.col}


def tensor_data(name: str, t: TensorType, span: Span) -> dict[str, Any]:
    return {"name": name, "dtype": t.dtype, "shape": [dim_data(d) for d in t.shape],
            "layout": list(t.layout.order) if t.layout is not None else None,
            "span": span_data(span)}


def build_manifest(model: CheckedModel) -> dict[str, Any]:
    written = written_inputs(model.graph)
    return {
        "model": model.name,
        "file": model.file,
        "metadata": dict(model.metadata),
        "inputs": [tensor_data(i.name, i.type, i.span) for i in model.inputs],
        "outputs": [tensor_data(o.name, o.type, o.span) for o in model.outputs],
        "params": [{"path": p.path, "dtype": p.dtype, "shape": list(p.shape),
                    "layout": list(p.layout.order), "span": span_data(p.span)}
                   for p in model.params],
        "dims": [{"name": d.name, "dynamic": d.dynamic, "lo": d.lo, "hi": d.hi, "align": d.align,
                  "tune": list(d.tune) if d.tune else None, "span": span_data(d.span)}
                 for d in model.dims if d.dynamic],
        "buckets": [dict(b) for b in model.buckets],
        **({"written": [w.to_data() for w in written]} if written else {}),
    }


def manifest_record(model: CheckedModel, graph: Graph | None = None,
                    record: GraphRecord | None = None) -> Manifest:
    """The manifest as the runtime reads it, checked against the graph it describes (`record`, or
    `graph`, or the model's checked graph)."""
    return Manifest.from_data(build_manifest(model),
                              record or GraphRecord.of(graph or model.graph, model.env))
