"""Families that move data or only re-describe it: transpose, reshape, slice (as a call and in
`x[a:b]` syntax), concat, contiguous, and genstats' tuple binding. Views of inputs, of params and
of computed values, chained, are where a wrong stride hides."""

from __future__ import annotations

from dataclasses import replace

from dslc.core import dims
from dslc.fuzz.families import is_float, printable, size, static, tame
from dslc.fuzz.program import Expr
from dslc.fuzz.state import Gen


def _permutation(g: Gen, rank: int) -> tuple[int, ...]:
    pool = list(range(rank))
    return tuple(pool.pop(g.ch.below(len(pool))) for _ in range(rank))


def _reshape_target(g: Gen, shape: tuple[dims.Dim, ...]) -> tuple[dims.Dim, ...] | None:
    """Merge two neighbours, split one axis, add a size-1 axis, or flatten; an axis the source
    cannot spell becomes -1 (at most one)."""
    rank = len(shape)
    how = g.ch.pick(["merge", "split", "unsqueeze", "flatten"])
    new: list[dims.Dim]
    if how == "merge" and rank >= 2:
        i = g.ch.below(rank - 1)
        new = [*shape[:i], dims.mul(shape[i], shape[i + 1]), *shape[i + 2:]]
    elif how == "split":
        axes = [i for i, d in enumerate(shape) if static(d) and size(d) >= 4 and _factor(size(d))]
        if not axes:
            return None
        i = g.ch.pick(axes)
        f = _factor(size(shape[i]))
        new = [*shape[:i], f, size(shape[i]) // f, *shape[i + 1:]]
    elif how == "unsqueeze":
        i = g.ch.between(0, rank)
        new = [*shape[:i], 1, *shape[i:]]
    else:
        new = [-1]
    bad = [i for i, d in enumerate(new) if not printable(d)]
    if len(bad) > 1 or (bad and -1 in new):
        return None
    for i in bad:
        new[i] = -1
    return tuple(new)


def _factor(n: int) -> int:
    return next((f for f in (2, 3, 4, 5) if n % f == 0 and n // f > 1), 0)


def view(g: Gen) -> bool:
    x = g.pick(lambda e: e.type.rank >= 1)
    if x is None:
        return False
    kind = g.ch.pick(["transpose", "reshape", "slice", "index", "expand"])
    out: Expr | None
    if kind == "expand":
        out = _expand(g, x)
    elif kind == "transpose":
        if x.type.rank < 2:
            return False
        out = g.apply("transpose", {"x": x}, {"perm": _permutation(g, x.type.rank)})
    elif kind == "reshape":
        target = _reshape_target(g, x.type.shape)
        out = None if target is None else g.apply("reshape", {"x": x}, {"shape": target})
    else:
        out = _slice(g, x, syntax=kind == "index")
    if out is None:
        return False
    g.bind(out)
    return True


def _expand(g: Gen, x: Expr) -> Expr | None:
    """x repeated along some of its size-1 axes (and a new leading one); -1 keeps an axis."""
    target: list[dims.Dim] = []
    grew = False
    for d in x.type.shape:
        if d == 1 and g.ch.coin(0.7):
            target.append(g.ch.between(2, 4))
            grew = True
        else:
            # -1 also for a dim the source cannot spell (a conv's floor of a dynamic dim)
            target.append(-1 if g.ch.coin(0.3) or not printable(d) else d)
    if x.type.rank < 4 and g.ch.coin(0.3):
        target.insert(0, g.ch.between(2, 3))
        grew = True
    if not grew:
        return None
    g.stats.features["expand"] += 1
    return g.apply("expand", {"x": x}, {"shape": tuple(target)})


def _slice(g: Gen, x: Expr, syntax: bool) -> Expr | None:
    starts: list[dims.Dim] = []
    ends: list[dims.Dim] = []
    written: list[str] = []
    drop: list[int] = []
    for axis, d in enumerate(x.type.shape):
        if syntax and static(d) and x.type.rank - len(drop) > 1 and g.ch.coin(0.15):
            k = g.ch.below(size(d))  # an integer index: the axis is dropped
            starts.append(k)
            ends.append(k + 1)
            drop.append(axis)
            written.append(str(k))
        elif static(d) and size(d) >= 2 and g.ch.coin(0.6):
            n = size(d)
            a = g.ch.below(n - 1)
            b = g.ch.between(a + 1, n)
            starts.append(a)
            ends.append(b)
            lo = a - n if g.ch.coin(0.2) else a  # a negative bound counts from the end
            written.append(f"{lo}:{b}")
        elif not printable(d) and not syntax:
            return None
        else:
            starts.append(0)
            ends.append(d)
            written.append(":")
    if all(w == ":" for w in written):
        return None
    out = g.apply("slice", {"x": x}, {"starts": tuple(starts), "ends": tuple(ends)})
    if out is not None and drop:
        kept = tuple(d for i, d in enumerate(out.type.shape) if i not in drop)
        out = g.apply("reshape", {"x": out}, {"shape": kept})
    if out is None or not syntax:
        return out
    return replace(out, text=f"{x.text}[{', '.join(written)}]")


def concat(g: Gen) -> bool:
    x = g.pick(lambda e: is_float(e) and e.type.rank >= 1)
    if x is None:
        return False
    axis = g.ch.below(x.type.rank)
    items = [x]
    for _ in range(g.ch.between(1, 2)):
        if g.ch.coin(0.5) and static(x.type.shape[axis]) and all(printable(d) for d in x.type.shape):
            shape = list(x.type.shape)
            shape[axis] = g.ch.between(1, 4)
            items.append(g.new_input(tuple(shape), dtype=x.type.dtype))
        else:
            sibling = g.apply(g.ch.pick(["relu", "tanh", "neg"]), {"x": x})
            if sibling is None:
                return False
            items.append(sibling)
    out = g.apply("concat", {"xs": items}, {"axis": axis - x.type.rank if g.ch.coin(0.2) else axis})
    if out is None:
        return False
    g.bind(out)
    return True


def contiguous(g: Gen) -> bool:
    x = g.pick(lambda e: e.type.rank >= 1)
    out = None if x is None else g.apply("contiguous", {"x": x})
    if out is None:
        return False
    g.bind(out)
    return True


def genstats(g: Gen) -> bool:
    x = g.pick(lambda e: is_float(e) and e.type.rank >= 3 and static(e.type.shape[1]))
    if x is None:
        return False
    x = tame(g, x, 2.0)
    count = 1  # genstats sums over the batch and the spatial axes (its sum of squares is the
    for d in (x.type.shape[0], *x.type.shape[2:]):  # largest: a cast to f16 of it overflowed)
        count *= size(d) if static(d) else 64
    return g.bind_tuple("genstats", x, scale=4.0 * count)


def gather(g: Gen) -> bool:
    """Entries of a value along a static axis at integer indices: `arange(m)` (position ids),
    or a new i64 model input whose values the oracles draw inside the axis (token ids)."""
    table = g.pick(lambda e: is_float(e) and any(static(d) and size(d) >= 2 for d in e.type.shape))
    if table is None:
        return False
    axis = g.ch.pick([i for i, d in enumerate(table.type.shape) if static(d) and size(d) >= 2])
    n = size(table.type.shape[axis])
    if g.ch.coin(0.4):
        indices = g.apply("arange", {}, {"n": g.ch.between(1, n)})
        g.stats.features["gather of arange"] += 1
    else:
        batch = g.prog.inputs[0].type.shape[0]
        indices = g.new_input(g.ch.pick([(batch,), (batch, g.ch.between(1, 6))]), dtype="i64")
        g.prog.index_bounds[indices.text] = n
        g.stats.features["gather of an index input"] += 1
    if indices is None or table.type.rank + indices.type.rank > 8:
        return False
    out = g.apply("gather", {"x": table, "indices": indices}, {"axis": axis})
    if out is None:
        return False
    g.bind(out)
    return True


def cache_write(g: Gen) -> bool:
    """A rank-4 value written into a key/value cache in place (`written`). Drawn less often
    than the others: each one adds two inputs."""
    if not g.ch.coin(0.3):
        return False
    new = g.pick(lambda e: is_float(e) and e.type.rank == 4 and static(e.type.shape[2])
                 and all(printable(d) for d in e.type.shape))
    out = None if new is None else written(g, new)
    if out is None:
        return False
    g.bind(out)
    return True


def written(g: Gen, new: Expr) -> Expr | None:
    """`new` (rank 4, its rows static, every dim one the source can spell: the cache is a model
    input) written into a cache in place: the cache a new model input that nothing else reads
    (E0211 otherwise: it leaves the pool at once), a few rows longer than the value, at a new
    i32 offset input drawn in [0, rows + 2), so some writes reach past the end (those rows are
    dropped, on every backend)."""
    b, h, s, d = new.type.shape
    rows = size(s) + g.ch.between(0, 4)
    cache = g.new_input((b, h, rows, d), dtype=new.type.dtype)
    at = g.new_input((1,), dtype="i32")
    g.pool.remove(cache)
    g.pool.remove(at)
    g.prog.index_bounds[at.text] = rows + 2
    out = g.apply("cache_write", {"cache": cache, "new": new, "at": at})
    if out is not None:
        g.stats.features["cache written in place"] += 1
    return out


def rotary(g: Gen) -> bool:
    """A rotary embedding's rotation as a Llama layer writes it, `x * cos + rotate_half(x) *
    sin` with `rotate_half(x) = concat([-x[.., h:], x[.., :h]], axis=-1)`: the slices, negation,
    concat and products a decoder step runs twice a layer (docs/benchmarks.md, the decoder).
    cos and sin are of a param along the last axis, as the positions' angles are. Sometimes,
    the rotated value and the value rotated (of rank 4) then written into caches."""
    x = g.pick(lambda e: is_float(e) and e.type.rank >= 2 and static(e.type.shape[-1])
               and size(e.type.shape[-1]) % 2 == 0 and all(printable(d) for d in e.type.shape))
    if x is None:
        return False
    n = size(x.type.shape[-1])
    lead = tuple(x.type.shape[:-1])

    def half(lo: int, hi: int) -> Expr | None:
        return g.apply("slice", {"x": x}, {"starts": (*(0,) * len(lead), lo),
                                           "ends": (*lead, hi)})

    angles = g.new_param((n,), role="gain", dtype=x.type.dtype)
    first, second = half(0, n // 2), half(n // 2, n)
    negated = None if second is None else g.apply("neg", {"x": second})
    turned = None if negated is None or first is None else \
        g.apply("concat", {"xs": [negated, first]}, {"axis": -1})
    cos, sin = g.apply("cos", {"x": angles}), g.apply("sin", {"x": angles})
    if turned is None or cos is None or sin is None:
        return False
    a = g.apply("mul", {"a": x, "b": cos}, infix=True)
    b = g.apply("mul", {"a": turned, "b": sin}, infix=True)
    out = None if a is None or b is None else g.apply("add", {"a": a, "b": b}, infix=True)
    if out is None:
        return False
    g.stats.features["rotary"] += 1
    if x.type.rank == 4 and static(x.type.shape[2]) and g.ch.coin(0.4):
        # as a decoder step writes its rotated keys and its values: small steps of no
        # dependency between them, which the runtime runs as one launch (`runtime.batches`)
        k = written(g, out)
        v = None if k is None else written(g, x)
        if v is not None:
            g.stats.features["rotated and plain values cached"] += 1
            g.bind(v)
        out = out if k is None else k
    g.bind(out)
    return True
