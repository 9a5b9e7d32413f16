"""Which steps run as one launch (`backend.merge`), and in what order, at one memory plan.

The schedule's order is one topological order of its steps; any other that keeps every pair of
steps that touch the same memory (one writes what the other reads or writes) in their order
computes the same values. Within a window of recent slots, a small kernel step (`mergeable`)
joins the earliest slot of such steps after the last slot it must follow; every other step
starts a slot of its own at the end. Memory is compared as the memory plan lays it out: two
arena values whose bytes meet are one memory (the plan reuses a value's bytes once its last
reader has run, in the schedule's order), so a step never moves ahead of a reader of the
bytes it overwrites. Two slices of one concatenation written in place are disjoint by
construction (`ir.placement`), however their spans interleave.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from dslc.backend import fused
from dslc.ir.interp import ITEMSIZE
from dslc.runtime.cachewrites import Recomputed, recomputed
from dslc.runtime.records import StepRecord
from dslc.runtime.schedule import MemoryPlan, Schedule

WINDOW = 8  # slots a step may move ahead over


@dataclass(frozen=True)
class Region:
    """Bytes a step touches: of memory `key` (an arena, or a value's own buffer), [lo, hi); and
    for a slice of a concatenation written in place, which (concat, operand)."""

    key: str
    lo: int
    hi: int
    slice: tuple[str, str] | None = None

    def meets(self, other: Region) -> bool:
        if self.key != other.key or self.lo >= other.hi or other.lo >= self.hi:
            return False
        return not (self.slice is not None and other.slice is not None
                    and self.slice[0] == other.slice[0] and self.slice != other.slice)


@dataclass(frozen=True)
class Touch:
    """A step's reads and writes."""

    reads: tuple[Region, ...]
    writes: tuple[Region, ...]

    def must_follow(self, earlier: Touch) -> bool:
        """Whether this step reads or writes what `earlier` writes, or writes what it reads."""
        return any(w.meets(r) for w in earlier.writes for r in (*self.reads, *self.writes)) \
            or any(w.meets(r) for w in self.writes for r in earlier.reads)


def slots(touches: Sequence[Touch], mergeable: Callable[[int], bool],
          window: int = WINDOW) -> list[list[int]]:
    """The steps (by index) in slots, in run order: a slot of more than one step holds only
    mergeable steps, none of which must follow another."""
    out: list[list[int]] = []
    for i, touch in enumerate(touches):
        recent = range(max(len(out) - window, 0), len(out))
        after = max((k for k in recent if any(touch.must_follow(touches[j]) for j in out[k])),
                    default=recent.start - 1)
        if mergeable(i):
            into = next((k for k in range(after + 1, len(out)) if mergeable(out[k][0])), None)
            if into is not None:
                out[into].append(i)
                continue
        out.append([i])
    return out


def small(program: Schedule, memory: MemoryPlan, step: StepRecord,
          bucket: str | None = None) -> bool:
    """Whether the step runs a kernel that can be a part of a merged launch (no graph at this
    `bucket`: `Schedule.runs_graph`): a cache write, a gather (an embedding lookup: a
    model's lookups read their tables side by side), or a pointwise step small enough for the
    strided kernel."""
    if program.graph_here(step, bucket):
        return False
    if len(step.nodes) == 1 and program.nodes[step.nodes[0]].op in ("cache_write", "gather"):
        return True
    shape = memory.storage[step.outputs[0]].shape
    return program.pointwise_kernel(step) is not None and \
        math.prod(shape) < fused.VECTOR_AT_LEAST


def plan(program: Schedule, memory: MemoryPlan, bucket: str | None = None,
         ) -> tuple[list[list[StepRecord]], dict[str, Recomputed]]:
    """The program's steps in slots at this memory plan (`slots`, the mergeable steps those
    `small` takes at this `bucket`), and the cache writes run as their value's writers
    (`cachewrites`)."""
    steps = program.steps
    plain = touches(program, memory)
    again = _kept(program, plain, recomputed(program, memory,
                                             lambda s: small(program, memory, s, bucket)))
    moved = [_touch(program, memory, reads(s, again), s) if s.name in again else t
             for s, t in zip(steps, plain, strict=True)]
    return ([[steps[i] for i in slot]
             for slot in slots(moved, lambda i: small(program, memory, steps[i], bucket))],
            again)


def _kept(program: Schedule, plain: Sequence[Touch],
          again: dict[str, Recomputed]) -> dict[str, Recomputed]:
    """The cache writes that may run as their value's writers: those whose writers' operands
    no step between the first writer and the cache write overwrites (the memory plan reuses
    an operand's bytes once its last reader in the schedule's order has run; run again by the
    cache write, the writers' kernels would read what came after)."""
    index = {s.name: i for i, s in enumerate(program.steps)}
    out = {}
    for name, r in again.items():
        first = min(index[w.name] for w in r.writers)
        operands = [t for w in r.writers for t in plain[index[w.name]].reads]
        if not any(w.meets(t) for j in range(first + 1, index[name])
                   for w in plain[j].writes for t in operands):
            out[name] = r
    return out


def touches(program: Schedule, memory: MemoryPlan) -> list[Touch]:
    """Each step's reads and writes at this memory plan."""
    return [_touch(program, memory, step.inputs, step) for step in program.steps]


def reads(step: StepRecord, again: Mapping[str, Recomputed]) -> tuple[str, ...]:
    """What a step reads: a cache write run as its value's writers, what they read."""
    r = again.get(step.name)
    return step.inputs if r is None else (*(v for w in r.writers for v in w.inputs), r.at)


def _touch(program: Schedule, memory: MemoryPlan, values: Sequence[str],
           step: StepRecord) -> Touch:
    return Touch(tuple(_region(program, memory, v) for v in values
                       if program.nodes[v].op != "scalar"),
                 tuple(_region(program, memory, v) for v in written(step)))


def written(step: StepRecord) -> tuple[str, ...]:
    """What a step stores: its outputs, and a single op its result even where no other step
    reads it (a cache written in place)."""
    return step.outputs if len(step.nodes) > 1 else step.nodes


def _region(program: Schedule, memory: MemoryPlan, value: str) -> Region:
    s = memory.storage[value]
    item = ITEMSIZE[s.dtype]
    placed = program.placement.get(value)
    slice_ = None if placed is None else (placed[0], value)
    lo = s.offset * item
    if s.base in memory.offsets:
        lo += memory.offsets[s.base]
        return Region("arena", lo, lo + s.span * item, slice_)
    return Region(s.base, lo, lo + s.span * item, slice_)
