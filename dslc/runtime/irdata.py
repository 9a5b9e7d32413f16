"""The IR graph a bundle carries, read as untrusted data: every node's fields are checked (names
defined before use, ops known, attributes of the kinds their op takes, axes within the operand's
rank, dims over declared symbols, layouts that are permutations), the data is decoded with
`dslc.ir.serial`, and the decoded graph must pass the IR verifier (every node's type is what its
op's type rule gives). What reaches the numpy references, the fallback kernels and the cuDNN
graphs built from it is then as sound as a graph the compiler made. Errors are `BundleError`s
naming the field (`graph.nodes[12].attrs.stride[0]: expected an int in ...`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

from dslc.core.dims import Dim, DimEnv, Poly, SymInfo
from dslc.core.types import DTYPES, FAMILIES
from dslc.ir.graph import SOURCES as GRAPH_SOURCES
from dslc.ir.graph import Graph
from dslc.ir.serial import dim_from, graph_data, graph_from
from dslc.runtime import fields as f
from dslc.runtime.fields import MAX_DIM, MAX_ELEMENTS, MAX_RANK, BundleError

SOURCES = GRAPH_SOURCES
NODE_FIELDS = ("name", "op", "inputs", "attrs", "type", "path", "precision", "span")
# Attributes type rules and lowering add beyond an op's parameters, by kind.
EXTRA_ATTRS = {"operands": "names", "compute": "DTYPE", "precision": "DTYPE",
               "weight_scales": "STR", "output": "INT", "pre_pad": "INTS",
               "post_pad": "INTS", "axes": "AXES", "axis": "INT"}
AXIS_ATTRS = ("axis", "axes", "perm")  # indices into the first operand's axes


@dataclass(frozen=True)
class GraphRecord:
    """The lowered IR and its dims: symbols (range, alignment) and floor atoms."""

    graph: Graph
    syms: tuple[SymInfo, ...]
    floors: tuple[tuple[str, Poly, int], ...]

    def env(self) -> DimEnv:
        env = DimEnv()
        for s in self.syms:
            env.add(s)
        for name, poly, c in self.floors:
            env.floors[name] = (poly, c)
        return env

    def to_data(self) -> dict[str, Any]:
        return graph_data(self.graph, self.env())

    @staticmethod
    def of(graph: Graph, env: DimEnv) -> GraphRecord:
        return GraphRecord(graph, tuple(env.syms.values()),
                           tuple((n, p, c) for n, (p, c) in env.floors.items()))

    @staticmethod
    def from_data(d: Any, path: str = "graph") -> GraphRecord:
        d = f.mapping(d, path, ("nodes", "outputs", "floors", "syms"), ())
        symbols = _syms(d["syms"], f"{path}.syms")
        _floors(d["floors"], f"{path}.floors", symbols)
        ranks: dict[str, int] = {}
        for i, n in enumerate(f.items(d["nodes"], f"{path}.nodes", 1)):
            _node(n, f"{path}.nodes[{i}]", ranks, symbols)
        outputs = f.items(d["outputs"], f"{path}.outputs", 1)
        for i, o in enumerate(outputs):
            pair = f.items(o, f"{path}.outputs[{i}]", 2, 2)
            f.text(pair[0], f"{path}.outputs[{i}][0]")
            f.name_of(pair[1], f"{path}.outputs[{i}][1]", ranks)
        if len({o[0] for o in outputs}) != len(outputs):
            f.wrong(f"{path}.outputs", "an output name appears twice")
        graph, env = graph_from(d)
        _verify(graph, env, path)
        return GraphRecord.of(graph, env)


def _verify(graph: Graph, env: DimEnv, path: str) -> None:
    from dslc.ir.verify import verify

    try:
        problems = verify(graph, env)
    except Exception as err:  # a type rule meeting values no checked program has
        raise BundleError(f"{path}: the IR does not check out ({type(err).__name__}: "
                          f"{str(err)[:100]})") from err
    if problems:
        raise BundleError(f"{path}: the IR does not check out ({problems[0][:160]})")


def _syms(v: Any, path: str) -> dict[str, SymInfo]:
    out = {}
    for name, info in f.mapping(v, path).items():
        lo, hi, align = f.items(info, f"{path}.{name}", 3, 3)
        lo = f.integer(lo, f"{path}.{name}[0]", 0, MAX_DIM)
        hi = f.integer(hi, f"{path}.{name}[1]", lo, MAX_DIM)
        out[f.text(name, path, hi=128)] = SymInfo(name, lo, hi,
                                                  f.integer(align, f"{path}.{name}[2]", 1, MAX_DIM))
    return out


def _floors(v: Any, path: str, symbols: dict[str, Any]) -> None:
    """Floor atoms `⌊p/c⌋`, each over symbols or floors before it (so evaluating one ends)."""
    for name, value in f.mapping(v, path).items():
        if name in symbols:
            f.wrong(f"{path}.{name}", "a floor atom named like a dim")
        poly, c = f.items(value, f"{path}.{name}", 2, 2)
        if not isinstance(dim(poly, f"{path}.{name}[0]", symbols), Poly):
            f.wrong(f"{path}.{name}[0]", "a floor of a constant")
        f.integer(c, f"{path}.{name}[1]", 1, MAX_DIM)
        symbols[name] = None


def dim(v: Any, path: str, symbols: Mapping[str, Any], lo: int = -MAX_ELEMENTS) -> Dim:
    """A dim from its data (see `check_dim`), decoded."""
    check_dim(v, path, symbols, lo)
    if isinstance(v, int):
        return v
    out = dim_from(v)
    if isinstance(out, int):
        return f.integer(out, path, lo, MAX_ELEMENTS)
    return out


def check_dim(v: Any, path: str, symbols: Mapping[str, Any], lo: int = -MAX_ELEMENTS) -> None:
    """A dim as data: an int, or {"terms": [[[[symbol, power], ...], num, den], ...]} in normal
    form (monomials distinct and sorted, coefficients non-zero, an integer if constant) over
    known symbols."""
    if isinstance(v, int) and not isinstance(v, bool):
        f.integer(v, path, lo, MAX_ELEMENTS)
        return
    terms = f.items(f.mapping(v, path, ("terms",), ())["terms"], f"{path}.terms", 1, 64)
    seen = set()
    for i, t in enumerate(terms):
        at = f"{path}.terms[{i}]"
        mono, num, den = f.items(t, at, 3, 3)
        factors = []
        for j, factor in enumerate(f.items(mono, f"{at}[0]", 0, 4)):
            s, p = f.items(factor, f"{at}[0][{j}]", 2, 2)
            factors.append((f.name_of(s, f"{at}[0][{j}][0]", symbols, "a declared dim"),
                            f.integer(p, f"{at}[0][{j}][1]", 1, 4)))
        if factors != sorted(set(factors)) or len({s for s, _ in factors}) != len(factors):
            f.wrong(f"{at}[0]", "a monomial not in normal form")
        if tuple(factors) in seen:
            f.wrong(at, "a monomial that appears twice")
        seen.add(tuple(factors))
        if f.integer(num, f"{at}[1]", -(2**62), 2**62) == 0:
            f.wrong(f"{at}[1]", "a zero coefficient")
        f.integer(den, f"{at}[2]", 1, 2**62)
    if len(terms) == 1 and not terms[0][0]:  # a constant: make() folds it to an int
        if terms[0][1] % terms[0][2]:
            f.wrong(path, "a constant that is not an integer")
        f.integer(terms[0][1] // terms[0][2], path, lo, MAX_ELEMENTS)


@cache
def known_ops() -> frozenset[str]:
    from dslc.ops import OPS  # here: the op table is needed only to read a graph

    return frozenset((*OPS, *SOURCES, "view"))


def _node(n: Any, path: str, ranks: dict[str, int], symbols: Mapping[str, Any]) -> None:
    n = f.mapping(n, path, NODE_FIELDS, ())
    name = f.text(n["name"], f"{path}.name")
    if name in ranks:
        f.wrong(f"{path}.name", f"`{name[:60]}` is defined twice")
    op = f.text(n["op"], f"{path}.op", known_ops())
    inputs = f.names(n["inputs"], f"{path}.inputs", ranks, "a value defined before it")
    t = f.mapping(n["type"], f"{path}.type", ("dtype", "shape", "layout"), ("tag",))
    if "tag" in t:  # how the layout prints (`@BSHD`)
        f.text(t["tag"], f"{path}.type.tag", tuple(FAMILIES))
    f.text(t["dtype"], f"{path}.type.dtype", DTYPES)
    shape = f.items(t["shape"], f"{path}.type.shape", 0, MAX_RANK)
    for i, d in enumerate(shape):
        check_dim(d, f"{path}.type.shape[{i}]", symbols, lo=0)
    if t["layout"] is not None or op not in ("scalar", "view"):
        order = f.ints(t["layout"], f"{path}.type.layout", 0, MAX_RANK, len(shape), len(shape))
        if sorted(order) != list(range(len(shape))):
            f.wrong(f"{path}.type.layout", f"{list(order)} is no order of {len(shape)} axes")
    f.text(n["path"], f"{path}.path")
    for i, p in enumerate(f.items(n["precision"], f"{path}.precision", 3, 3)):
        f.text(p, f"{path}.precision[{i}]", DTYPES)
    span = f.items(n["span"], f"{path}.span", 5, 5)
    f.text(span[0], f"{path}.span[0]")
    for i in range(1, 5):
        f.integer(span[i], f"{path}.span[{i}]", 0, 2**31)
    _attrs(f.mapping(n["attrs"], f"{path}.attrs"), f"{path}.attrs", op,
           ranks[inputs[0]] if inputs else len(shape), symbols)
    ranks[name] = len(shape)


def _attrs(attrs: Mapping[str, Any], path: str, op: str, rank: int,
           symbols: Mapping[str, Any]) -> None:
    from dslc.ops import OPS

    if op in SOURCES or op == "view":
        kinds = {"input": {"name": "STR"}, "param": {"path": "STR"},
                 "scalar": {"value": "FLOAT"}, "amax": {"tensor": "STR"},
                 "view": {"steps": "STEPS", "strides": "SHAPE", "offset": "DIM"}}[op]
        f.mapping(attrs, path, tuple(kinds), ())
    else:
        kinds = {**EXTRA_ATTRS, **{p.name: p.kind.name for p in OPS[op].params}}
    for key, value in attrs.items():
        at = f"{path}.{key}"
        kind = kinds.get(key)
        if kind is None:  # an attribute no reader uses: plain data, nothing more
            f.plain(value, at)
            continue
        _attr(value, at, kind, symbols)
        if key in AXIS_ATTRS and value is not None:
            for i, axis in enumerate(value if isinstance(value, list) else [value]):
                f.integer(axis, f"{at}[{i}]" if isinstance(value, list) else at, -rank,
                          max(rank - 1, 0))
        choices = next((p.choices for p in getattr(OPS.get(op), "params", ()) if p.name == key),
                       ())
        if choices and value not in choices:
            f.fail(at, "one of " + ", ".join(choices), value)


def _attr(v: Any, path: str, kind: str, symbols: Mapping[str, Any]) -> None:
    """One attribute value of a parameter kind (`dslc.ops.opdef.Kind`), as data."""
    if (v is None and kind.startswith("OPT_")) or (v is None and kind in ("INTS", "SHAPE")):
        return
    kind = kind.removeprefix("OPT_")
    if kind == "INT":
        f.integer(v, path, -MAX_DIM, MAX_DIM)
    elif kind in ("INTS", "AXES"):
        if kind == "INTS" and isinstance(v, int) and not isinstance(v, bool):
            f.integer(v, path, -MAX_DIM, MAX_DIM)
        else:
            f.ints(v, path, -MAX_DIM, MAX_DIM)
    elif kind == "SHAPE":
        for i, x in enumerate(f.items(v, path, 0, MAX_RANK)):
            _attr(x, f"{path}[{i}]", "DIM", symbols)
    elif kind == "DIM":
        if isinstance(v, dict):
            check_dim(f.mapping(v, path, ("dim",), ())["dim"], f"{path}.dim", symbols)
        else:
            f.integer(v, path, -MAX_ELEMENTS, MAX_ELEMENTS)
    elif kind == "FLOAT":
        f.number(v, path)
    elif kind == "BOOL":
        f.flag(v, path)
    elif kind in ("STR", "DTYPE"):
        f.text(v, path, DTYPES if kind == "DTYPE" else None)
    elif kind == "names":
        f.items(v, path, 0, 4096)
        for i, x in enumerate(v):
            f.text(x, f"{path}[{i}]")
    elif kind == "STEPS":
        _view_steps(v, path, symbols)
    else:
        f.plain(v, path)


def _view_steps(v: Any, path: str, symbols: Mapping[str, Any]) -> None:
    for i, step in enumerate(f.items(v, path, 0, 64)):
        at = f"{path}[{i}]"
        parts = f.items(step, at, 2, 3)
        kind = f.text(parts[0], f"{at}[0]", ("transpose", "reshape", "slice"))
        if len(parts) != (3 if kind == "slice" else 2):
            f.wrong(at, f"a {kind} step of {len(parts)} parts")
        if kind == "transpose":
            perm = f.ints(parts[1], f"{at}[1]", 0, MAX_RANK)
            if sorted(perm) != list(range(len(perm))):
                f.wrong(f"{at}[1]", f"{list(perm)} is no permutation")
        else:
            for j in range(1, len(parts)):
                _attr(parts[j], f"{at}[{j}]", "SHAPE", symbols)
