"""Fusion as a measured choice (`dslc tune --fusion measure`). Fusing a pointwise tail into a
convolution's or matmul's epilogue saves a round trip through memory, but the fused graph may
run on a slower engine (a runtime-compiled one where the library has a tuned kernel for the
anchor alone), so where a group has that alternative the tuner measures both: the group fused,
and split after its anchor (and the anchor's bias or scale; a depthwise conv's bias goes with
the rest: with it cuDNN ran a 7x7 12x slower) into the anchor's graph and a pointwise graph for
the rest. A split is kept where, summed over the buckets, it is faster than
the fused group by more than the noise a plan must beat (`measure.NOISE`); the steps say what
was measured either way (`dslc inspect` shows it).

A graph of pointwise ops alone is also measured against the one fallback kernel that computes
it (`backend.fused`): on tiny tensors (a decoder's `[1, 32, 1, 64]` at one token) a CUDA kernel
of one expression beat cuDNN's generated one on the H200. So is an attention the split-key
kernel takes (`backend.attention`: a decoder's step over its cache, 7.8 us a layer against
cuDNN's 17 or more). The kernel is taken where, summed over the buckets, it is faster than the
graph by more than `measure.NOISE`.

Steps computed inside their readers' kernels (a gated MLP's pair of projections, a norm ahead
of them) are the next choice, measured on the bundle these make: `tune.joins`.

The bundle's schedule is rewritten for a split (its steps, the graphs of every bucket, their
memory plans) or a kernel (the step's kind, the graphs no step uses dropped): the runtime runs
whatever schedule a bundle holds.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from dslc.backend import attention, fused, gemv
from dslc.backend.measure import NOISE
from dslc.backend.spec import GroupSpec, group_spec
from dslc.ir.graph import Node
from dslc.ir.groups import Group, make_group, unique_names
from dslc.ir.naming import StepNames
from dslc.ops import OPS
from dslc.ops.attention import named_operands
from dslc.ops.conv import depthwise_taps
from dslc.runtime.records import (
    BucketRecord,
    Bundle,
    GraphEntry,
    PlanRecord,
    SpecRecord,
    StepRecord,
)
from dslc.runtime.schedule import Schedule

HEAD_EPILOGUE = ("bias_add", "scale_mul")  # what stays with the anchor: its engines take it


@dataclass(frozen=True)
class Split:
    """A graph step that may run as its anchor's graph, then a pointwise graph."""

    step: StepRecord
    head: Group
    tail: Group


@dataclass
class Measured:
    """One split's times per bucket key: the fused graph's, and the two parts'."""

    split: Split
    fused_ms: dict[str, float | None] = field(default_factory=dict)
    head_ms: dict[str, float | None] = field(default_factory=dict)
    tail_ms: dict[str, float | None] = field(default_factory=dict)
    # the parts' specs and plans per bucket key, for a bundle that takes the split
    parts: dict[str, tuple[tuple[GroupSpec, PlanRecord], tuple[GroupSpec, PlanRecord]]] = \
        field(default_factory=dict)

    @property
    def chosen(self) -> bool:
        return split_is_faster(self.fused_ms, self.head_ms, self.tail_ms)

    def summary(self) -> str:
        return "fusion measured: " + "; ".join(
            f"{key}: fused {ms(fused)} ms, split {ms(self.head_ms.get(key))} + "
            f"{ms(self.tail_ms.get(key))} ms" for key, fused in self.fused_ms.items())


@dataclass
class KernelMeasured:
    """A graph step one fallback kernel also computes (`kernel_steps`): the graph's time and
    the kernel's, per bucket."""

    step: StepRecord
    graph_ms: dict[str, float | None] = field(default_factory=dict)
    kernel_ms: dict[str, float | None] = field(default_factory=dict)

    @property
    def chosen(self) -> bool:
        """The kernel faster than the graph by more than NOISE at one bucket or more (not where
        a time is missing: a kernel that failed its check stays a graph)."""
        times = [*self.graph_ms.values(), *(self.kernel_ms.get(k) for k in self.graph_ms)]
        if not self.graph_ms or any(t is None or not math.isfinite(t) for t in times):
            return False
        return len(self.graph_at) < len(self.graph_ms)

    @property
    def graph_at(self) -> frozenset[str]:
        """The buckets where the graph stays, the kernel chosen: the kernel not faster there by
        more than NOISE (a decoder's attention: the kernel at one query a step, cuDNN's flash
        engine over a prompt)."""
        return frozenset(k for k, g in self.graph_ms.items()
                         if not split_is_faster({k: g}, {k: self.kernel_ms.get(k)}, {}))

    def summary(self) -> str:
        return "backend measured: " + "; ".join(
            f"{key}: cuDNN graph {ms(g)} ms, one kernel {ms(self.kernel_ms.get(key))} ms"
            for key, g in self.graph_ms.items())


