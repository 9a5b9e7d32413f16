"""Steps computed inside their readers' kernels, as measured choices (`dslc tune --fusion
measure`, after the kernels are chosen: `tune.fusion`). The few-row matmul kernel
(`backend.gemv`) costs its weight's read plus about 5 us fixed on the H200, so a step that only
feeds such kernels is worth computing inside them: a matmul alone whose value only the next
kernel step's epilogue reads, of the same input (`pairs`: a gated MLP's up projection beside
its gate), and an RMS norm whose value only such kernels read as their input (`norms`: a
decoder's layer norms). Each join is timed against the steps apart and made where faster
(`join_measured`); `every_kernel` makes every one (the generated programs' GPU check).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from dslc.backend import gemv
from dslc.backend.spec import SpecError, group_spec
from dslc.ir.graph import Node, outside_reads
from dslc.ir.groups import Group, signature
from dslc.runtime.records import BucketRecord, Bundle, StepRecord
from dslc.runtime.schedule import Schedule
from dslc.tune.fusion import (
    KernelMeasured,
    MeasureKernel,
    joined_reason,
    kernel_steps,
    ms,
    split_is_faster,
    takes_matmul_kernel,
    with_fusion,
)


@dataclass
class Joined:
    """A step one kernel computes inside each of its readers' (`backend.gemv`), measured: a
    matmul alone whose value only one such step's epilogue reads, of the same input (`pairs`: a
    gated MLP's up projection, joined with its gate, the SiLU and the product), or an RMS norm
    whose value only such steps' matmuls read (`norms`: a decoder's layer norm, computed as its
    projections read their input). Per bucket, the times of the steps apart as tuning left them
    (graph or kernel) and each joined reader's."""

    absorbed: StepRecord
    readers: tuple[StepRecord, ...]
    apart_ms: dict[str, float | None] = field(default_factory=dict)
    reader_ms: dict[str, dict[str, float | None]] = field(default_factory=dict)

    @property
    def joined_ms(self) -> dict[str, float | None]:
        """The joined readers' times summed, per bucket (None where one is missing)."""
        out: dict[str, float | None] = {}
        for key in self.apart_ms:
            times = [self.reader_ms.get(r.name, {}).get(key) for r in self.readers]
            out[key] = None if None in times else sum(t for t in times if t is not None)
        return out

    @property
    def chosen(self) -> bool:
        return split_is_faster(self.apart_ms, self.joined_ms, {})

    def summary(self) -> str:
        joined = self.joined_ms
        return f"joined with {self.absorbed.name} measured: " + "; ".join(
            f"{key}: apart {ms(t)} ms, joined {ms(joined.get(key))} ms"
            for key, t in self.apart_ms.items())


def pairs(program: Schedule) -> list[Joined]:
    """The steps the few-row matmul kernel computes that one kernel computes together: a
    matmul alone whose value only the next such step's epilogue reads, both of one input (the
    second reads the input once for both)."""
    producer = {o: s for s in program.steps for o in s.outputs}
    users = program.graph.users()
    exported = {v for _, v in program.graph.outputs}
    out: list[Joined] = []
    for second in program.steps:
        for name in second.inputs:
            first = producer.get(name)
            if first is None or len(first.nodes) != 1 or name in exported or \
                    any(u.name not in second.nodes for u in users[name]) or \
                    not (takes_matmul_kernel(program, first) and takes_matmul_kernel(program, second)):
                continue
            if _computes(program, joined(first, second, program.nodes, "")):
                out.append(Joined(first, (second,)))
                break
    return out


def norms(program: Schedule) -> list[Joined]:
    """RMS norms whose value only steps of the few-row matmul kernel read, each as its
    matmuls' input (the kernel computes the norm as it reads the input: `backend.gemv.Norm`)."""
    readers: dict[str, list[StepRecord]] = {}
    for step in program.steps:
        for name in step.inputs:
            readers.setdefault(name, []).append(step)
    users = program.graph.users()
    exported = {v for _, v in program.graph.outputs}
    out = []
    for step in program.steps:
        [name] = step.nodes if len(step.nodes) == 1 else [""]
        if not name or program.nodes[name].op != "rmsnorm" or name in exported:
            continue
        them = readers.get(name, [])
        inside = {n for r in them for n in r.nodes}  # a view of it, or a concat it is
        if them and all(u.name in inside for u in users[name]) and all(  # written into: no
                r.kind == "kernel" and takes_matmul_kernel(program, r) and
                _computes(program, joined(step, r, program.nodes, "")) for r in them):
            out.append(Joined(step, tuple(them)))
    return out


def _computes(program: Schedule, step: StepRecord) -> bool:
    """Does the few-row matmul kernel compute this (joined) step?"""
    return isinstance(gemv.plan_of(program.nodes, step.nodes, step.inputs, step.outputs),
                      gemv.Gemv)


def joined(absorbed: StepRecord, reader: StepRecord, nodes: Mapping[str, Node],
           reason: str) -> StepRecord:
    """The kernel step computing `absorbed` inside `reader` (`pairs`, `norms`), where
    `reader` was."""
    members = (*absorbed.nodes, *reader.nodes)
    inputs = outside_reads(nodes, members)
    # its own signature: the reader's names the reader's graph, which a bucket may keep
    # (`tune.fusion.KernelMeasured.graph_at`) and which computes the reader alone
    return StepRecord("kernel", reader.name, reader.pattern, members, inputs, reader.outputs,
                      signature(nodes, members, inputs, reader.pattern), reason)


