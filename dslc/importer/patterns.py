"""The standard library's layers found in the imported graph: a convolution with
its weight (and bias) is `conv2d`, a batchnorm of four params `batchnorm2d`, a matrix product
with a transposed weight (and a bias) `linear`, a layernorm of two params over the last axis
`layer_norm`, a gather from a table `embedding`. Each becomes an instance whose path is the
prefix its initializers share (`layer1.0.conv1` for `layer1.0.conv1.weight`), else the module
the exporter recorded for its node, so the params keep PyTorch's names."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from dslc.core.dims import DimEnv
from dslc.importer.emit import topological, uses
from dslc.importer.graph import Arg, Op
from dslc.importer.shapes import product


def param(a: Arg | None) -> Op | None:
    return a if isinstance(a, Op) and a.op == "param" else None


def instance_path(params: dict[str, Op], scope: str | None) -> str | None:
    """The path of an instance holding `params` (by the def's name for each): the prefix of the
    first param named `<prefix>.<its name in the def>`, else the module the node came from."""
    for leaf, p in params.items():
        if p.path and p.path.endswith("." + leaf):
            return p.path[: -len(leaf) - 1]
    return scope


Rule = Callable[["Recogniser", Op], "Op | None"]


class Recogniser:
    """One pass over the graph, operands before their readers, each op tried against the rules;
    a rule replaces an op whose inner operations nobody else reads."""

    def __init__(self, outputs: list[Op], rules: list[Rule], env: DimEnv) -> None:
        self.rules = rules
        self.env = env
        self.order = topological(outputs)
        self.count = uses(self.order)
        self.replaced: dict[int, Op] = {}
        self.params: dict[int, dict[str, Op]] = {}  # an instance -> the params it was made of

    def run(self) -> None:
        for op in self.order:
            op.args = [self.replaced.get(id(a), a) if isinstance(a, Op) else a for a in op.args]
            for rule in self.rules:
                new = rule(self, op)
                if new is not None:
                    self.replaced[id(op)] = new
                    self.count[id(new)] = self.count.get(id(op), 0)
                    break

    def final(self, op: Op) -> Op:
        return self.replaced.get(id(op), op)

    def single(self, op: Op) -> bool:
        return self.count.get(id(op), 0) == 1

    def instance(self, op: str, like: Op, x: list[Arg], attrs: dict[str, object],
                 params: dict[str, Op], arrays: dict[str, np.ndarray] | None = None) -> Op:
        """A call of the std def `op` holding `params` (their arrays, or `arrays`)."""
        weights = arrays or {k: p.weights[""] for k, p in params.items()}
        new = Op(op, list(x), attrs, like.dtype, like.shape, like.origin, weights,
                 instance_path(params, like.origin.scope if like.origin else None),
                 like.onnx_name)
        self.params[id(new)] = params
        return new

    def with_bias(self, base: Op, bias: Arg, like: Op) -> Op | None:
        """`base` (an instance without bias) given `bias`, a param of one value per output."""
        b = param(bias)
        if b is None or not self.single(base) or base.attrs.get("has_bias") is not False or \
                b.shape != (base.attrs["out"],):
            return None
        params = {**self.params[id(base)], "bias": b}
        weights = {**base.weights, "bias": b.weights[""]}
        return self.instance(base.op, like, base.args, {**base.attrs, "has_bias": True}, params,
                             weights)


def conv2d(r: Recogniser, op: Op) -> Op | None:
    if op.op != "conv":
        return None
    w = param(op.args[1])
    if w is None or w.rank != 4 or w.shape[2] != w.shape[3] or op.attrs.get("pre_pad") is not None:
        return None
    if any(isinstance(op.attrs.get(k), list) for k in ("stride", "pad", "dilation")):
        return None
    attrs = {"out": w.shape[0], "k": w.shape[2], "stride": op.attrs.get("stride") or 1,
             "pad": op.attrs.get("pad") or 0, "dilation": op.attrs.get("dilation") or 1,
             "groups": op.attrs.get("groups") or 1, "has_bias": False}
    return r.instance("conv2d", op, [op.args[0]], attrs, {"weight": w})


def conv2d_bias(r: Recogniser, op: Op) -> Op | None:
    if op.op != "bias_add" or not isinstance(op.args[0], Op) or op.args[0].op != "conv2d":
        return None
    return r.with_bias(op.args[0], op.args[1], op)


def batchnorm2d(r: Recogniser, op: Op) -> Op | None:
    if op.op != "batchnorm" or op.rank != 4:
        return None
    x, mean, var, scale, bias = op.args
    ps = {"weight": param(scale), "bias": param(bias), "running_mean": param(mean),
          "running_var": param(var)}
    if any(p is None or p.rank != 1 for p in ps.values()):
        return None
    arrays = {k: p.weights[""].astype(np.float32) for k, p in ps.items() if p is not None}
    return r.instance("batchnorm2d", op, [x], {"eps": op.attrs["eps"]},
                      {k: p for k, p in ps.items() if p is not None}, arrays)


def linear(r: Recogniser, op: Op) -> Op | None:
    """x W^T with W a named param (written transposed), or with an unnamed 2-D constant: the
    exporter's own transpose of a Linear's weight (which the optimiser names `val_4`)."""
    if op.op != "matmul" or op.args[1].__class__ is not Op:
        return None
    w = op.args[1]
    assert isinstance(w, Op)
    if w.op == "transpose" and param(w.args[0]) is not None and w.attrs["perm"] == [1, 0] \
            and r.single(w):
        p = param(w.args[0])
        assert p is not None
        array = p.weights[""]
    elif param(w) is not None and w.rank == 2 and w.path is None:
        p = w
        array = np.ascontiguousarray(w.weights[""].T)
    else:
        return None
    x = op.args[0]
    if not isinstance(x, Op) or x.rank < 1:
        return None
    return r.instance("linear", op, [x], {"out": array.shape[0], "has_bias": False},
                      {"weight": p}, {"weight": array})


def linear_bias(r: Recogniser, op: Op) -> Op | None:
    if op.op != "add":
        return None
    for base, bias in (op.args, op.args[::-1]):
        if isinstance(base, Op) and base.op == "linear":
            new = r.with_bias(base, bias, op)
            if new is not None:
                return new
    return None


def layer_norm(r: Recogniser, op: Op) -> Op | None:
    if op.op != "layernorm":
        return None
    x, scale, bias = op.args
    w, b = param(scale), param(bias)
    if w is None or b is None or w.rank != 1 or b.rank != 1:
        return None
    return r.instance("layer_norm", op, [x], {"eps": op.attrs["eps"]}, {"weight": w, "bias": b})


def embedding(r: Recogniser, op: Op) -> Op | None:
    if op.op != "gather" or op.attrs.get("axis") is not None:
        return None
    table = param(op.args[0])
    if table is None or table.rank != 2:
        return None
    return r.instance("embedding", op, [op.args[1]],
                      {"num": table.shape[0], "dim": table.shape[1]}, {"weight": table})


def unflattened(r: Recogniser, op: Op) -> Op | None:
    """`reshape(f(reshape(x, [prod(L), K])), [*L, N])` for an f that works row by row (a
    matrix product with a 2-D weight, its bias, a `linear`): `f(x)` on `[*L, K]` directly, as
    the module was written (exporters flatten the rows for ONNX's 2-D Gemm)."""
    if op.op != "reshape":
        return None
    chain, inner = [], op.args[0]
    while isinstance(inner, Op) and r.single(inner) and inner.op in ("matmul", "add", "linear"):
        chain.append(inner)
        inner = inner.args[0]
    if not chain or not isinstance(inner, Op) or inner.op != "reshape" or not r.single(inner):
        return None
    x = inner.args[0]
    assert isinstance(x, Op)
    lead, k = op.shape[:-1], inner.shape[-1]
    if inner.shape != (product(lead), k) or product(x.shape) != product(inner.shape):
        return None
    rows = x if x.shape == (*lead, k) else Op("reshape", [x], {"shape": [*lead, k]}, x.dtype,
                                               (*lead, k), inner.origin)
    for step in reversed(chain):
        rest = step.args[1:]
        if step.op == "matmul" and not (isinstance(rest[0], Op) and rest[0].rank == 2):
            return None
        if step.op == "add" and not (isinstance(rest[0], Op) and rest[0].rank <= 1):
            return None
        shape = (*lead, step.shape[-1])
        rows = Op(step.op, [rows, *rest], dict(step.attrs), step.dtype, shape, step.origin,
                  step.weights, step.path, step.onnx_name)
        if step.op == "linear":
            r.params[id(rows)] = r.params[id(step)]
    return rows


RULES: list[Rule] = [conv2d, conv2d_bias, batchnorm2d, linear, linear_bias, layer_norm,
                     embedding, unflattened]
