"""The compiled schedule run on the CPU as the runtime runs it on the GPU: one arena of bytes laid
out by the bundle's memory plan, model inputs, weights and outputs in buffers of their own, each
step reading and writing through the pointers and strides the runtime would bind, a cuDNN graph
through its saved tensors' dims and strides (in cuDNN's form) and a fallback kernel through its
values' storage. The math is the reference's, op by op, so the result equals the reference
executor bit for bit unless the memory picture is wrong: two live values sharing bytes, a
tensor bound to the wrong offset or strides, a step reading what nothing has written yet
(the arena starts filled with a poison byte).

Masks are held as bytes here (cuDNN's bits are `compile.stage.masks_as_bytes`' business)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import as_strided

from dslc.backend.spec import GroupSpec, group_spec
from dslc.ir import interp
from dslc.ir.graph import IN_PLACE, stored_dtype
from dslc.ir.groups import make_group
from dslc.ir.interp import ITEMSIZE, NUMPY_DTYPES, concrete_attrs
from dslc.ir.placement import placed_in
from dslc.ir.storage import Storage
from dslc.ir.storage import span as storage_span
from dslc.runtime import batches
from dslc.runtime.cachewrites import ROWS_AXIS, Recomputed
from dslc.runtime.schedule import MemoryPlan, Schedule

POISON = 0xA7  # as f32 bytes about -4.6e-15 repeated: never an output of a well-formed run


class Overlap(Exception):
    """A step writes bytes it also reads: on the GPU, a race between its threads."""


class Memory:
    """The bytes every value lives in: the arena, and a buffer per input, weight and output."""

    def __init__(self, program: Schedule, plan: MemoryPlan) -> None:
        self.program = program
        self.plan = plan
        self.arena = np.full(max(plan.arena, 1), POISON, dtype=np.uint8)
        self.own: dict[str, np.ndarray] = {}  # base -> its bytes (inputs, weights, outputs)

    def bytes_of(self, base: str) -> tuple[np.ndarray, int]:
        if base in self.plan.offsets:
            return self.arena, self.plan.offsets[base]
        if base not in self.own:
            s = self.plan.storage[base]
            self.own[base] = np.full(max(s.nbytes, 1), POISON, dtype=np.uint8)
        return self.own[base], 0

    def array(self, dims: tuple[int, ...], strides: tuple[int, ...], dtype: str, base: str,
              offset: int) -> np.ndarray:
        """The elements at (dims, strides) from `offset` elements into `base`'s memory."""
        raw, start = self.bytes_of(base)
        item = ITEMSIZE[dtype]
        flat = raw[start + offset * item:].view(NUMPY_DTYPES[dtype]) if raw.size > start else \
            raw.view(NUMPY_DTYPES[dtype])
        span = storage_span(dims, strides)
        if span > flat.size:
            raise IndexError(f"{list(dims)} with strides {list(strides)} reaches past `{base}`")
        return as_strided(flat, dims, tuple(s * item for s in strides), writeable=True)

    def value(self, s: Storage) -> np.ndarray:
        return self.array(s.shape, s.strides, s.dtype, s.base, s.offset)

    def extent(self, dims: tuple[int, ...], strides: tuple[int, ...], dtype: str, base: str,
               offset: int) -> Extent:
        raw, start = self.bytes_of(base)
        return Extent(id(raw), start + offset * ITEMSIZE[dtype], dims, strides, ITEMSIZE[dtype])


class Extent:
    """The bytes a tensor covers in one buffer (strided: interleaved slices share a range)."""

    def __init__(self, buffer: int, first: int, dims: tuple[int, ...], strides: tuple[int, ...],
                 item: int) -> None:
        self.buffer, self.first, self.dims, self.strides, self.item = buffer, first, dims, strides, item
        span = storage_span(dims, strides)
        self.end = first + span * item

    def bytes(self) -> np.ndarray:
        addr = np.zeros((), np.int64)
        for d, s in zip(self.dims, self.strides, strict=True):
            addr = np.add.outer(addr, np.arange(d, dtype=np.int64) * s * self.item)
        return np.unique(np.add.outer(addr.ravel() + self.first, np.arange(self.item)))

    def meets(self, other: Extent) -> bool:
        if self.buffer != other.buffer or self.end <= other.first or other.end <= self.first:
            return False
        return bool(np.intersect1d(self.bytes(), other.bytes(), assume_unique=True).size)


