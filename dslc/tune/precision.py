"""Precision as a measured choice (`--fp8 auto`): which of the ops that may compute in fp8 do.

Two programs are measured: every candidate in fp16 (the model as declared) and every candidate
in fp8. An op's choice changes only the steps around it: its own step, the step that computes
each activation it reads (which, in fp8, also quantises it: or a step of its own quantises it),
so its gain is what those steps take in fp8 less what the same steps take without (`Region`).
The ops fp8 makes faster are kept, the most gain first, as far as the model's output error on
the calibration samples stays within the budget: the longest such prefix, found by bisection
(the error grows, roughly, with every op quantised), then checked.

Everything here is plain data and functions of it: the times come from a measuring backend (the
tuner on the GPU: `dslc.pipeline.choose_fp8`), the error from a function of a choice, so the
logic runs on the CPU with stand-ins for both (tests/test_fp8_choice.py).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field

from dslc.core.types import FP8
from dslc.ir.graph import Graph

NOISE = 0.03  # fp8 must beat fp16 by more than this share of the region's time to be kept


@dataclass(frozen=True)
class StepTime:
    """One step of a compiled program and its measured time (summed over the buckets)."""

    name: str
    nodes: frozenset[str]
    anchor: str
    ms: float


@dataclass(frozen=True)
class Region:
    """The steps one op's choice changes, in each program."""

    op: str
    fp16: tuple[str, ...]  # step names in the program without fp8
    fp8: tuple[str, ...]  # step names in the program with every candidate in fp8
    fp16_ms: float
    fp8_ms: float

    @property
    def gain_ms(self) -> float:
        return self.fp16_ms - self.fp8_ms

    @property
    def faster(self) -> bool:
        return self.fp8_ms < self.fp16_ms * (1 - NOISE)


def quantised_operands(graph: Graph, op: str) -> set[str]:
    """What the fp8 graph computes for op `op` alone: the quantisation of its activation operands
    (the multiply by the scale and the cast, and the views of the result it reads) and the
    descale after it, besides the op itself."""
    nodes = graph.by_name()
    users = graph.users()
    out = {op}
    for name in nodes[op].inputs:
        x = nodes[name]
        while x.op in ("view", "contiguous") and x.type.dtype in FP8:
            out.add(x.name)
            x = nodes[x.inputs[0]]
        if x.op == "cast" and x.type.dtype in FP8 and x.inputs and \
                nodes[x.inputs[0]].op == "mul":
            out.update((x.name, x.inputs[0]))
            out.add(nodes[x.inputs[0]].inputs[0])  # the activation itself: its producer's step
    out.update(u.name for u in users.get(op, []) if u.name.startswith(f"{op}.descaled"))
    return out


def region(op: str, fp8_graph: Graph, fp16_steps: Sequence[StepTime],
           fp8_steps: Sequence[StepTime]) -> Region:
    """The steps `op`'s choice changes: in the fp8 program, those that run any of what it adds
    (`quantised_operands`); in the fp16 program, those anchored where those are anchored, and
    the one that runs the op."""
    touched = quantised_operands(fp8_graph, op)
    in8 = [s for s in fp8_steps if s.nodes & touched]
    anchors = {s.anchor for s in in8}
    in16 = [s for s in fp16_steps if s.anchor in anchors or op in s.nodes or s.nodes & touched]
    return Region(op, tuple(s.name for s in in16), tuple(s.name for s in in8),
                  sum(s.ms for s in in16), sum(s.ms for s in in8))


def regions(candidates: Collection[str], fp8_graph: Graph, fp16_steps: Sequence[StepTime],
            fp8_steps: Sequence[StepTime]) -> dict[str, Region]:
    return {op: region(op, fp8_graph, fp16_steps, fp8_steps) for op in candidates}


@dataclass
class Choice:
    """What `choose` kept, and why each op was or was not."""

    chosen: list[str] = field(default_factory=list)
    error: float = 0.0  # of the chosen set (0 for none)
    why: dict[str, str] = field(default_factory=dict)
    tried: list[tuple[int, float]] = field(default_factory=list)  # (prefix length, its error)


ErrorFn = Callable[[list[str]], float]  # a choice of ops -> the model's relative output error


def choose(found: Mapping[str, Region], error_of: ErrorFn, budget: float) -> Choice:
    """The faster ops, most gain first, in the longest prefix whose error is within `budget`."""
    out = Choice()
    order = sorted((r for r in found.values() if r.faster), key=lambda r: (-r.gain_ms, r.op))
    for r in found.values():
        if not r.faster:
            out.why[r.op] = (f"not faster in fp8: {r.fp16_ms:.4f} ms -> {r.fp8_ms:.4f} ms over "
                             "the steps it changes")
    names = [r.op for r in order]
    errors: dict[int, float] = {0: 0.0}

    def err(k: int) -> float:
        if k not in errors:
            errors[k] = error_of(names[:k])
            out.tried.append((k, errors[k]))
        return errors[k]

    lo, hi = 0, len(names)  # err(lo) is within the budget; find the largest such k
    if names and err(hi) <= budget:
        lo = hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if err(mid) <= budget:
            lo = mid
        else:
            hi = mid
    out.chosen, out.error = names[:lo], err(lo)
    for i, r in enumerate(order):
        if i < lo:
            out.why[r.op] = f"faster in fp8: {r.fp16_ms:.4f} ms -> {r.fp8_ms:.4f} ms"
        else:
            out.why[r.op] = (f"faster in fp8 ({r.fp16_ms:.4f} ms -> {r.fp8_ms:.4f} ms), but with "
                             f"it the output error passes the budget {budget:g}")
    return out
