"""Calls: binding arguments to a built-in op's parameters and running its type rule, or
instantiating a def (shape-pattern unification, instance paths, the declared result type)."""

from __future__ import annotations

import itertools
from typing import Any, Protocol

from dslc.check.context import Context
from dslc.check.exprs import ExprEval
from dslc.check.resolve import DefRef, suggest
from dslc.check.values import ERROR, DType, Frame, ListVal, Scope, TensorVal, TupleVal, kind_of
from dslc.core import dims
from dslc.core.dims import DimEnv
from dslc.core.types import (
    DTYPES,
    FP8,
    INTS,
    WEIGHT_SCALES,
    PrecisionSpec,
    TensorType,
    format_type,
    is_float,
)
from dslc.diag.codes import CodeId
from dslc.diag.diagnostic import Label
from dslc.diag.span import Span
from dslc.ops import OPS
from dslc.ops.opdef import REQUIRED, Args, Kind, OpDef
from dslc.parse import ast

Arg = tuple[Any, Span]
# The keys of a `precision` statement besides io, intermediate and compute: the ops that compute
# in fp8 (their operand precision) and how fp8 weights are scaled.
QUANTIZE_KEYS = (*(name for name, op in OPS.items() if op.quantize is not None), "weight_scales")


class OpCtx:
    """`InferCtx` for one op call: errors land on the argument that caused them."""

    __slots__ = ("asked", "attrs", "call_span", "compute_at", "cudnn", "el", "env", "func_span",
                 "op", "precision", "producers", "scope", "spans")

    def __init__(self, el: CallEval, op: OpDef, call_span: Span, func_span: Span,
                 spans: dict[str, Span], producers: dict[str, str], scope: Scope,
                 precision: PrecisionSpec, compute_at: Span | None) -> None:
        self.el = el
        self.op = op
        self.call_span = call_span
        self.func_span = func_span
        self.spans = spans
        self.producers = producers
        self.scope = scope
        self.env: DimEnv = el.ctx.env
        self.precision = precision
        self.cudnn = el.ctx.backend == "cudnn"
        self.attrs: dict[str, Any] = {}
        self.asked: Span | None = None  # where this op's fp8 precision was asked for
        self.compute_at = compute_at  # the call's own `compute=`, where it has one

    @property
    def compute(self) -> str:
        return self.precision.compute

    def span(self, arg: str) -> Span:
        return self.spans.get(arg, self.call_span)

    def label(self, arg: str, text: str) -> Label:
        return Label(self.span(arg), text)

    def text(self, arg: str) -> str:
        if arg not in self.spans:
            return arg
        written = self.el.ctx.program.sources.snippet(self.spans[arg])
        if "=" in written.split("(")[0]:  # a keyword argument: its value
            written = written.split("=", 1)[1].strip()
        return written if written and len(written) <= 40 else arg

    def producer(self, arg: str) -> str | None:
        return self.producers.get(arg)

    def set_attr(self, name: str, value: Any) -> None:
        self.attrs[name] = value

    def precision_origin(self, key: str) -> Span | None:
        if key == "precision":  # the operand precision of this call: its keyword, or a statement
            return self.asked
        if key == "compute" and self.compute_at is not None:
            return self.compute_at
        return self.scope.precision_origin.get(key)

    def error(self, code: CodeId, message: str, at: str | None = None, label: str = "",
              labels: tuple[Label, ...] = (), notes: tuple[str, ...] = (),
              help: tuple[str, ...] = ()) -> None:
        span = self.func_span if at is None else self.span(at)
        self.el.ctx.report(code, message, span, label, labels, notes, help, frame=self.scope.frame)


class Bodies(Protocol):
    """What calls need of the elaborator: a def call expanded, and a def body run."""

    def apply_def(self, ref: DefRef, call: ast.Call, pos: list[Arg], kws: dict[str, Arg],
                  scope: Scope, hint: str) -> Any: ...

    def run_body(self, body: tuple[ast.Stmt, ...], scope: Scope) -> Any: ...


