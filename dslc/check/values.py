"""What expressions evaluate to during elaboration, and the scopes and frames they live in.

Compile-time values are plain Python: `int` or `Poly` (dims), `float`, `bool`, `str`; plus
`DType`, `ListVal`, `TupleVal`. A tensor is a `TensorVal` naming the IR node that computes it.
`ERROR` marks a value that already failed a check (nothing further is reported about it);
`Absent` is a binding whose `when` condition was false.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dslc.core.dims import Poly, format_dim
from dslc.core.types import PrecisionSpec, TensorType, format_type
from dslc.diag.records import quick_init
from dslc.diag.span import Span
from dslc.parse import ast


@quick_init
@dataclass(frozen=True, slots=True)
class TensorVal:
    node: str
    type: TensorType


@quick_init
@dataclass(frozen=True, slots=True)
class DType:
    name: str


@quick_init
@dataclass(frozen=True, slots=True)
class ListVal:
    items: tuple[Any, ...]


@quick_init
@dataclass(frozen=True, slots=True)
class TupleVal:
    items: tuple[Any, ...]


class _Error:
    _instance: _Error | None = None

    def __new__(cls) -> _Error:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "ERROR"


ERROR = _Error()


@quick_init
@dataclass(frozen=True, slots=True)
class Absent:
    name: str
    guard: Span


def kind_of(v: Any) -> str:
    """A value's kind, as messages name it."""
    if isinstance(v, TensorVal):
        return "a tensor"
    if isinstance(v, bool):
        return "a bool"
    if isinstance(v, int):
        return "an int"
    if isinstance(v, Poly):
        return "a dim expression"
    if isinstance(v, float):
        return "a float"
    if isinstance(v, str):
        return "a string"
    if isinstance(v, DType):
        return "a dtype"
    if isinstance(v, ListVal):
        return "a list"
    if isinstance(v, TupleVal):
        return f"{len(v.items)} values"
    return "nothing"


def show(v: Any) -> str:
    """A value in source syntax, for messages and instance descriptions."""
    if isinstance(v, TensorVal):
        return format_type(v.type)
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, Poly)):
        return format_dim(v)
    if isinstance(v, str):
        return f'"{v}"'
    if isinstance(v, DType):
        return v.name
    if isinstance(v, (ListVal, TupleVal)):
        return "[" + ", ".join(show(x) for x in v.items) + "]"
    return repr(v)


@dataclass(frozen=True)
class Frame:
    """One def instance being elaborated; the chain of frames is the instance trace."""

    parent: Frame | None
    def_name: str
    call_span: Span | None
    instance: str  # instance path: prefix of param paths ("" at model level)
    prefix: str  # prefix of IR value names
    args_text: str = ""
    creates_instance: bool = False

    def chain(self) -> list[Frame]:
        out: list[Frame] = []
        f: Frame | None = self
        while f is not None and f.call_span is not None:
            out.append(f)
            f = f.parent
        return out


@quick_init
@dataclass(frozen=True, slots=True)
class Binding:
    value: Any
    span: Span
    kind: str  # dim, input, param, let, arg, shape, output


@dataclass
class Scope:
    """The values of one body (a model, or one def instance) and the settings in effect."""

    module: ast.Module
    frame: Frame
    owner: str  # "model `m`" or "def `f`", for messages
    precision: PrecisionSpec
    precision_origin: dict[str, Span] = field(default_factory=dict)
    values: dict[str, Binding] = field(default_factory=dict)
    is_model: bool = False
    # The operand precision of the ops that compute in fp8 (`precision matmul=f8e4m3`), by op
    # name, and `weight_scales` (LANGUAGE.md 3.4); where each was set is in `precision_origin`.
    quantize: dict[str, str] = field(default_factory=dict)
