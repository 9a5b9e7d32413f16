"""The generator's state: the program being built, the values later ops may read, and
`apply`, which accepts a proposed op only when the op's own type rule (`OpDef.infer`, the rule the
checker runs) accepts it; that rule also gives the result's type. So every program is well-typed
by construction, and a new op is legal exactly where the checker says it is.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from dslc.core import dims
from dslc.core.dims import DimEnv, SymInfo
from dslc.core.types import Layout, PrecisionSpec, TensorType
from dslc.diag.span import Span
from dslc.fuzz.choices import Choices
from dslc.fuzz.program import DynDim, Expr, Input, ParamDecl, Program, Stmt
from dslc.ops import OPS
from dslc.ops.opdef import Args, Kind, SilentCtx

_SPAN = Span("<generated>", 1, 1, 1, 1)

# Ops whose result both oracles compute bit-identically from bit-identical operands: only these
# may feed a discontinuous op (floor, ceil, a comparison), where one ulp can flip the result.
EXACT_OPS = {"relu", "abs", "neg", "max", "min", "maxpool", "reduce_max", "reduce_min",
             "reduce_amax", "transpose", "reshape", "slice", "concat", "contiguous", "select"}
INFIX = {"add": "+", "sub": "-", "mul": "*", "div": "/", "cmp_lt": "<", "cmp_le": "<=",
         "cmp_gt": ">", "cmp_ge": ">=", "cmp_eq": "==", "cmp_ne": "!="}
Operand = Expr | TensorType | float | list[Expr] | None


@dataclass
class Stats:
    """What a run of the generator covered: ops, op pairs (operand op -> op), rejections."""

    ops: Counter[str] = field(default_factory=Counter)
    pairs: Counter[tuple[str, str]] = field(default_factory=Counter)
    rejected: Counter[str] = field(default_factory=Counter)
    features: Counter[str] = field(default_factory=Counter)
    programs: int = 0

    def table(self) -> str:
        """The coverage of a run: each op's count, and the op pairs (fusion candidates) hit."""
        rows = [f"{'op':<16}{'count':>8}{'rejected':>10}"]
        for op in sorted({*OPS, *self.ops}):
            rows.append(f"{op:<16}{self.ops[op]:>8}{self.rejected[op]:>10}")
        missed = sorted(op for op in OPS if not self.ops[op])
        rows.append(f"{self.programs} programs, {sum(self.ops.values())} ops, "
                    f"{len(self.pairs)} distinct op pairs; ops never generated: "
                    f"{', '.join(missed) or 'none'}")
        rows += [f"{name}: {count}" for name, count in sorted(self.features.items())]
        return "\n".join(rows)


