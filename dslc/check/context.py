"""The state of one elaboration run: the nodes built so far, the dims in scope, the parameter
manifest, and diagnostics that carry the def-instance chain. Shared by the expression, call and
statement layers of the elaborator (`exprs`, `calls`, `elaborate`)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from dslc.check.dims import DimEnv, Poly
from dslc.check.resolve import Resolved
from dslc.check.types import Layout, PrecisionSpec, TensorType
from dslc.check.values import Frame, TensorVal
from dslc.diag.diagnostic import Diagnostic, Label, Sink
from dslc.diag.span import Span
from dslc.ir.graph import Attrs, Node
from dslc.parse.loader import Program

MAX_NODES = 1_000_000  # a runaway `repeat` stops here with a diagnostic, not an out-of-memory
MAX_FRAMES_SHOWN = 4


@dataclass(frozen=True)
class ParamSpec:
    """One entry of the parameter manifest: a weight the runner loads by its path."""

    path: str
    dtype: str
    shape: tuple[int, ...]
    layout: Layout
    span: Span


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_dim(v: Any) -> bool:
    return is_int(v) or isinstance(v, Poly)


def _describe(f: Frame) -> str:
    text = f"in instance `{f.instance}`" if f.creates_instance else f"in this call to `{f.def_name}`"
    return f"{text} ({f.args_text})" if f.args_text else text


class TooLarge(Exception):
    """The model grew past MAX_NODES (reported once, then elaboration stops)."""


class Context:
    def __init__(self, program: Program, resolved: Resolved, sink: Sink,
                 bucket: dict[str, int] | None = None,
                 precision_override: PrecisionSpec | None = None, backend: str = "cudnn") -> None:
        self.precision_override = precision_override
        self.backend = backend
        self.program = program
        self.resolved = resolved
        self.sink = sink
        self.bucket = bucket
        self.env = DimEnv()
        self.nodes: list[Node] = []
        self.producers: dict[str, Node] = {}
        self.params: dict[str, ParamSpec] = {}
        self.used: set[str] = set()  # value names read at least once (for W0201)
        self.active_defs: list[tuple[str, str]] = []
        self.instance_paths: dict[str, Span] = {}  # where each instance was created
        self.duplicate_instances: set[str] = set()

    # -- diagnostics ---------------------------------------------------------------------------
    def report(self, code: str, message: str, span: Span, label: str = "",
               labels: tuple[Label, ...] = (), notes: tuple[str, ...] = (),
               help: tuple[str, ...] = (), frame: Frame | None = None) -> None:
        chain = frame.chain() if frame is not None else []
        if span.file.startswith("std/"):
            # Inside the bundled library: the user's call is what to fix, so it is the primary
            # span; the library line becomes a secondary label.
            user = next((f for f in chain if f.call_span is not None
                         and not f.call_span.file.startswith("std/")), None)
            if user is not None and user.call_span is not None:
                labels = (Label(span, label or "inside the library"), *labels)
                span, label = user.call_span, _describe(user)
                chain = [f for f in chain if f is not user]
        trace = []
        for f in chain[:MAX_FRAMES_SHOWN]:
            trace.append(Label(f.call_span or span, _describe(f)))
        if len(chain) > MAX_FRAMES_SHOWN:
            notes = (*notes, f"... and {len(chain) - MAX_FRAMES_SHOWN} more enclosing calls")
        if self.bucket is not None:
            if code.startswith("W"):
                return  # warnings come from the symbolic run only
            where = ", ".join(f"{k}={v}" for k, v in self.bucket.items())
            notes = (*notes, f"in the bucket {where}")
        instance = next((f.instance for f in chain if f.creates_instance), None)
        self.sink.report(Diagnostic(code, message, span, label, (*labels, *trace), notes, help,
                                    instance=instance))

    # -- nodes ---------------------------------------------------------------------------------
    def unique(self, base: str) -> str:
        name = base
        k = 1
        while name in self.producers:
            name = f"{base}_{k}"
            k += 1
        return name

    def add_node(self, op: str, inputs: tuple[str, ...], attrs: dict[str, Any], type_: TensorType,
                 span: Span, frame: Frame, precision: PrecisionSpec, name: str) -> TensorVal:
        if len(self.nodes) >= MAX_NODES:
            self.report("E0305", f"the model grows past {MAX_NODES} operations", span,
                        "while expanding this", frame=frame,
                        help=("check `repeat` counts and recursion through `repeat`",))
            raise TooLarge()
        node = Node(self.unique(name), op, inputs, Attrs(attrs), type_, span, frame.instance,
                    precision)
        self.nodes.append(node)
        self.producers[node.name] = node
        return TensorVal(node.name, type_)

    def _replace(self, old: Node, new: Node) -> None:
        index = len(self.nodes) - 1
        while self.nodes[index] is not old:  # the node is nearly always the last one
            index -= 1
        self.nodes[index] = new
        del self.producers[old.name]
        self.producers[new.name] = new

    def retype(self, value: TensorVal, type_: TensorType) -> TensorVal:
        """Give a node created for the current statement a new type (an ascription)."""
        node = self.producers[value.node]
        self._replace(node, replace(node, type=type_))
        return TensorVal(node.name, type_)

    def rename(self, value: TensorVal, name: str) -> TensorVal:
        """Name the node a statement just created after the value it binds (`let h1 = ...`).
        Nothing reads it yet, so no operand needs updating."""
        node = self.producers[value.node]
        if node.name == name:
            return value
        new = replace(node, name=self.unique(name))
        self._replace(node, new)
        return TensorVal(new.name, value.type)

    def node_name(self, frame: Frame, hint: str) -> str:
        return f"{frame.prefix}.{hint}" if frame.prefix else hint