def kernel_steps(program: Schedule) -> list[StepRecord]:
    """The graph steps one fallback kernel also computes: a pointwise group's, attention's
    where its kernel takes the operands at the first bucket (`backend.attention`: a decoder's
    few queries over a long cache), or a matmul's with its epilogue (the few-row kernel, or
    cuBLASLt past its rows). Not those that read or write a mask: cuDNN stores a mask
    as bits, a kernel as bytes, and which masks stay bits was settled at compile time
    (`compile.stage.masks_as_bytes`)."""
    def touches_a_mask(s: StepRecord) -> bool:
        return any(program.nodes[n].type.dtype == "bool" for n in (*s.inputs, *s.nodes))

    return [s for s in program.steps if s.kind == "graph" and not touches_a_mask(s) and (
        isinstance(fused.plan_of(program.nodes, s.nodes, s.inputs, s.outputs), fused.Plan)
        or _attention_kernel(program, s) or takes_matmul_kernel(program, s)
        or takes_many_rows(program, s))]


def takes_matmul_kernel(program: Schedule, step: StepRecord) -> bool:
    """A matmul of at most `gemv.MOST_ROWS` rows at the first bucket, its weight's K
    contiguous (a PyTorch linear's [N, K] read transposed), with its epilogue."""
    g = program.matmul_kernel(step)
    if g is None:
        return False
    dims = dict(program.bundle.buckets[0].dims)
    x, w = program.storage(g.x, dims), program.storage(g.w, dims)
    return math.prod(x.shape[:-1]) <= gemv.MOST_ROWS and w.strides[0] == 1


def takes_many_rows(program: Schedule, step: StepRecord) -> bool:
    """A matmul of more than `gemv.MOST_ROWS` rows at the first bucket with an epilogue
    cuBLASLt's result can feed, no pair or norm joined (`gemv.on_cublaslt`): cuBLASLt may run
    it (`backend.blas`; cuDNN's engines ran a transformer's projections 1.3-1.6x slower than
    cuBLAS's kernels on an H100)."""
    g = program.matmul_kernel(step)
    if g is None or not gemv.on_cublaslt(g):
        return False
    x = program.storage(g.x, dict(program.bundle.buckets[0].dims))
    return math.prod(x.shape[:-1]) > gemv.MOST_ROWS


def _attention_kernel(program: Schedule, step: StepRecord) -> bool:
    node = program.nodes[step.nodes[0]]
    if len(step.nodes) != 1 or node.op != "sdpa":
        return False
    dims = dict(program.bundle.buckets[0].dims)
    shapes = {n: program.storage(i, dims).shape
              for n, i in named_operands(node.attrs, node.inputs).items()}
    return attention.takes(shapes, program.nodes[node.inputs[0]].type.dtype)


MeasureKernel = Callable[[StepRecord, GroupSpec, Mapping[str, Any], str], float | None]


def measure_kernels(bundle: Bundle, plans: Mapping[tuple[str, str], PlanRecord],
                    measure: MeasureKernel, progress: Callable[[str], None] | None = None,
                    ) -> list[KernelMeasured]:
    """Each pointwise graph step's kernel measured at every bucket (`measure`: milliseconds, or
    None where it failed its check), beside the graph's time from `plans`, else the bundle's."""
    program = Schedule(bundle)
    out = [KernelMeasured(step) for step in kernel_steps(program)]
    for i, bucket, storage, graph in _each_bucket(program, plans, [m.step for m in out],
                                                  "as one kernel", progress):
        m = out[i]
        m.graph_ms[bucket.key] = graph.ms
        group = make_group(program.graph, list(m.step.nodes), m.step.pattern,
                           placement=program.placement)
        spec = group_spec(program.graph, group, dict(bucket.dims), program.env,
                          program.placement)
        m.kernel_ms[bucket.key] = measure(m.step, spec, storage,
                                          f"{m.step.name} at {bucket.key}")
    return out


