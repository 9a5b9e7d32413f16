"""Compile: FusionPlan -> one cuDNN graph per group and bucket (or a fallback kernel step).

A group cuDNN rejects is split in two and each half retried, down to single ops; the reason is
kept on the steps (`dslc inspect` shows it). Groups with one signature share one graph and plan
per bucket. With a live GPU, plans are built here; deviceless, a graph is validated and lowered
to an operation graph, and plans are built where the library can without a driver.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dslc.backend.graphs import Built, GraphError, build
from dslc.backend.kernels import DTYPES as KERNEL_DTYPES
from dslc.backend.spec import GroupSpec, SpecError, group_spec
from dslc.backend.target import Target
from dslc.check.checker import CheckedModel
from dslc.core.dims import bucket_key
from dslc.ir.graph import Graph, Node
from dslc.ir.groups import FusionPlan, Group, make_group
from dslc.ir.interp import ITEMSIZE
from dslc.ir.views import aligned
from dslc.ops import OPS


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
    out = Compiled(model, graph, plan, target, list(buckets or model.buckets))
    handle = target.handle() if target.live else None
    properties = None if target.live else target.properties()
    for i, group in enumerate(plan.groups):
        if progress:
            progress(f"[{i + 1}/{len(plan.groups)}] {group.name} ({group.pattern})")
        out.steps.extend(_compile(out, group, handle, properties, ""))
    return out


def _kernel(out: Compiled, group: Group, reason: str, error: str = "") -> Step:
    """A fallback-kernel step, if CuPy can hold every tensor it touches (else E0801)."""
    nodes = out.graph.by_name()
    node = nodes[group.nodes[0]]
    dtypes = {node.type.dtype, *(nodes[i].type.dtype for i in node.inputs)}
    if not dtypes <= set(KERNEL_DTYPES):
        raise CompileFailure(node.name, f"cuDNN cannot run `{node.op}` here{error} and the fallback "
                             f"kernels take no {'/'.join(sorted(dtypes - set(KERNEL_DTYPES)))}")
    return Step("kernel", group, reason)


def _compile(out: Compiled, group: Group, handle: Any, properties: Any, why: str) -> list[Step]:
    nodes = out.graph.by_name()
    if len(group.nodes) == 1 and OPS[nodes[group.nodes[0]].op].lower is None:
        op = nodes[group.nodes[0]].op
        return [_kernel(out, group, group.reason or f"`{op}` runs as a fallback kernel")]
    if len(group.nodes) == 1 and _reads_unaligned(nodes, nodes[group.nodes[0]]):
        return [_kernel(out, group, "a copy of a view that starts off a 16-byte boundary, which "
                                    "cuDNN's kernels cannot read: a fallback kernel copies it")]
    try:
        for bucket in out.buckets:
            key = (bucket_key(bucket), group.signature)
            if key in out.builds:
                continue
            spec = group_spec(out.graph, group, bucket, out.model.env)
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


def _split(out: Compiled, group: Group, handle: Any, properties: Any, error: str) -> list[Step]:
    nodes = out.graph.by_name()
    if len(group.nodes) == 1:
        op = nodes[group.nodes[0]].op
        return [_kernel(out, group, f"cuDNN rejected `{op}` ({error}): a fallback kernel runs it",
                        f" ({error})")]
    half = len(group.nodes) // 2
    users = out.graph.users()
    steps: list[Step] = []
    for part in (group.nodes[:half], group.nodes[half:]):
        sub = make_group(out.graph, list(part), group.pattern, group.reason, users)
        steps.extend(_compile(out, sub, handle, properties,
                              f"split from the fused group {group.name}: cuDNN rejected it "
                              f"({error})"))
    return steps


def _reads_unaligned(nodes: dict[str, Node], node: Node) -> bool:
    """A copy lowering inserted for a view that may start off a 16-byte boundary."""
    if node.op != "contiguous":
        return False
    x = nodes[node.inputs[0]]
    return x.op == "view" and not aligned(x.attrs["offset"], ITEMSIZE[x.type.dtype])