def _apart(step: Any, reads: list[Extent], writes: list[Extent]) -> None:
    for w in writes:
        for r in reads:
            if w.meets(r):
                raise Overlap(f"step `{step.name[:60]}` writes bytes it reads "
                              f"({w.first}..{w.end} and {r.first}..{r.end})")


def _independent(mem: Memory, slot: Sequence[Any], again: Mapping[str, Recomputed]) -> None:
    """Steps the runtime runs as one launch (`runtime.batches`): none writes a byte another
    reads or writes (their threads run in no order). A cache write run as its value's writers
    reads what they read."""
    storage = mem.plan.storage
    touched = [([mem.extent(*_where(storage[i])) for i in batches.reads(step, again)
                 if mem.program.nodes[i].op != "scalar"],
                [mem.extent(*_where(storage[o])) for o in batches.written(step)])
               for step in slot]
    for a, (_, writes) in enumerate(touched):
        for b, (read, others) in enumerate(touched):
            if a != b and any(w.meets(t) for w in writes for t in (*read, *others)):
                raise Overlap(f"steps `{slot[a].name[:60]}` and `{slot[b].name[:60]}` run as "
                              "one launch, but the one writes bytes the other touches")


def _recomputed_step(mem: Memory, program: Schedule, r: Recomputed,
                     dims: Mapping[str, int]) -> None:
    """A cache write run as its value's writers (`runtime.cachewrites`): each writer's ops
    again, its result stored in its region of the cache `at` rows on, rows past the cache
    dropped."""
    storage = mem.plan.storage
    at = int(np.asarray(mem.value(storage[r.at])).reshape(-1)[0])
    for writer, region in zip(r.writers, r.regions, strict=True):
        result = _evaluated(mem, program, writer, dims)[writer.outputs[0]]
        for s in range(result.shape[ROWS_AXIS]):
            row = at + s
            if 0 <= row < r.rows:
                moved = Storage((*region.shape[:ROWS_AXIS], 1, *region.shape[ROWS_AXIS + 1:]),
                                region.strides, region.dtype, region.base,
                                region.offset + row * region.strides[ROWS_AXIS])
                np.copyto(mem.value(moved), result[:, :, s:s + 1])


def run(program: Schedule, dims: Mapping[str, int], inputs: Mapping[str, np.ndarray],
        weights: Mapping[str, np.ndarray],
        written: dict[str, np.ndarray] | None = None,
        amax: Mapping[str, float] | None = None) -> dict[str, np.ndarray]:
    """The model's outputs, computed step by step in memory laid out as the runtime lays it;
    `written` gets the inputs written in place as their buffers hold them after the run; `amax`:
    the calibration of a model computing in fp8."""
    plan = program.memory_plan(dict(dims))
    mem = Memory(program, plan)
    for name, node_name in program.inputs.items():
        np.copyto(mem.value(plan.storage[node_name]),
                  np.asarray(inputs[name]).astype(NUMPY_DTYPES[plan.storage[node_name].dtype]))
    loaded = interp.run(program.graph, inputs, weights, program.env,
                        keep=lambda n: n.name in program.load_time, amax=amax)
    for name in program.load_time:
        if program.nodes[name].op != "scalar" and name in loaded:
            np.copyto(mem.value(plan.storage[name]), loaded[name])
    found = next((b for b in program.bundle.buckets if dict(b.dims) == dict(dims)), None)
    bucket = None if found is None else found.key  # None: a size between buckets
    specs = {} if found is None else {sig: GroupSpec.from_data(g.spec.to_data())
                                      for sig, g in found.graphs.items()}
    slots, again = batches.plan(program, plan, bucket)  # the runtime's order
    for slot in slots:
        _independent(mem, slot, again)
        for step in reversed(slot):  # one launch: no order among them
            if step.name in again:
                _recomputed_step(mem, program, again[step.name], dims)
            elif program.runs_graph(step, bucket):
                spec = specs.get(step.signature) or _spec_at(program, step, dims)
                _graph_step(mem, program, step, spec, dims)
            else:
                _kernel_step(mem, program, step, dims)
    if written is not None:
        for name in program.written_inputs():
            written[name] = np.array(mem.value(plan.storage[program.inputs[name]]))
    return {out: np.array(mem.value(plan.storage[value]))
            for out, value in program.outputs.items()}


