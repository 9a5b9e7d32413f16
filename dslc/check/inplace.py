"""What writing in place asks of the whole model (`cache_write`, `dslc.ops.cache`): the input it
writes is read by nothing else. Another reader would see the new rows or the old ones
depending on where the schedule puts it, and a second write would make the first one's result
the second's; an output exporting the input would be the written buffer, not the value the
source names. The type rule sees one call; this sees every use, once the model is elaborated."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from dslc.check.context import Context
from dslc.diag.diagnostic import Label
from dslc.ir.graph import IN_PLACE, Node


def check_in_place(ctx: Context, nodes: Sequence[Node], exported: Iterable[tuple[str, str]],
                   ) -> None:
    """E0211 for each model input written in place that another op, write or output reads.
    `exported`: (output name, the value it exports)."""
    by_value: dict[str, list[tuple[str, Node | None]]] = {}
    for node in nodes:
        for i in node.inputs:
            by_value.setdefault(i, []).append((node.op, node))
    for name, value in exported:
        by_value.setdefault(value, []).append((f"output `{name}`", None))
    for node in nodes:
        if node.op not in IN_PLACE:
            continue
        cache = node.inputs[0]
        others = [(what, n) for what, n in by_value.get(cache, []) if n is not node]
        if not others:
            continue
        what, other = others[0]
        shown = what if other is None else f"`{what}`"
        labels = (Label(other.span, f"{shown} reads it too"),) if other is not None else ()
        ctx.report("E0211", f"`{cache}` is written in place by `cache_write` and read by "
                   f"{shown} as well", node.span, "written in place here", labels=labels,
                   notes=("the write changes the caller's buffer when its step runs, so any "
                          "other reader would see the old rows or the new ones depending on "
                          "the schedule",),
                   help=("read the result of `cache_write` instead: it is the cache with the "
                         "new rows",))
