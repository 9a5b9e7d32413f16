"""A generated program: its dims, inputs, params, `let` statements, defs and outputs, with
what the generator knows of each value, printed as `.cgraph` source (only what the outputs need).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dslc.core.dims import Dim, format_dim
from dslc.core.types import TensorType


@dataclass(frozen=True)
class Expr:
    """An expression the generator built: its source text and type, the names it reads, and
    what the oracles may assume of its values."""

    text: str
    type: TensorType
    reads: frozenset[str]
    exact: bool  # both oracles compute it bit-identically (exact ops of exact values only)
    scale: float  # rough magnitude of its values (keeps f16/bf16 programs finite)
    op: str = ""  # the op at its root ("" for a bare name)
    atom: bool = True  # needs no parentheses as an operand of an infix operator
    # Axes along which every value is the same (an upsampled 1x1 map): a norm over them divides
    # rounding noise by sqrt(eps), so the generator keeps norms off them.
    constant: frozenset[int] = frozenset()


@dataclass(frozen=True)
class Input:
    name: str
    type: TensorType  # dims symbolic
    written_dtype: bool  # the dtype is written (else the model's `io`)
    tag: str = ""  # a layout tag written on it, e.g. "NHWC"


@dataclass(frozen=True)
class ParamDecl:
    name: str
    dtype: str
    shape: tuple[int, ...]
    role: str  # weight | scale | shift | mean | var: how the oracle draws its values


@dataclass(frozen=True)
class Stmt:
    names: tuple[str, ...]
    text: str  # the whole statement
    reads: frozenset[str]
    defs: tuple[str, ...] = ()  # defs it calls


@dataclass(frozen=True)
class DynDim:
    name: str
    lo: int
    hi: int
    align: int
    tune: tuple[int, ...]


@dataclass
class Program:
    name: str
    precision: tuple[str, str, str]  # io, intermediate, compute
    layout: str = ""  # a model-level `layout` statement
    dims: list[DynDim] = field(default_factory=list)
    inputs: list[Input] = field(default_factory=list)
    params: list[ParamDecl] = field(default_factory=list)
    stmts: list[Stmt] = field(default_factory=list)
    defs: dict[str, str] = field(default_factory=dict)  # name -> source text
    # (output name, value name, a type written on the output: "" or e.g. ": f32")
    outputs: list[tuple[str, str, str]] = field(default_factory=list)
    run_dims: dict[str, int] = field(default_factory=dict)  # where the oracles run it
    # Integer inputs that index an axis: their values are drawn in [0, bound).
    index_bounds: dict[str, int] = field(default_factory=dict)
    uses_std: bool = False
    # Declared inputs no output reads are kept (an unread input is part of the model's interface:
    # a bundle built from one once failed to compile).
    keeps_unread_inputs: bool = False

    def live(self) -> set[str]:
        """The names the outputs need, transitively."""
        producers = {n: s for s in self.stmts for n in s.names}
        todo = [v for _, v, _ in self.outputs]
        seen: set[str] = set()
        while todo:
            name = todo.pop()
            if name in seen:
                continue
            seen.add(name)
            if name in producers:
                todo.extend(producers[name].reads)
        return seen

    def source(self) -> str:
        live = self.live()
        stmts = [s for s in self.stmts if live & set(s.names)]
        called = {d for s in stmts for d in s.defs}
        lines = ["cgraph 0.1"]
        if self.uses_std:
            lines.append('import "std/nn.cgraph"')
        lines += [text for name, text in self.defs.items() if name in called]
        lines.append(f"model {self.name} {{")
        io, inter, comp = self.precision
        lines.append(f"  precision io={io}, intermediate={inter}, compute={comp}")
        if self.layout:
            lines.append(f"  layout {self.layout}")
        for d in self.dims:
            align = f" align {d.align}" if d.align > 1 else ""
            lines.append(f"  dim {d.name} = {d.lo}..{d.hi}{align} tune "
                         f"[{', '.join(map(str, d.tune))}]")
        for i in self.inputs:
            if i.name in live or self.keeps_unread_inputs:
                dtype = i.type.dtype if i.written_dtype else ""
                tag = f" @{i.tag}" if i.tag else ""
                lines.append(f"  input {i.name}: {dtype}{shape_text(i.type.shape)}{tag}")
        for p in self.params:
            if p.name in live:  # the dtype is written only where it is not the model's io
                dtype = p.dtype if p.dtype != io else ""
                lines.append(f"  param {p.name}: {dtype}{shape_text(p.shape)}")
        lines += [s.text for s in stmts]
        lines += [f"  output {name}{typ} = {value}" for name, value, typ in self.outputs]
        lines.append("}")
        return "\n".join(lines) + "\n"

    def roles(self) -> dict[str, str]:
        return {p.name: p.role for p in self.params}


def shape_text(shape: tuple[Dim, ...]) -> str:
    return "[" + ", ".join(format_dim(d) for d in shape) + "]"