class CallEval:
    """Calls: of ops (arguments bound and converted, the op's type rule run) and of defs (handed
    to the elaborator, `bodies`), in the checker's state (`ctx`)."""

    def __init__(self, ctx: Context, exprs: ExprEval, bodies: Bodies) -> None:
        self.ctx = ctx
        self.exprs = exprs
        self.bodies = bodies

    def call(self, call: ast.Call, scope: Scope, hint: str) -> Any:
        ns = self.ctx.resolved.namespaces[scope.module.path]
        callee = ns.lookup(call.func)
        if callee is None:
            return ERROR  # reported by name resolution
        kinds = [type(a) is ast.Kwarg for a in call.args]
        if True in kinds:
            names = [a.name.name for a in call.args if isinstance(a, ast.Kwarg)]
            if any(k and not later for k, later in itertools.pairwise(kinds)) or \
                    len(set(names)) != len(names):
                return ERROR  # argument order or a repeated keyword: E0104 said so already
        args = self.eval_args(call, [], scope, hint)
        if args is None:
            return ERROR
        pos, kws = args
        if isinstance(callee, DefRef):
            return self.bodies.apply_def(callee, call, pos, kws, scope, hint)
        return self.apply_op(callee, call.span, call.func.span, pos, kws, scope, hint,
                             self.exprs.final_name(call))

    # -- built-in ops ----------------------------------------------------------------------------
    def eval_args(self, call: ast.Call, pos: list[Arg], scope: Scope, hint: str,
                  ) -> tuple[list[Arg], dict[str, Arg]] | None:
        """The call's arguments evaluated, after `pos` (already evaluated ones); None when one
        of them failed (its error is reported)."""
        failed = any(v is ERROR for v, _ in pos)
        pos = list(pos)
        kws: dict[str, Arg] = {}
        for a in call.args:
            if isinstance(a, ast.Kwarg):
                value = self.exprs.eval(a.value, scope, hint)
                kws[a.name.name] = (value, a.span)
            else:
                value = self.exprs.eval(a, scope, hint)
                pos.append((value, a.span))
            failed = failed or value is ERROR
        return None if failed else (pos, kws)

    def apply_op(self, name: str, call_span: Span, func_span: Span, pos: list[Arg],
                 kws: dict[str, Arg], scope: Scope, hint: str, final: str | None = None) -> Any:
        """The node of op `name` on the evaluated arguments, named `final` if given."""
        op = OPS[name]
        precision = scope.precision
        compute_at = None
        if "compute" in kws:
            value, compute_at = kws.pop("compute")
            if not isinstance(value, DType):
                self.ctx.report("E0209", f"`compute` takes a dtype, found {kind_of(value)}",
                                compute_at, frame=scope.frame)
                return ERROR
            precision = PrecisionSpec(precision.io, precision.intermediate, value.name)
        request = self._operand_precision(op, kws, scope)
        if request is ERROR:
            return ERROR
        bound = self._bind_op(op, call_span, func_span, pos, kws, scope)
        if bound is None:
            return ERROR
        values: dict[str, Any] = {}
        spans: dict[str, Span] = {}
        producers: dict[str, str] = {}
        inputs: list[str] = []
        operands: list[str] = []
        numbers = _number_dtype(op, [v for v, _ in bound.values()])
        for p in op.params:
            value, span = bound[p.name]
            spans[p.name] = span
            converted = self._convert(op, p.name, p.kind, value, span, scope, hint, precision,
                                      numbers)
            if converted is ERROR:
                return ERROR
            if isinstance(converted, TensorVal):
                values[p.name] = converted.type
                producers[p.name] = self.ctx.producers[converted.node].op
                inputs.append(converted.node)
                operands.append(p.name)
            elif isinstance(converted, ListVal) and p.kind is Kind.TENSORS:
                values[p.name] = [t.type for t in converted.items]
                inputs.extend(t.node for t in converted.items)
                operands.extend(f"{p.name}.{i}" for i in range(len(converted.items)))
            else:
                values[p.name] = converted
        ctx = OpCtx(self, op, call_span, func_span, spans, producers, scope, precision,
                    compute_at)
        result = op.infer(ctx, Args(values))
        if result is None:
            return ERROR
        if request is not None and self.ctx.fp8:
            if not self._quantizable(op, ctx, values, *request):
                return ERROR
            ctx.attrs["precision"] = request[0]
            if request[0] in FP8:
                ctx.attrs["weight_scales"] = scope.quantize.get("weight_scales", WEIGHT_SCALES[0])
        for t in result if isinstance(result, tuple) else (result,):
            if not self.ctx.fits(t, call_span, scope.frame, name):
                return ERROR
        attr_names, listed = _shape_of(op)
        attrs = {n: values[n] for n in attr_names}
        attrs.update(ctx.attrs)
        if listed:
            attrs["operands"] = tuple(operands)
        if precision.compute != scope.precision.compute:
            attrs["compute"] = precision.compute
        # Named `<let>.<op>` for now; the `let` renames the node that ends up as its value.
        base = final or self.ctx.node_name(scope.frame, f"{hint}.{name}" if hint else name)
        if isinstance(result, tuple):
            return TupleVal(tuple(
                self.ctx.add_node(name, tuple(inputs), {**attrs, "output": i}, t, call_span,
                                  scope.frame, precision, f"{base}.{i}")
                for i, t in enumerate(result)))
        return self.ctx.add_node(name, tuple(inputs), attrs, result, call_span, scope.frame, precision,
                                 base)

    def _operand_precision(self, op: OpDef, kws: dict[str, Arg], scope: Scope,
                           ) -> tuple[str, Span] | Any | None:
        """The operand precision asked of this call (its `precision=` keyword, taken out of
        `kws`, or the scope's `precision <op>=` setting) and where; None; ERROR once reported."""
        if "precision" not in kws:
            if op.quantize is None or op.name not in scope.quantize:
                return None
            return scope.quantize[op.name], scope.precision_origin[op.name]
        value, span = kws.pop("precision")
        if op.quantize is None:
            able = ", ".join(f"`{n}`" for n in QUANTIZE_KEYS[:-1])
            self.ctx.report("E0204", f"`{op.name}` takes no `precision`", span,
                            "unknown keyword",
                            notes=(f"only {able} compute from operands quantised to fp8",),
                            help=("for the math precision, write `compute=`",), frame=scope.frame)
            return ERROR
        if not isinstance(value, DType) or not (value.name in FP8 or is_float(value.name)):
            shown = value.name if isinstance(value, DType) else kind_of(value)
            self.ctx.report("E0209", f"`precision` of `{op.name}` takes an fp8 or a float dtype, "
                            f"found {shown}", span, frame=scope.frame,
                            help=("`precision=f8e4m3` quantises the operands; a float dtype "
                                  "(their own) leaves them as they are",))
            return ERROR
        return value.name, span

    def _quantizable(self, op: OpDef, ctx: OpCtx, values: dict[str, Any], dtype: str,
                     asked: Span) -> bool:
        """The op's fp8 rule for an fp8 `dtype` (E0404); for a float one, the operands must
        already be of it: it leaves them unquantised (E0401)."""
        ctx.asked = asked
        if dtype in FP8:
            assert op.quantize is not None
            return op.quantize(ctx, Args(values), dtype)
        for p in op.tensor_params:
            t = values.get(p.name)
            if isinstance(t, TensorType) and p.kind is Kind.TENSOR and t.dtype != dtype:
                ctx.error("E0401", f"`precision={dtype}` leaves the operands of `{op.name}` "
                          f"unquantised, and `{p.name}` is {t.dtype}", at=p.name,
                          label=f"{t.dtype} here", labels=(Label(asked, f"{dtype} asked for here"),),
                          notes=("a float operand precision names the dtype the operands "
                                 "already have",),
                          help=(f"write `precision={t.dtype}`, or cast the operand",))
                return False
        return True

    def _bind_op(self, op: OpDef, call_span: Span, func_span: Span, pos: list[Arg],
                 kws: dict[str, Arg], scope: Scope) -> dict[str, Arg] | None:
        bound: dict[str, Arg] = {}
        if len(pos) > len(op.params):
            self.ctx.report("E0204", f"`{op.name}` takes at most {len(op.params)} arguments but "
                            f"{len(pos)} were supplied", pos[len(op.params)][1], "unexpected argument",
                            notes=(f"signature: {op.signature()}",), frame=scope.frame)
            return None
        for p, arg in zip(op.params, pos, strict=False):
            bound[p.name] = arg
        for key, arg in kws.items():
            if op.param(key) is None:
                hint = suggest(key, [q.name for q in op.params] + ["compute"])
                self.ctx.report("E0204", f"`{op.name}` has no parameter `{key}`", arg[1],
                                "unknown keyword", notes=(f"signature: {op.signature()}",),
                                help=(f"did you mean `{hint}`?",) if hint else (), frame=scope.frame)
                return None
            if key in bound:
                self.ctx.report("E0204", f"`{key}` is given twice to `{op.name}`", arg[1],
                                "given again by keyword", (Label(bound[key][1], "given here"),),
                                frame=scope.frame)
                return None
            bound[key] = arg
        missing = [p for p in op.params if p.name not in bound and p.default is REQUIRED]
        if missing:
            tensors = [p for p in op.params if p.kind is Kind.TENSOR]
            given = sum(1 for p in tensors if p.name in bound)
            if missing[0].kind is Kind.TENSOR:
                message = (f"`{op.name}` takes {len(tensors)} tensor argument"
                           f"{'s' if len(tensors) != 1 else ''} but {given} "
                           f"{'was' if given == 1 else 'were'} supplied")
            else:
                message = f"`{op.name}` needs the argument `{missing[0].name}`"
            self.ctx.report("E0204", message, call_span,
                            "missing argument " + ", ".join(f"`{p.name}`" for p in missing),
                            notes=(f"signature: {op.signature()}",), frame=scope.frame)
            return None
        for p in op.params:
            if p.name not in bound:
                bound[p.name] = (p.default, call_span)
        return bound

    def _convert(self, op: OpDef, name: str, kind: Kind, value: Any, span: Span, scope: Scope,
                 hint: str, precision: PrecisionSpec, numbers: str = "f32") -> Any:
        """Check an argument's kind; a number standing for a tensor becomes a scalar node (of
        dtype `numbers`: an integer written beside integer tensors is one of theirs)."""
        ok: bool
        if kind in (Kind.TENSOR, Kind.OPT_TENSOR):
            if kind is Kind.OPT_TENSOR and value is None:
                return None
            if isinstance(value, TensorVal):
                return value
            if op.scalars_as_tensors and isinstance(value, (int, float)) and not isinstance(value, bool):
                dtype = numbers if isinstance(value, int) else "f32"
                return self.ctx.add_node("scalar", (), {"value": float(value)}, TensorType(dtype, ()),
                                         span, scope.frame, precision,
                                         self.ctx.node_name(scope.frame, f"{hint or op.name}.scalar"))
            ok = False
        elif kind is Kind.TENSORS:
            ok = isinstance(value, ListVal) and all(isinstance(v, TensorVal) for v in value.items)
        elif kind is Kind.INT:
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif kind is Kind.OPT_INT:
            ok = value is None or (isinstance(value, int) and not isinstance(value, bool))
        elif kind is Kind.INTS:
            if isinstance(value, ListVal):
                value = tuple(value.items)
                ok = all(isinstance(v, int) and not isinstance(v, bool) for v in value)
            else:
                ok = value is None or (isinstance(value, int) and not isinstance(value, bool))
        elif kind is Kind.AXES:
            value = tuple(value.items) if isinstance(value, ListVal) else value
            items = value if isinstance(value, tuple) else (value,)
            ok = all(isinstance(v, int) and not isinstance(v, bool) for v in items)
        elif kind is Kind.DIM:
            ok = isinstance(value, dims.Poly) or (isinstance(value, int) and not isinstance(value, bool))
        elif kind is Kind.SHAPE:
            value = tuple(value.items) if isinstance(value, ListVal) else value
            ok = isinstance(value, tuple) and all(
                v is None or isinstance(v, dims.Poly) or (isinstance(v, int) and not isinstance(v, bool))
                for v in value)
        elif kind in (Kind.FLOAT, Kind.OPT_FLOAT):
            if kind is Kind.OPT_FLOAT and value is None:
                return None
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            value = float(value) if ok else value
        elif kind is Kind.BOOL:
            ok = isinstance(value, bool)
        elif kind is Kind.STR:
            ok = isinstance(value, str)
            p = op.param(name)
            if ok and p is not None and p.choices and value not in p.choices:
                hint_ = suggest(value, list(p.choices))
                self.ctx.report("E0305", f"`{name}` of `{op.name}` must be one of "
                                + ", ".join(f'"{c}"' for c in p.choices), span, f'"{value}" here',
                                help=(f'did you mean "{hint_}"?',) if hint_ else (), frame=scope.frame)
                return ERROR
        elif kind is Kind.DTYPE:
            ok = isinstance(value, DType) or value in DTYPES  # a default is the dtype's name
            value = value.name if isinstance(value, DType) else value
        else:
            ok = False
        if ok:
            return value
        self.ctx.report("E0209", f"`{name}` of `{op.name}` takes {_article(kind)}, found "
                        f"{kind_of(value)}", span, f"this is {kind_of(value)}",
                        notes=(f"signature: {op.signature()}",), frame=scope.frame)
        return ERROR

    # -- defs ------------------------------------------------------------------------------------
    def frame_for(self, ref: DefRef, call: ast.Call, scope: Scope, hint: str, args_text: str,
                  ) -> Frame:
        """The frame of a new def instance; consumes the pending instance name if it needs one."""
        creates = self.ctx.resolved.creates_instance(ref)
        name = ref.node.name.name
        if not creates:
            prefix = self.ctx.node_name(scope.frame, hint or name)
            return Frame(scope.frame, name, call.span, scope.frame.instance, prefix, args_text)
        pending = self.ctx.pending_instance
        self.ctx.pending_instance = None
        if pending is None:
            self.ctx.report("E0208", f"this instance of `{name}` has no name", call.span,
                            "its parameters need a path", frame=scope.frame,
                            help=("bind it with `let` first, e.g. `let block = "
                                  f"{name}(...)`, then use that value",))
            local = name
        else:
            local = pending[0]
        path = f"{scope.frame.instance}.{local}" if scope.frame.instance else local
        first = self.ctx.instance_paths.get(path)
        if first is None:
            self.ctx.instance_paths[path] = pending[1] if pending else call.span
        else:
            self.ctx.duplicate_instances.add(path)
            self.ctx.report("E0208", f"the instance path `{path}` is used twice",
                            pending[1] if pending else call.span, "second instance",
                            (Label(first, "first instance"),), frame=scope.frame,
                            help=('give each instance its own name with `as "..."`',))
        return Frame(scope.frame, name, call.span, path, path, args_text, True)


