"""The schedule of a compiled model at given sizes, without a GPU: which value each step reads
and writes, where every stored value lives (the arena offsets of the memory plan, a model input,
a weight, a view of another value), and how many bytes each takes.

The compiler uses it to record each bucket's memory plan; the runtime, to run any size.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dslc.check.dims import DimEnv
from dslc.ir.graph import Graph, Node
from dslc.ir.interp import NUMPY_DTYPES, concrete
from dslc.ir.serial import graph_from
from dslc.ir.views import layout_strides
from dslc.runtime.memory import Buffer, plan_memory

ITEMSIZE = {name: int(np.dtype(dt).itemsize) for name, dt in NUMPY_DTYPES.items()}


@dataclass(frozen=True)
class StepInfo:
    kind: str  # graph | kernel
    name: str
    pattern: str
    nodes: tuple[str, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    signature: str
    reason: str

    @staticmethod
    def from_data(d: Mapping[str, Any]) -> StepInfo:
        return StepInfo(d["kind"], d["name"], d["pattern"], tuple(d["nodes"]), tuple(d["inputs"]),
                        tuple(d["outputs"]), d["signature"], d.get("reason", ""))

    def data(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name, "pattern": self.pattern,
                "nodes": list(self.nodes), "inputs": list(self.inputs),
                "outputs": list(self.outputs), "signature": self.signature, "reason": self.reason}


@dataclass(frozen=True)
class Storage:
    """Where a value's elements are: shape and strides (elements), and its base."""

    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: str
    base: str  # the value that owns the memory (itself, unless a view)
    offset: int  # elements from the base's first element

    @property
    def nbytes(self) -> int:
        if not self.shape or 0 in self.shape:
            return ITEMSIZE[self.dtype] * (0 if 0 in self.shape else 1)
        span = 1 + sum((d - 1) * s for d, s in zip(self.shape, self.strides, strict=True))
        return span * ITEMSIZE[self.dtype]


@dataclass
class Layout:
    """The memory picture at one set of dim values."""

    dims: dict[str, int]
    storage: dict[str, Storage] = field(default_factory=dict)
    offsets: dict[str, int] = field(default_factory=dict)  # arena values
    arena: int = 0  # bytes


class Program:
    """The dims-independent part of a bundle: graph, steps, load-time values, inputs, outputs."""

    def __init__(self, payload: Mapping[str, Any]) -> None:
        self.payload = payload
        graph, env = graph_from(payload["graph"])
        self.graph: Graph = graph
        self.env: DimEnv = env
        self.nodes: dict[str, Node] = graph.by_name()
        self.steps = [StepInfo.from_data(s) for s in payload["steps"]]
        self.load_time: set[str] = set(payload["load_time"])
        self.inputs = {n.attrs["name"]: n.name for n in graph.nodes if n.op == "input"}
        self.outputs = dict(graph.outputs)

    def storage(self, name: str, values: Mapping[str, int]) -> Storage:
        node = self.nodes[name]
        shape = tuple(int(concrete(d, values, self.env)) for d in node.type.shape)
        if node.op == "view":
            base = self.storage(node.inputs[0], values)
            strides = tuple(int(concrete(s, values, self.env)) for s in node.attrs["strides"])
            offset = int(concrete(node.attrs["offset"], values, self.env))
            return Storage(shape, strides, node.type.dtype, base.base, base.offset + offset)
        assert node.type.layout is not None, name
        strides = tuple(int(s) for s in layout_strides(shape, node.type.layout))  # type: ignore[arg-type]
        return Storage(shape, strides, node.type.dtype, name, 0)

    def weights_used(self) -> list[str]:
        """Load-time values the steps read (directly, or as the base of a view they read)."""
        out: list[str] = []
        for step in self.steps:
            for value in step.inputs:
                base = self._base(value)
                if base in self.load_time and self.nodes[base].op != "scalar" and base not in out:
                    out.append(base)
        return out

    def _base(self, name: str) -> str:
        while self.nodes[name].op == "view":
            name = self.nodes[name].inputs[0]
        return name

    def layout(self, values: Mapping[str, int]) -> Layout:
        out = Layout(dict(values))
        last: dict[str, int] = {}
        first: dict[str, int] = {}
        for i, step in enumerate(self.steps):
            for value in step.outputs:
                first.setdefault(value, i)
            for value in step.inputs:
                last[self._base(value)] = i
        for node in self.graph.nodes:
            if node.op != "scalar":
                out.storage[node.name] = self.storage(node.name, values)
        model_outputs = {self._base(v) for v in self.outputs.values()}
        buffers = [Buffer(v, out.storage[v].nbytes, first[v], last.get(v, first[v]))
                   for v in first if v not in model_outputs]
        out.offsets, out.arena = plan_memory(buffers)
        return out

    def peak_bytes(self, values: Mapping[str, int]) -> int:
        return self.layout(values).arena

