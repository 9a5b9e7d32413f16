"""A PyTorch translation of a checked graph: the independent oracle for the reference executor,
and the PyTorch side of benchmarks.

`to_torch(graph, dims)` maps each node of a checked graph (`CheckedModel.graph`, before
`dslc.lower`) to PyTorch calls of its own (`dslc.ir.torch_ops`), written from the ops'
documented meaning; it never calls the numpy references (`dslc.ops`, `dslc.ir.interp`), so the
two can be compared. The
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

Nothing else in dslc imports this module or `torch_ops` at import time: torch is a development
dependency.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import numpy as np
import torch
from torch import Tensor, nn

from dslc.core import dims as dimlib
from dslc.core.dims import DimEnv, Poly
from dslc.core.types import FP8, is_float
from dslc.ir.graph import Graph, Node
from dslc.ir.torch_ops import OPS, OWN_OPERAND_DTYPES, OpFn

TORCH_DTYPES: dict[str, torch.dtype] = {
    "f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16,
    "f8e4m3": torch.float8_e4m3fn, "f8e5m2": torch.float8_e5m2,
    "i8": torch.int8, "u8": torch.uint8, "i32": torch.int32, "i64": torch.int64,
    "bool": torch.bool,
}
MODES = ("f32", "declared")


class TranslationError(Exception):
    """The graph cannot be translated (an op without a mapping, a dim without a value)."""


def _concrete(value: Any, values: Mapping[str, int], env: DimEnv | None) -> Any:
    if isinstance(value, Poly):
        try:
            return dimlib.evaluate(value, dict(values), env)
        except KeyError as err:
            name = err.args[0]
            hint = "" if name.isidentifier() else " (pass the model's DimEnv as `env`)"
            raise TranslationError(f"no value given for the dim `{name}`{hint}") from None
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
        if self.dtype.is_floating_point and node.op not in OWN_OPERAND_DTYPES:
            self.compute = self.dtype if node.type.dtype not in FP8 else torch.float32
        elif node.type.dtype not in ("bool", *FP8) and node.op not in OWN_OPERAND_DTYPES:
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
        scalars: list[float] = []  # kept in float64: an integer number is exact to 2^53
        fixed: set[str] = set()  # values computed from params and numbers alone: weights
        for node in graph.nodes:
            attrs = {k: _concrete(v, dims, env) for k, v in node.attrs.items()}
            if node.op in ("param", "scalar") or (node.inputs and all(i in fixed
                                                                      for i in node.inputs)):
                fixed.add(node.name)
            if attrs.get("precision") in FP8:  # fp8 operands: weights are scaled per channel
                attrs["fp8_weights"] = tuple(i for i, x in enumerate(node.inputs) if x in fixed)
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
        self.register_buffer("_scalars", torch.tensor(scalars, dtype=torch.float64),
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
                # a value made from nothing (arange) is made on the module's device: a CUDA
                # graph cannot capture a copy from the host
                attrs = step.attrs if xs else {**step.attrs, "device": self._scalars.device}
                out = step.fn(xs, attrs).to(step.dtype)
            elif step.op == "input":
                out = self._input(step, inputs)
            elif step.op == "param":
                out = self.param(step.attrs["path"])
            else:  # a number: f32, or an integer beside integer tensors (LANGUAGE 3.4)
                out = self._scalars[step.attrs["index"]]
                out = out.to(torch.float32 if step.dtype.is_floating_point else step.dtype)
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
