"""Compile: FusionPlan -> one cuDNN graph per group and bucket (or a fallback kernel step).

A group cuDNN rejects is split in two and each half retried, down to single ops; the reason is
kept on the steps (`dslc inspect` shows it). Groups with one signature share one graph and plan
per bucket. With a live GPU, plans are built here; deviceless, a graph is validated and lowered
to an operation graph, and plans are built where the library can without a driver.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from dslc.backend import fused
from dslc.backend.channels_last import form_holds_at_every_size
from dslc.backend.graphs import Built, GraphError, build
from dslc.backend.kernels import DTYPES as KERNEL_DTYPES
from dslc.backend.kernels import MOVES
from dslc.backend.spec import GroupSpec, SpecError, group_spec
from dslc.backend.target import Target
from dslc.check.checker import CheckedModel
from dslc.core.dims import bucket_key
from dslc.core.types import FP8, INTS
from dslc.ir.graph import Graph, Node
from dslc.ir.groups import FusionPlan, Group, make_group, unique_names
from dslc.ir.interp import ITEMSIZE
from dslc.ir.naming import StepNames
from dslc.ir.placement import Placement
from dslc.ir.views import aligned
from dslc.ops import OPS
from dslc.ops.conv import depthwise_taps


@dataclass
class Step:
    kind: str  # "graph" (a cuDNN graph) | "kernel" (a fallback kernel between graphs)
    group: Group
    reason: str = ""  # why it is not the fused group the plan proposed, or runs outside cuDNN


@dataclass
class Compiled:
    model: CheckedModel
    graph: Graph
    plan: FusionPlan
    target: Target
    buckets: list[dict[str, int]] = field(default_factory=list)  # those compiled
    steps: list[Step] = field(default_factory=list)
    builds: dict[tuple[str, str], Built] = field(default_factory=dict)  # (bucket, signature)
    specs: dict[tuple[str, str], GroupSpec] = field(default_factory=dict)
    names: StepNames | None = None  # how the groups a split makes are named
    # Concat operands their producers write in place (`dslc.ir.placement`).
    placement: Placement = field(default_factory=dict)

    def built(self, bucket: str, signature: str) -> Built:
        return self.builds[(bucket, signature)]


class CompileFailure(Exception):
    """No cuDNN engine and no fallback kernel for an op (E0801): the build fails (exit 3)."""

    def __init__(self, node: str, reason: str) -> None:
        super().__init__(reason)
        self.node = node
        self.reason = reason


Progress = Callable[[str], None]


def compile_model(model: CheckedModel, graph: Graph, plan: FusionPlan, target: Target,
                  progress: Progress | None = None,
                  buckets: list[dict[str, int]] | None = None) -> Compiled:
    """Fusion plan -> steps with a cuDNN graph (and plan, where one builds) per bucket (all of
    the model's buckets, or the subset `buckets`)."""
    out = Compiled(model, graph, plan, target, list(buckets or model.buckets),
                   placement=dict(plan.placement))
    out.names = StepNames(graph, plan.load_time)
    handle = target.handle() if target.live else None
    properties = None if target.live else target.properties()
    for i, group in enumerate(plan.groups):
        if progress:
            progress(f"[{i + 1}/{len(plan.groups)}] {group.name} ({group.pattern}); "
                     f"{len(out.builds)} graphs built")
        out.steps.extend(_compile(out, group, handle, properties, ""))
    masks_as_bytes(out, handle, properties)
    # A split group's parts are named after their own anchors: each name once in the schedule.
    for step, group in zip(out.steps, unique_names(s.group for s in out.steps), strict=True):
        step.group = group
    return out


# cuDNN writes and reads a mask (a bool tensor) in memory as bits, eight to a byte (seen on the
# H200: a mask of 1,056 values filled 132 bytes), where numpy, CuPy, the fallback kernels and a
# caller hold one byte per value.
MASK_AS_BYTES = ("a mask is passed here as bytes (from a caller, a fallback kernel or a view), "
                 "and cuDNN stores masks as bits: a fallback kernel runs it")


def masks_as_bytes(out: Compiled, handle: Any, properties: Any) -> None:
    """A stored mask stays cuDNN's bits only where a cuDNN graph writes it and cuDNN graphs read
    it as written (the comparison, then `select`, verified on the H200). A mask a caller gives
    or receives, that a fallback kernel or load time writes or reads, or that is read through a
    view or copied (a copy into another order came out wrong: each value sets one bit of a byte
    others write too) is bytes: every step that writes or reads it runs as a fallback kernel,
    until no cuDNN graph touches a mask of bytes."""
    while True:
        masks = _masks_of_bytes(out)
        steps = []
        for step in out.steps:
            if step.kind == "graph" and _touches(out, step.group, masks):
                steps.extend(_as_kernels(out, step, masks, handle, properties))
            else:
                steps.append(step)
        if len(steps) == len(out.steps) and all(a is b for a, b in zip(steps, out.steps)):
            break
        out.steps = steps
    used = {s.group.signature for s in out.steps if s.kind == "graph"}
    for key in [k for k in out.builds if k[1] not in used]:
        out.builds.pop(key)
        out.specs.pop(key, None)


def _base(nodes: dict[str, Node], name: str) -> str:
    while nodes[name].op == "view":
        name = nodes[name].inputs[0]
    return name


def _masks_of_bytes(out: Compiled) -> set[str]:
    nodes = out.graph.by_name()
    writer = {n: s.kind for s in out.steps for n in s.group.outputs}
    outputs = {_base(nodes, v) for _, v in out.graph.outputs}
    bits_ok: dict[str, bool] = {}
    for n in out.graph.nodes:
        if n.type.dtype == "bool" and n.op != "view":
            bits_ok[n.name] = writer.get(n.name) == "graph" and n.name not in outputs
    for step in out.steps:
        for i in step.group.inputs:
            base = _base(nodes, i)
            if base in bits_ok and (step.kind != "graph" or i != base or
                                    any(nodes[m].op == "contiguous" and i in nodes[m].inputs
                                        for m in step.group.nodes)):
                bits_ok[base] = False
    return {name for name, ok in bits_ok.items() if not ok}


def _touches(out: Compiled, group: Group, masks: set[str]) -> bool:
    nodes = out.graph.by_name()
    return any(_base(nodes, i) in masks for i in group.inputs) or \
        any(n in masks for n in group.outputs)


def _as_kernels(out: Compiled, step: Step, masks: set[str], handle: Any,
                properties: Any) -> list[Step]:
    """The step's ops that write or read a mask of bytes as fallback kernels, and each run of
    the others between them as one cuDNN graph."""
    if len(step.group.nodes) == 1:
        return [_kernel(out, step.group, MASK_AS_BYTES)]
    users = out.graph.users()
    steps: list[Step] = []
    run: list[str] = []
    why = f"split from the fused group {step.group.name}: {MASK_AS_BYTES}"
    for name in (*step.group.nodes, ""):
        one = make_group(out.graph, [name], "single", step.group.reason, users, out.names,
                         out.placement) if name else None
        if one is not None and not _touches(out, one, masks):
            run.append(name)
            continue
        if run:
            part = make_group(out.graph, run, step.group.pattern, step.group.reason, users,
                              out.names, out.placement)
            steps.extend(_compile(out, part, handle, properties, why))
            run = []
        if one is not None:
            steps.append(_kernel(out, one, MASK_AS_BYTES))
    return steps


def _kernel(out: Compiled, group: Group, reason: str, error: str = "") -> Step:
    """A fallback-kernel step: one pointwise kernel (`backend.fused`), or an op's own kernel
    if CuPy can hold every tensor it touches (else E0801)."""
    nodes = out.graph.by_name()
    node = nodes[group.nodes[0]]
    if _one_kernel(nodes, group):
        return Step("kernel", group, reason)
    dtypes = {node.type.dtype, *(nodes[i].type.dtype for i in node.inputs)}
    # A copy moves bytes as they are stored: fp8 too (a quantised activation copied into the
    # channels-last order its conv reads, which cuDNN's fp8 identity rejects on the GPU).
    takes = {*KERNEL_DTYPES, *FP8} if node.op in MOVES else set(KERNEL_DTYPES)
    assert node.op not in MOVES or len(dtypes) == 1, node.name  # a copy keeps its dtype
    if not dtypes <= takes:
        raise CompileFailure(node.name, f"cuDNN cannot run `{node.op}` here{error} and the fallback "
                             f"kernels take no {'/'.join(sorted(dtypes - takes))}")
    return Step("kernel", group, reason)


def _compile(out: Compiled, group: Group, handle: Any, properties: Any, why: str) -> list[Step]:
    nodes = out.graph.by_name()
    if len(group.nodes) == 1 and OPS[nodes[group.nodes[0]].op].lower is None:
        op = nodes[group.nodes[0]].op
        return [_kernel(out, group, group.reason or f"`{op}` runs as a fallback kernel")]
    if len(group.nodes) == 1 and _integer_math(nodes, nodes[group.nodes[0]]):
        return [_kernel(out, group, "integer arithmetic runs in a fallback kernel, exactly (a "
                                    "cuDNN graph computes in floats)")]
    if len(group.nodes) == 1 and _reads_unaligned(nodes, nodes[group.nodes[0]]):
        return [_kernel(out, group, "a copy of a view that starts off a 16-byte boundary, which "
                                    "cuDNN's kernels cannot read: a fallback kernel copies it")]
    if len(group.nodes) == 1 and _copy_of_high_rank(nodes[group.nodes[0]]):
        return [_kernel(out, group, HIGH_RANK_COPY)]
    if len(group.nodes) > 1 and nodes[group.nodes[-1]].op in fused.BROADCASTS:
        if _one_kernel(nodes, group):
            return [Step("kernel", group, BROADCAST_TAIL)]
        return _in_two(out, group, len(group.nodes) - 1, ("pointwise", "single"), handle,
                       properties, NO_BROADCAST_TAIL)
    if _depthwise_with_epilogue(nodes, group):
        return _anchor_then_rest(out, group, handle, properties, DEPTHWISE)
    if _norm_writing_fp8(nodes, group):
        return _anchor_then_rest(out, group, handle, properties, NORM_FP8)
    try:
        for bucket in out.buckets:
            key = (bucket_key(bucket), group.signature)
            if key in out.builds:
                continue
            spec = group_spec(out.graph, group, bucket, out.model.env, out.placement)
            if not form_holds_at_every_size(spec, partial(_spec_everywhere, out, group, bucket)):
                raise SpecError("its channels-last form at this bucket is none at other sizes")
            out.specs[key] = spec
            built = build(spec, handle, properties)
            out.builds[key] = built
            if handle is not None and not built.has_plan:
                # On the GPU, no plan means no engine for this fusion: split it.
                raise GraphError(built.note or "no plan builds")
    except (GraphError, SpecError) as err:
        for key in [k for k in out.specs if k[1] == group.signature]:
            out.specs.pop(key, None)
            out.builds.pop(key, None)
        return _split(out, group, handle, properties, str(err))
    return [Step("graph", group, why)]


# A depthwise conv's filter taps from which it compiles alone, its bias and epilogue a pointwise
# graph of their own. On the H200 (cuDNN 9.19) ConvNeXt's 7x7 with its bias in one graph ran in
# 1.2 ms, the conv alone in 0.098 (scripts/probe_gpu.py, part depthwise); from 5x5 up the fused
# graph was slower at every measured size, at 3x3 it was mixed (`tune --fusion measure` times it).
DEPTHWISE_ALONE_TAPS = 25
DEPTHWISE = ("a depthwise conv of 25 filter taps or more compiles alone: with its bias in one "
             "graph cuDNN's engines ran ConvNeXt's 7x7 12x slower (docs/benchmarks.md)")


def _depthwise_with_epilogue(nodes: dict[str, Node], group: Group) -> bool:
    """The group is a depthwise conv of DEPTHWISE_ALONE_TAPS or more, then its epilogue."""
    conv = nodes[group.nodes[0]]
    if conv.op != "conv" or len(group.nodes) < 2:
        return False
    x, w = (nodes[i].type.shape for i in conv.inputs)
    taps = depthwise_taps(x, w, conv.attrs["groups"])
    return taps is not None and taps >= DEPTHWISE_ALONE_TAPS


# A pointwise chain that ends in a broadcast (`fuse.patterns`): one kernel computes it at the
# broadcast size; cuDNN's pointwise graph computes one shape, and it computed a broadcast sdpa
# bias wrongly on the H200 (the reason the mask is expanded at all).
BROADCAST_TAIL = ("a pointwise chain ending in an `expand` is one fallback kernel writing the "
                  "broadcast result: its operands are read in place, nothing between is stored")
NO_BROADCAST_TAIL = ("split from a pointwise chain ending in an `expand`, which no one kernel "
                     "computes: the broadcast runs on its own")


# A norm whose group quantises its result to fp8 (the layer norm before an fp8 matmul: norm,
# multiply by the scale, cast to e4m3) builds deviceless and on the H200 (cuDNN 9.19), and its
# plan made an illegal memory access at the GPT block's B8 S1024 (its first step): the norm
# compiles alone, the quantising multiply and cast after it.
NORM_FP8 = ("a norm whose result is quantised to fp8 compiles alone: in one graph cuDNN's plan "
            "made an illegal memory access on the H200")
NORMS = ("layernorm", "rmsnorm", "instancenorm", "batchnorm")


def _norm_writing_fp8(nodes: dict[str, Node], group: Group) -> bool:
    return nodes[group.nodes[0]].op in NORMS and len(group.nodes) > 1 and \
        any(nodes[o].type.dtype in FP8 for o in group.outputs)


def _anchor_then_rest(out: Compiled, group: Group, handle: Any, properties: Any,
                      why: str) -> list[Step]:
    """The anchor compiled as a group of its own, then the rest of its group (its bias, its
    epilogue) as another."""
    return _in_two(out, group, 1, (group.pattern, "pointwise"), handle, properties, why)


def _in_two(out: Compiled, group: Group, cut: int, patterns: tuple[str, str], handle: Any,
            properties: Any, why: str) -> list[Step]:
    """The group's first `cut` ops compiled as a group, then the rest as another."""
    users = out.graph.users()
    parts = (list(group.nodes[:cut]), patterns[0]), (list(group.nodes[cut:]), patterns[1])
    steps: list[Step] = []
    for members, pattern in parts:
        sub = make_group(out.graph, members, pattern, group.reason, users, out.names,
                         out.placement)
        steps.extend(_compile(out, sub, handle, properties, why))
    return steps


def _spec_everywhere(out: Compiled, group: Group, bucket: dict[str, int]) -> GroupSpec | None:
    """The group's spec with every dim of the bucket 2 longer (none of 1), or None where the
    model's dims cannot take those values."""
    try:
        return group_spec(out.graph, group, {k: v + 2 for k, v in bucket.items()},
                          out.model.env, out.placement)
    except Exception:  # a dim relation the grown values break: no spec to check against
        return None


def _one_kernel(nodes: dict[str, Node], group: Group) -> bool:
    """Whether one pointwise kernel (`backend.fused`) computes the group."""
    return isinstance(fused.plan_of(nodes, group.nodes, group.inputs, group.outputs), fused.Plan)


def _split(out: Compiled, group: Group, handle: Any, properties: Any, error: str) -> list[Step]:
    """A group cuDNN rejected: of pointwise ops only, one fallback kernel (`backend.fused`);
    else its halves, each compiled again, down to single ops."""
    nodes = out.graph.by_name()
    if len(group.nodes) > 1 and _one_kernel(nodes, group):
        return [Step("kernel", group, f"cuDNN rejected the group ({error}): one fallback kernel "
                                      f"computes its {len(group.nodes)} ops")]
    if len(group.nodes) == 1:
        op = nodes[group.nodes[0]].op
        return [_kernel(out, group, f"cuDNN rejected `{op}` ({error}): a fallback kernel runs it",
                        f" ({error})")]
    half = len(group.nodes) // 2
    users = out.graph.users()
    steps: list[Step] = []
    for part in (group.nodes[:half], group.nodes[half:]):
        sub = make_group(out.graph, list(part), group.pattern, group.reason, users, out.names,
                         out.placement)
        steps.extend(_compile(out, sub, handle, properties,
                              f"split from the fused group {group.name}: cuDNN rejected it "
                              f"({error})"))
    return steps


def _integer_math(nodes: dict[str, Node], node: Node) -> bool:
    """Arithmetic or a comparison on integers (`arange(S) + 2`, `ids == 0`), or an integer
    broadcast (`expand` of a cache's length over the batch): cuDNN would compute it in f32,
    exact only below 2^24."""
    if node.op == "expand":  # cuDNN's identity computes in floats too: an integer copy as well
        return nodes[node.inputs[0]].type.dtype in INTS
    return OPS[node.op].family == "pointwise" and node.op not in ("cast", "contiguous") and \
        any(nodes[i].type.dtype in INTS for i in node.inputs)


# A copy of rank 6 or more: a space-to-depth, [N, C, H/2, 2, W/2, 2] moved to [N, 2, 2, C, H/2,
# W/2] (a patch embedding's or a YOLO focus layer's). cuDNN proposes no engine for it deviceless
# (it would compile one at start-up) and no GPU run has checked its copies at that rank; CuPy's
# strided copy is one kernel, right by construction (it ran the space-to-depth of ResNet's
# stem, right, on an H100 in session 27).
HIGH_RANK_COPY = ("a copy of rank 6 or more (a space-to-depth) runs as a fallback kernel: cuDNN "
                  "would compile one at start-up")


def _copy_of_high_rank(node: Node) -> bool:
    return node.op == "contiguous" and node.type.rank >= 6


def _reads_unaligned(nodes: dict[str, Node], node: Node) -> bool:
    """A copy lowering inserted for a view that may start off a 16-byte boundary."""
    if node.op != "contiguous":
        return False
    x = nodes[node.inputs[0]]
    return x.op == "view" and not aligned(x.attrs["offset"], ITEMSIZE[x.type.dtype])

