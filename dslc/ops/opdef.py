"""`OpDef`: everything about one built-in op in one place: its parameters, its type rule
(`infer`), and (added by later stages) its numpy reference, cuDNN lowering and fusion role.

A type rule sees its arguments through `InferCtx`, which the checker implements: it reports
diagnostics at the argument's source span and knows the precision and dims in effect.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, Literal, Protocol

import numpy as np

from dslc.core.dims import Dim, DimEnv
from dslc.core.types import PrecisionSpec, TensorType
from dslc.diag.codes import CodeId
from dslc.diag.diagnostic import Label
from dslc.diag.span import Span


class Kind(Enum):
    """What a parameter accepts; `.value` is how signatures show it (OPT_ kinds may be none)."""

    TENSOR = ("tensor", False)
    OPT_TENSOR = ("tensor", True)
    TENSORS = ("[tensor, ...]", False)
    INT = ("int", False)
    OPT_INT = ("int", True)
    INTS = ("int | [int, ...]", False)  # one per spatial axis, or one for all
    AXES = ("[int, ...]", False)
    SHAPE = ("[dim, ...]", False)
    DIM = ("dim", False)  # an int or a declared dim (static or dynamic)
    FLOAT = ("float", False)
    OPT_FLOAT = ("float", True)
    BOOL = ("bool", False)
    STR = ("str", False)
    DTYPE = ("dtype", False)

    @property
    def shown(self) -> str:
        return self.value[0]


REQUIRED: Any = object()


@dataclass(frozen=True)
class Param:
    name: str
    kind: Kind
    default: Any = REQUIRED
    choices: tuple[str, ...] = ()

    @property
    def is_tensor(self) -> bool:
        return self.kind in (Kind.TENSOR, Kind.OPT_TENSOR, Kind.TENSORS)

    def __str__(self) -> str:
        kind = self.kind.shown
        if self.choices:
            quote = "" if self.kind is Kind.DTYPE else '"'
            kind = " | ".join(f"{quote}{c}{quote}" for c in self.choices)
        text = f"{self.name}: {kind}"
        if self.default is not REQUIRED:  # a dtype is a keyword of the language, not a string
            shown = self.default if self.kind is Kind.DTYPE and self.default is not None else \
                _show_default(self.default)
            text += f" = {shown}"
        return text


def _show_default(v: Any) -> str:
    if v is None:
        return "none"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return f'"{v}"'
    return str(v)


class InferCtx(Protocol):
    """What a type rule may ask of the checker."""

    env: DimEnv
    precision: PrecisionSpec
    cudnn: bool  # apply cuDNN's support limits too (off for the reference backend)

    @property
    def compute(self) -> str: ...

    def error(self, code: CodeId, message: str, at: str | None = None, label: str = "",
              labels: tuple[Label, ...] = (), notes: tuple[str, ...] = (),
              help: tuple[str, ...] = ()) -> None: ...

    def span(self, arg: str) -> Span: ...

    def label(self, arg: str, text: str) -> Label: ...

    def text(self, arg: str) -> str: ...  # the argument as the user wrote it

    def producer(self, arg: str) -> str | None: ...

    def set_attr(self, name: str, value: Any) -> None: ...

    def precision_origin(self, key: str) -> Span | None: ...


class SilentCtx:
    """An `InferCtx` outside the checker (the IR verifier, the program generator): errors are
    recorded, not reported; warnings are ignored."""

    def __init__(self, env: DimEnv, precision: PrecisionSpec, producers: Mapping[str, str],
                 span: Span, compute: str | None = None, cudnn: bool = False) -> None:
        self.env = env
        self.precision = precision
        self.cudnn = cudnn
        self.errors: list[str] = []
        self.attrs: dict[str, Any] = {}
        self._producers = producers
        self._span = span
        self._compute = compute or precision.compute

    @property
    def compute(self) -> str:
        return self._compute

    def error(self, code: CodeId, message: str, at: str | None = None, label: str = "",
              labels: tuple[Label, ...] = (), notes: tuple[str, ...] = (),
              help: tuple[str, ...] = ()) -> None:
        if not code.startswith("W"):
            self.errors.append(f"{code} {message}")

    def span(self, arg: str) -> Span:
        return self._span

    def label(self, arg: str, text: str) -> Label:
        return Label(self._span, text)

    def text(self, arg: str) -> str:
        return arg

    def producer(self, arg: str) -> str | None:
        return self._producers.get(arg)

    def set_attr(self, name: str, value: Any) -> None:
        self.attrs[name] = value

    def precision_origin(self, key: str) -> Span | None:
        return None


class Args:
    """The bound arguments of one call: tensors by parameter name, and compile-time values."""

    def __init__(self, values: dict[str, Any]) -> None:
        self.values = values

    def __getitem__(self, name: str) -> Any:
        return self.values[name]

    def get(self, name: str, default: Any = None) -> Any:
        return self.values.get(name, default)

    def t(self, name: str) -> TensorType:
        value = self.values[name]
        assert isinstance(value, TensorType), name
        return value

    def opt(self, name: str) -> TensorType | None:
        value = self.values.get(name)
        return value if isinstance(value, TensorType) else None


InferFn = Callable[[InferCtx, Args], TensorType | tuple[TensorType, ...] | None]

class LowerCtx(Protocol):
    """What an op's cuDNN lowering may use (`dslc.compile` implements it; only it imports cudnn):
    the graph being built, enums by name, pass-by-value scalars, and this node's result shape in
    the group's cuDNN form (for ops whose output dims cuDNN needs spelled out)."""

    g: Any  # the cudnn.pygraph

    def enum(self, kind: str, member: str) -> Any: ...

    def scalar(self, value: float) -> Any: ...

    def result_dims(self) -> list[int]: ...

    def result_strides(self) -> list[int]: ...


