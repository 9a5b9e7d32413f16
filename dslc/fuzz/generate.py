"""`generate(choices) -> Program`: dims and inputs first, then a run of op families, then the
outputs (values nothing else reads). A plain function of its choices: the same choices give the
same program, fewer or smaller choices a smaller one."""

from __future__ import annotations

from dslc.core import dims
from dslc.fuzz import blocks, families, shapes
from dslc.fuzz.choices import Choices
from dslc.fuzz.program import Program
from dslc.fuzz.state import Gen, Stats

# Drawn by index, so a shrunk choice moves towards the first (simplest) families.
FAMILIES = [families.unary, families.binary, shapes.view, families.matmul, families.conv,
            families.reduce, families.norm, families.pool, shapes.concat, families.unary,
            families.binary, families.compare_select, families.bias_scale, families.cast,
            families.attention, blocks.std_call, blocks.block, shapes.contiguous, shapes.genstats,
            shapes.view, families.conv, families.matmul, shapes.gather, shapes.cache_write,
            shapes.rotary, families.gated]
MAX_OPS = 40


def generate(ch: Choices, stats: Stats | None = None, max_ops: int = MAX_OPS) -> Program:
    g = Gen(ch, stats)
    g.stats.programs += 1
    g.stats.features[f"io={g.precision.io}"] += 1
    if ch.coin(0.3):
        g.prog.layout = "NHWC"
        g.stats.features["layout NHWC"] += 1
    batch: dims.Dim = g.dyn_dim("N", 1, 6) if ch.coin(0.5) else ch.between(1, 3)
    length: dims.Dim | None = g.dyn_dim("L", 8, 24, 8) if ch.coin(0.15) else None
    for d in g.prog.dims:
        g.stats.features[f"dynamic dim {d.name}"] += 1
    for _ in range(ch.between(1, 2)):
        _input(g, batch, length)
    # One "go on?" choice per op (a shrunk sequence stops early): 14 ops on average, 1 to max_ops.
    added = attempts = 0
    while added < max_ops and attempts < 4 * max_ops:
        start = ch.begin()
        if added and not ch.coin(0.93):
            break
        attempts += 1
        if ch.pick(FAMILIES)(g):
            added += 1
        ch.end(start)
    _outputs(g)
    if ch.coin(0.1):
        g.prog.keeps_unread_inputs = True
        if set(i.name for i in g.prog.inputs) - g.prog.live():
            g.stats.features["an input no output reads"] += 1
    return g.prog


def _input(g: Gen, batch: dims.Dim, length: dims.Dim | None) -> None:
    kind = g.ch.pick(["image", "seq", "flat"])
    if kind == "image":
        h = length if length is not None and g.ch.coin(0.5) else g.ch.between(4, 12)
        tag = "NHWC" if not g.prog.layout and g.ch.coin(0.3) else ""
        g.new_input((batch, g.ch.pick([3, 4, 8, 16, 1]), h, g.ch.between(4, 12)), tag)
    elif kind == "seq":
        s = length if length is not None and g.ch.coin(0.5) else g.ch.pick([4, 6, 8])
        g.new_input((batch, s, g.ch.pick([16, 8, 32, 24])))
    else:
        g.new_input((batch, g.ch.pick([16, 4, 64, 10])),
                    dtype="f32" if g.ch.coin(0.1) else "")  # sometimes not the model's io


def _outputs(g: Gen) -> None:
    read = {n for s in g.prog.stmts for n in s.reads}
    computed = [e for e in g.pool if e.op != "input"]
    leaves = [e for e in computed if e.text not in read]
    if not leaves:
        relu = g.apply("relu", {"x": g.pool[0]})
        assert relu is not None
        leaves = [g.bind(relu)]
    chosen = leaves[::-1][:1 + g.ch.below(min(3, len(leaves)))]
    if g.ch.coin(0.1):  # an output that another op also reads
        inner = [e for e in computed if e.text in read]
        if inner:
            chosen.append(g.ch.pick(inner))
    for i, e in enumerate(chosen):
        typ = ""
        if e.type.dtype == "bool":  # a mask returned as one (else it is stored as 0s and 1s)
            typ = ": bool"
            g.stats.features["mask output"] += 1
        elif e.type.dtype in ("f32", "f16", "bf16") and g.ch.coin(0.15):  # another dtype
            typ = ": " + g.ch.pick([d for d in ("f32", "f16", "bf16") if d != e.type.dtype])
            g.stats.features["output dtype written"] += 1
        g.prog.outputs.append((f"o{i + 1}", e.text, typ))
