"""The built-in ops: one `OpDef` per op, one module per family; `OPS` maps name -> OpDef."""

from __future__ import annotations

from dslc.ops import attention, cache, conv, index, layout, matmul, norm, pointwise, pool, reduce
from dslc.ops.opdef import OpDef

OPS: dict[str, OpDef] = {
    op.name: op
    for family in (conv, matmul, pointwise, norm, reduce, attention, pool, layout, index,
                   cache)
    for op in family.OPS
}