def measure_joins(bundle: Bundle, found: list[Joined],
                  kernel_ms: Mapping[str, Mapping[str, float | None]],
                  measurer: Callable[[Bundle], MeasureKernel],
                  progress: Callable[[str], None] | None = None) -> list[Joined]:
    """Each join `found` (`pairs` or `norms` of a tuned bundle) measured at every bucket: its
    readers joined, as kernels (`measurer` of the bundle with every join made), beside the
    steps apart as each bucket runs them: a kernel's time from `kernel_ms` (by step, then
    bucket), a graph's plan's."""
    if not found:
        return found
    both = with_joins(bundle, found, every=True)
    program = Schedule(both)
    measure = measurer(both)
    steps = {s.name: s for s in program.steps}

    def apart(s: StepRecord, bucket: BucketRecord) -> float | None:
        """The step's time at the bucket as it runs there: its kernel's (None: not measured,
        cuDNN refused its graph at compile time), or its graph's where it runs one (a graph
        step, or a kernel step that kept its graph at this bucket: `StepRecord.graph_at`)."""
        if not Schedule.runs_graph(s, bucket.key):
            return kernel_ms.get(s.name, {}).get(bucket.key)
        [graphs] = [b.graphs for b in bundle.buckets if b.key == bucket.key]
        return graphs[s.signature].plan.ms

    for i, m in enumerate(found):
        for bucket in both.buckets:
            times = [apart(s, bucket) for s in (m.absorbed, *m.readers)]
            m.apart_ms[bucket.key] = sum(t for t in times if t is not None) \
                if None not in times else None
            storage = program.memory_plan(dict(bucket.dims)).storage
            for reader in m.readers:
                step = steps[reader.name]
                if progress:
                    progress(f"[{i + 1}/{len(found)}] {bucket.key} {step.name} joined")
                try:
                    spec = group_spec(program.graph, join_group(program, step), dict(bucket.dims),
                                      program.env, program.placement)
                except SpecError:  # no buffers to time it in: it stays apart
                    ms = None
                else:
                    ms = measure(step, spec, storage, f"{step.name} at {bucket.key}")
                m.reader_ms.setdefault(reader.name, {})[bucket.key] = ms
    return found


def join_group(program: Schedule, step: StepRecord) -> Group:
    """A joined kernel step as the group it is timed as: anchored on its (last) matmul, so that
    only the epilogue after it is an epilogue, and storing the step's outputs alone (a norm's
    value, which each reader computes for itself, is stored by none)."""
    [anchor] = [n for n in step.nodes if program.nodes[n].op == "matmul"][-1:]
    return Group(step.name, step.pattern, step.nodes, anchor, step.inputs, step.outputs,
                 step.signature, step.reason)


def with_joins(bundle: Bundle, measured: list[Joined], every: bool = False) -> Bundle:
    """The bundle with each chosen join (every one, with `every`) made: its absorbed step
    computed inside each reader, and each measured step saying what was measured."""
    nodes = bundle.graph.graph.by_name()
    taken = {id(m) for m in measured if every or m.chosen}
    into = {r.name: m for m in measured for r in m.readers}
    dropped = {m.absorbed.name for m in measured if id(m) in taken}
    steps: list[StepRecord] = []
    for step in bundle.steps:
        m = into.get(step.name)
        if step.name in dropped:
            continue
        if m is None:
            steps.append(step)
        elif id(m) in taken:
            why = f"{m.summary()}: one kernel is faster" if m.chosen else \
                f"joined with {m.absorbed.name}: one kernel"
            steps.append(joined(m.absorbed, step, nodes, joined_reason(step.reason, why)))
        else:
            steps.append(replace(step, reason=joined_reason(step.reason, f"{m.summary()}: kept apart")))
    return with_fusion(replace(bundle, steps=tuple(steps)), [])


def join_measured(bundle: Bundle, kernels: list[KernelMeasured],
                  measurer: Callable[[Bundle], MeasureKernel],
                  progress: Callable[[str], None] | None = None,
                  ) -> tuple[Bundle, list[Joined]]:
    """The tuned bundle (its kernels chosen: `kernels`) with each join measured faster made:
    the pairs of projections first, then the norms ahead of them (a pair already joined reads
    the norm once); and every join measured."""
    times = {k.step.name: dict(k.kernel_ms) for k in kernels}
    out: list[Joined] = []
    for find in (pairs, norms):
        found = measure_joins(bundle, find(Schedule(bundle)), times, measurer, progress)
        bundle = with_joins(bundle, found)
        times.update((name, ms) for j in found if j.chosen for name, ms in j.reader_ms.items())
        out += found
    return bundle, out


def every_kernel(bundle: Bundle) -> Bundle:
    """The bundle with every step a fallback kernel also computes (`kernel_steps`) made that
    kernel, whatever it measures: the generated programs' check of the kernels against the
    reference (`fuzz.gpu`), where tuning would take a kernel only where it is faster."""
    names = {s.name for s in kernel_steps(Schedule(bundle))}
    # a kernel at every bucket: also a tuned kernel step that kept its graph at some
    steps = tuple(replace(s, kind="kernel", graph_at=(),
                          reason=joined_reason(s.reason, "made its fallback kernel to check it"))
                  if s.name in names else replace(s, graph_at=()) for s in bundle.steps)
    out = with_fusion(replace(bundle, steps=steps), [])
    out = with_joins(out, pairs(Schedule(out)), every=True)
    return with_joins(out, norms(Schedule(out)), every=True)
