"""The schedule of a compiled model at given sizes, without a GPU: which value each step reads
and writes, where every stored value lives (the arena offsets of the memory plan, a model input,
a weight, a view of another value), and how many bytes each takes.

The compiler uses it to record each bucket's memory plan; the runtime, to run any size. Every
number that reaches CuPy or cuDNN from here is bounded: a value's sizes and bytes, a view within
the memory of its base (`BundleError` otherwise, at whatever sizes the runtime meets), and, per
bucket of a bundle (`check_buckets`), each tensor a saved cuDNN graph reads or writes within the
memory of the value it is bound to.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dslc.backend import fused, gemv
from dslc.backend.device import KERNEL_DTYPES
from dslc.backend.spec import one_row_attrs, over_one_row
from dslc.core.dims import DimEnv
from dslc.core.types import FP8
from dslc.ir.graph import IN_PLACE, Graph, Node, stored_dtype
from dslc.ir.interp import ITEMSIZE, concrete
from dslc.ir.placement import in_place, slice_of
from dslc.ir.serial import plain
from dslc.ir.storage import Storage
from dslc.ir.storage import span as storage_span
from dslc.ir.views import layout_strides
from dslc.runtime.fields import MAX_BYTES, MAX_DIM, MAX_ELEMENTS, BundleError
from dslc.runtime.memory import Buffer, plan_memory
from dslc.runtime.records import BucketRecord, Bundle, SpecRecord, StepRecord


@dataclass
class MemoryPlan:
    """The memory picture at one set of dim values."""

    dims: dict[str, int]
    storage: dict[str, Storage] = field(default_factory=dict)
    offsets: dict[str, int] = field(default_factory=dict)  # arena values
    arena: int = 0  # bytes


class Schedule:
    """The dims-independent part of a bundle: graph, steps, load-time values, inputs, outputs.
    Takes the records (`dslc.runtime.bundle.load`), or a payload's plain data (validated)."""

    def __init__(self, bundle: Bundle | Mapping[str, Any]) -> None:
        self.bundle = bundle if isinstance(bundle, Bundle) else Bundle.from_data(bundle)
        self.graph: Graph = self.bundle.graph.graph
        self.env: DimEnv = self.bundle.graph.env()
        self.nodes: dict[str, Node] = self.graph.by_name()
        self.steps = list(self.bundle.steps)
        self.load_time: set[str] = set(self.bundle.load_time)
        self.inputs = {n.attrs["name"]: n.name for n in self.graph.nodes if n.op == "input"}
        self.outputs = dict(self.graph.outputs)
        # Concat operands their producers write in place (`dslc.ir.placement`).
        self.placement = in_place(self.graph, self.load_time)
        # Inputs written in place, as the manifest lists them (held to the graph when the
        # bundle is read), found once: every plain call's replay asks.
        self._written = frozenset(w.input for w in self.bundle.manifest.written)
        self._pointwise: dict[str, fused.Plan | None] = {}
        self._matmul: dict[str, gemv.Gemv | None] = {}
        # Graph steps (by signature) for which start-up found no cuDNN plan that runs on this
        # GPU and which run their fallback kernel instead (`runtime.model.Executable`).
        self.kernels_here: set[str] = set()

    def pointwise_kernel(self, step: StepRecord) -> fused.Plan | None:
        """The one pointwise kernel that runs a fallback-kernel step (`backend.fused`), or None
        where the step is an op with a kernel of its own (a multi-op kernel step always has
        one: `StepRecord.from_data` holds it to that)."""
        if step.name not in self._pointwise:
            p = fused.plan_of(self.nodes, step.nodes, step.inputs, step.outputs)
            self._pointwise[step.name] = p if isinstance(p, fused.Plan) else None
        return self._pointwise[step.name]

    @staticmethod
    def runs_graph(step: StepRecord, bucket: str | None) -> bool:
        """Whether the step runs its cuDNN graph at a bucket (its key; None: sizes between
        buckets): a graph step always; a kernel step the tuner chose at some buckets only, at
        the others (`StepRecord.graph_at`) and between them, where its kernel was never
        measured."""
        if step.kind == "graph":
            return True
        return bool(step.graph_at) and (bucket is None or bucket in step.graph_at)

    def graph_here(self, step: StepRecord, bucket: str | None) -> bool:
        """`runs_graph`, but not for a group start-up moved to its fallback kernel here."""
        return self.runs_graph(step, bucket) and step.signature not in self.kernels_here

    def has_kernel(self, step: StepRecord) -> bool:
        """Whether the step can run as fallback kernels: one op (its kernel, or its reference on
        the device), a pointwise chain as one kernel, or a matmul with its epilogue."""
        return len(step.nodes) == 1 or self.pointwise_kernel(step) is not None or \
            self.matmul_kernel(step) is not None

    def by_ops(self, step: StepRecord) -> bool:
        """Whether the step can run as its ops' fallback kernels one after the other, its inner
        values in scratch of their own (`Executable.inner`): the last resort of a group with
        no cuDNN plan that runs here and no kernel of its own (a deviceless compile's softmax
        pieces on a GPU whose cuDNN proposes no engine for them). Not where an inner value is
        a view or written in place into another's memory."""
        if len(step.nodes) < 2 or any(self._fp8(n) for n in (*step.inputs, *step.nodes)):
            return False  # the ops' kernels take no fp8: their references would read bytes
        return not any(
            n not in step.outputs and (self.nodes[n].op in ("view", *IN_PLACE)
                                       or n in self.placement
                                       or stored_dtype(self.nodes[n], True) not in KERNEL_DTYPES)
            for n in step.nodes)

    def _fp8(self, name: str) -> bool:
        node = self.nodes[name]
        return node.type.dtype in FP8 or node.attrs.get("precision") in FP8

    def matmul_kernel(self, step: StepRecord) -> gemv.Gemv | None:
        """The matmul kernel with its epilogue (`backend.gemv`) that runs a step of a matmul and
        pointwise ops (or a matmul alone), or None."""
        if step.name not in self._matmul:
            g = gemv.plan_of(self.nodes, step.nodes, step.inputs, step.outputs)
            self._matmul[step.name] = g if isinstance(g, gemv.Gemv) else None
        return self._matmul[step.name]

    def virtual(self) -> set[str]:
        """The values that stay inside their step (a cuDNN graph's virtual tensors, a fused
        kernel's registers): the reference rounds them to the intermediate dtype."""
        return {n for s in self.steps if len(s.nodes) > 1 for n in s.nodes if n not in s.outputs}

    def storage(self, name: str, values: Mapping[str, int]) -> Storage:
        node = self.nodes[name]
        if node.op in IN_PLACE:  # the memory of the input it writes (`written_inputs`)
            return self.storage(node.inputs[0], values)
        shape = tuple(self._concrete(d, values, name) for d in node.type.shape)
        if any(not 0 <= d <= MAX_DIM for d in shape):
            raise BundleError(f"graph: `{name}` has shape {list(shape)}{_at(values)}")
        if node.op == "view" or name in self.placement:
            if name in self.placement:  # a slice of the concat it is written into
                concat, steps = self.placement[name]
                base = self.storage(concat, values)
                symbolic = slice_of(self.nodes[concat], steps)
            else:
                base = self.storage(node.inputs[0], values)
                symbolic = (node.attrs["strides"], node.attrs["offset"])
            strides = tuple(self._concrete(s, values, name) for s in symbolic[0])
            offset = base.offset + self._concrete(symbolic[1], values, name)
            out = Storage(shape, strides, node.type.dtype, base.base, offset)
            root = self.storage(base.base, values)
            if len(strides) != len(shape) or min(strides, default=0) < 0 or offset < 0 or \
                    out.dtype != root.dtype or (out.span and offset + out.span > root.span):
                raise BundleError(f"graph: view `{name}` reaches outside `{base.base}`"
                                  f"{_at(values)}")
            return out
        assert node.type.layout is not None, name  # every stored value has one (irdata)
        strides = tuple(int(s) for s in layout_strides(shape, node.type.layout))  # type: ignore[arg-type]
        out = Storage(shape, strides, node.type.dtype, name, 0)
        if out.nbytes > MAX_BYTES:
            raise BundleError(f"graph: `{name}` takes {out.nbytes:,} bytes at {dict(values)}")
        return out

    def _concrete(self, d: Any, values: Mapping[str, int], name: str) -> int:
        try:
            v = int(concrete(d, values, self.env))
        except (KeyError, ValueError, ZeroDivisionError) as err:
            raise BundleError(f"graph: a dim of `{name}` has no value at {dict(values)} "
                              f"({err})") from err
        if abs(v) > MAX_ELEMENTS:
            raise BundleError(f"graph: a dim of `{name}` is {v} at {dict(values)}")
        return v

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
        while self.nodes[name].op in ("view", *IN_PLACE) or name in self.placement:
            name = self.placement[name][0] if name in self.placement else self.nodes[name].inputs[0]
        return name

    def written_inputs(self) -> frozenset[str]:
        """The model inputs (by input name) that steps write in place: the caller's buffers,
        never copied (a replayed CUDA graph records their pointers instead)."""
        return self._written

    def memory_plan(self, values: Mapping[str, int]) -> MemoryPlan:
        out = MemoryPlan(dict(values))
        last: dict[str, int] = {}
        first: dict[str, int] = {}
        for i, step in enumerate(self.steps):
            for value in step.outputs:
                if self.nodes[self._base(value)].op != "input":  # written in place: the caller's
                    first.setdefault(self._base(value), i)
            for value in step.inputs:
                last[self._base(value)] = i
        for node in self.graph.nodes:
            if node.op != "scalar":
                out.storage[node.name] = self.storage(node.name, values)
        model_outputs = {self._base(v) for v in self.outputs.values()}
        buffers = [Buffer(v, out.storage[v].nbytes, first[v], last.get(v, first[v]))
                   for v in first if v not in model_outputs]
        out.offsets, out.arena = plan_memory(buffers)
        if out.arena > MAX_BYTES:  # what no GPU holds never reaches cupy.empty
            raise BundleError(f"graph: its memory plan at {dict(values)} takes {out.arena:,} bytes")
        return out

    def peak_bytes(self, values: Mapping[str, int]) -> int:
        return self.memory_plan(values).arena

    def check_bindings(self, step: StepRecord, spec: SpecRecord | Any,
                       storage: Mapping[str, Storage], dims: Mapping[str, int],
                       where: str) -> None:
        """`spec` is the step's graph at `dims`: its ops are the step's nodes with their
        attributes at these dims, and each tensor the step binds to memory (by uid, in the order
        of the step's inputs then nodes) is a value the step reads or writes, of its dtype,
        reaching no further than that value's memory."""
        if [o.op for o in spec.ops] != [self.nodes[n].op for n in step.nodes]:
            raise BundleError(f"{where}: its ops are not those of step `{step.name[:60]}`")
        one_row = any(over_one_row(self.nodes[n]) for n in step.nodes)  # its 2-d form
        for o, name in zip(spec.ops, step.nodes, strict=True):
            node = self.nodes[name]
            want = {k: concrete(v, dims, self.env) for k, v in node.attrs.items()}
            if plain(dict(o.attrs)) != plain(one_row_attrs(node.op, want) if one_row else want):
                raise BundleError(f"{where}: the attributes of `{o.node[:60]}` are not those "
                                  f"of node `{name[:60]}` at {dict(dims)}")
        names = list(step.inputs) + list(step.nodes)
        for t in spec.tensors:
            if t.role == "scalar" and not any(
                    self.nodes[n].op == "scalar" and float(self.nodes[n].attrs["value"]) == t.value
                    for n in step.inputs):
                raise BundleError(f"{where}: scalar `{t.name[:60]}` is no constant the step reads")
            if t.role not in ("input", "output"):
                continue
            value = names[t.uid - 1] if 1 <= t.uid <= len(names) else None
            allowed = step.inputs if t.role == "input" else step.outputs
            if value is None or value not in allowed:
                raise BundleError(f"{where}: tensor `{t.name[:60]}` (uid {t.uid}) is bound to "
                                  f"no {t.role} of step `{step.name[:60]}`")
            s = storage[value]
            span = storage_span(t.dims, t.strides)
            if t.dtype != s.dtype or span * ITEMSIZE[t.dtype] > s.nbytes:
                raise BundleError(f"{where}: tensor `{t.name[:60]}` reaches past the memory of "
                                  f"`{value[:60]}` ({span} {t.dtype} elements, it holds "
                                  f"{s.nbytes:,} bytes of {s.dtype}); a bundle compiled by an "
                                  "earlier dslc may place values otherwise (which results its "
                                  "producers write into a concat's slice): compile the model "
                                  "again")


