"""A PyTorch translation of a checked graph: the independent oracle for the reference executor,
and the PyTorch side of benchmarks.

`to_torch(graph, dims)` maps each node of a checked graph (`CheckedModel.graph`, before
`dslc.lower`) to PyTorch calls of its own, written from the ops' documented meaning; it never
calls the numpy references (`dslc.ops`, `dslc.ir.interp`), so the two can be compared. The
result is a `torch.nn.Module` for one binding of the dynamic dims: weights live under their
param paths (`state_dict()` keys are the paths), `load_weights` takes numpy arrays, and
`forward(**inputs)` returns the outputs by name. It traces as plain tensor code, so it can go
through `torch.compile`.

Precision modes:
- "f32": every float value (inputs, params, every result) is float32, whatever its declared
  dtype (f16, bf16 and fp8 roundings are not emulated); integers and bools keep their dtype.
- "declared": each value is stored in its declared dtype; an op runs in its result's float dtype
  (fp8 results compute in f32), PyTorch's kernels choosing their own accumulation. Rank-4 and
  rank-5 inputs declared channels-last are passed on channels-last.

Nothing else in dslc imports this module at import time: torch is a development dependency.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dslc.check import dims as dimlib
from dslc.check.dims import DimEnv, Poly
from dslc.check.types import FP8, is_float
from dslc.ir.graph import Graph, Node

TORCH_DTYPES: dict[str, torch.dtype] = {
    "f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16,
    "f8e4m3": torch.float8_e4m3fn, "f8e5m2": torch.float8_e5m2,
    "i8": torch.int8, "u8": torch.uint8, "i32": torch.int32, "i64": torch.int64,
    "bool": torch.bool,
}
MODES = ("f32", "declared")

Attrs = Mapping[str, Any]
OpFn = Callable[[list[Tensor], Attrs], Tensor]


class TranslationError(Exception):
    """The graph cannot be translated (an op without a mapping, a dim without a value)."""


# ---- pointwise ----------------------------------------------------------------------------------

def _clamp(x: Tensor, a: Attrs) -> Tensor:
    if a["lo"] is None and a["hi"] is None:
        return x
    return torch.clamp(x, a["lo"], a["hi"])


UNARY: dict[str, Callable[[Tensor, Attrs], Tensor]] = {
    "relu": lambda x, a: torch.relu(x),
    "leaky_relu": lambda x, a: F.leaky_relu(x, a["slope"]),
    "clamp": _clamp,
    "gelu": lambda x, a: F.gelu(x),
    "gelu_tanh": lambda x, a: F.gelu(x, approximate="tanh"),
    "silu": lambda x, a: F.silu(x),
    "swish": lambda x, a: x * torch.sigmoid(a["beta"] * x),
    "sigmoid": lambda x, a: torch.sigmoid(x),
    "tanh": lambda x, a: torch.tanh(x),
    "elu": lambda x, a: F.elu(x, a["alpha"]),
    # threshold above any float's log range: softplus exactly, not its linear tail
    "softplus": lambda x, a: F.softplus(x, threshold=1e30),
    "exp": lambda x, a: torch.exp(x),
    "log": lambda x, a: torch.log(x),
    "sqrt": lambda x, a: torch.sqrt(x),
    "rsqrt": lambda x, a: torch.rsqrt(x),
    "reciprocal": lambda x, a: torch.reciprocal(x),
    "erf": lambda x, a: torch.special.erf(x),
    "sin": lambda x, a: torch.sin(x),
    "cos": lambda x, a: torch.cos(x),
    "floor": lambda x, a: torch.floor(x),
    "ceil": lambda x, a: torch.ceil(x),
    "abs": lambda x, a: torch.abs(x),
    "neg": lambda x, a: torch.neg(x),
}

BINARY: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.true_divide,
    "max": torch.maximum, "min": torch.minimum, "pow": torch.pow,
    "cmp_lt": torch.lt, "cmp_le": torch.le, "cmp_gt": torch.gt, "cmp_ge": torch.ge,
    "cmp_eq": torch.eq, "cmp_ne": torch.ne,
}


def _on_axis(b: Tensor, ndim: int, axis: int) -> Tensor:
    """A vector laid along `axis` of a rank-`ndim` tensor; other shapes broadcast as they are."""
    if b.dim() != 1:
        return b
    shape = [1] * ndim
    shape[axis] = b.shape[0]
    return b.reshape(shape)


# ---- convolutions, pooling, resampling ----------------------------------------------------------

_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
_CONV_T = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}
_MAXPOOL = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}
_AVGPOOL = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}
_LINEAR_MODE = {1: "linear", 2: "bilinear", 3: "trilinear"}


def _in_float(fn: OpFn) -> OpFn:
    """PyTorch's window kernels take floats only: integer operands go through float64 (exact
    for the i8 products and sums these ops meet); the caller converts the result back."""
    def run(xs: list[Tensor], a: Attrs) -> Tensor:
        if all(x.is_floating_point() for x in xs):
            return fn(xs, a)
        return fn([x.double() for x in xs], a)

    return run


def _conv(xs: list[Tensor], a: Attrs) -> Tensor:
    x, w = xs
    pre, post = a["pre_pad"], a["post_pad"]
    padding = pre
    if pre != post:  # asymmetric: pad explicitly (F.pad lists the last axis first)
        x = F.pad(x, [p for i in reversed(range(len(pre))) for p in (pre[i], post[i])])
        padding = 0
    return _CONV[x.dim() - 2](x, w, None, a["stride"], padding, a["dilation"], a["groups"])


def _conv_transpose(xs: list[Tensor], a: Attrs) -> Tensor:
    x, w = xs
    return _CONV_T[x.dim() - 2](x, w, None, a["stride"], a["pad"], a["output_pad"], 1,
                                a["dilation"])


def _maxpool(xs: list[Tensor], a: Attrs) -> Tensor:
    # dslc's pads are symmetric and at most half the window, as PyTorch's; floor mode.
    x = xs[0]
    return _MAXPOOL[x.dim() - 2](x, a["window"], a["stride"], a["pad"])


def _avgpool(xs: list[Tensor], a: Attrs) -> Tensor:
    x = xs[0]
    return _AVGPOOL[x.dim() - 2](x, a["window"], a["stride"], a["pad"],
                                 count_include_pad=bool(a["count_pad"]))


def _upsample(xs: list[Tensor], a: Attrs) -> Tensor:
    """Integer factors: nearest repeats each element; bilinear (linear per spatial axis) samples
    at half-pixel centres, clamped at the borders (align_corners=False)."""
    x = xs[0]
    n = x.dim() - 2
    size = [s * f for s, f in zip(x.shape[2:], a["factor"], strict=True)]
    if a["mode"] == "nearest":
        return F.interpolate(x, size=size, mode="nearest")
    return F.interpolate(x, size=size, mode=_LINEAR_MODE[n], align_corners=False)


# ---- norms, attention, reductions ---------------------------------------------------------------

def _named(xs: list[Tensor], a: Attrs, default: tuple[str, ...]) -> dict[str, Tensor]:
    """Operands by parameter name (optional tensors are listed in the `operands` attr)."""
    return dict(zip(a.get("operands") or default, xs, strict=True))


def _batchnorm(xs: list[Tensor], a: Attrs) -> Tensor:
    x, mean, var, scale, bias = xs
    return F.batch_norm(x, mean, var, scale, bias, training=False, eps=a["eps"])


def _layernorm(xs: list[Tensor], a: Attrs) -> Tensor:
    t = _named(xs, a, ("x", "scale", "bias"))
    return F.layer_norm(t["x"], tuple(t["scale"].shape), t["scale"], t["bias"], a["eps"])


def _rmsnorm(xs: list[Tensor], a: Attrs) -> Tensor:
    t = _named(xs, a, ("x", "scale"))
    x, scale = t["x"], t["scale"]
    if hasattr(F, "rms_norm"):
        y = F.rms_norm(x, tuple(scale.shape), scale, a["eps"])
    else:  # older PyTorch: written out
        axes = tuple(range(x.dim() - scale.dim(), x.dim()))
        y = x * torch.rsqrt(x.pow(2).mean(axes, keepdim=True) + a["eps"]) * scale
    return y + t["bias"] if "bias" in t else y


def _instancenorm(xs: list[Tensor], a: Attrs) -> Tensor:
    x, scale, bias = xs
    return F.instance_norm(x, weight=scale, bias=bias, eps=a["eps"])


def _sdpa(xs: list[Tensor], a: Attrs) -> Tensor:
    """Heads of k and v repeated for GQA (query head h reads kv head h // group); `causal` keeps
    key j <= query i (top-left aligned), `window` keeps j > i - window; bias adds to the scores."""
    t = _named(xs, a, ("q", "k", "v"))
    q, k, v = t["q"], t["k"], t["v"]
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    mask: Tensor | None = t.get("bias")
    if a["causal"] or a["window"] is not None:
        i = torch.arange(q.shape[2], device=q.device)[:, None]
        j = torch.arange(k.shape[2], device=q.device)[None, :]
        keep = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device)
        if a["causal"]:
            keep = keep & (j <= i)
        if a["window"] is not None:
            keep = keep & (j > i - a["window"])
        if mask is None:
            mask = keep
        else:
            mask = mask.to(q.dtype).masked_fill(~keep, float("-inf"))
    elif mask is not None:
        mask = mask.to(q.dtype)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=a["scale"])


def _prod(x: Tensor, axes: tuple[int, ...], keep: bool) -> Tensor:
    for axis in sorted(axes, reverse=True):  # torch.prod takes one axis at a time
        x = torch.prod(x, dim=axis, keepdim=keep)
    return x


REDUCE: dict[str, Callable[[Tensor, tuple[int, ...], bool], Tensor]] = {
    "reduce_sum": lambda x, ax, k: torch.sum(x, dim=ax, keepdim=k),
    "reduce_mean": lambda x, ax, k: torch.mean(x, dim=ax, keepdim=k),
    "reduce_max": lambda x, ax, k: torch.amax(x, dim=ax, keepdim=k),
    "reduce_min": lambda x, ax, k: torch.amin(x, dim=ax, keepdim=k),
    "reduce_amax": lambda x, ax, k: torch.amax(x.abs(), dim=ax, keepdim=k),
    "reduce_prod": _prod,
    "reduce_l1": lambda x, ax, k: torch.linalg.vector_norm(x, 1, dim=ax, keepdim=k),
    "reduce_l2": lambda x, ax, k: torch.linalg.vector_norm(x, 2, dim=ax, keepdim=k),
}


def _genstats(xs: list[Tensor], a: Attrs) -> Tensor:
    """Output 0: per-channel sum; output 1: per-channel sum of squares (kept as [1, C, 1...])."""
    x = xs[0]
    axes = (0, *range(2, x.dim()))
    return torch.sum(x if a.get("output", 0) == 0 else x * x, dim=axes, keepdim=True)


# ---- the table ----------------------------------------------------------------------------------

def _table() -> dict[str, OpFn]:
    ops: dict[str, OpFn] = {}
    for name, unary in UNARY.items():
        ops[name] = lambda xs, a, f=unary: f(xs[0], a)  # type: ignore[misc]
    for name, binary in BINARY.items():
        ops[name] = lambda xs, a, f=binary: f(xs[0], xs[1])  # type: ignore[misc]
    ops.update({
        "select": lambda xs, a: torch.where(xs[0].to(torch.bool), xs[1], xs[2]),
        "bias_add": lambda xs, a: xs[0] + _on_axis(xs[1], xs[0].dim(), a["axis"]),
        "scale_mul": lambda xs, a: xs[0] * _on_axis(xs[1], xs[0].dim(), a["axis"]),
        "cast": lambda xs, a: xs[0],  # the result is converted to the node's dtype by the caller
        "contiguous": lambda xs, a: xs[0].contiguous(),
        "conv": _in_float(_conv),
        "conv_transpose": _in_float(_conv_transpose),
        "matmul": lambda xs, a: torch.matmul(xs[0], xs[1]),
        "batchnorm": _batchnorm,
        "layernorm": _layernorm,
        "rmsnorm": _rmsnorm,
        "instancenorm": _instancenorm,
        "sdpa": _sdpa,
        "genstats": _genstats,
        "maxpool": _in_float(_maxpool),
        "avgpool": _in_float(_avgpool),
        "upsample": _upsample,
        "concat": lambda xs, a: torch.cat(xs, dim=a["axis"]),
        "reshape": lambda xs, a: xs[0].reshape(a["shape"]),
        "transpose": lambda xs, a: xs[0].permute(a["perm"]),
        "slice": lambda xs, a: xs[0][tuple(slice(s, e) for s, e in
                                          zip(a["starts"], a["ends"], strict=True))],
    })
    for name, reduce in REDUCE.items():
        ops[name] = lambda xs, a, f=reduce: f(xs[0], tuple(a["axes"]), bool(a["keepdims"]))  # type: ignore[misc]
    return ops


OPS: dict[str, OpFn] = _table()
# Ops whose operands keep their own dtypes (their result dtype says nothing of the math).
_OWN_OPERAND_DTYPES = {"cast", *(name for name in BINARY if name.startswith("cmp_"))}


# ---- the module ---------------------------------------------------------------------------------

def _concrete(value: Any, values: Mapping[str, int], env: DimEnv | None) -> Any:
    if isinstance(value, Poly):
        try:
            return dimlib.evaluate(value, dict(values), env)
        except KeyError as err:
            raise TranslationError(f"no value given for the dim `{err.args[0]}`") from None
    if isinstance(value, tuple):
        return tuple(_concrete(v, values, env) for v in value)
    return value


class _Step:
    """One node, ready to run: its op's function, concrete attrs, and the dtypes it computes in
    (float operands are converted to `compute`; None keeps them) and is stored in."""

    __slots__ = ("attrs", "compute", "dtype", "fn", "free", "inputs", "name", "op", "shape")

    def __init__(self, node: Node, attrs: dict[str, Any], shape: tuple[int, ...], mode: str) -> None:
        self.name, self.op, self.inputs = node.name, node.op, node.inputs
        self.attrs, self.shape = attrs, shape
        self.dtype = storage_dtype(node.type.dtype, mode)
        self.compute: torch.dtype | None = None
        if self.dtype.is_floating_point and node.op not in _OWN_OPERAND_DTYPES:
            self.compute = self.dtype if node.type.dtype not in FP8 else torch.float32
        elif node.type.dtype not in ("bool", *FP8) and node.op not in _OWN_OPERAND_DTYPES:
            self.compute = torch.int64  # integer math exactly, whatever the stored width
        self.fn: OpFn | None = None
        if node.op not in ("input", "param", "scalar"):
            if node.op not in OPS:
                raise TranslationError(f"no PyTorch translation for the op `{node.op}` (node "
                                       f"`{node.name}`); a checked graph is expected")
            self.fn = OPS[node.op]
        self.free: tuple[str, ...] = ()  # values no later step reads, dropped after this one


def storage_dtype(dtype: str, mode: str) -> torch.dtype:
    """The torch dtype a value of `dtype` is kept in under `mode`."""
    if mode == "f32" and is_float(dtype):
        return torch.float32
    return TORCH_DTYPES[dtype]


def _operand(x: Tensor, compute: torch.dtype | None) -> Tensor:
    if compute is None or x.dtype == compute or x.dtype == torch.bool:
        return x
    if x.is_floating_point() == compute.is_floating_point:
        return x.to(compute)
    return x


class TorchProgram(nn.Module):
    """A checked graph as a PyTorch module, for one binding of its dynamic dims."""

    _scalars: Tensor  # the graph's scalar constants, a buffer (it follows the module's device)

    def __init__(self, graph: Graph, dims: Mapping[str, int], mode: str,
                 env: DimEnv | None = None) -> None:
        super().__init__()
        if mode not in MODES:
            raise ValueError(f"dtype mode must be one of {MODES}, not {mode!r}")
        self._mode = mode
        self._steps: list[_Step] = []
        self._slots: dict[str, tuple[nn.Module, str]] = {}  # param path -> (module, attribute)
        scalars: list[float] = []
        for node in graph.nodes:
            attrs = {k: _concrete(v, dims, env) for k, v in node.attrs.items()}
            shape = _concrete(tuple(node.type.shape), dims, env)
            step = _Step(node, attrs, shape, mode)
            if node.op == "param":
                self._add_param(attrs["path"], shape, step.dtype)
            elif node.op == "scalar":
                attrs["index"] = len(scalars)
                scalars.append(float(attrs["value"]))
            elif node.op == "input" and mode == "declared" and node.type.layout is not None:
                attrs["channels_last"] = node.type.layout.order in ((0, 2, 3, 1), (0, 2, 3, 4, 1))
            self._steps.append(step)
        self.register_buffer("_scalars", torch.tensor(scalars, dtype=torch.float32),
                             persistent=False)
        self._outputs = graph.outputs
        self._mark_frees({v for _, v in graph.outputs})

    def _add_param(self, path: str, shape: tuple[int, ...], dtype: torch.dtype) -> None:
        """Registered under its path (nested modules), so state_dict keys are the paths; a path
        that clashes with another or with a module attribute goes flat under an escaped name."""
        param = nn.Parameter(torch.zeros(shape, dtype=dtype), requires_grad=False)
        *parents, leaf = path.split(".")
        module: nn.Module = self
        try:
            for part in parents:
                child = module._modules.get(part)
                if child is None:
                    child = nn.Module()
                    module.add_module(part, child)
                module = child
            module.register_parameter(leaf, param)
        except KeyError:
            module, leaf = self, path.replace(".", "\N{MIDDLE DOT}")
            module.register_parameter(leaf, param)
        self._slots[path] = (module, leaf)

    def _mark_frees(self, outputs: set[str]) -> None:
        last: dict[str, int] = {}
        for k, step in enumerate(self._steps):
            for i in step.inputs:
                last[i] = k
        for name, k in last.items():
            if name not in outputs:
                self._steps[k].free += (name,)

    @property
    def mode(self) -> str:
        return self._mode

    def param(self, path: str) -> Tensor:
        module, leaf = self._slots[path]
        return cast(Tensor, getattr(module, leaf))

    def load_weights(self, weights: Mapping[str, np.ndarray | Tensor]) -> None:
        """Copy each param's value in (converted to its dtype here); every param is needed."""
        missing = [p for p in self._slots if p not in weights]
        if missing:
            raise TranslationError(f"missing weight `{missing[0]}` ({len(missing)} missing)")
        with torch.no_grad():
            for path in self._slots:
                target = self.param(path)
                value = to_tensor(weights[path])
                if tuple(value.shape) != tuple(target.shape):
                    raise TranslationError(f"weight `{path}` has shape {tuple(value.shape)}, "
                                           f"expected {tuple(target.shape)}")
                target.copy_(value.to(target.dtype))

    def forward(self, **inputs: Tensor) -> dict[str, Tensor]:
        values: dict[str, Tensor] = {}
        for step in self._steps:
            if step.fn is not None:
                xs = [_operand(values[i], step.compute) for i in step.inputs]
                out = step.fn(xs, step.attrs).to(step.dtype)
            elif step.op == "input":
                out = self._input(step, inputs)
            elif step.op == "param":
                out = self.param(step.attrs["path"])
            else:
                out = self._scalars[step.attrs["index"]]
            values[step.name] = out
            for name in step.free:
                del values[name]
        return {name: values[value] for name, value in self._outputs}

    def _input(self, step: _Step, inputs: Mapping[str, Tensor]) -> Tensor:
        name = step.attrs["name"]
        if name not in inputs:
            raise TranslationError(f"missing input `{name}`")
        x = inputs[name]
        if tuple(x.shape) != step.shape:
            raise TranslationError(f"input `{name}` has shape {tuple(x.shape)}, expected "
                                   f"{step.shape} for the dims given")
        x = x.to(step.dtype)
        if step.attrs.get("channels_last"):
            fmt = torch.channels_last if x.dim() == 4 else torch.channels_last_3d
            x = x.contiguous(memory_format=fmt)
        return x


def to_torch(graph: Graph, dims: Mapping[str, int], dtype: str = "f32",
             env: DimEnv | None = None) -> TorchProgram:
    """The checked `graph` as a PyTorch module with every dynamic dim bound by `dims` (floor
    dims such as `H / 2` of an odd-capable H are evaluated through `env`, the model's DimEnv).
    Weights start at zero: call `load_weights`."""
    return TorchProgram(graph, dims, dtype, env)


def to_tensor(value: np.ndarray | Tensor) -> Tensor:
    """A numpy array (ml_dtypes' bf16 and fp8 included, through float32) as a tensor."""
    if isinstance(value, Tensor):
        return value
    array = np.asarray(value)
    if array.dtype.kind == "V" or array.dtype.name in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
        return torch.from_numpy(array.astype(np.float32))
    return torch.from_numpy(np.ascontiguousarray(array))


def run(program: TorchProgram, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Numpy in, numpy out (outputs as float32 for float values, on the CPU)."""
    device = program._scalars.device
    with torch.no_grad():
        outs = program(**{k: to_tensor(v).to(device) for k, v in inputs.items()})
    return {k: (v.float() if v.is_floating_point() else v).cpu().numpy() for k, v in outs.items()}
