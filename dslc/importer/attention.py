"""Attention as the exporters write it out, found and written as the language's `sdpa`:
`softmax(q k^T * scale + bias) v`, the scale a product of numbers on the scores or on q and k
(the torch.export-based exporter splits it into a square root on each), the bias an additive
mask (`[B, 1, 1, S]` padding) or a causal mask (`where(tril[:S, :S], scores, min)`, GPT-2's),
k^T a transpose of k however many reshapes and transposes spell it."""

from __future__ import annotations

import math
from itertools import count

import numpy as np

from dslc.core import dims
from dslc.core.dims import DimEnv
from dslc.importer.graph import Arg, Lit, Op
from dslc.importer.patterns import Recogniser, param

BIG = float(np.finfo(np.float32).max) / 2  # a score filled with less than -BIG is masked out


def view_transpose(x: Op, perm: list[int]) -> Op:
    """`x` with its axes permuted, a transpose of a transpose composed into one."""
    if x.op == "transpose":
        perm = [x.attrs["perm"][p] for p in perm]
        x = x.args[0]  # type: ignore[assignment]
    if perm == list(range(x.rank)):
        return x
    return Op("transpose", [x], {"perm": perm}, x.dtype, tuple(x.shape[p] for p in perm),
              x.origin)


def scaled(r: Recogniser, x: Arg) -> tuple[Arg, float]:
    """`x` as `y * c`: products and quotients by numbers peeled off (those only `x` reads)."""
    factor = 1.0
    while isinstance(x, Op) and x.op in ("mul", "div") and r.single(x):
        a, b = x.args
        if isinstance(b, Lit):
            factor = factor * float(b.value) if x.op == "mul" else factor / float(b.value)
            x = a
        elif isinstance(a, Lit) and x.op == "mul":
            factor *= float(a.value)
            x = b
        else:
            break
    return x, factor


def sample_values(symbols: set[str]) -> dict[str, int]:
    """Distinct sizes for the symbolic dims, unlike the static sizes models use."""
    primes = (p for p in count(7) if all(p % d for d in range(2, p)))
    return {s: next(primes) for s in sorted(symbols)}


def as_transpose(x: Op, env: DimEnv) -> tuple[Op, list[int]] | None:
    """`x` as `transpose(base, perm)` where a chain of reshapes and transposes amounts to one
    (found by running the chain on the positions of a sample tensor)."""
    chain: list[Op] = []
    y = x
    while y.op in ("reshape", "transpose"):
        chain.append(y)
        y = y.args[0]  # type: ignore[assignment]
    symbols = {s for op in [y, *chain] for d in op.shape if isinstance(d, dims.Poly)
               for s in d.symbols()}
    values = sample_values(symbols - set(env.floors))
    for depth in range(len(chain), 0, -1):
        base = chain[depth - 1].args[0]
        assert isinstance(base, Op)
        try:
            shape = [dims.evaluate(d, values, env) for d in base.shape]
            a = np.arange(math.prod(shape)).reshape(shape)
            out = a
            for op in reversed(chain[:depth]):
                if op.op == "transpose":
                    out = out.transpose(op.attrs["perm"])
                else:
                    out = out.reshape([dims.evaluate(d, values, env) for d in op.shape])
        except (KeyError, ValueError):
            return None
        perm = _permutation(a, out)
        if perm is not None:
            return base, perm
    return None


def _permutation(a: np.ndarray, out: np.ndarray) -> list[int] | None:
    """The perm with `a.transpose(perm) == out`, if there is one."""
    if out.ndim != a.ndim or sorted(out.shape) != sorted(a.shape) or out.size == 0:
        return None
    strides = [int(np.prod(a.shape[i + 1:])) for i in range(a.ndim)]
    perm, free = [], list(range(a.ndim))
    for axis in range(out.ndim):
        unit = [0] * out.ndim
        if out.shape[axis] > 1:
            unit[axis] = 1
            step = int(out[tuple(unit)] - out[(0,) * out.ndim])
            match = [j for j in free if strides[j] == step and a.shape[j] == out.shape[axis]]
        else:
            match = [j for j in free if a.shape[j] == 1]
        if not match:
            return None
        perm.append(match[0])
        free.remove(match[0])
    return perm if np.array_equal(a.transpose(perm), out) else None


