"""The one mechanism every lowering pass uses: walk the nodes in order and, per node, keep it,
replace it by an existing value, or emit new nodes whose last is its replacement."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from functools import cached_property
from typing import Any

from dslc.core.dims import DimEnv
from dslc.core.types import PrecisionSpec, TensorType
from dslc.ir.graph import CALIBRATED, Attrs, Graph, Node, renamed


def derived(op: str, inputs: tuple[str, ...], attrs: dict[str, Any], type_: TensorType,
            like: Node, name: str, precision: PrecisionSpec | None = None) -> Node:
    """A new node with the span, instance path and precision (unless given) of `like`."""
    return Node(name, op, inputs, Attrs(attrs), type_, like.span, like.path,
                precision or like.precision)


class Rewriter:
    def __init__(self, graph: Graph, env: DimEnv | None = None) -> None:
        self.old = graph
        self.env = env or DimEnv()  # the dims' ranges (none known: only static sizes decide)
        self.old_users = graph.users()
        self.nodes: list[Node] = []
        self.by_name: dict[str, Node] = {}
        self.renamed: dict[str, str] = {}
        self.memo: dict[str, str] = {}  # values a rule made once for several readers

    def node(self, name: str) -> Node:
        """A node of the graph being built (operand names are already the new ones)."""
        return self.by_name[name]

    def users_of(self, old_name: str) -> list[Node]:
        return self.old_users.get(old_name, [])

    def only_read_by_one(self, old_name: str) -> bool:
        """One op reads the value, no output exports it and no amax observes it (the calibration
        reads it whole): a rewrite may consume it."""
        exported = any(value == old_name for _, value in self.old.outputs)
        return len(self.users_of(old_name)) == 1 and not exported \
            and old_name not in self.observed

    @cached_property
    def observed(self) -> frozenset[str]:
        """The values an amax names (`quantize`): the calibration computes them as they are."""
        return frozenset(str(n.attrs["tensor"]) for n in self.old.nodes if n.op == CALIBRATED)

    def emit(self, node: Node) -> str:
        name = node.name
        k = 1
        while name in self.by_name:
            name = f"{node.name}_{k}"
            k += 1
        if name != node.name:
            node = replace(node, name=name)
        self.nodes.append(node)
        self.by_name[name] = node
        return name

    def drop(self, name: str) -> None:
        """Take back an emitted node that nothing emitted so far reads (its name is reused)."""
        assert not any(name in n.inputs for n in self.nodes), name
        self.nodes.remove(self.by_name.pop(name))

    def new(self, op: str, inputs: tuple[str, ...], attrs: dict[str, Any], type_: TensorType,
            like: Node, name: str, precision: PrecisionSpec | None = None) -> str:
        """A node derived from `like` (`derived`), emitted."""
        return self.emit(derived(op, inputs, attrs, type_, like, name, precision))

    def finish(self) -> Graph:
        outputs = tuple((n, self.renamed.get(v, v)) for n, v in self.old.outputs)
        return Graph(tuple(self.nodes), outputs)


# A rule sees a node (operands already renamed): None keeps it, a name replaces it by that value.
Rule = Callable[[Rewriter, Node], str | None]


def rewrite(graph: Graph, rule: Rule, env: DimEnv | None = None) -> Graph:
    rw = Rewriter(graph, env)
    for node in graph.nodes:
        node = renamed(node, rw.renamed)
        result = rule(rw, node)
        if result is None:
            name = rw.emit(node)
            if name != node.name:
                rw.renamed[node.name] = name
        else:
            rw.renamed[node.name] = result
    return rw.finish()