_SHAPES: dict[str, tuple[tuple[str, ...], bool]] = {}


def _shape_of(op: OpDef) -> tuple[tuple[str, ...], bool]:
    """An op's attribute names, and whether its node lists its operands (optional or variadic
    tensors): the same for every call, so found once."""
    shape = _SHAPES.get(op.name)
    if shape is None:
        shape = _SHAPES[op.name] = (
            tuple(p.name for p in op.params if not p.is_tensor),
            any(p.kind in (Kind.OPT_TENSOR, Kind.TENSORS) for p in op.params))
    return shape


# Ops where an integer written beside integer tensors is an integer of theirs (`arange(S) + 1`,
# `ids == 0`, `max(pos, 0)`): exact integer math. Division and powers stay float-only (E0402).
INTEGER_NUMBER_OPS = ("add", "sub", "mul", "max", "min", "cmp_lt", "cmp_le", "cmp_gt", "cmp_ge",
                      "cmp_eq", "cmp_ne")


def _number_dtype(op: OpDef, args: list[Any]) -> str:
    """The dtype an integer number takes among `args`: the integer tensors' one dtype, where the
    op is one of INTEGER_NUMBER_OPS and no float tensor is there; f32 otherwise."""
    dtypes = {v.type.dtype for v in args if isinstance(v, TensorVal)}
    if op.name in INTEGER_NUMBER_OPS and len(dtypes) == 1 and next(iter(dtypes)) in INTS:
        return next(iter(dtypes))
    return "f32"


def _article(kind: Kind) -> str:
    return {
        Kind.TENSOR: "a tensor", Kind.OPT_TENSOR: "a tensor", Kind.TENSORS: "a list of tensors",
        Kind.INT: "a static int", Kind.OPT_INT: "a static int",
        Kind.INTS: "an int or a list of ints", Kind.AXES: "a list of axes",
        Kind.SHAPE: "a list of dims", Kind.DIM: "a dim", Kind.FLOAT: "a float",
        Kind.OPT_FLOAT: "a float",
        Kind.BOOL: "a bool", Kind.STR: "a string", Kind.DTYPE: "a dtype",
    }[kind]


def same_type(a: TensorType, b: TensorType) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape


__all__ = ["CallEval", "format_type", "is_float", "same_type"]
