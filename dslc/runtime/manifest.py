"""The manifest a bundle carries (what a caller gives the model and what its weights are) as typed
records, read as untrusted data and checked against the IR it describes: each input, output and
param is a node of the graph with the same dtype, shape and layout, and each dynamic dim is a
symbol of the graph with the same range. The input checks (`dslc.runtime.inputs`) and the weight
reader (`dslc.runtime.params`) read these records; `to_data()` gives the plain form the bundle
stores.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dslc.core.dims import Dim
from dslc.core.types import DTYPES
from dslc.ir import views
from dslc.ir.graph import IN_PLACE
from dslc.ir.serial import dim_data
from dslc.runtime import fields as f
from dslc.runtime.fields import MAX_DIM, MAX_RANK
from dslc.runtime.irdata import GraphRecord, dim


@dataclass(frozen=True)
class Where:
    """A `.cgraph` location, as run-time errors quote it."""

    file: str
    line: int
    col: int

    def to_data(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line, "col": self.col}

    @staticmethod
    def from_data(d: Any, path: str) -> Where:
        d = f.mapping(d, path, ("file", "line", "col"), ())
        return Where(f.text(d["file"], f"{path}.file"), f.integer(d["line"], f"{path}.line"),
                     f.integer(d["col"], f"{path}.col"))


@dataclass(frozen=True)
class Declared:
    """An input, output (`name`) or param (`name` is its path) of the model."""

    name: str
    dtype: str
    shape: tuple[Dim, ...]
    layout: tuple[int, ...] | None
    span: Where

    def to_data(self, key: str = "name") -> dict[str, Any]:
        return {key: self.name, "dtype": self.dtype, "shape": [dim_data(d) for d in self.shape],
                "layout": list(self.layout) if self.layout is not None else None,
                "span": self.span.to_data()}

    @staticmethod
    def from_data(d: Any, path: str, symbols: Mapping[str, Any], key: str = "name") -> Declared:
        d = f.mapping(d, path, (key, "dtype", "shape", "layout", "span"), ())
        shape = tuple(dim(x, f"{path}.shape[{i}]", symbols, lo=0)
                      for i, x in enumerate(f.items(d["shape"], f"{path}.shape", 0, MAX_RANK)))
        layout = None if d["layout"] is None else \
            f.ints(d["layout"], f"{path}.layout", 0, MAX_RANK, len(shape), len(shape))
        return Declared(f.text(d[key], f"{path}.{key}"), f.text(d["dtype"], f"{path}.dtype", DTYPES),
                        shape, layout, Where.from_data(d["span"], f"{path}.span"))


@dataclass(frozen=True)
class DimDecl:
    name: str
    dynamic: bool
    lo: int
    hi: int
    align: int
    tune: tuple[int, ...] | None
    span: Where

    def to_data(self) -> dict[str, Any]:
        return {"name": self.name, "dynamic": self.dynamic, "lo": self.lo, "hi": self.hi,
                "align": self.align, "tune": list(self.tune) if self.tune is not None else None,
                "span": self.span.to_data()}

    @staticmethod
    def from_data(d: Any, path: str) -> DimDecl:
        d = f.mapping(d, path, ("name", "dynamic", "lo", "hi", "align", "tune", "span"), ())
        lo = f.integer(d["lo"], f"{path}.lo", 0, MAX_DIM)
        tune = None if d["tune"] is None else f.ints(d["tune"], f"{path}.tune", 0, MAX_DIM, 0, 4096)
        return DimDecl(f.text(d["name"], f"{path}.name"), f.flag(d["dynamic"], f"{path}.dynamic"),
                       lo, f.integer(d["hi"], f"{path}.hi", lo, MAX_DIM),
                       f.integer(d["align"], f"{path}.align", 1, MAX_DIM), tune,
                       Where.from_data(d["span"], f"{path}.span"))


@dataclass(frozen=True)
class Written:
    """A model input a step writes in place (`cache_write`): the caller's buffer, never copied,
    which a replayed CUDA graph records by its pointer; `at` is the input giving the write
    offset (None where the offset is computed) and `rows` how many rows a call writes, so a
    decoder knows where the next call writes."""

    input: str
    at: str | None
    rows: Dim

    def to_data(self) -> dict[str, Any]:
        return {"input": self.input, "at": self.at, "rows": dim_data(self.rows)}

    @staticmethod
    def from_data(d: Any, path: str, symbols: Mapping[str, Any]) -> Written:
        d = f.mapping(d, path, ("input", "at", "rows"), ())
        return Written(f.text(d["input"], f"{path}.input"),
                       None if d["at"] is None else f.text(d["at"], f"{path}.at"),
                       dim(d["rows"], f"{path}.rows", symbols, lo=1))


def written_inputs(graph: Any) -> tuple[Written, ...]:
    """What the graph writes in place, in the order of its writes: one record per input."""
    nodes = graph.by_name()
    out = []
    for n in graph.nodes:
        if n.op not in IN_PLACE:
            continue
        cache, new, at = (nodes[i] for i in n.inputs)
        out.append(Written(cache.attrs["name"] if cache.op == "input" else cache.name,
                           at.attrs["name"] if at.op == "input" else None, new.type.shape[2]))
    return tuple(out)


@dataclass(frozen=True)
class Manifest:
    model: str
    file: str
    metadata: Mapping[str, Any]
    inputs: tuple[Declared, ...]
    outputs: tuple[Declared, ...]
    params: tuple[Declared, ...]
    dims: tuple[DimDecl, ...]
    buckets: tuple[Mapping[str, int], ...]
    written: tuple[Written, ...] = ()  # inputs written in place (absent from older bundles)

    def to_data(self) -> dict[str, Any]:
        return {"model": self.model, "file": self.file, "metadata": dict(self.metadata),
                "inputs": [i.to_data() for i in self.inputs],
                "outputs": [o.to_data() for o in self.outputs],
                "params": [p.to_data("path") for p in self.params],
                "dims": [d.to_data() for d in self.dims],
                "buckets": [dict(b) for b in self.buckets],
                **({"written": [w.to_data() for w in self.written]} if self.written else {})}

    @staticmethod
    def from_data(d: Any, graph: GraphRecord, path: str = "manifest") -> Manifest:
        d = f.mapping(d, path, ("model", "file", "metadata", "inputs", "outputs", "params",
                                "dims", "buckets"), ("written",))
        symbols = {s.name: s for s in graph.syms} | {n: None for n, _, _ in graph.floors}
        metadata = f.mapping(d["metadata"], f"{path}.metadata")
        for k, v in metadata.items():
            f.plain(v, f"{path}.metadata.{k}", depth=0)
        declared = {part: tuple(Declared.from_data(x, f"{path}.{part}[{i}]", symbols,
                                                   "path" if part == "params" else "name")
                                for i, x in enumerate(f.items(d[part], f"{path}.{part}")))
                    for part in ("inputs", "outputs", "params")}
        out = Manifest(
            f.text(d["model"], f"{path}.model"), f.text(d["file"], f"{path}.file"), metadata,
            declared["inputs"], declared["outputs"], declared["params"],
            tuple(DimDecl.from_data(x, f"{path}.dims[{i}]")
                  for i, x in enumerate(f.items(d["dims"], f"{path}.dims"))),
            tuple(f.int_map(b, f"{path}.buckets[{i}]", 0, MAX_DIM)
                  for i, b in enumerate(f.items(d["buckets"], f"{path}.buckets"))),
            tuple(Written.from_data(x, f"{path}.written[{i}]", symbols)
                  for i, x in enumerate(f.items(d.get("written", []), f"{path}.written"))))
        out.check(graph, path)
        return out

    def check(self, graph: GraphRecord, path: str) -> None:
        """The manifest describes this graph: what callers are checked against is what the
        schedule reads and writes."""
        nodes = graph.graph.by_name()
        inputs = {n.attrs["name"]: n for n in graph.graph.nodes if n.op == "input"}
        params = {n.attrs["path"]: n for n in graph.graph.nodes if n.op == "param"}
        outputs = {name: nodes[value] for name, value in graph.graph.outputs}
        for part, declared, found in (("inputs", self.inputs, inputs),
                                      ("outputs", self.outputs, outputs),
                                      ("params", self.params, params)):
            if sorted(x.name for x in declared) != sorted(found):
                f.wrong(f"{path}.{part}", f"the names differ from the graph's {part}")
            for i, x in enumerate(declared):
                _same_type(x, found[x.name], f"{path}.{part}[{i}]")
        if self.written != written_inputs(graph.graph):
            # A runner that copied a written input into a static buffer would write the copy.
            f.wrong(f"{path}.written", "the inputs written in place differ from the graph's")
        users = graph.graph.users()
        exported = {value for _, value in graph.graph.outputs}
        for i, w in enumerate(self.written):
            # E0211 holds in a bundle too: a second reader of a cache would see it before or
            # after the write depending on the order of the steps.
            node = inputs.get(w.input)
            readers = users[node.name] if node is not None else []
            if node is None or node.name in exported or len(readers) != 1:
                f.wrong(f"{path}.written[{i}]", f"input `{w.input[:40]}` is written in place "
                        "and read by something else too")
        syms = {s.name: s for s in graph.syms}
        for i, dd in enumerate(self.dims):
            s = syms.get(dd.name)
            if not dd.dynamic or s is None or (s.lo, s.hi, s.align) != (dd.lo, dd.hi, dd.align):
                f.wrong(f"{path}.dims[{i}]", f"dim `{dd.name[:40]}` differs from the graph's")


def _same_type(x: Declared, node: Any, path: str) -> None:
    t = node.type
    layout = t.layout.order if t.layout is not None else None
    # A view (an output that is a transpose of a stored value) has its base's memory order; two
    # orders that differ only where an axis has one element are the same bytes (a pointwise op
    # moved through a reshape that added one: `[N, 1, 1, 6, 11]` ordered 1, 0, 2, 3, 4).
    if x.dtype != t.dtype or x.shape != t.shape or (layout is not None and (
            x.layout is None or not views.same_memory(t.shape, tuple(x.layout), tuple(layout)))):
        f.wrong(path, f"`{x.name[:40]}` differs from its node `{node.name[:40]}` in the graph")
