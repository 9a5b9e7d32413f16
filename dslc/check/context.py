"""The state of one elaboration run: the nodes built so far, the dims in scope, the parameter
manifest, and diagnostics that carry the def-instance chain. One `Context` is shared, as a part,
by the expression, call and statement parts of the elaborator (`exprs`, `calls`, `elaborate`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dslc.check.expansion import chain_text
from dslc.check.resolve import DefRef, Resolved
from dslc.check.values import Frame, TensorVal
from dslc.core.dims import DimEnv, Poly, interval
from dslc.core.types import BITS, Layout, PrecisionSpec, TensorType, format_type
from dslc.diag.codes import CodeId
from dslc.diag.diagnostic import Diagnostic, Label, Sink
from dslc.diag.span import Span
from dslc.ir.graph import Attrs, Node
from dslc.parse import ast
from dslc.parse.loader import Program

# The most operations and def instances a model may expand to. A model past it is refused before
# it is expanded where the call graph tells (`check.expansion`), else when it gets there (a runaway
# `repeat`). It bounds the work of a check: each costs 30-100 us and ~300 bytes, so the largest
# model checks in well under a minute; 2.5 times the 10^5-operation benchmark (docs/benchmarks.md).
MAX_NODES = 250_000
MAX_FRAMES_SHOWN = 4
# cuDNN describes a tensor by at most 8 dims (CUDNN_DIM_MAX). The frontend 1.32 rejects rank 9-11
# with CUDNN_STATUS_BAD_PARAM and, from rank 12, builds graphs on corrupted memory or crashes
# (rank 16 and up: a segmentation fault, even deviceless). The limit holds for every backend: the
# reference executor is the oracle of the cuDNN plans, so both run the same language.
MAX_RANK = 8
MAX_BYTES = 2**63 - 1  # cuDNN, CuPy and numpy index a tensor's bytes with signed 64-bit integers


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
    """The model would grow past MAX_NODES (reported once, then elaboration stops)."""


class Context:
    def __init__(self, program: Program, resolved: Resolved, sink: Sink,
                 bucket: dict[str, int] | None = None,
                 precision_override: PrecisionSpec | None = None, backend: str = "cudnn",
                 fp8: bool = True) -> None:
        self.precision_override = precision_override
        self.fp8 = fp8  # False (`--fp8 off`): fp8 requests are checked for form, not applied
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
        self._upper: dict[Poly, int] = {}
        self.instances = 0  # def instances expanded so far (with the nodes: the work done)
        self._suffix: dict[str, int] = {}  # see `unique`
        # Shared by the checker's parts (expressions, calls, statements):
        self.depth = 0  # the current nesting level: each `eval` one, each def body two (`defs`)
        self.too_deep = False  # E0705 for nesting is reported once
        self.naming: tuple[ast.Expr, str] | None = None  # a `let`'s expression and its value's name
        self.pending_instance: tuple[str, Span] | None = None  # the `let` naming a def instance
        self.dim_decls: dict[str, Span] = {}  # where each dim was declared

    # -- diagnostics ---------------------------------------------------------------------------
    def report(self, code: CodeId, message: str, span: Span, label: str = "",
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

    # -- limits --------------------------------------------------------------------------------
    def fits(self, t: TensorType, span: Span, frame: Frame, op: str | None) -> bool:
        """E0306 when `t`, made by `op` (None: declared), has more axes than cuDNN takes, or more
        bytes than int64 can index (for the largest admissible value of its dims)."""
        if t.rank > MAX_RANK:
            what = f"the result of `{op}`" if op else "this tensor"
            self.report("E0306", f"{what} has rank {t.rank}; cuDNN takes tensors of rank "
                        f"{MAX_RANK} at most", span, format_type(t), frame=frame,
                        notes=(f"cuDNN describes a tensor by at most {MAX_RANK} dims "
                               "(CUDNN_DIM_MAX)",),
                        help=("merge axes with `reshape`",))
            return False
        size = BITS[t.dtype] // 8
        for d in t.shape:
            size *= d if isinstance(d, int) else self.upper(d)
        if size > MAX_BYTES:
            what = f"the result of `{op}`" if op else "this tensor"
            self.report("E0306", f"{what} is too large: {float(size):.3g} bytes", span,
                        format_type(t), frame=frame,
                        notes=(f"a tensor spans at most {MAX_BYTES} bytes: cuDNN and CuPy index "
                               "it with signed 64-bit integers",))
            return False
        return True

    def expansion_limit(self, ops: int, span: Span, frame: Frame, what: str,
                        callee: DefRef | None) -> None:
        """E0705 and stop, before expanding something estimated at `ops` more operations, when
        the model would grow past MAX_NODES. `callee`: the def whose chain multiplies."""
        if len(self.nodes) + self.instances + ops <= MAX_NODES:
            return
        chain = chain_text(callee, self.resolved.estimates) if callee is not None else ""
        self.report("E0705", f"{what} would expand to about {_count(ops)} operations and def "
                    f"instances, more than the {MAX_NODES:,} a model may have", span,
                    f"about {_count(ops)}",
                    frame=frame, notes=(chain,) if chain else (),
                    help=("every call of a def is expanded inline, so defs that call others "
                          "several times multiply the model; check the counts above",))
        raise TooLarge()

    def upper(self, d: Poly) -> int:
        """The largest value of a dim expression over its dims' ranges (cached: shapes repeat)."""
        hi = self._upper.get(d)
        if hi is None:
            hi = self._upper[d] = max(1, int(interval(d, self.env)[1]))
        return hi

    # -- nodes ---------------------------------------------------------------------------------
    def unique(self, base: str) -> str:
        """`base`, or `base_1`, `base_2`...: the first one not taken. The next suffix to try is
        kept per base, so a statement that makes thousands of nodes of one kind stays linear."""
        if base not in self.producers:
            return base
        k = self._suffix.get(base, 1)
        while f"{base}_{k}" in self.producers:
            k += 1
        self._suffix[base] = k + 1
        return f"{base}_{k}"

    def add_node(self, op: str, inputs: tuple[str, ...], attrs: dict[str, Any], type_: TensorType,
                 span: Span, frame: Frame, precision: PrecisionSpec, name: str) -> TensorVal:
        if len(self.nodes) + self.instances >= MAX_NODES:
            self.report("E0705", f"the model grows past {MAX_NODES:,} operations and def "
                        "instances", span,
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
        self._replace(node, Node(node.name, node.op, node.inputs, node.attrs, type_, node.span,
                                 node.path, node.precision))
        return TensorVal(node.name, type_)

    def rename(self, value: TensorVal, name: str) -> TensorVal:
        """Name the node a statement just created after the value it binds (`let h1 = ...`).
        Nothing reads it yet, so no operand needs updating."""
        node = self.producers[value.node]
        if node.name == name:
            return value
        new = Node(self.unique(name), node.op, node.inputs, node.attrs, node.type, node.span,
                   node.path, node.precision)  # not dataclasses.replace: a tenth of the cost
        self._replace(node, new)
        return TensorVal(new.name, value.type)

    def node_name(self, frame: Frame, hint: str) -> str:
        return f"{frame.prefix}.{hint}" if frame.prefix else hint


def _count(n: int) -> str:
    return f"{n:,}" if n < 10**15 else f"{float(n):.2g}"
