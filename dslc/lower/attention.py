"""The query lengths of cuDNN's padding mask: an sdpa with `kv_len` reads `q_len` too, the
frontend refusing one without the other. Every query of the block is valid, so `q_len` is Sq for
each batch row: `full([B], Sq, i32)`, one value for every sdpa of that shape (the layers of a
decoder share it). It is a load-time value where B and Sq are static, else a fallback kernel
fills it at each call (on the device: a CUDA graph records it). Not a compile-time constant in
the cuDNN graph: the frontend takes the lengths only as tensors, and a pass-by-value scalar is
[1, 1, 1, 1], where it needs [B, 1, 1, 1].

The key lengths cuDNN reads are `min(kv_len, Skv)`, a value of their own: the frontend reads
them as contiguous `[B, 1, 1, 1]` (a strided view of the caller's lengths was read as if it
were contiguous), and a length past the keys there are (a position past the end of a cache)
would have it read past them; the reference treats such a length as every key, as the clamp
does."""

from __future__ import annotations

from dataclasses import replace

from dslc.core.dims import Dim, format_dim
from dslc.core.types import TensorType
from dslc.ir.graph import Attrs, Node
from dslc.lower.rewrite import Rewriter


def padding_mask_lengths(rw: Rewriter, node: Node) -> str | None:
    if node.op != "sdpa":
        return None
    operands = tuple(node.attrs.get("operands", ()))  # no `kv_len` without them
    if "kv_len" not in operands:  # the pass runs once: no sdpa has `q_len` before it
        return None
    q = rw.node(node.inputs[operands.index("q")]).type
    batch, sq = q.shape[0], q.shape[2]
    key = f"q_len.{format_dim(batch)}x{format_dim(sq)}"
    if key not in rw.memo:
        rw.memo[key] = _full(rw, node, batch, sq, f"{node.name}.q_len")
    k = rw.node(node.inputs[operands.index("k")]).type
    inputs = list(node.inputs)
    at = operands.index("kv_len")
    inputs[at] = _within(rw, node, inputs[at], batch, k.shape[2])
    attrs = Attrs({**node.attrs, "operands": (*operands, "q_len")})
    return rw.emit(replace(node, inputs=(*inputs, rw.memo[key]), attrs=attrs))


def _within(rw: Rewriter, node: Node, lengths: str, batch: Dim, keys: Dim) -> str:
    """`min(lengths, full([B], Skv, i32))`, made once per lengths and key count."""
    key = f"kv_len.{lengths}.{format_dim(keys)}"
    if key not in rw.memo:
        limit = _full(rw, node, batch, keys, f"{node.name}.kv_max")
        rw.memo[key] = rw.new("min", (lengths, limit), {}, TensorType("i32", (batch,)), node,
                              f"{node.name}.kv_len")
    return rw.memo[key]


def _full(rw: Rewriter, node: Node, batch: Dim, value: Dim, name: str) -> str:
    """`full([B], value, i32)`: one length per batch row."""
    return rw.new("full", (), {"shape": (batch,), "value": value, "dtype": "i32"},
                  TensorType("i32", (batch,)), node, name)
