"""The fusion pattern table, in priority order: an anchor op, the pointwise ops that may follow
it inside one cuDNN graph, and a support check that names what cuDNN cannot take. Which ops are
anchors and epilogues is the op table's word (`OpDef.fusion`); a pattern names roles, not ops."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from dslc.core.types import INTS, Layout
from dslc.ir.graph import Node
from dslc.ir.views import same_memory
from dslc.ops import OPS
from dslc.ops.opdef import FusionRole


def _ops(role: FusionRole, family: str | None = None) -> frozenset[str]:
    """The ops of the op table with this fusion role (and family)."""
    return frozenset(op.name for op in OPS.values()
                     if op.fusion == role and family in (None, op.family))


# Pointwise ops that cuDNN runs as an epilogue (its pointwise modes, `bias`, `scale`, identity).
EPILOGUE = _ops("epilogue")
FALLBACK_REASONS = {
    "maxpool": "cuDNN's resample node (pooling) is not exposed by the Python frontend; "
               "a fallback kernel runs it",
    "avgpool": "cuDNN's resample node (pooling) is not exposed by the Python frontend; "
               "a fallback kernel runs it",
    "upsample": "cuDNN's resample node is not exposed by the Python frontend; "
                "a fallback kernel runs it",
    "concat": "a concatenation runs on its own: it copies each operand its producer did not "
              "write in place",
    "genstats": "genstats runs as its own graph",
    "contiguous": "a copy into a new layout runs on its own",
    "gather": "cuDNN's graph API has no gather; a fallback kernel runs it",
    "arange": "cuDNN's graph API makes no index sequence; a fallback kernel runs it",
    "full": "cuDNN's graph API makes no constant tensor; a fallback kernel fills it",
    "cache_write": "a write into the caller's cache in place, at an offset read on the device: "
                   "a fallback kernel",
}

Check = Callable[[list[Node]], str | None]


@dataclass(frozen=True)
class FusionPattern:
    name: str
    anchors: frozenset[str]
    epilogue: frozenset[str]
    check: Check  # None when cuDNN takes the group, else the reason it cannot
    # ops that may end the chain with a larger result than its value: the group then computes
    # at that size (one kernel: `compile.stage` never gives it to cuDNN)
    tails: frozenset[str] = frozenset()


def _float_io(nodes: list[Node]) -> str | None:
    for n in nodes:
        if n.type.dtype in ("i64", "u8"):
            return f"cuDNN graphs do not take {n.type.dtype} tensors (%{n.name})"
    return None


def _pointwise(nodes: list[Node]) -> str | None:
    """A chain's broadcast tail writes a float: an integer broadcast (a cache's lengths over the
    batch) runs on its own, exactly (`compile.stage`: integer arithmetic in a kernel)."""
    last = nodes[-1]  # (an expand anchors no chain: it is a tail or alone)
    if last.op == "expand" and last.type.dtype in INTS:
        return f"an integer broadcast (%{last.name}, {last.type.dtype}) runs on its own, exactly"
    return _float_io(nodes)


def _one_memory_order(nodes: list[Node]) -> str | None:
    """An epilogue writes its result in the anchor's memory order. On the H200, cuDNN computed
    conv groups whose epilogue wrote another order than the convolution's (an NCHW output after
    an NHWC conv) wrongly, in f32 as in f16 (generated programs found it): the op that changes
    the order runs in a graph of its own."""
    order = nodes[0].type.layout
    for n in nodes[1:]:
        if n.type.layout is not None and order is not None and \
                not same_memory(n.type.shape, n.type.layout.order, order.order):
            return (f"%{n.name} is stored {_order(n.type.layout)}, unlike %{nodes[0].name} "
                    f"({_order(order)})")
    return _float_io(nodes)


def _order(layout: Layout) -> str:
    return "row-major" if layout.is_row_major else str(layout)


def _matmul_epilogue(nodes: list[Node]) -> str | None:
    anchor = nodes[0]
    if anchor.type.rank > 4:
        return f"cuDNN matmul takes at most 3 batch axes; %{anchor.name} has rank {anchor.type.rank}"
    return _one_memory_order(nodes)


PATTERNS: tuple[FusionPattern, ...] = (
    # Attention: one flash-attention graph; cuDNN SDPA takes no epilogue.
    FusionPattern("sdpa", _ops("anchor", "attention"), frozenset(), _float_io),
    # conv + bias + scale + residual add + activation: the classic conv epilogue.
    FusionPattern("conv_epilogue", _ops("anchor", "conv"), EPILOGUE, _one_memory_order),
    # matmul + bias + activation (+ residual add): projections and MLPs.
    FusionPattern("matmul_epilogue", _ops("anchor", "matmul"), EPILOGUE, _matmul_epilogue),
    # norm + pointwise: layernorm / rmsnorm / instancenorm / batchnorm and what follows.
    FusionPattern("norm_epilogue", _ops("norm"), EPILOGUE, _one_memory_order),
    # reduction + pointwise on the reduced value.
    FusionPattern("reduce_epilogue", _ops("reduce"), EPILOGUE, _one_memory_order),
    # what is left of pointwise chains: one graph per chain; a chain that ends in an expand
    # is one kernel writing the broadcast result (BERT's padding mask: cast, 1 - m, * -65504,
    # broadcast over heads and queries, 3 steps before).
    FusionPattern("pointwise", EPILOGUE, EPILOGUE, _pointwise, frozenset({"expand"})),
)
