"""The result of fusion: groups of IR nodes that each become one cuDNN graph, in an order that
respects their dependencies, and the reason for every op that runs on its own."""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from dslc.core.types import format_type
from dslc.ir.graph import Graph, Node, outside_reads
from dslc.ir.naming import StepNames
from dslc.ir.placement import Placement
from dslc.ir.printer import format_node, format_value


@dataclass(frozen=True)
class Group:
    name: str  # after its anchor and what is fused into it (`ir.naming`), unique in a schedule
    pattern: str  # a FusionPattern's name, or "single"
    nodes: tuple[str, ...]  # in topological order
    anchor: str
    inputs: tuple[str, ...]  # values read from outside the group
    outputs: tuple[str, ...]  # values stored for later groups or as model outputs
    signature: str  # equal for groups that compile to the same cuDNN graph
    reason: str = ""  # for a single op: why it runs on its own


@dataclass(frozen=True)
class FusionPlan:
    graph: Graph
    groups: tuple[Group, ...]  # in execution order
    load_time: tuple[str, ...]  # values computed once from the params, at load
    views: tuple[str, ...]  # values that are strides over another value: nothing runs
    placement: Placement = field(default_factory=dict)  # concat operands written in place

    def group_of(self) -> dict[str, Group]:
        return {n: g for g in self.groups for n in g.nodes}

    def virtual(self) -> set[str]:
        """Values that stay inside their group (cuDNN virtual tensors)."""
        out: set[str] = set()
        for g in self.groups:
            out.update(n for n in g.nodes if n not in g.outputs)
        return out

    def shared_signatures(self) -> Counter[str]:
        return Counter(g.signature for g in self.groups)


def make_group(graph: Graph, members: list[str], pattern: str, reason: str = "",
               users: dict[str, list[Node]] | None = None,
               names: StepNames | None = None, placement: Placement | None = None) -> Group:
    """A group of `members` (in order): what it reads from outside, what it stores, its
    signature (`placement`: the concat operands written in place, whose strides it holds),
    its name (`ir.naming`; without `names`, weights are only params read directly)."""
    names = names if names is not None else StepNames(graph)
    nodes = names.nodes
    users = users if users is not None else graph.users()
    outputs_of_graph = {v for _, v in graph.outputs}
    member_set = set(members)
    inputs = outside_reads(nodes, members)
    outputs = tuple(m for m in members if m in outputs_of_graph
                    or any(u.name not in member_set for u in users[m]))
    return Group(names.name(members), pattern, tuple(members), members[0], inputs,
                 outputs, signature(nodes, tuple(members), inputs, pattern, placement),
                 reason)


def unique_names(groups: Iterable[Group]) -> tuple[Group, ...]:
    """The groups, each one that has an earlier one's name renamed `<name>#2`, `#3`... (the
    runtime keys a step's bindings by its name); but groups of one name whose anchors are parts
    of one op a rewrite made (the upsample's matmul per kernel row, `up1.upconv.row0` and
    `.row1`) are each named by their part: `up1.upconv.row0+bias_add`."""
    groups = _by_parts(list(groups))
    taken: set[str] = set()
    next_k: dict[str, int] = {}
    out = []
    for g in groups:
        name = g.name
        if name in taken:
            k = next_k.get(name, 2)
            while f"{name}#{k}" in taken:
                k += 1
            next_k[name] = k + 1
            g = replace(g, name=f"{name}#{k}")
        taken.add(g.name)
        out.append(g)
    return tuple(out)


def _by_parts(groups: list[Group]) -> list[Group]:
    """Groups of one name, each anchored at a distinct part `<head>.<part>` of its name's head,
    renamed `<head>.<part>+...`; any other group as it is."""
    parts: dict[str, list[str]] = {}
    for g in groups:
        head = g.name.partition("+")[0]
        part = g.anchor[len(head) + 1:] if g.anchor.startswith(head + ".") else ""
        parts.setdefault(g.name, []).append(part if part and "." not in part else "")
    named = {name for name, ps in parts.items()
             if len(ps) > 1 and all(ps) and len(set(ps)) == len(ps)}
    out = []
    for g in groups:
        if g.name in named:
            head, plus, rest = g.name.partition("+")
            g = replace(g, name=f"{head}.{g.anchor[len(head) + 1:]}{plus}{rest}")
        out.append(g)
    return out


def signature(graph_nodes: Mapping[str, Node], nodes: tuple[str, ...], inputs: tuple[str, ...],
              pattern: str, placement: Placement | None = None) -> str:
    """A digest of what the group computes, blind to value names and spans: identical blocks
    (ResNet's repeated bottlenecks) get identical signatures and share one plan. A value written
    in place into a concat adds where it is there (its strides differ from a buffer's own)."""
    index = {name: f"in{i}" for i, name in enumerate(inputs)}
    index.update({name: f"n{i}" for i, name in enumerate(nodes)})
    parts = [pattern]
    for name in inputs:
        n = graph_nodes[name]
        strides = n.attrs.get("strides") if n.op == "view" else None
        value = n.attrs["value"] if n.op == "scalar" else None
        parts.append(f"{format_type(n.type)} {format_value(strides)} {value}")
    for name in nodes:
        n = graph_nodes[name]
        operands = ",".join(index[i] for i in n.inputs)
        attrs = format_value(tuple(n.attrs.items()))
        parts.append(f"{n.op}({operands}) {attrs} {format_type(n.type)} {n.precision}")
    for name in (*inputs, *nodes):
        if placement and name in placement:
            concat, steps = placement[name]
            parts.append(f"{index[name]} in {format_type(graph_nodes[concat].type)} "
                         f"{format_value(steps)}")
    return hashlib.sha1("\n".join(parts).encode()).hexdigest()[:12]


def format_plan(plan: FusionPlan) -> str:
    nodes = plan.graph.by_name()
    counts = plan.shared_signatures()
    lines = [f"# {len(plan.groups)} groups ({len(counts)} distinct), "
             f"{len(plan.load_time)} load-time values, {len(plan.views)} views"]
    for i, g in enumerate(plan.groups):
        shared = f", shared by {counts[g.signature]} groups" if counts[g.signature] > 1 else ""
        lines.append(f"\ngroup {i} {g.name}: {g.pattern} [{g.signature}{shared}]")
        if g.reason:
            lines.append(f"  why alone: {g.reason}")
        for name in g.nodes:
            mark = "  out " if name in g.outputs else "      "
            lines.append(mark + format_node(nodes[name]))
        lines.append("  reads: " + ", ".join(f"%{v}" for v in g.inputs))
    if plan.views:
        lines.append("\nviews (strides over their base, nothing runs):")
        lines.extend("  " + format_node(nodes[v]) for v in plan.views)
    if plan.placement:
        lines.append("\nwritten in place (each into its slice of a concat, which copies it not):")
        lines.extend(f"  %{v} -> %{c} {format_value(steps[0][1:])}"
                     for v, (c, steps) in plan.placement.items())
    if plan.load_time:
        lines.append("\nload-time (computed once from the params when the weights load):")
        lines.extend("  " + format_node(nodes[v]) for v in plan.load_time
                     if nodes[v].op not in ("param", "scalar"))
    return "\n".join(lines) + "\n"