# The cuDNN lowering: operands as cuDNN tensors (in parameter order, absent optional ones left
# out), the attrs with every dim concrete -> the cuDNN tensor of the result.
LowerFn = Callable[[LowerCtx, list[Any], Mapping[str, Any]], Any]

# A memory-order requirement on the operands, checked after lowering chose every layout (by
# parameter name, views with their order in their base): a reason, or None when it holds. Lowering
# copies an operand that fails it into row-major order; the checker never reports it.
NeedsFn = Callable[[Mapping[str, TensorType]], str | None]

# The numpy reference: operands (already converted to the compute dtype) and the node's attrs with
# every dim made concrete -> the result, still in the compute dtype (the caller rounds it).
RefFn = Callable[[list[np.ndarray], Mapping[str, Any]], np.ndarray]


# The op's fp8 rule: whether it can compute from its operands quantised to the fp8 `dtype`
# (`precision matmul=f8e4m3`, LANGUAGE.md 3.4): True, or False once E0404 is reported. The
# checker runs it where the source asks for fp8.
QuantizeFn = Callable[[InferCtx, Args, str], bool]


# An op's place in the fusion patterns: an anchor (conv, matmul, sdpa: a pattern of its family),
# a pointwise epilogue after an anchor, a norm or reduction anchor, a view (no kernel), or none
# (it runs on its own).
FusionRole = Literal["anchor", "epilogue", "norm", "reduce", "view", "none"]


@dataclass(frozen=True)
class OpDef:
    name: str
    family: str  # conv, matmul, pointwise, norm, reduce, attention, pool, layout
    params: tuple[Param, ...]
    infer: InferFn
    returns: str  # the result's shape in signature notation, for `dslc ops`
    summary: str
    scalars_as_tensors: bool = False  # a compile-time number may stand for a tensor operand
    fusion: FusionRole = "none"  # its place in the fusion patterns (`dslc.fuse.patterns`)
    reference: RefFn | None = None
    lower: LowerFn | None = None  # None: no cuDNN graph node (a fallback kernel runs it)
    needs: NeedsFn | None = None  # a memory order its operands must have (lowering copies)
    quantize: QuantizeFn | None = None  # None: the op never computes from fp8 operands

    @property
    def reserved(self) -> tuple[str, ...]:
        """The keywords every call of this op takes besides its params: `compute=`, and on
        the ops that compute in fp8, `precision=`."""
        return ("compute", "precision") if self.quantize is not None else ("compute",)

    def param(self, name: str) -> Param | None:
        for p in self.params:
            if p.name == name:
                return p
        return None

    @property
    def tensor_params(self) -> tuple[Param, ...]:
        return tuple(p for p in self.params if p.is_tensor)

    def signature(self) -> str:
        shown = [str(p) for p in self.params]
        if self.quantize is not None:
            shown.append("precision: dtype = none")
        return f"{self.name}({', '.join(shown)}) -> {self.returns}"


DimList = tuple[Dim, ...]
