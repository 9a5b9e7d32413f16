"""The IR as plain data (msgpack- and JSON-friendly), and back: how the bundle carries the lowered
graph, so the runtime can rebuild graphs, re-tune and compute load-time weights without the
`.cgraph` source or the front end."""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from dslc.core.dims import Dim, DimEnv, Poly, SymInfo, make
from dslc.core.types import Layout, PrecisionSpec, TensorType
from dslc.diag.span import Span
from dslc.ir.graph import Attrs, Graph, Node


def dim_data(d: Dim) -> Any:
    """An int, or {"terms": [[[[symbol, power], ...], numerator, denominator], ...]}."""
    if isinstance(d, int):
        return d
    return {"terms": [[[list(m) for m in mono], Fraction(c).numerator, Fraction(c).denominator]
                      for mono, c in d.terms]}


def dim_from(d: Any) -> Dim:
    if isinstance(d, int):
        return d
    terms: dict[tuple[tuple[str, int], ...], int | Fraction] = {
        tuple((str(s), int(p)) for s, p in mono): Fraction(num, den)
             for mono, num, den in d["terms"]}
    out = make(terms)
    assert not isinstance(out, Fraction)
    return out


def _value(v: Any) -> Any:
    if isinstance(v, Poly):
        return {"dim": dim_data(v)}
    if isinstance(v, (tuple, list)):
        return [_value(x) for x in v]
    return v


def _value_from(v: Any) -> Any:
    if isinstance(v, dict) and "dim" in v:
        return dim_from(v["dim"])
    if isinstance(v, list):
        return tuple(_value_from(x) for x in v)
    return v


def node_data(n: Node) -> dict[str, Any]:
    t = n.type
    typ: dict[str, Any] = {"dtype": t.dtype, "shape": [dim_data(d) for d in t.shape],
                           "layout": list(t.layout.order) if t.layout is not None else None}
    if t.layout is not None and t.layout.tag:  # how it prints (`@BSHD`), kept for the dumps
        typ["tag"] = t.layout.tag
    return {
        "name": n.name, "op": n.op, "inputs": list(n.inputs),
        "attrs": {k: _value(v) for k, v in n.attrs.items()},
        "type": typ,
        "path": n.path,
        "precision": [n.precision.io, n.precision.intermediate, n.precision.compute],
        "span": [n.span.file, n.span.line, n.span.col, n.span.end_line, n.span.end_col],
    }


def node_from(d: Mapping[str, Any]) -> Node:
    t = d["type"]
    layout = Layout(tuple(t["layout"]), t.get("tag")) if t["layout"] is not None else None
    return Node(d["name"], d["op"], tuple(d["inputs"]),
                Attrs({k: _value_from(v) for k, v in d["attrs"].items()}),
                TensorType(t["dtype"], tuple(dim_from(x) for x in t["shape"]), layout),
                Span(*d["span"]), d["path"], PrecisionSpec(*d["precision"]))


def graph_data(g: Graph, env: DimEnv) -> dict[str, Any]:
    return {"nodes": [node_data(n) for n in g.nodes], "outputs": [list(o) for o in g.outputs],
            "floors": {name: [dim_data(p), c] for name, (p, c) in env.floors.items()},
            "syms": {s.name: [s.lo, s.hi, s.align] for s in env.syms.values()}}


def graph_from(d: Mapping[str, Any]) -> tuple[Graph, DimEnv]:
    env = DimEnv()
    for name, (lo, hi, align) in d["syms"].items():
        env.add(SymInfo(name, lo, hi, align))
    for name, (p, c) in d["floors"].items():
        poly = dim_from(p)
        assert isinstance(poly, Poly)
        env.floors[name] = (poly, int(c))
    graph = Graph(tuple(node_from(n) for n in d["nodes"]),
                  tuple((a, b) for a, b in d["outputs"]))
    return graph, env


def plain(v: Any) -> Any:
    """Attribute values as plain data (tuples and lists alike), as specs store and compare them."""
    if isinstance(v, Mapping):
        return {k: plain(x) for k, x in v.items()}
    if isinstance(v, (tuple, list)):
        return [plain(x) for x in v]
    return v

