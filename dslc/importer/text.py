"""Operations as `.cgraph` expressions: infix operators with the language's precedence, calls
with their attributes, slices, numbers the parser reads back as the same f32."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from dslc.core import dims
from dslc.core.dims import DimEnv
from dslc.importer.graph import Arg, Lit, Op, attr_items
from dslc.importer.shapes import dim_text

# Precedence (LANGUAGE.md §2.2): higher binds tighter.
SUM, PRODUCT, UNARY, POSTFIX, ATOM = 5, 6, 7, 8, 9
COMPARE = 4
INFIX = {"add": ("+", SUM), "sub": ("-", SUM), "mul": ("*", PRODUCT), "div": ("/", PRODUCT),
         "cmp_eq": ("==", COMPARE), "cmp_ne": ("!=", COMPARE), "cmp_lt": ("<", COMPARE),
         "cmp_le": ("<=", COMPARE), "cmp_gt": (">", COMPARE), "cmp_ge": (">=", COMPARE)}
# Attributes written without their keyword (`reshape(x, [B, S])`, `cast(x, f16)`).
POSITIONAL = frozenset({("reshape", "shape"), ("transpose", "perm"), ("expand", "shape"),
                        ("cast", "dtype"), ("arange", "n")})
# The standard library's defaults: an attribute equal to its default is not written.
DEFAULTS: dict[str, dict[str, Any]] = {
    "conv2d": {"stride": 1, "pad": 0, "dilation": 1, "groups": 1, "has_bias": False},
    "linear": {"has_bias": True}, "layer_norm": {"eps": 1e-5}, "batchnorm2d": {"eps": 1e-5},
}
DTYPE_WORDS = frozenset({"f32", "f16", "bf16", "f8e4m3", "f8e5m2", "i8", "u8", "i32", "i64",
                         "bool"})


def number(value: float | int | bool) -> str:
    """A non-negative number as the parser reads it back: an int, or the shortest decimal that
    is the same f32 (`0.5`, `1e-05`, `3.4028235e+38`)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    target = np.float32(value)
    with np.errstate(over="ignore"):  # a rounding of f32's largest value reads back as inf
        for digits in range(1, 10):
            text = f"{float(target):.{digits}g}"
            if np.float32(float(text)) == target:
                break
    return text if ("." in text or "e" in text) else text + ".0"


class Writer:
    """Writes operations as expressions; `name_of` gives the name of an operation that is a
    `let` (or an input or param) and None for one written in place."""

    def __init__(self, env: DimEnv, name_of: Callable[[Op], str | None]) -> None:
        self.env = env
        self.name_of = name_of

    def arg(self, a: Arg, context: int = 0) -> str:
        """`a` as an operand of something binding at `context`, bracketed when weaker."""
        if isinstance(a, Lit):
            if isinstance(a.value, bool) or a.value >= 0:
                return number(a.value)
            text = "-" + number(-a.value)
            return f"({text})" if context > UNARY else text
        name = self.name_of(a)
        if name is not None:
            return name
        text, precedence = self.expr(a)
        return f"({text})" if precedence < context else text

    def expr(self, op: Op) -> tuple[str, int]:
        """The expression of `op` and how tightly it binds."""
        if op.op in INFIX:
            symbol, p = INFIX[op.op]
            left, right = op.args
            # left-associative: the right operand of `a - (b - c)` keeps its brackets
            lp = p + 1 if p == COMPARE else p
            return f"{self.arg(left, lp)} {symbol} {self.arg(right, p + 1)}", p
        if op.op == "neg":
            return f"-{self.arg(op.args[0], UNARY)}", UNARY
        if op.op == "index":
            return f"{self.arg(op.args[0], POSTFIX)}[{self.spec(op.attrs['spec'])}]", POSTFIX
        args = [self.arg(a) for a in op.args]
        if op.op == "sdpa" and len(args) == 4:
            args[3] = f"bias={args[3]}"
        if op.op == "concat":
            args = [f"[{', '.join(args)}]"]
        if op.op.startswith("def:"):  # an instance of an imported def: no attributes
            return f"{op.op[4:]}({', '.join(args)})", POSTFIX
        defaults = DEFAULTS.get(op.op, {})
        args += [self.keyword(op.op, k, v) for k, v in attr_items(op.attrs)
                 if not (k in defaults and _same(v, defaults[k]))]
        return f"{op.op}({', '.join(args)})", POSTFIX

    def keyword(self, op: str, key: str, value: Any) -> str:
        text = self.value(value)
        return text if (op, key) in POSITIONAL else f"{key}={text}"

    def value(self, v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, str):
            return v if v in DTYPE_WORDS else f'"{v}"'
        if isinstance(v, float):
            return number(v) if v >= 0 else "-" + number(-v)
        if isinstance(v, int):
            return str(v)
        if isinstance(v, (list, tuple)):
            return "[" + ", ".join(self.value(x) for x in v) + "]"
        if isinstance(v, dims.Poly):
            return dim_text(v, self.env)
        raise TypeError(f"no source form for {v!r}")

    def spec(self, spec: Sequence[Any]) -> str:
        parts = []
        for s in spec:
            if s is None:
                parts.append(":")
            elif isinstance(s, tuple):
                parts.append(f"{self.value(s[0])}:{self.value(s[1])}")
            else:
                parts.append(self.value(s))
        return ", ".join(parts)


def _same(value: Any, default: Any) -> bool:
    """An attribute equal to a default (floats compared as the f32 they stand for)."""
    if isinstance(default, float) and isinstance(value, float):
        return bool(np.float32(value) == np.float32(default))
    return bool(value == default) and type(value) is type(default)