def _each_bucket(program: Schedule, plans: Mapping[tuple[str, str], PlanRecord],
                 steps: list[StepRecord], what: str, progress: Callable[[str], None] | None,
                 ) -> Iterator[tuple[int, BucketRecord, Mapping[str, Any], PlanRecord]]:
    """For each step (by index) and bucket: the bucket, its storage, and the step graph's plan
    (from `plans`, the tuning just done, else the bundle's); each said to `progress`."""
    buckets = program.bundle.buckets
    storages = {b.key: program.memory_plan(dict(b.dims)).storage for b in buckets}
    for i, step in enumerate(steps):
        for bucket in buckets:
            if progress:
                progress(f"[{i + 1}/{len(steps)}] {bucket.key} {step.name} {what}")
            plan = plans.get((bucket.key, step.signature)) or bucket.graphs[step.signature].plan
            yield i, bucket, storages[bucket.key], plan


def splits(program: Schedule) -> list[Split]:
    """The graph steps of a conv or matmul anchor with a pointwise tail after its bias: each
    split after the bias (a depthwise conv's before it). Steps writing into a concat's buffer
    stay as they are."""
    users = program.graph.users()
    names = StepNames(program.graph, program.load_time)
    out = []
    for step in program.steps:
        nodes = [program.nodes[n] for n in step.nodes]
        if step.kind != "graph" or len(nodes) < 2 or nodes[0].op not in ("conv", "matmul"):
            continue
        k = 1 if _depthwise(program, nodes[0]) else _through_bias(nodes)
        tail = nodes[k:]
        if not tail or any(OPS[n.op].fusion != "epilogue" for n in tail) or \
                any(o in program.placement for o in step.outputs):
            continue
        head = make_group(program.graph, list(step.nodes[:k]), step.pattern, "", users, names,
                          program.placement)
        rest = make_group(program.graph, list(step.nodes[k:]), "pointwise", "", users, names,
                          program.placement)
        out.append(Split(step, head, rest))
    return out


def _through_bias(nodes: list[Node]) -> int:
    """How many of a group's ops its anchor's part keeps: the anchor, then its bias or scale
    (cuDNN's fused engines take it), with a residual added before the bias
    (`lower.canonical.residual_before_bias`, cuDNN's conv, add, bias order); else the anchor."""
    k = 2 if nodes[0].op == "conv" and len(nodes) > 2 and nodes[1].op == "add" else 1
    return k + 1 if nodes[k].op in HEAD_EPILOGUE else 1


def _depthwise(program: Schedule, anchor: Node) -> bool:
    """A depthwise conv splits before its bias: cuDNN's engines for the conv with its bias may
    be far slower than for the conv alone (docs/DESIGN.md, depthwise convolutions)."""
    if anchor.op != "conv":
        return False
    x, w = (program.nodes[i].type.shape for i in anchor.inputs)
    return depthwise_taps(x, w, anchor.attrs["groups"]) is not None


def split_is_faster(fused: Mapping[str, float | None], head: Mapping[str, float | None],
                    tail: Mapping[str, float | None]) -> bool:
    """Summed over the buckets, are the two parts faster than the fused graph by more than
    NOISE? Not where any time is missing (a part that did not tune stays fused)."""
    times = [*fused.values(), *head.values(), *tail.values()]
    if not fused or any(t is None or not math.isfinite(t) for t in times):
        return False
    total_fused = sum(t for t in fused.values() if t is not None)
    total_split = sum(t for t in (*head.values(), *tail.values()) if t is not None)
    return total_split < total_fused * (1 - NOISE)


MeasureGroup = Callable[[GroupSpec, Mapping[str, Any], str], PlanRecord | None]


def measure_splits(bundle: Bundle, plans: Mapping[tuple[str, str], PlanRecord],
                   measure: MeasureGroup, progress: Callable[[str], None] | None = None,
                   ) -> list[Measured]:
    """Each split's parts measured at every bucket (`measure`: a tuned plan with its time, or
    None), beside the fused graph's time from `plans` (the tuning just done), else the
    bundle's."""
    program = Schedule(bundle)
    out = [Measured(s) for s in splits(program)]
    for i, bucket, storage, whole in _each_bucket(program, plans, [m.split.step for m in out],
                                                  "split", progress):
        m = out[i]
        m.fused_ms[bucket.key] = whole.ms
        parts = []
        for group, times in ((m.split.head, m.head_ms), (m.split.tail, m.tail_ms)):
            spec = group_spec(program.graph, group, dict(bucket.dims), program.env,
                              program.placement)
            plan = measure(spec, storage, f"{group.name} at {bucket.key}")
            times[bucket.key] = plan.ms if plan is not None else None
            if plan is not None:
                parts.append((spec, plan))
        if len(parts) == 2:
            m.parts[bucket.key] = (parts[0], parts[1])
    return out


