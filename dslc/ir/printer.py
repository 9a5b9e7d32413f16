"""Print a graph, one stable line per node (used by `--dump` and by golden tests):

    %layer1.0.conv1 = conv(%stem, %layer1.0.conv1.weight) {groups=1, ...} : f16[N, 64, 56, 56] @NHWC
"""

from __future__ import annotations

from typing import Any

from dslc.core.dims import Poly, format_dim
from dslc.core.types import format_type
from dslc.ir.graph import Graph, Node


def format_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, Poly)):
        return format_dim(v)
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, str):
        return f'"{v}"'
    if isinstance(v, (tuple, list)):
        return "[" + ", ".join(format_value(x) for x in v) + "]"
    if v is None:
        return "none"
    return str(v)


def format_node(node: Node, with_source: bool = False) -> str:
    attrs = ", ".join(f"{k}={format_value(v)}" for k, v in node.attrs.items())
    args = ", ".join(f"%{i}" for i in node.inputs)
    text = f"%{node.name} = {node.op}({args})" if node.inputs else f"%{node.name} = {node.op}"
    if attrs:
        text += f" {{{attrs}}}"
    text += f" : {format_type(node.type)}"
    if with_source:
        where = f"{node.span.file}:{node.span.line}"
        text += f"  # {node.path + ' ' if node.path else ''}{where}"
    return text


def format_graph(graph: Graph, with_source: bool = False) -> str:
    lines = [format_node(n, with_source) for n in graph.nodes]
    lines += [f"output {name} = %{value}" for name, value in graph.outputs]
    return "\n".join(lines) + "\n"