class Gen:
    """The state of one program being generated."""

    def __init__(self, ch: Choices, stats: Stats | None = None) -> None:
        self.ch = ch
        self.stats = stats if stats is not None else Stats()
        self.env = DimEnv()
        io = ch.pick(["f32", "f16", "bf16"])
        inter = ch.pick(["f32", io])
        self.precision = PrecisionSpec(io, inter, "f32")
        self.prog = Program("fuzz", (io, inter, "f32"))
        self.pool: list[Expr] = []  # bound values later ops may read
        # A key mask [1, Skv] per key count, shared by the attentions over that many keys
        # (`families.attention`).
        self.masks: dict[int, Expr] = {}
        self._count = 0

    # -- names, dims, declarations ---------------------------------------------------------------
    def fresh(self, prefix: str) -> str:
        self._count += 1
        return f"{prefix}{self._count}"

    def dyn_dim(self, name: str, lo: int, hi: int, align: int = 1) -> dims.Dim:
        """Declare a dynamic dim with two tune buckets; the oracles run at one admissible value."""
        top = hi // align * align
        bottom = -(-lo // align) * align
        tune = tuple(sorted({bottom, top}))
        self.prog.dims.append(DynDim(name, lo, hi, align, tune))
        self.env.add(SymInfo(name, lo, hi, align))
        self.prog.run_dims[name] = bottom + align * self.ch.below((top - bottom) // align + 1)
        return dims.sym(name)

    def new_input(self, shape: tuple[dims.Dim, ...], tag: str = "", dtype: str = "") -> Expr:
        name = self.fresh("x")
        written = bool(dtype) and dtype != self.precision.io
        dtype = dtype or self.precision.io
        layout = Layout.from_tag(tag) if tag else None
        if layout is None and self.prog.layout and len(shape) == 4:
            layout = Layout.from_tag(self.prog.layout)
        typ = TensorType(dtype, shape, layout or Layout.row_major(len(shape)))
        self.prog.inputs.append(Input(name, typ, written, tag))
        value = self._value(name, typ, exact=True, scale=1.0, op="input")
        self.pool.append(value)
        return value

    def new_param(self, shape: tuple[int, ...], role: str = "weight", dtype: str = "") -> Expr:
        name = self.fresh("p")
        dtype = dtype or self.precision.io
        self.prog.params.append(ParamDecl(name, dtype, shape, role))
        typ = TensorType(dtype, shape, Layout.row_major(len(shape)))
        fan_in = math.prod(shape[1:]) if len(shape) >= 2 else 1
        scale = {"weight": 1 / math.sqrt(max(fan_in, 1)), "shift": 0.05, "mean": 0.1}.get(role, 1.0)
        return self._value(name, typ, exact=True, scale=scale, op="param")

    def _value(self, name: str, typ: TensorType, exact: bool, scale: float, op: str) -> Expr:
        return Expr(name, typ, frozenset({name}), exact, scale, op)

    # -- ops -------------------------------------------------------------------------------------
    def apply(self, op: str, tensors: Mapping[str, Operand], attrs: Mapping[str, Any] | None = None,
              scale: float | None = None, infix: bool = False) -> Expr | None:
        """`op` applied, if its type rule accepts it (else None, counted as a rejection)."""
        attrs = attrs or {}
        opdef = OPS[op]
        result = self.infer(op, tensors, attrs)
        if not isinstance(result, TensorType):
            return None
        operands = [v for v in tensors.values() if v is not None]
        flat = [e for v in operands for e in (v if isinstance(v, list) else [v])]
        exprs = [e for e in flat if isinstance(e, Expr)]
        for e in exprs:
            self.stats.pairs[(e.op or "input", op)] += 1
        self.stats.ops[op] += 1
        exact = op in EXACT_OPS and all(e.exact for e in exprs)
        if scale is None:
            scale = max((e.scale for e in exprs), default=1.0)
        return Expr(self._call_text(opdef, op, tensors, attrs, infix), result,
                    frozenset().union(*(e.reads for e in exprs)), exact, scale, op,
                    atom=not infix, constant=constant_axes(op, exprs, result, attrs))

    def infer(self, op: str, tensors: Mapping[str, Operand], attrs: Mapping[str, Any],
              ) -> TensorType | tuple[TensorType, ...] | None:
        """The op's type rule on these operands: the result type, or None (a rejection)."""
        opdef = OPS[op]
        values: dict[str, Any] = {}
        producers: dict[str, str] = {}
        for p in opdef.params:
            if p.is_tensor:
                v = tensors.get(p.name)
                if isinstance(v, Expr):
                    values[p.name] = v.type
                    producers[p.name] = v.op or "input"
                elif isinstance(v, TensorType):
                    values[p.name] = v
                elif isinstance(v, list):
                    values[p.name] = [e.type for e in v]
                elif isinstance(v, float):
                    values[p.name] = TensorType("f32", ())
                else:
                    values[p.name] = None
            else:
                values[p.name] = attrs.get(p.name, p.default)
        # cudnn=True: programs must also compile for cuDNN (the GPU oracle runs them).
        ctx = SilentCtx(self.env, self.precision, producers, _SPAN, cudnn=True)
        result = opdef.infer(ctx, Args(values))
        if result is None or ctx.errors:
            self.stats.rejected[op] += 1
            return None
        return result

    def bind_tuple(self, op: str, x: Expr, scale: float) -> bool:
        """`let (a, b) = op(x)` for an op with several results (genstats)."""
        result = self.infer(op, {"x": x}, {})
        if not isinstance(result, tuple):
            return False
        self.stats.ops[op] += 1
        self.stats.pairs[(x.op or "input", op)] += 1
        names = tuple(self.fresh("v") for _ in result)
        self.prog.stmts.append(Stmt(names, f"  let ({', '.join(names)}) = {op}({x.text})",
                                    x.reads))
        for name, typ in zip(names, result, strict=True):
            self.pool.append(Expr(name, typ, frozenset({name}), False, scale, op))
        return True

    def declare(self, stmt: Stmt, value: Expr) -> Expr:
        """A statement the caller wrote (a def call), binding `value`."""
        self.prog.stmts.append(stmt)
        self.pool.append(value)
        return value

    def _call_text(self, opdef: Any, op: str, tensors: Mapping[str, Operand],
                   attrs: Mapping[str, Any],
                   infix: bool) -> str:
        if infix and op in INFIX:
            a, b = (_operand_text(tensors[p.name], wrap=True) for p in opdef.tensor_params[:2])
            return f"{a} {INFIX[op]} {b}"
        args: list[str] = []
        keyword = False
        for p in opdef.params:
            if p.is_tensor:
                v = tensors.get(p.name)
                if v is None:
                    keyword = True
                    continue
                text = _operand_text(v, wrap=False)
                args.append(f"{p.name}={text}" if keyword or p.kind is Kind.OPT_TENSOR else text)
            elif p.name in attrs and attrs[p.name] is not None:
                args.append(f"{p.name}={attr_text(attrs[p.name])}")
        return f"{op}({', '.join(args)})"

    def bind(self, e: Expr, note: str = "") -> Expr:
        """`let vN = <e>`: a named value later ops may read."""
        name = self.fresh("v")
        comment = f"  # {note}" if note else ""
        self.prog.stmts.append(Stmt((name,), f"  let {name} = {e.text}{comment}", e.reads))
        value = replace(e, text=name, reads=frozenset({name}), atom=True)
        self.pool.append(value)
        return value

    # -- picking operands --------------------------------------------------------------------------
    def pick(self, want: Callable[[Expr], bool]) -> Expr | None:
        """A value from the pool that `want` accepts, the most recent ones first."""
        cands = [e for e in self.pool if want(e)]
        if not cands:
            return None
        return cands[-1 - self.ch.below(len(cands))]


ELEMENTWISE = {"relu", "tanh", "sigmoid", "gelu", "gelu_tanh", "silu", "abs", "neg", "erf", "sin",
               "cos", "softplus", "leaky_relu", "clamp", "swish", "elu", "exp", "log", "sqrt",
               "rsqrt", "reciprocal", "floor", "ceil", "add", "sub", "mul", "div", "max", "min",
               "pow", "select", "bias_add", "scale_mul", "cast", "contiguous", "cmp_lt", "cmp_le",
               "cmp_gt", "cmp_ge", "cmp_eq", "cmp_ne", "hardsigmoid", "hardswish"}


def constant_axes(op: str, operands: list[Expr], result: TensorType, attrs: Mapping[str, Any],
                  ) -> frozenset[int]:
    """Axes of the result (of size > 1) along which every value is the same."""
    shape = result.shape
    if op in ELEMENTWISE:
        def flat(e: Expr, axis: int) -> bool:  # e is the same along `axis` of the result
            a = axis - (len(shape) - e.type.rank)
            return a < 0 or e.type.shape[a] == 1 or a in e.constant
        axes = {a for a in range(len(shape)) if all(flat(e, a) for e in operands)}
    elif op == "upsample":
        x = operands[0]
        axes = {a for a in range(len(shape)) if x.type.shape[a] == 1 or a in x.constant}
    elif op == "transpose":
        perm = tuple(attrs["perm"])
        axes = {i for i, p in enumerate(perm) if p in operands[0].constant}
    elif op in ("slice", "maxpool", "avgpool"):
        axes = set(operands[0].constant)
    else:
        axes = set()
    return frozenset(a for a in axes if shape[a] != 1)


def _operand_text(v: Operand, wrap: bool) -> str:
    if isinstance(v, Expr):
        return f"({v.text})" if wrap and not v.atom else v.text
    if isinstance(v, list):
        return "[" + ", ".join(_operand_text(e, False) for e in v) + "]"
    if isinstance(v, float):
        return f"({v!r})" if wrap and v < 0 else repr(v)
    raise AssertionError(v)


def attr_text(v: Any) -> str:
    """An attribute value in source syntax."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return v if v in ("f32", "f16", "bf16", "i8", "u8", "i32", "i64", "bool") else f'"{v}"'
    if isinstance(v, (tuple, list)):
        return "[" + ", ".join(attr_text(x) for x in v) + "]"
    if isinstance(v, dims.Poly):
        return dims.format_dim(v)
    return repr(v)
