"""The imported graph as `.cgraph` source (`emit`): the dims, inputs and params a model
declares, one `let` per value that is read twice or is an instance of a def, every other value
written where it is read, and the outputs; with the weights under the params' paths."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from dslc.core.dims import DimEnv
from dslc.importer.graph import Op
from dslc.importer.names import Names, identifier, path_segments
from dslc.importer.shapes import dim_text
from dslc.importer.text import Writer

MAX_DEPTH = 4  # operations nested in one expression before a `let` is made for the inner ones
DEFS_WITH_WEIGHTS = frozenset({"conv2d", "batchnorm2d", "linear", "layer_norm", "embedding",
                               "rms_norm", "group_norm", "conv_transpose2d"})


@dataclass(frozen=True)
class DimDecl:
    name: str
    lo: int
    hi: int
    tune: tuple[int, ...] = ()


@dataclass
class Emitted:
    name: str  # the model's
    text: str
    weights: dict[str, np.ndarray] = field(default_factory=dict)


def topological(roots: Iterable[Op]) -> list[Op]:
    """Every operation the roots read, each after its operands (in the order they are first
    read, so the text follows the model's own order)."""
    order: list[Op] = []
    seen: set[int] = set()
    for root in roots:
        stack: list[tuple[Op, bool]] = [(root, False)]
        while stack:
            op, done = stack.pop()
            if done:
                order.append(op)
                continue
            if id(op) in seen:
                continue
            seen.add(id(op))
            stack.append((op, True))
            stack.extend((a, False) for a in reversed(op.operands()) if id(a) not in seen)
    return order


def uses(order: list[Op]) -> dict[int, int]:
    count: dict[int, int] = {}
    for op in order:
        for a in op.operands():
            count[id(a)] = count.get(id(a), 0) + 1
    return count


def instance(op: Op) -> bool:
    """An operation that creates a def instance (a `let` of its own: E0205)."""
    return op.op in DEFS_WITH_WEIGHTS or op.op.startswith("def:")


class Body:
    """The statements of a model: which operations are `let`s, and their names."""

    def __init__(self, order: list[Op], outputs: list[tuple[str, Op]], names: Names,
                 env: DimEnv, prefix: str = "") -> None:
        self.prefix = prefix  # a def's body: instance paths are relative to it
        self.order = order
        self.outputs = outputs
        self.names = names
        self.env = env
        self.count = uses(order)
        self.output_ops = {id(op) for _, op in outputs}
        self.named: dict[int, str] = {}
        self.writer = Writer(env, lambda op: self.named.get(id(op)))

    def bind(self, op: Op, name: str) -> None:
        self.named[id(op)] = name

    def lets(self) -> list[Op]:
        """The operations that get a `let`, in order: instances, values read twice, and values
        nested too deep to be read inline."""
        chosen: list[Op] = []
        depth: dict[int, int] = {}
        for op in self.order:
            if id(op) in self.named:
                continue
            reads = self.count.get(id(op), 0)
            inner = max((depth.get(id(a), 0) for a in op.operands() if id(a) not in self.named),
                        default=0)
            own = id(op) in self.output_ops and reads == 0 and not instance(op)
            if not own and (instance(op) or reads > 1 or inner >= MAX_DEPTH or
                            id(op) in self.output_ops):
                chosen.append(op)
                self.bind(op, self.names.fresh(let_name(op, self.path(op))))
            else:
                depth[id(op)] = inner + 1
        return chosen

    def path(self, op: Op) -> str | None:
        if op.path and self.prefix and op.path.startswith(self.prefix + "."):
            return op.path[len(self.prefix) + 1:]
        return op.path

    def lines(self, returns: bool = False) -> list[str]:
        """The statements; a def's body (`returns`) ends in `return` of its one output."""
        out = []
        for op in self.lets():
            text = self.writer.expr(op)[0]
            path = self.path(op)
            if "repeat" in op.attrs:  # a run of a def's instances at consecutive paths
                start = op.attrs["start"]
                text = f'repeat {op.attrs["repeat"]} {text} as "{path}.{{i+{start}}}"' if start \
                    else f'repeat {op.attrs["repeat"]} {text} as "{path}.{{i}}"'
            elif path and instance(op) and path != self.named[id(op)]:
                text += f' as "{path}"'
            out.append(f"  let {self.named[id(op)]} = {text}")
        for name, op in self.outputs:
            value = self.writer.arg(op)
            out.append(f"  return {value}" if returns else f"  output {name} = {value}")
        return out


def let_name(op: Op, path: str | None = None) -> str:
    """An instance is named after its path (`conv1`; `downsample_0` for `downsample.0`), any
    other value after its op."""
    path = path or op.path
    if path and instance(op):
        parts = path.split(".")
        tail = parts[-2:] if parts[-1].isdigit() and len(parts) > 1 else parts[-1:]
        return identifier("_".join(tail), op.op.removeprefix("def:"))
    return {"index": "part", "bias_add": "biased"}.get(op.op, op.op)


def unique_path(op: Op, weights: dict[str, np.ndarray]) -> None:
    """An instance path no other instance has: a module the exporter shared between two uses
    (or two initializers it merged because they were equal) gets a second path, and its
    weights are written twice. That path is the module the node was exported from where the
    exporter recorded one (an optimiser merges the equal weights of `ln_1` and `ln_2`)."""
    if op.path is None:
        return
    def taken(path: str) -> bool:
        return any(f"{path}.{role}" in weights for role in op.weights)
    scope = op.origin.scope if op.origin else None
    if taken(op.path) and scope and path_segments(scope) and not taken(scope):
        op.path = scope
        return
    base, n = op.path, 1
    while any(f"{op.path}.{role}" in weights for role in op.weights):
        n += 1
        op.path = f"{base}_{n}"


def emit(name: str, header: list[str], dims: list[DimDecl], inputs: list[Op],
         outputs: list[tuple[str, Op]], env: DimEnv, defs: Iterable[list[str]] = ()) -> Emitted:
    """The model `name`: `header` comment lines, the `defs` (each its lines), then the model's
    dims, inputs, params and body."""
    order = topological(op for _, op in outputs)
    taken = {d.name for d in dims}
    names = Names(taken)
    body = Body(order, [], names, env)
    lines = ["cgraph 0.1", *(f"# {h}" for h in header)]
    if any(instance(op) or op.op in ("softmax",) for op in order):
        lines.append('import "std/nn.cgraph"')
    for def_lines in defs:
        lines += ["", *def_lines]
    lines += ["", f"model {name} {{", "  precision io=f32, intermediate=f32, compute=f32"]
    for d in dims:
        tune = f" tune [{', '.join(map(str, d.tune))}]" if d.tune else ""
        lines.append(f"  dim {d.name} = {d.lo}..{d.hi}{tune}")
    for op in inputs:
        assert op.path is not None
        nm = names.fresh(op.path)
        body.bind(op, nm)
        shape = ", ".join(dim_text(d, env) for d in op.shape)
        lines.append(f"  input {nm}: {op.dtype}[{shape}]")
    weights: dict[str, np.ndarray] = {}
    consts = 0
    # an instance of unnamed weights is named after its def (`conv2d`, `conv2d_2`)
    paths = Names({op.path for op in order if op.path and instance(op)})
    for op in order:
        if instance(op) and op.path is None:
            op.path = paths.fresh(op.op.removeprefix("def:"))
    for op in order:
        if op.op == "param":
            if op.path is None:
                consts += 1
                op.path = f"const_{consts}"
            body.bind(op, op.path)
            names.taken.add(op.path.split(".")[0])
            shape = ", ".join(str(d) for d in op.shape)
            lines.append(f"  param {op.path}: {op.dtype}[{shape}]")
            weights[op.path] = op.weights[""]
        elif instance(op):
            unique_path(op, weights)
            for role, array in op.weights.items():
                weights[f"{op.path}.{role}"] = array
    body.outputs = [(names.fresh(identifier(n, "output")), op) for n, op in outputs]
    body.output_ops = {id(op) for _, op in body.outputs}
    lines += body.lines()
    lines.append("}")
    return Emitted(name, "\n".join(lines) + "\n", weights)
