"""Sibling matmuls packed into one: projections of the same activation by weights of the same
depth (an attention's q, k and v, or a gated MLP's gate and up) become one matmul by the weights
joined along their output axis (joined at load time), with the biases joined likewise (zeros
for a projection without one, where others have one: Whisper's k_proj), and each projection a
slice (a view) of the packed result. The activation is read once instead of once
per projection, and one launch replaces several: the encoders' q/k/v projections were three
launches each reading the same layer norm.

A projection whose result a pointwise op reads is left alone: that op is its epilogue today,
fused into the matmul, and on a slice of a packed result it would run on its own.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, replace

from dslc.core.types import TensorType
from dslc.ir.graph import Graph, Node, renamed
from dslc.ir.naming import StepNames
from dslc.lower.canonical import load_time
from dslc.lower.rewrite import derived
from dslc.ops import OPS


@dataclass(frozen=True)
class Branch:
    matmul: Node
    weight: TensorType  # [K, N], load-time
    bias: Node | None  # the bias_add of the projection's bias vector, if it has one
    bias_vector: TensorType | None  # [N]
    block: str  # the instance its weight belongs to (`encoder.layer.0.attn.q_proj`)

    @property
    def end(self) -> Node:
        return self.bias if self.bias is not None else self.matmul

    @property
    def width(self) -> int:
        width = self.weight.shape[1]
        assert isinstance(width, int)
        return width


def pack_sibling_matmuls(graph: Graph) -> Graph:
    """Projections of one activation by load-time weights of one depth -> one packed matmul
    (see the module's docstring)."""
    families = [f for f in _families(graph) if len(f) > 1]
    if not families:
        return graph
    order = {n.name: i for i, n in enumerate(graph.nodes)}
    replaced: dict[str, str] = {}  # a branch's end -> the slice standing for it
    dropped: set[str] = set()
    added: dict[str, list[Node]] = {}  # new nodes, emitted just after this existing node
    for family in families:
        new = _packed(family)
        last = max((b.end.name for b in family), key=order.__getitem__)
        added[last] = new
        for branch, piece in zip(family, new[-len(family):], strict=True):
            replaced[branch.end.name] = piece.name
            dropped.add(branch.matmul.name)
            dropped.add(branch.end.name)
    nodes: list[Node] = []
    for node in graph.nodes:
        if node.name not in dropped:
            nodes.append(renamed(node, replaced))
        # the activation of a family may itself be a projection another family packed
        nodes.extend(renamed(n, replaced) for n in added.get(node.name, ()))
    outputs = tuple((n, replaced.get(v, v)) for n, v in graph.outputs)
    return Graph(_topological(nodes), outputs)


def _families(graph: Graph) -> list[list[Branch]]:
    """Projections grouped by what makes them one matmul: the activation, the weights' depth
    and dtype, the result's dtype and precision, and a bias's dtype. Projections without a bias
    join a family with one, of their result's dtype, taking a zero bias (Whisper's k_proj
    beside its q_proj and v_proj)."""
    constants = load_time(graph)
    users = graph.users()
    nodes = graph.by_name()
    exported = {v for _, v in graph.outputs}
    names = StepNames(graph, constants)
    # (what every branch shares, the bias's dtypes and precision or None) -> the branches
    groups: dict[tuple[tuple[object, ...], tuple[object, ...] | None], list[Branch]] = \
        defaultdict(list)
    order = {n.name: i for i, n in enumerate(graph.nodes)}
    for m in graph.nodes:
        if m.op != "matmul" or m.inputs[1] not in constants or m.inputs[0] in constants:
            continue
        w = nodes[m.inputs[1]].type
        if w.rank != 2 or not isinstance(w.shape[1], int) or m.name in exported:
            continue
        readers = users[m.name]
        bias = readers[0] if len(readers) == 1 and _is_bias(readers[0], m, constants) else None
        vector = nodes[bias.inputs[1]].type if bias is not None else None
        branch = Branch(m, w, bias, vector, _block(names.weight(m.inputs[1]), m))
        if _feeds_an_epilogue(branch.end.name, users):
            continue
        base = (m.inputs[0], w.shape[0], w.dtype, m.type.dtype, m.precision, m.attrs)
        biased = None if bias is None or vector is None else (vector.dtype, bias.type.dtype,
                                                                bias.precision)
        groups[base, biased].append(branch)
    for plain in [k for k in groups if k[1] is None]:
        # the biased family whose result has these projections' dtype (the base's fourth)
        host = next((k for k in groups if k[0] == plain[0] and k[1] is not None
                     and k[1][1] == plain[0][3]), None)
        if host is not None:
            groups[host] = sorted(groups[host] + groups.pop(plain),
                                  key=lambda b: order[b.matmul.name])
    return list(groups.values())


def _block(weight: str | None, matmul: Node) -> str:
    """The instance a projection's weight belongs to: its param's path without the param's own
    name (`model.layers.0.self_attn.q_proj.weight` -> `...q_proj`), else the matmul's."""
    if weight is None or "." not in weight:
        return matmul.path or matmul.name
    return weight.rsplit(".", 1)[0]


def _feeds_an_epilogue(name: str, users: dict[str, list[Node]]) -> bool:
    """Does a pointwise op read the value itself? (Fusion extends a matmul's epilogue through
    its direct readers only, never through a view: a pointwise op after a view runs apart
    anyway, as the rotary embedding after a Llama layer's split heads does.)"""
    return any(OPS[u.op].fusion == "epilogue" for u in users[name])


def _is_bias(node: Node, matmul: Node, constants: set[str]) -> bool:
    """`bias_add(matmul, b)` along the last axis, with a load-time vector b."""
    return (node.op == "bias_add" and node.inputs[0] == matmul.name
            and node.inputs[1] in constants and node.attrs["axis"] == matmul.type.rank - 1)


def _packed(family: list[Branch]) -> list[Node]:
    """The joined weights (and biases), the packed matmul (and its bias_add), then one slice
    per branch, in the family's order."""
    first = family[0]
    m = replace(first.matmul, path=_joined_path(b.block for b in family))
    total = sum(b.width for b in family)
    name = f"{m.name}.packed"
    shape = (*m.type.shape[:-1], total)
    depth = first.weight.shape[0]
    # PyTorch linears' [N, K] weights, read transposed, stay K-contiguous when joined: a concat
    # is laid out as its first operand is seen (`lower.views`), as the few-row matmul kernel
    # needs (`backend.gemv`)
    out = [derived("concat", tuple(b.matmul.inputs[1] for b in family),
                   concat_attrs(1, len(family)), TensorType(first.weight.dtype, (depth, total)),
                   m, f"{name}.weight")]
    out += [derived("matmul", (m.inputs[0], f"{name}.weight"), dict(m.attrs),
                   TensorType(m.type.dtype, shape, m.type.layout), m, name)]
    biased = next((b for b in family if b.bias is not None), None)
    if biased is not None and biased.bias is not None and biased.bias_vector is not None:
        bias = replace(biased.bias, path=m.path)
        vdtype = biased.bias_vector.dtype
        vectors = []
        for b in family:
            if b.bias is not None:
                vectors.append(b.bias.inputs[1])
                continue
            # a projection without a bias adds zeros (made once, when the weights load)
            zero = f"{b.matmul.name}.zero_bias"
            out += [derived("full", (), {"shape": (b.width,), "value": 0, "dtype": "i32"},
                            TensorType("i32", (b.width,)), b.matmul, f"{zero}.i32"),
                    derived("cast", (f"{zero}.i32",), {"dtype": vdtype},
                            TensorType(vdtype, (b.width,)), b.matmul, zero)]
            vectors.append(zero)
        out.append(derived("concat", tuple(vectors), concat_attrs(0, len(family)),
                           TensorType(vdtype, (total,)), bias, f"{name}.bias"))
        out.append(derived("bias_add", (name, f"{name}.bias"), dict(bias.attrs),
                           TensorType(bias.type.dtype, shape, bias.type.layout), bias,
                           f"{name}.biased"))
    packed = out[-1].name
    offset = 0
    for b in family:
        starts = (0,) * (len(shape) - 1) + (offset,)
        ends = (*shape[:-1], offset + b.width)
        out.append(derived("slice", (packed,), {"starts": starts, "ends": ends}, b.end.type,
                           b.end, f"{b.end.name}.slice"))
        offset += b.width
    return out


def _joined_path(paths: Iterable[str]) -> str:
    """The instance path of a packed projection, naming its step: the branches' common block,
    then each branch's own part, `encoder.layer.0.attn.q_proj|k_proj|v_proj`."""
    split = [p.split(".") for p in paths]
    common = 0
    while all(len(s) > common + 1 and s[common] == split[0][common] for s in split):
        common += 1
    head = ".".join(split[0][:common])
    tail = "|".join(".".join(s[common:]) for s in split)
    return f"{head}.{tail}" if head else tail


def concat_attrs(axis: int, count: int) -> dict[str, object]:
    """A concat's attributes: its axis and its operands named as the checker names them."""
    return {"axis": axis, "operands": tuple(f"xs.{i}" for i in range(count))}


def _topological(nodes: list[Node]) -> tuple[Node, ...]:
    """The nodes in an order where each comes after what it reads, as close to the given one
    as that allows: a reader of an early projection moves after the packed matmul."""
    placed: set[str] = set()
    out: list[Node] = []
    waiting: dict[str, list[Node]] = defaultdict(list)  # a value -> nodes it holds back

    def place(node: Node) -> None:
        stack = [node]
        while stack:
            n = stack.pop()
            missing = next((i for i in n.inputs if i not in placed), None)
            if missing is not None:
                waiting[missing].append(n)
                continue
            out.append(n)
            placed.add(n.name)
            stack.extend(reversed(waiting.pop(n.name, [])))

    for node in nodes:
        place(node)
    assert not waiting, sorted(waiting)
    return tuple(out)