def with_fusion(bundle: Bundle, measured: list[Measured],
                kernels: list[KernelMeasured] | None = None) -> Bundle:
    """The bundle with each chosen split taking its step's place (the parts' graphs added to
    every bucket, the fused one dropped where no step uses it, memory plans made again), each
    chosen kernel its step's (the step a fallback kernel, its graphs dropped), and every
    measured step saying what was measured."""
    as_kernel = {k.step.name: k for k in kernels or []}
    bundle = replace(bundle, steps=tuple(_kernel_or_graph(s, as_kernel.get(s.name))
                                         for s in bundle.steps))
    by_step = {m.split.step.name: m for m in measured}
    # a split is taken where it won and both parts have a plan at every bucket
    taken = [m for m in measured if m.chosen and len(m.parts) == len(bundle.buckets)]
    split_steps = {m.split.step.name for m in taken}
    steps: list[StepRecord] = []
    for step in bundle.steps:
        m = by_step.get(step.name)
        if m is None:
            steps.append(step)
        elif step.name not in split_steps:
            steps.append(replace(step, reason=joined_reason(step.reason, f"{m.summary()}: kept fused")))
        else:
            why = f"split from the fused group {step.name} by measurement ({m.summary()})"
            steps.extend(_step(g, why) for g in (m.split.head, m.split.tail))
    named = [replace(s, name=g.name) for s, g in zip(steps, unique_names(_as_groups(steps)),
                                                     strict=True)]
    nodes = bundle.graph.graph.by_name()
    buckets = []
    for bucket in bundle.buckets:
        # the graphs of the steps that run one here (a kernel step where its graph was kept)
        used = {s.signature for s in named if Schedule.runs_graph(s, bucket.key)}
        graphs = {sig: g for sig, g in bucket.graphs.items() if sig in used}
        for m in taken:
            for spec, plan in m.parts[bucket.key]:
                at = f"buckets.{bucket.key}.graphs.{spec.signature}"
                graphs.setdefault(spec.signature, GraphEntry(
                    SpecRecord.from_data(spec.data(), f"{at}.spec", nodes),
                    PlanRecord.from_data(plan.to_data(), f"{at}.plan")))
        buckets.append(replace(bucket, graphs=graphs))
    out = replace(bundle, steps=tuple(named), buckets=tuple(buckets))
    program = Schedule(out)
    return replace(out, buckets=tuple(_memory(program, b) for b in out.buckets))


def _kernel_or_graph(step: StepRecord, m: KernelMeasured | None) -> StepRecord:
    if m is None:
        return step
    if not m.chosen:
        return replace(step, reason=joined_reason(step.reason, f"{m.summary()}: kept the graph"))
    graph_at = tuple(sorted(m.graph_at))
    why = f"{m.summary()}: one kernel is faster" + (
        f" (the graph kept at {', '.join(graph_at)}, where it is not)" if graph_at else "")
    return replace(step, kind="kernel", reason=joined_reason(step.reason, why),
                   graph_at=graph_at)


def _step(group: Group, reason: str) -> StepRecord:
    return StepRecord("graph", group.name, group.pattern, group.nodes, group.inputs,
                      group.outputs, group.signature, reason)


def _as_groups(steps: list[StepRecord]) -> list[Group]:
    """The steps as groups, for `unique_names` (which looks at names alone)."""
    return [Group(s.name, s.pattern, s.nodes, s.nodes[0], s.inputs, s.outputs, s.signature,
                  s.reason) for s in steps]


def _memory(program: Schedule, bucket: BucketRecord) -> BucketRecord:
    plan = program.memory_plan(dict(bucket.dims))
    return replace(bucket, offsets=dict(plan.offsets), arena_bytes=plan.arena)


def ms(t: float | None) -> str:
    """A measured time in a step's reason: milliseconds, or "-" where none was measured."""
    return "-" if t is None else f"{t:.4f}"


def joined_reason(reason: str, more: str) -> str:
    return f"{reason}; {more}" if reason else more
