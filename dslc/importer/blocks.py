"""Blocks that repeat, written as `def`s (`find_blocks`): the operations exported from one module
of a numbered container (`layer1.0`, `features.3`) whose instances hold all their weights, that
read one tensor from outside and give one back, are a block; two blocks of the same text are
instances of one def, and a run of them, each reading the one before, is a `repeat`."""

from __future__ import annotations

from dataclasses import dataclass

from dslc.core import dims
from dslc.importer.emit import Body, instance, topological, uses
from dslc.importer.graph import Op
from dslc.importer.names import Names, identifier

# The dims a block's input is declared with, by its rank (a def's own names).
INPUT_DIMS = {2: "B, D", 3: "B, S, D", 4: "N, C, H, W"}


@dataclass
class Block:
    prefix: str  # the module path: `layer1.0`
    members: list[Op]  # in order
    input: Op
    output: Op
    text: list[str]  # the def's body, which decides which blocks are equal


def home(op: Op) -> str | None:
    """The module an operation belongs to: an instance's path, else its node's scope."""
    if op.op in ("input", "param"):
        return None
    if instance(op) and op.path:
        return op.path
    return op.origin.scope if op.origin else None


def _candidates(order: list[Op]) -> list[str]:
    """Every module path ending in a number (an entry of a Sequential or ModuleList)."""
    found: set[str] = set()
    for op in order:
        h = home(op)
        parts = h.split(".") if h else []
        for i in range(1, len(parts) + 1):
            if parts[i - 1].isdigit():
                found.add(".".join(parts[:i]))
    return sorted(found, key=lambda p: (p.count("."), p))


def _symbolic(value: object) -> bool:
    if isinstance(value, dims.Poly):
        return True
    if isinstance(value, (list, tuple)):
        return any(_symbolic(v) for v in value)
    return False


def _block(prefix: str, order: list[Op], readers: dict[int, list[Op]], roots: set[int],
           env: dims.DimEnv) -> Block | None:
    inside = [op for op in order if (h := home(op)) and (h == prefix or h.startswith(prefix + "."))]
    ids = {id(op) for op in inside}
    if len(inside) < 2 or not any(instance(op) for op in inside):
        return None
    outer = {id(a): a for op in inside for a in op.operands() if id(a) not in ids}
    if len(outer) != 1:
        return None
    [x] = outer.values()
    if x.op == "param" or any(_symbolic(v) for op in inside for v in op.attrs.values()):
        return None
    leaving = [op for op in inside if id(op) in roots or
               any(id(r) not in ids for r in readers.get(id(op), []))]
    if len(leaving) != 1 or leaving[0].rank not in INPUT_DIMS or x.rank not in INPUT_DIMS:
        return None
    body = Body(inside, [], Names({"x"}), env, prefix=prefix)
    body.bind(x, "x")
    body.outputs = [("", leaving[0])]
    body.output_ops = {id(leaving[0])}
    return Block(prefix, inside, x, leaving[0], body.lines(returns=True))


def _def_name(prefix: str, taken: Names) -> str:
    parent = prefix.rsplit(".", 1)[0] if "." in prefix else "block"
    return taken.fresh(identifier(parent.replace(".", "_"), "block") + "_block")


@dataclass
class Def:
    name: str
    lines: list[str]


def find_blocks(outputs: list[tuple[str, Op]], env: dims.DimEnv
                ) -> tuple[list[tuple[str, Op]], list[Def]]:
    """The outputs with each repeating block made a def instance (or a `repeat` of them), and
    the defs."""
    order = topological(op for _, op in outputs)
    readers: dict[int, list[Op]] = {}
    for op in order:
        for a in op.operands():
            readers.setdefault(id(a), []).append(op)
    roots = {id(op) for _, op in outputs}
    blocks: dict[str, Block] = {}
    for prefix in _candidates(order):
        if any(prefix.startswith(p + ".") for p in blocks):
            continue  # inside a block found already
        b = _block(prefix, order, readers, roots, env)
        if b is not None and b.input.rank == b.output.rank:
            blocks[prefix] = b
    groups: dict[str, list[Block]] = {}
    for b in blocks.values():
        groups.setdefault("\n".join(b.text) + f"|{b.input.rank}", []).append(b)
    names, defs = Names(), []
    replaced: dict[int, Op] = {}
    for group in groups.values():
        if len(group) < 2:
            continue
        name = _def_name(group[0].prefix, names)
        header = f"def {name}(x: [{INPUT_DIMS[group[0].input.rank]}]) {{"
        defs.append(Def(name, [header, *group[0].text, "}"]))
        for b in group:
            weights = {f"{op.path[len(b.prefix) + 1:]}.{role}": array for op in b.members
                       if instance(op) and op.path for role, array in op.weights.items()}
            replaced[id(b.output)] = Op(f"def:{name}", [b.input], {}, b.output.dtype,
                                        b.output.shape, b.output.origin, weights, b.prefix)
    for op in [*order, *replaced.values()]:  # a block's input may be the block before it
        op.args = [replaced.get(id(a), a) if isinstance(a, Op) else a for a in op.args]
    new_outputs = [(n, replaced.get(id(op), op)) for n, op in outputs]
    return _repeats(new_outputs), defs


def _repeats(outputs: list[tuple[str, Op]]) -> list[tuple[str, Op]]:
    """Runs of one def's instances at consecutive paths (`layer3.1` .. `layer3.5`), each read
    only by the next, as one `repeat`."""
    order = topological(op for _, op in outputs)
    count = uses(order)
    roots = {id(op) for _, op in outputs}
    merged: dict[int, Op] = {}
    for op in order:
        if not op.op.startswith("def:") or id(op) in merged:
            continue
        run = [op]
        while True:
            last = run[-1]
            nxt = [r for r in order if r.op == op.op and r.args and r.args[0] is last]
            if len(nxt) != 1 or count.get(id(last), 0) != 1 or id(last) in roots or \
                    not _next_path(last.path, nxt[0].path):
                break
            run.append(nxt[0])
        if len(run) < 2:
            continue
        base, start = run[0].path.rsplit(".", 1)  # type: ignore[union-attr]
        weights = {f"{r.path.rsplit('.', 1)[1]}.{k}": v  # type: ignore[union-attr]
                   for r in run for k, v in r.weights.items()}
        whole = Op(op.op, list(run[0].args), {"repeat": len(run), "start": int(start)},
                   op.dtype, op.shape, op.origin, weights, base)
        for r in run:
            merged[id(r)] = whole
        merged[id(run[-1])] = whole
    wholes = list({id(w): w for w in merged.values()}.values())
    for op in [*order, *wholes]:  # a run's input may be the end of another run
        op.args = [merged.get(id(a), a) if isinstance(a, Op) else a for a in op.args]
    return [(n, merged.get(id(op), op)) for n, op in outputs]


def _next_path(a: str | None, b: str | None) -> bool:
    if not a or not b or "." not in a or "." not in b:
        return False
    (pa, ia), (pb, ib) = a.rsplit(".", 1), b.rsplit(".", 1)
    return pa == pb and ia.isdigit() and ib.isdigit() and int(ib) == int(ia) + 1