def _key_of(kt: Arg, env: DimEnv) -> Op | None:
    """k from k^T (rank 4, the last two axes swapped)."""
    if not isinstance(kt, Op) or kt.rank != 4:
        return None
    found = as_transpose(kt, env) if kt.op in ("reshape", "transpose") else None
    if found is None:
        return None
    base, perm = found
    return view_transpose(base, [perm[0], perm[1], perm[3], perm[2]])


def _causal(mask: Arg, rows: dims.Dim, cols: dims.Dim) -> bool:
    """A boolean mask keeping each query's keys up to its own: a lower triangle of ones, or the
    top-left corner of one, as many rows as columns."""
    if not isinstance(mask, Op) or rows != cols:
        return False
    table = param(mask)
    if mask.op == "index":
        table = param(mask.args[0])
        spec = list(mask.attrs["spec"]) + [None] * 4
        ranges = spec[mask.args[0].rank - 2:mask.args[0].rank]  # type: ignore[union-attr]
        if any(not (isinstance(s, tuple) and s[0] == 0) for s in ranges) or \
                any(s is not None for s in spec[:mask.args[0].rank - 2]):  # type: ignore[union-attr]
            return False
    if table is None or table.dtype != "bool" or table.rank < 2:
        return False
    array = table.weights[""]
    n = array.shape[-1]
    if array.shape[-2] != n or any(d != 1 for d in array.shape[:-2]):
        return False
    return bool(np.array_equal(array.reshape(n, n), np.tril(np.ones((n, n), bool))))


def _peel_mask(r: Recogniser, scores: Arg) -> tuple[Arg, Arg | None, bool]:
    """The scores without their mask: (scores, additive bias, causal)."""
    if not isinstance(scores, Op) or not r.single(scores):
        return scores, None, False
    if scores.op == "select":
        mask, kept, fill = scores.args
        if isinstance(fill, Lit) and float(fill.value) < -BIG and isinstance(kept, Op) and \
                _causal(mask, kept.shape[-2], kept.shape[-1]):
            return kept, None, True
    if scores.op == "add":
        for core, bias in (scores.args, scores.args[::-1]):
            inner, _ = scaled(r, core)
            if isinstance(inner, Op) and inner.op == "matmul" and isinstance(bias, Op):
                return core, bias, False
    return scores, None, False


def _head_dim(d: dims.Dim) -> bool:
    """What `sdpa` takes (multiples of 8 up to 256); any other is left as matmuls."""
    return isinstance(d, int) and d % 8 == 0 and d <= 256


def sdpa(r: Recogniser, op: Op) -> Op | None:
    if op.op != "matmul" or op.rank != 4:
        return None
    probs, v = op.args
    if not isinstance(probs, Op) or probs.op != "softmax" or not r.single(probs):
        return None
    scores, bias, causal = _peel_mask(r, probs.args[0])
    core, scale = scaled(r, scores)
    if not isinstance(core, Op) or core.op != "matmul" or not r.single(core):
        return None
    q, a = scaled(r, core.args[0])
    kt, b = scaled(r, core.args[1])
    k = _key_of(kt, r.env)
    if not isinstance(q, Op) or k is None or not isinstance(v, Op) or q.rank != 4:
        return None
    (batch, heads, _, dk), (_, kv_heads, keys, _) = q.shape, k.shape
    if k.shape[0] != batch or k.shape[3] != dk or v.shape[:3] != k.shape[:3] or \
            not _head_dim(dk) or not _head_dim(v.shape[3]) or \
            dims.div_exact(heads, kv_heads, r.env) is None:
        return None
    total = scale * a * b
    default = np.float32(1 / math.sqrt(dk)) if isinstance(dk, int) else None
    attrs = {"scale": None if np.float32(total) == default else total,
             "causal": True if causal else None}
    args: list[Arg] = [q, k, v] if bias is None else [q, k, v, bias]
    del keys
    return Op("sdpa", args, attrs, op.dtype, op.shape, op.origin, onnx_name=op.onnx_name)