def _at(values: Mapping[str, int]) -> str:
    """The dim values a message is about: ` at N=2, S=8`; nothing for a model without dims."""
    return " at " + ", ".join(f"{k}={v}" for k, v in values.items()) if values else ""


def check_buckets(program: Schedule) -> None:
    """Every bucket's saved graphs fit the memory of what each step binds them to, and its
    memory plan stays within its arena (BundleError naming the bucket and graph)."""
    for i, bucket in enumerate(program.bundle.buckets):
        check_bucket(program, bucket, f"buckets[{i}]")


class _Lazy(dict[str, Storage]):
    """Storage of the values asked for, at one set of dims."""

    def __init__(self, program: Schedule, dims: Mapping[str, int]) -> None:
        super().__init__()
        self.program = program
        self.dims = dims

    def __missing__(self, name: str) -> Storage:
        self[name] = self.program.storage(name, self.dims)
        return self[name]


def check_bucket(program: Schedule, bucket: BucketRecord, path: str) -> None:
    storage = _Lazy(program, bucket.dims)
    for step in program.steps:
        entry = bucket.graphs.get(step.signature)
        if entry is not None:
            program.check_bindings(step, entry.spec, storage, bucket.dims,
                                   f"{path}.graphs.{step.signature[:40]}.spec")
    for name, offset in bucket.offsets.items():
        if offset + storage[name].nbytes > bucket.arena_bytes:
            raise BundleError(f"{path}.memory.offsets.{name[:60]}: {offset} + "
                              f"{storage[name].nbytes} bytes is past the arena")

