"""Fusion: the lowered IR -> a `FusionPlan`. Patterns are tried in priority order; each grows a
chain from an anchor through ops whose input nobody else reads (a pointwise group also takes
the pointwise values its ops read beside the chain, computed for them alone), and a support
check may refuse it. Every op not fused with its neighbours gets the reason in the plan."""

from __future__ import annotations

from dslc.fuse.patterns import FALLBACK_REASONS, PATTERNS, FusionPattern
from dslc.ir.graph import SOURCES, Graph, Node
from dslc.ir.groups import FusionPlan, Group, format_plan, make_group, unique_names
from dslc.ir.naming import StepNames
from dslc.ir.placement import in_place
from dslc.lower.canonical import load_time

NOT_RUN = (*SOURCES, "view")


class _Partition:
    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.nodes = graph.by_name()
        self.index = {n.name: i for i, n in enumerate(graph.nodes)}
        self.users = graph.users()
        self.outputs = {v for _, v in graph.outputs}
        self.constant = load_time(graph)
        self.placement = in_place(graph, self.constant)
        self.names = StepNames(graph, self.constant, self.nodes)
        self.grouped: dict[str, int] = {}
        self.groups: list[tuple[FusionPattern | None, list[str], str]] = []
        self.refused: dict[str, str] = {}  # op -> why a pattern's support check left it out

    def runs(self, node: Node) -> bool:
        return node.op not in NOT_RUN and node.name not in self.constant

    def grow(self, anchor: Node, pattern: FusionPattern) -> list[str]:
        """The chain from `anchor` through the only reader of each value. No other operand of
        a joining op can depend on a member: that dependence would be a second reader of one
        (so a group never needs, as its input, a value computed from its own)."""
        members = [anchor.name]
        value = anchor
        while value.name not in self.outputs:
            users = self.users[value.name]
            if len(users) != 1:
                break
            user = users[0]
            if user.op in pattern.tails and user.name not in self.grouped:
                members.append(user.name)  # the last member: its result is larger
                break
            if (user.op not in pattern.epilogue or user.name in self.grouped
                    or user.type.shape != value.type.shape):
                break
            if pattern.name == "pointwise":
                members.extend(self.beside(user, set(members), pattern))
            members.append(user.name)
            value = user
        return members

    def beside(self, user: Node, members: set[str], pattern: FusionPattern) -> list[str]:
        """The pointwise values `user` reads beside the chain that nothing else reads, with
        those they read alike, in an order that computes each before its reader: they join
        the group (`x * cos + rotate_half(x) * sin` is one step, not one per product). Each
        has `user`'s shape and memory order, as a chain's ops do. Only pointwise groups take
        them (one cuDNN pointwise graph, or one generated kernel); a conv or a matmul graph
        keeps a chain. A value computed only for `user` cannot depend on the group (each
        member's one reader is the next member), so the group reads nothing it computes."""
        out: list[str] = []
        for name in dict.fromkeys(user.inputs):  # an operand read twice is taken once
            p = self.nodes[name]
            if (name in members or name in self.grouped or not self.runs(p)
                    or p.op not in pattern.epilogue or name in self.outputs
                    or {u.name for u in self.users[name]} != {user.name}
                    or p.type.shape != user.type.shape or p.type.layout != user.type.layout):
                continue
            out.extend(self.beside(p, members, pattern))
            out.append(name)
        return out

    def run(self) -> None:
        for pattern in PATTERNS:
            for node in self.graph.nodes:
                if node.name in self.grouped or node.op not in pattern.anchors or not self.runs(node):
                    continue
                members = self.grow(node, pattern)
                while members and (why := pattern.check([self.nodes[m] for m in members])):
                    self.refused[members.pop()] = why  # the check refuses: try the shorter chain
                if not members:
                    continue
                self.add(pattern, members, "")
        for node in self.graph.nodes:  # what no pattern took: the check's reason, if one refused it
            if self.runs(node) and node.name not in self.grouped:
                self.add(None, [node.name], self.refused.get(node.name) or FALLBACK_REASONS.get(
                    node.op, "no fusion pattern starts with this op"))

    def add(self, pattern: FusionPattern | None, members: list[str], reason: str) -> None:
        for m in members:
            self.grouped[m] = len(self.groups)
        self.groups.append((pattern, members, reason))

    def why_alone(self, node: Node) -> str:
        """Why a single pointwise op did not join the graph of the op before it."""
        if node.name in self.refused:
            return self.refused[node.name]
        for name in node.inputs:
            p = self.nodes[name]
            if name in self.constant:  # params, scalars and what load time computes
                continue
            if p.op == "input":
                return f"it reads the model input %{name}; no op runs before it"
            if p.op == "view":
                return f"it reads the view %{name}, whose base must be stored"
            if name in self.outputs:
                return f"%{name} is a model output, so it is stored"
            readers = [u.name for u in self.users[name] if u.name != node.name]
            if readers:
                return f"%{name} is also read by %{readers[0]}, so it is stored and this op " \
                       "starts a new graph"
            if p.name in self.grouped:
                return f"no fusion pattern continues the group of %{p.name} ({p.op}) with {node.op}"
        return "nothing before it to fuse with"

    def plan(self) -> FusionPlan:
        groups: list[Group] = []
        order = sorted(range(len(self.groups)),
                       key=lambda g: max(self.index[m] for m in self.groups[g][1]))
        for gi in order:
            pattern, members, reason = self.groups[gi]
            if len(members) == 1 and not reason:
                reason = self.why_alone(self.nodes[members[0]])
            groups.append(make_group(self.graph, members, pattern.name if pattern else "single",
                                     reason, self.users, self.names, self.placement))
        views = tuple(n.name for n in self.graph.nodes if n.op == "view"
                      and n.name not in self.constant)
        constant = tuple(n.name for n in self.graph.nodes if n.name in self.constant)
        return FusionPlan(self.graph, unique_names(groups), constant, views, self.placement)


def fuse(graph: Graph) -> FusionPlan:
    """Lowered IR -> FusionPlan (groups in execution order, with reasons)."""
    part = _Partition(graph)
    part.run()
    return part.plan()


__all__ = ["FusionPlan", "Group", "format_plan", "fuse"]
