"""Cache writes computed from their value's inputs, not from the value: a decoder step's rotated
keys, written into their slices of `k_new` by small pointwise steps, then copied into the key
cache at row `position` (`cache_write`), cost a launch after those steps (~3 us on the H200:
the copy waits for them). Where every step writing `new` is such a step, the cache write runs
those steps' kernels again with their results stored straight into the cache's rows
(`fused.Plan.strided_kernel` with a shift read on the device): it then reads what they read,
not what they write, and runs in their launch (`runtime.batches`, which also keeps it from
running where a step before it overwrote what they read). The steps still write `new`, for
whatever else reads it (a few kilobytes).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from dslc.ir.storage import Storage
from dslc.runtime.records import StepRecord
from dslc.runtime.schedule import MemoryPlan, Schedule

ROWS_AXIS = 2  # a cache is [B, H, rows, D]


@dataclass(frozen=True)
class Recomputed:
    """A cache write run as its value's writers: each writer with where in the cache its result
    goes at row 0 (the shift `at` added on the device), and the cache's rows."""

    writers: tuple[StepRecord, ...]
    regions: tuple[Storage, ...]
    at: str
    rows: int


def recomputed(program: Schedule, memory: MemoryPlan,
               small: Callable[[StepRecord], bool]) -> dict[str, Recomputed]:
    """The cache write steps (by name) that run as their value's writers at this memory plan:
    each writer a pointwise step of one result that `small` takes (the strided kernel runs it).
    The writers still write the value, so whatever else reads it reads it as before; nothing
    but the cache write reads the cache (E0211), so they read nothing of it."""
    out: dict[str, Recomputed] = {}
    writer_of = {v: s for s in program.steps for v in s.outputs}
    for step in program.steps:
        node = program.nodes[step.nodes[0]]
        if len(step.nodes) != 1 or node.op != "cache_write":
            continue
        _cache, new, at = node.inputs
        value = program.nodes[new]
        # an operand of a concatenation that is copied, not written in place, has a buffer of
        # its own: `_region` finds no place for it in the value
        parts = list(value.inputs) if value.op == "concat" else [new]
        writers = [writer_of.get(p) for p in parts]
        if any(w is None or w.outputs != (p,) or program.pointwise_kernel(w) is None
               or not small(w) for w, p in zip(writers, parts, strict=True)):
            continue
        into = memory.storage[step.nodes[0]]
        regions = tuple(_region(memory.storage[new], memory.storage[p], into) for p in parts)
        if None in regions:
            continue
        out[step.name] = Recomputed(tuple(w for w in writers if w is not None),
                                    tuple(r for r in regions if r is not None), at,
                                    into.shape[ROWS_AXIS])
    return out


def _region(whole: Storage, part: Storage, cache: Storage) -> Storage | None:
    """Where `part` (the value `whole`, or a slice of it written in place) goes in `cache` at
    row 0: its coordinates in `whole` found from its offset (`whole` dense), laid out by the
    cache's strides. None where `part` lives elsewhere (a copied operand), `whole` is not
    dense, or `part` is not of every row (a concatenation along the rows: the kernel's bounds
    check counts the part's own rows)."""
    if part.base != whole.base or len(whole.shape) != len(cache.shape) or \
            math.prod(whole.shape) != whole.span:
        return None
    rest = part.offset - whole.offset
    coords = [0] * len(whole.shape)
    for k in sorted((k for k, d in enumerate(whole.shape) if d > 1),
                    key=lambda k: -whole.strides[k]):
        coords[k], rest = divmod(rest, whole.strides[k])
    if coords[ROWS_AXIS] or part.shape[ROWS_AXIS] != whole.shape[ROWS_AXIS]:
        return None  # the shift's bounds are the part's rows: a part of every row only
    offset = cache.offset + sum(c * s for c, s in zip(coords, cache.strides, strict=True))
    return Storage(part.shape, cache.strides, part.dtype, cache.base, offset)
