"""The typed single-assignment graph: frozen `Node`s in topological order.

A node has one result, named like the value it computes (`layer1.0.conv1`), so a message about a
node or a cuDNN tensor maps straight back to the `.cgraph` source through its span and path.
Users are computed, never stored. Graph inputs and params are nodes (`input`, `param`) too.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from dslc.core.types import FP8, PrecisionSpec, TensorType
from dslc.diag.span import Span


class Attrs(Mapping[str, Any]):
    """An immutable, hashable mapping of attribute values (ints, floats, dims, tuples, strs)."""

    __slots__ = ("_items",)

    def __init__(self, items: Mapping[str, Any] | None = None) -> None:
        self._items = tuple(sorted((items or {}).items()))

    def __getitem__(self, key: str) -> Any:
        for k, v in self._items:
            if k == key:
                return v
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return (k for k, _ in self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(self._items)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Attrs) and self._items == other._items

    def __repr__(self) -> str:
        return "Attrs(" + ", ".join(f"{k}={v!r}" for k, v in self._items) + ")"


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    op: str
    inputs: tuple[str, ...]
    attrs: Attrs
    type: TensorType
    span: Span
    path: str  # the instance path of the def instance it came from; "" at model level
    precision: PrecisionSpec


@dataclass(frozen=True, slots=True)
class Graph:
    nodes: tuple[Node, ...]
    outputs: tuple[tuple[str, str], ...]  # (output name, value name)

    def by_name(self) -> dict[str, Node]:
        return {n.name: n for n in self.nodes}

    def users(self) -> dict[str, list[Node]]:
        out: dict[str, list[Node]] = {n.name: [] for n in self.nodes}
        for n in self.nodes:
            for i in n.inputs:
                out[i].append(n)
        return out


FLOAT_STORAGE = ("f32", "f16", "bf16")
# A calibrated amax: the largest magnitude the tensor `attrs["tensor"]` took on the calibration
# data (`dslc calibrate`), from which the scale of its quantisation to fp8 is computed at load
# time. A source, like a param: its value is in the bundle's calibration record.
CALIBRATED = "amax"
SOURCES = ("input", "param", "scalar", CALIBRATED)  # the nodes that read no other value
# Ops whose result is their first operand's memory, written in place (`cache_write`: a model
# input the caller owns; the checker sees to it that nothing else reads it).
IN_PLACE = ("cache_write",)


def outside_reads(nodes: Mapping[str, Node], members: Sequence[str]) -> tuple[str, ...]:
    """What the members read from outside them, each once, in first-use order (the order a
    step's inputs, and its cuDNN tensors' uids, follow)."""
    inside = set(members)
    reads: list[str] = []
    for m in members:
        reads.extend(i for i in nodes[m].inputs if i not in inside and i not in reads)
    return tuple(reads)


def renamed(node: Node, names: Mapping[str, str]) -> Node:
    """`node` reading the values `names` maps its references to: its operands, and the tensor
    a calibrated amax measures (named in an attribute: a pass that replaces that value must
    rename it too, or calibration reads a value that no longer exists)."""
    inputs = tuple(names.get(i, i) for i in node.inputs)
    attrs = node.attrs
    if node.op == CALIBRATED and str(attrs["tensor"]) in names:
        attrs = Attrs({**attrs, "tensor": names[str(attrs["tensor"])]})
    if inputs == node.inputs and attrs is node.attrs:
        return node
    return replace(node, inputs=inputs, attrs=attrs)


def compute_dtype(node: Node) -> str:
    """The dtype an op computes in: its own `compute` attribute where it has one (an op that
    needs a wider one than the model's precision), else its precision's. The interpreter, the
    verifier and cuDNN's graph specs all use this."""
    return str(node.attrs.get("compute", node.precision.compute))


def stored_dtype(node: Node, virtual: bool) -> str:
    """The dtype a value's elements are held in: its own dtype when materialised; inside a fused
    group (virtual) the `intermediate` dtype, except a `cast`'s result, which keeps the dtype it
    casts to (a cast asks for that rounding), and an fp8 op's product before its descale: in
    units of the two scales (up to 448 * 448 * K), it overflows f16 at once (the descale after
    it brings it back), so it stays the f32 it is typed. The interpreter and cuDNN's graphs
    both use this."""
    if virtual and node.type.dtype in FLOAT_STORAGE and node.op != "cast" and \
            node.attrs.get("precision") not in FP8:
        return node.precision.intermediate
    return node.type.dtype