def _spec_at(program: Schedule, step: Any, dims: Mapping[str, int]) -> GroupSpec:
    group = make_group(program.graph, list(step.nodes), step.pattern,
                       placement=program.placement)
    return group_spec(program.graph, group, dims, program.env, program.placement)


def _graph_step(mem: Memory, program: Schedule, step: Any, spec: GroupSpec,
                dims: Mapping[str, int]) -> None:
    """A cuDNN graph: inputs read and outputs written through the spec's tensors, bound (by
    uid) to the step's inputs then its nodes, as the runtime binds them."""
    names = list(step.inputs) + list(step.nodes)
    values: dict[str, np.ndarray] = {}
    bound = {t.name: mem.plan.storage[names[t.uid - 1]] for t in spec.tensors
             if t.role in ("input", "output")}
    _apart(step, *([mem.extent(t.dims, t.strides, t.dtype, bound[t.name].base,
                               bound[t.name].offset) for t in spec.tensors if t.role == role]
                   for role in ("input", "output")))
    for t in spec.tensors:
        if t.role == "input":
            s = mem.plan.storage[names[t.uid - 1]]
            values[t.name] = np.ascontiguousarray(mem.array(t.dims, t.strides, t.dtype, s.base,
                                                            s.offset))
        elif t.role == "scalar":
            values[t.name] = np.asarray(t.value, np.float32)
    for op in spec.ops:
        node = program.nodes[op.node]
        operands = [_logical(values[i], program, i, dims) for i in op.inputs]
        t = spec.tensor(op.node)
        out = interp.evaluate_node(node, operands, concrete_attrs(node, dims, program.env),
                                   stored_dtype(node, t.role == "virtual"))
        values[op.node] = out
        if t.role == "output":
            s = mem.plan.storage[names[t.uid - 1]]
            np.copyto(mem.array(t.dims, t.strides, t.dtype, s.base, s.offset),
                      out.reshape(t.dims).astype(NUMPY_DTYPES[t.dtype]))


def _where(s: Storage) -> tuple[tuple[int, ...], tuple[int, ...], str, str, int]:
    return s.shape, s.strides, s.dtype, s.base, s.offset


def _logical(x: np.ndarray, program: Schedule, name: str, dims: Mapping[str, int]) -> np.ndarray:
    """A tensor read in cuDNN's form, in the value's own shape (same elements, same order)."""
    node = program.nodes[name]
    if node.op == "scalar":
        return np.asarray(x, np.float32)
    shape = tuple(int(interp.concrete(d, dims, program.env)) for d in node.type.shape)
    return x.reshape(shape)


def _kernel_step(mem: Memory, program: Schedule, step: Any, dims: Mapping[str, int]) -> None:
    """A fallback kernel: its ops in order, each result rounded as the kernel holds it (a value
    inside a fused pointwise kernel to its intermediate dtype), its outputs stored."""
    storage = mem.plan.storage
    stored = batches.written(step)  # a single op its result even where nothing here reads it
    first = program.nodes[step.nodes[0]]
    in_place = placed_in(program.placement, first.name)  # a concat's slices, already there
    if first.op in IN_PLACE:  # the memory it writes is its first operand's (rows not rewritten)
        in_place = {*in_place, first.inputs[0]}
    _apart(step, [mem.extent(*_where(storage[i])) for i in step.inputs
                  if program.nodes[i].op != "scalar" and i not in in_place],
           [mem.extent(*_where(storage[o])) for o in stored])
    values = _evaluated(mem, program, step, dims)
    for name in stored:
        np.copyto(mem.value(storage[name]), values[name])


def _evaluated(mem: Memory, program: Schedule, step: Any,
               dims: Mapping[str, int]) -> dict[str, np.ndarray]:
    """A fallback kernel step's ops in order, on what they read from memory, each value rounded
    as the kernel holds it (one it does not store to its intermediate dtype)."""
    stored = batches.written(step)
    values: dict[str, np.ndarray] = {}
    for name in step.nodes:
        node = program.nodes[name]
        operands = [values[i] if i in values else
                    np.asarray(float(program.nodes[i].attrs["value"]), np.float32)
                    if program.nodes[i].op == "scalar"
                    else np.ascontiguousarray(mem.value(mem.plan.storage[i]))
                    for i in node.inputs]
        values[name] = interp.evaluate_node(node, operands, concrete_attrs(node, dims, program.env),
                                            stored_dtype(node, name not in stored))
    return values
