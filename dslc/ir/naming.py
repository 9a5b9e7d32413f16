"""The names of fused groups, and so of the steps of a schedule (members -> name), as the runner,
`dslc inspect`, the tuning report and profiles show them: a group is named after its anchor and
the ops fused into it, so a profile reads like the model.

The anchor is named by its parameter path: the instance whose weights it reads
(`layer1.0.conv1`; the block inside it a def's dotted param names, `model.layers.0.mlp.up_proj`),
or at model level the parameter itself (`w1`); an anchor that reads no
weights by the value it computes (`encoder.layer.0.attn.ctx`). Each op fused into it is named the
same way, relative to the anchor's block (`bn1`, `downsample.1`), or by its op where it reads no
weights or those of the anchor's instance (`relu`, `add`, `bias_add`):
`layer1.0.conv1+bn1+relu`, `layer1.0.conv3+bn3+add+relu`, `w1+b1+relu`. Names are made unique
where they are used (`ir.groups.unique_names`): a later group of an earlier one's name gets
`#2`, `#3`...
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

from dslc.ir.graph import Graph, Node


class StepNames:
    """Names for groups of one graph. `constant`: the load-time values (computed from the params
    alone), through which an op reads its weights (a folded or re-laid-out weight)."""

    def __init__(self, graph: Graph, constant: Collection[str] = (),
                 nodes: Mapping[str, Node] | None = None) -> None:
        self.nodes = nodes if nodes is not None else graph.by_name()
        self.constant = constant
        self._weights: dict[str, str | None] = {}

    def weight(self, value: str) -> str | None:
        """The parameter `value` is read from: a param's path, or the first param a load-time
        value is computed from; None for a value computed from the inputs."""
        if value in self._weights:
            return self._weights[value]
        stack = [value]  # a walk with its own stack: load-time chains may be long
        while stack:
            name = stack[-1]
            node = self.nodes[name]
            if node.op == "param":
                self._weights[name] = str(node.attrs.get("path", name))
            elif name not in self.constant:
                self._weights[name] = None
            else:
                pending = [i for i in node.inputs if i not in self._weights]
                if pending:
                    stack.extend(pending)
                    continue
                self._weights[name] = next((w for i in node.inputs
                                            if (w := self._weights[i]) is not None), None)
            stack.pop()
        return self._weights[value]

    def label(self, node: Node) -> str | None:
        """Where the weights `node` reads belong: its instance, or at model level the parameter
        itself; None where it reads none."""
        for i in node.inputs:
            w = self.weight(i)
            if w is not None:
                return _owner(node.path, w)
        return None

    def name(self, members: Iterable[str]) -> str:
        anchor, *fused = (self.nodes[m] for m in members)
        head = self.label(anchor) or anchor.name
        parts = [head]
        for node in fused:
            label = self.label(node)
            same = label is None or label == head
            parts.append(node.op if same else _relative(label or "", head) or node.op)
        return "+".join(parts)


def _owner(path: str | None, weight: str) -> str:
    """The block a weight belongs to, as a node at instance `path` reads it: the instance, or a
    block inside it the weight's dotted name declares (a def's `param self_attn.o_proj.weight`:
    `model.layers.0.self_attn.o_proj`, not `model.layers.0`); at model level the weight itself."""
    if not path:
        return weight
    inner = weight[len(path) + 1:] if weight.startswith(path + ".") else ""
    return f"{path}.{inner.rsplit('.', 1)[0]}" if "." in inner else path


def _relative(label: str, anchor: str) -> str:
    """`label` without the blocks it shares with the anchor's block: `layer1.0.bn1` beside
    `layer1.0.conv1` is `bn1`. A name is never left a bare index: `layer1.0.downsample.1`
    beside `layer1.0.downsample.0` is `downsample.1`."""
    a, b = anchor.split("."), label.split(".")
    k = 0
    while k < len(a) - 1 and k < len(b) and a[k] == b[k]:
        k += 1
    while 0 < k < len(b) and b[k].isdigit():
        k -= 1
    return ".".join(b[k:])
