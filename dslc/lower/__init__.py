"""Lowering: the checked model's op graph -> the canonical IR that fusion and cuDNN take.

Each pass is a plain function with the reason it exists; they run in this order, and the tests
run the IR verifier after each one.
"""

from __future__ import annotations

from collections.abc import Callable

from dslc.core.dims import DimEnv
from dslc.ir.graph import Graph
from dslc.lower.attention import padding_mask_lengths
from dslc.lower.batchnorm import batchnorm_to_affine, fold_batchnorm
from dslc.lower.canonical import (
    expand_norm_reductions,
    fold_scalars,
    gather_of_arange,
    load_time,
    make_bias_rule,
    remove_dead,
    reshape_before_pointwise,
    residual_before_bias,
)
from dslc.lower.concat import pointwise_through_concat
from dslc.lower.packing import pack_sibling_matmuls
from dslc.lower.quantize import quantize
from dslc.lower.rewrite import Rule, rewrite
from dslc.lower.upconv import transposed_conv_as_matmul
from dslc.lower.views import (
    assign_layouts,
    full_size_attention_bias,
    make_views,
    weights_like_inputs,
)

# A pass takes the graph and the dims' ranges (which most ignore; None: no range known).
Pass = Callable[[Graph, DimEnv | None], Graph]


def _each(rule: Rule) -> Pass:  # pragma: no mutate block (runs at import, building PASSES)
    def run(graph: Graph, env: DimEnv | None = None) -> Graph:
        return rewrite(graph, rule, env)

    run.__name__ = rule.__name__
    run.__doc__ = rule.__doc__
    return run


def _graph_only(fn: Callable[[Graph], Graph]) -> Pass:  # pragma: no mutate block (as _each)
    def run(graph: Graph, env: DimEnv | None = None) -> Graph:
        return fn(graph)

    run.__name__ = fn.__name__
    run.__doc__ = fn.__doc__
    return run


def bias_from_add(graph: Graph, env: DimEnv | None = None) -> Graph:
    """x + b with a load-time channel vector b -> bias_add (and x * b -> scale_mul)."""
    return rewrite(graph, make_bias_rule(graph))


def quantize_fp8(graph: Graph, env: DimEnv | None = None) -> Graph:
    """The matmuls, convolutions and attentions the source asks to compute in fp8 read
    quantised operands."""
    return quantize(graph)


PASSES: list[Pass] = [
    # BN after a conv with a param weight folds into the conv's weight and a bias (load time).
    _graph_only(remove_dead),
    _each(fold_batchnorm),
    # The other BNs: a per-channel scale and shift, also computed at load time.
    _each(batchnorm_to_affine),
    # L1 and L2 reductions as a sum of |x| or of x * x: cuDNN's reduction has no such modes.
    _each(expand_norm_reductions),
    # Channel-vector adds and multiplies as bias / scale: what conv and matmul epilogues take.
    bias_from_add,
    # A residual added before the conv's bias: the order cuDNN's fused conv kernels take.
    _each(residual_before_bias),
    # x + 0, x * 1, same-dtype casts, scalar arithmetic: nothing to run.
    _each(fold_scalars),
    # The rows 0..n-1 of a table picked by `arange(n)`: a slice, read in place.
    _each(gather_of_arange),
    # A cast of an input, reshaped: the input reshaped (a view), then cast with what follows.
    _each(reshape_before_pointwise),
    # fp8: quantised operands (weights at load time, after batchnorm folding), descaled results.
    quantize_fp8,
    # A transposed conv whose kernel is its stride (a learned upsample): a matmul per kernel row,
    # each writing its rows of the channels-last output in place (cuDNN's conv_dgrad ran it at
    # 25x its memory bound).
    _each(transposed_conv_as_matmul),
    # Projections of one activation (q, k, v) as one matmul by weights joined at load time.
    _graph_only(pack_sibling_matmuls),
    # A pointwise op on a concatenation of two parts runs on each part, in its group, and no
    # step reads the concatenation back (rotary embeddings' `rotate_half`).
    _each(pointwise_through_concat),
    # Reshape / transpose / slice chains read their base in place: no copy, no kernel.
    _each(make_views),
    _graph_only(remove_dead),
    # An attention bias broadcast over batch or heads is read at full size (cuDNN's sdpa).
    _each(full_size_attention_bias),
    # cuDNN's padding mask takes the queries' lengths beside the keys' (`kv_len`): Sq per row.
    _each(padding_mask_lengths),
    # Every materialised value gets a layout; views get strides (or a copy where needed).
    # An op whose rule needs a memory order its operand lacks reads a row-major copy of it.
    _each(assign_layouts),
    # Convs on channels-last data read channels-last weights (copied once, at load time).
    _each(weights_like_inputs),
    # With layouts known, a copy into the layout a value already has is nothing to run.
    _each(fold_scalars),
    _graph_only(remove_dead),
]


def lower(graph: Graph, after_each: Callable[[str, Graph], None] | None = None,
          env: DimEnv | None = None) -> Graph:
    """Run the passes in order; `after_each(name, graph)` sees every intermediate graph."""
    for p in PASSES:
        graph = p(graph, env)
        if after_each is not None:
            after_each(p.__name__, graph)
    return graph


__all__ = ["PASSES", "load_time", "lower"]
