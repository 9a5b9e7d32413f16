"""Name resolution over every parsed file, before elaboration (`Program` -> `Resolved`).

Two namespaces: callables (built-in ops, defs, import aliases; looked up only at a call's head)
and values (dims, inputs, params, lets, def arguments, shape variables). Reports unknown names
(E0201, E0203), duplicates (E0202), import clashes (E0206), wrong-kind uses (E0209) and def call
cycles (E0701) everywhere, also in defs no model instantiates and in `if` branches not taken.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from dslc.diag.diagnostic import Diagnostic, Label, Sink
from dslc.diag.span import Span
from dslc.ops import OPS
from dslc.parse import ast
from dslc.parse.loader import STD_ROOT, Program


@dataclass(frozen=True)
class DefRef:
    module: ast.Module
    node: ast.Def

    @property
    def key(self) -> tuple[str, str]:
        return (self.module.path, self.node.name.name)


Callable_ = DefRef | str  # a def, or the name of a built-in op


@dataclass
class Namespace:
    """The callables visible in one file."""

    defs: dict[str, DefRef] = field(default_factory=dict)  # local and unqualified imports
    aliases: dict[str, ast.Module] = field(default_factory=dict)

    def lookup(self, func: ast.Expr) -> Callable_ | None:
        if isinstance(func, ast.Name):
            if func.name in self.defs:
                return self.defs[func.name]
            return func.name if func.name in OPS else None
        if isinstance(func, ast.Member) and isinstance(func.target, ast.Name):
            module = self.aliases.get(func.target.name)
            if module is not None:
                for d in module.defs:
                    if d.name.name == func.name.name:
                        return DefRef(module, d)
        return None


@dataclass
class Resolved:
    namespaces: dict[str, Namespace] = field(default_factory=dict)  # by module path
    has_params: dict[tuple[str, str], bool] = field(default_factory=dict)
    estimates: dict[tuple[str, str], Any] = field(default_factory=dict)  # `check.expansion`
    # The def calls in each right-hand side, by id(): found while resolving it.
    def_calls: dict[int, list[tuple[ast.Call, DefRef]]] = field(default_factory=dict)
    _instances: dict[int, list[ast.Call]] = field(default_factory=dict)

    def creates_instance(self, ref: Callable_ | None) -> bool:
        return isinstance(ref, DefRef) and self.has_params.get(ref.key, False)

    def instance_calls(self, expr: ast.Expr, module: ast.Module) -> list[ast.Call]:
        """The calls in `expr` that create def instances (cached: each bucket re-check asks)."""
        found = self._instances.get(id(expr))
        if found is None:
            calls = self.def_calls.get(id(expr))
            if calls is not None:
                found = [call for call, ref in calls if self.creates_instance(ref)]
            else:
                ns = self.namespaces[module.path]
                found = [e for e in ast.walk(expr) if isinstance(e, ast.Call)
                         and self.creates_instance(ns.lookup(e.func))]
            self._instances[id(expr)] = found
        return found


# PyTorch's spellings of parameters dslc names differently.
TORCH_NAMES = {"kernel_size": "k", "kernel": "k", "padding": "pad", "out_channels": "out",
               "out_features": "out", "bias": "has_bias", "keepdim": "keepdims", "dim": "axes",
               "negative_slope": "slope", "num_groups": "groups", "output_padding": "output_pad",
               "scale_factor": "factor", "is_causal": "causal"}


def suggest(name: str, candidates: list[str]) -> str | None:
    mapped = TORCH_NAMES.get(name)
    if mapped in candidates:
        return mapped
    if mapped == "axes" and "axis" in candidates:
        return "axis"
    found = difflib.get_close_matches(name, candidates, n=1, cutoff=0.75)
    return found[0] if found else None


def resolve(program: Program, sink: Sink) -> Resolved:
    out = Resolved()
    for module in program.modules.values():
        out.namespaces[module.path] = _namespace(program, module, sink)
    calls: dict[tuple[str, str], list[tuple[DefRef, Span]]] = {}
    for module in program.modules.values():
        ns = out.namespaces[module.path]
        model_names = cache(lambda module=module: {
            i.name: m.name.name for m in module.models for s in m.body for i in _bound_names(s)})
        for d in module.defs:
            body = _Body(ns, sink, f"def `{d.name.name}`", model_names, out.def_calls)
            calls[(module.path, d.name.name)] = body.def_(d)
        for m in module.models:
            _Body(ns, sink, f"model `{m.name.name}`", def_calls=out.def_calls).model(m)
    order = {(m.path, d.name.name): (i, d.span.line) for i, m in enumerate(program.modules.values())
             for d in m.defs}
    _report_cycles(calls, order, sink)
    for module in program.modules.values():
        for d in module.defs:
            _has_params(DefRef(module, d), calls, out.has_params)
    return out


def _namespace(program: Program, module: ast.Module, sink: Sink) -> Namespace:
    ns = Namespace()
    origin: dict[str, Span] = {}
    for d in module.defs:
        name = d.name.name
        if name in OPS:
            sink.report(Diagnostic(
                "E0202", f"`{name}` is already a built-in operation", d.name.span,
                "this def would hide it", help=(f"rename the def, e.g. `my_{name}`",)))
        elif name in ns.defs:
            sink.report(Diagnostic(
                "E0202", f"the def `{name}` is defined twice", d.name.span, "defined again here",
                (Label(origin[name], "first defined here"),),
                help=("rename one of them",)))
            continue
        ns.defs[name] = DefRef(module, d)
        origin[name] = d.name.span
    for imp, target in program.imported(module):
        if imp.alias is not None:
            alias = imp.alias.name
            if alias in ns.aliases or alias in ns.defs or alias in OPS:
                what = ("the built-in operation" if alias in OPS else "the def" if alias in ns.defs
                        else "the import alias")
                sink.report(Diagnostic(
                    "E0206", f"the import alias `{alias}` clashes with {what} `{alias}`",
                    imp.alias.span, "already in use", help=("choose another alias",)))
            ns.aliases[alias] = target
            continue
        for d in target.defs:
            name = d.name.name
            if name in ns.defs or name in OPS:
                first = origin.get(name)
                sink.report(Diagnostic(
                    "E0206", f"the imported def `{name}` clashes with "
                    + ("a built-in operation" if name in OPS else "another def"),
                    imp.span, f"brings in `{name}`",
                    (Label(first, "also defined here"),) if first else (),
                    help=(f'import it under a name: `import "{imp.path.value}" as ns`, '
                          f"then call `ns.{name}(...)`",)))
                continue
            ns.defs[name] = DefRef(target, d)
            origin[name] = d.name.span
    return ns


class _Body:
    """Resolves the value names of one def or model body, in statement order."""

    def __init__(self, ns: Namespace, sink: Sink, owner: str,
                 model_names: Callable[[], dict[str, str]] | None = None,
                 def_calls: dict[int, list[tuple[ast.Call, DefRef]]] | None = None) -> None:
        self.def_calls = def_calls if def_calls is not None else {}
        self._rhs_calls: list[tuple[ast.Call, DefRef]] | None = None
        # What only the message of an unknown name needs is found when one is reported: the
        # names a model of this file binds, and those the body binds further down.
        self._model_names = model_names or dict
        self._body: tuple[ast.Stmt, ...] = ()
        self._later: dict[str, Span] | None = None
        self.ns = ns
        self.sink = sink
        self.owner = owner
        self.scope: dict[str, Span] = {}
        self.calls: list[tuple[DefRef, Span]] = []
        self._heads: set[int] = set()  # ids of the Name nodes that are call heads

    def bind(self, ident: ast.Ident) -> None:
        first = self.scope.get(ident.name)
        if first is not None:
            self.sink.report(Diagnostic(
                "E0202", f"the name `{ident.name}` is defined twice in {self.owner}", ident.span,
                "defined again here", (Label(first, "first defined here"),),
                notes=("bindings are single-assignment; a name cannot be rebound or shadowed",),
                help=(f"give the second binding a new name, e.g. `{_next_name(ident.name)}`",)))
            return
        self.scope[ident.name] = ident.span

    def def_(self, d: ast.Def) -> list[tuple[DefRef, Span]]:
        self._body = d.body
        for p in d.params:
            if isinstance(p.type, ast.ScalarTypeExpr):
                if p.default is not None:
                    self.expr(p.default)
                self.bind(p.name)
        for p in d.params:
            if isinstance(p.type, ast.TensorTypeExpr):
                self.bind(p.name)
                self.pattern(p.type)
        for stmt in d.body:
            self.stmt(stmt)
        for t in d.ret or ():
            self.type_(t)
        return self.calls

    def model(self, m: ast.Model) -> None:
        self._body = m.body
        for a in m.args:
            self.expr(a.value if isinstance(a, ast.Kwarg) else a)
        for stmt in m.body:
            self.stmt(stmt)

    @property
    def later(self) -> dict[str, Span]:
        """Each name the body binds, where first bound (for "used before it is defined")."""
        if self._later is None:
            self._later = {}
            for stmt in self._body:
                for ident in _bound_names(stmt):
                    self._later.setdefault(ident.name, ident.span)
        return self._later

    def pattern(self, t: ast.TensorTypeExpr) -> None:
        """Shape-pattern names not yet bound are bound here; everything else is resolved."""
        for d in t.dims or ():
            if isinstance(d, (ast.Variadic, ast.Name)) and d.name not in self.scope:
                self.bind(ast.Ident(d.span, d.name))
            elif isinstance(d, ast.Variadic):
                pass  # bound by an earlier parameter: checked when the def is instantiated
            else:
                self.expr(d)

    def type_(self, t: ast.TensorTypeExpr | None) -> None:
        for e in ast.type_exprs(t):
            self.expr(e)
        if t is not None:
            for d in t.dims or ():
                if isinstance(d, ast.Variadic) and d.name not in self.scope:
                    self._unknown(ast.Name(d.span, d.name))

    def stmt(self, stmt: ast.Stmt) -> None:
        match stmt:  # `let` first: most statements are
            case ast.Let(targets=targets, type=t, rhs=rhs, guard=g):
                if g is not None:
                    self.expr(g)
                self.rhs(rhs)
                self.type_(t)
                for ident in targets:
                    self.bind(ident)
            case ast.DimFixed(name=name, value=value):
                self.expr(value)
                self.bind(name)
            case ast.DimRange(name=name):
                self.bind(name)
            case ast.Input(name=name, type=t):
                self.type_(t)
                self.bind(name)
            case ast.ParamStmt(name=name, type=t, guard=g):
                self.type_(t)
                if g is not None:
                    self.expr(g)
                self.bind(name)
            case ast.Output(name=name, type=t, rhs=rhs):
                if rhs is not None:
                    self.rhs(rhs)
                    self.type_(t)
                    self.bind(name)
                else:
                    self.type_(t)
                    if name.name not in self.scope:
                        self._unknown(ast.Name(name.span, name.name))
            case ast.Buckets(names=names):
                for ident in names:
                    if ident.name not in self.scope:
                        self._unknown(ast.Name(ident.span, ident.name))
            case ast.Precision(settings=kws):
                for kw in kws:
                    self.expr(kw.value)
            case ast.Return(values=values):
                for v in values:
                    self.expr(v)

    def rhs(self, rhs: ast.Rhs) -> None:
        if rhs.repeat is not None:
            self.expr(rhs.repeat)
        self._rhs_calls = []
        self.expr(rhs.expr)
        self.def_calls[id(rhs.expr)] = self._rhs_calls  # for `Resolved.instance_calls`
        self._rhs_calls = None

    def expr(self, expr: ast.Expr) -> None:
        for e in ast.walk(expr):
            if isinstance(e, ast.Call):
                self.call_head(e)
            elif isinstance(e, ast.Member) and (dotted := ast.dotted_name(e)) is not None and \
                    id(_root(e)) not in self._heads:
                root = dotted.split(".")[0]
                if root in self.ns.aliases and dotted not in self.scope:
                    self.sink.report(Diagnostic(
                        "E0209", "a namespace member can only be called", e.span, "not a value",
                        help=(f"call it: `{dotted}(...)`",)))
                elif dotted not in self.scope and root not in self.scope:
                    self._unknown(ast.Name(e.span, dotted))  # no dotted param of that name
                self._heads.update(id(n) for n in ast.walk(e))  # a dotted name, as a whole
            elif isinstance(e, ast.Name) and not self._is_head(e) and e.name not in self.scope:
                self._unknown(e)
        self._heads.clear()

    def _is_head(self, e: ast.Name) -> bool:
        return id(e) in self._heads

    def call_head(self, call: ast.Call) -> None:
        func = call.func
        if isinstance(func, ast.Member):
            for e in ast.walk(func.target):
                self._heads.add(id(e))
            if not isinstance(func.target, ast.Name):
                self.sink.report(Diagnostic(
                    "E0209", "only operations, defs and `namespace.def` can be called", func.span,
                    "not callable", notes=("namespaces are one level deep: `nn.linear(...)`",)))
                return
            if func.target.name not in self.ns.aliases:
                self._report_unknown_op(func.target.span, func.target.name, list(self.ns.aliases),
                                        f"unknown namespace `{func.target.name}`",
                                        "not an import alias")
                return
            module = self.ns.aliases[func.target.name]
            ref = self.ns.lookup(func)
            if ref is None:
                self._report_unknown_op(func.name.span, func.name.name,
                                        [d.name.name for d in module.defs],
                                        f"`{func.target.name}` has no def `{func.name.name}`",
                                        f"not defined in `{module.file}`")
            elif isinstance(ref, DefRef):
                self.calls.append((ref, call.func.span))
                self._note_def_call(call, ref)
            return
        if not isinstance(func, ast.Name):
            self.sink.report(Diagnostic("E0209", "only operations and defs can be called",
                                        func.span, "not callable"))
            return
        self._heads.add(id(func))
        ref = self.ns.lookup(func)
        if ref is None:
            if func.name in self.scope:
                self.sink.report(Diagnostic(
                    "E0209", f"`{func.name}` is a value, not an operation", func.span,
                    "cannot be called",
                    notes=("values and operations live in separate namespaces",)))
                return
            self._report_unknown_op(func.span, func.name, list(self.ns.defs) + list(OPS))
        elif isinstance(ref, DefRef):
            self.calls.append((ref, func.span))
            self._note_def_call(call, ref)

    def _note_def_call(self, call: ast.Call, ref: DefRef) -> None:
        if self._rhs_calls is not None:
            self._rhs_calls.append((call, ref))

    def _report_unknown_op(self, span: Span, name: str, candidates: list[str],
                           message: str | None = None, label: str | None = None) -> None:
        hint = suggest(name, candidates)
        helps = [f"did you mean `{hint}`?"] if hint else []
        std = _std_defs().get(name)
        if message is None and std is not None:
            helps.insert(0, f'`{name}` is defined in `{std}`: add `import "{std}"`')
        notes = () if message else ("`dslc ops` lists the built-in operations and their "
                                    "signatures",)
        self.sink.report(Diagnostic(
            "E0203", message or f"unknown operation `{name}`", span,
            label or "not a built-in op, nor a def in scope", help=tuple(helps), notes=notes))

    def _unknown(self, e: ast.Name) -> None:
        notes: tuple[str, ...] = ()
        helps: list[str] = []
        later = self.later.get(e.name)
        if later is not None and (later.line, later.col) > (e.span.line, e.span.col):
            notes = (f"`{e.name}` is defined on line {later.line}, after this use",)
        hint = suggest(e.name, list(self.scope))
        if hint is not None:
            helps.append(f"a value with a similar name exists: `{hint}` (defined on line "
                         f"{self.scope[hint].line})")
        if e.name in ("True", "False"):
            helps.append(f"booleans are written `{e.name.lower()}`")
        if e.name in OPS or e.name in self.ns.defs:
            helps.append(f"`{e.name}` is an operation; call it: `{e.name}(...)`")
        model_names = self._model_names()
        if e.name in model_names:
            notes = (*notes, f"`{e.name}` belongs to model `{model_names[e.name]}`; a def "
                     "sees only its own parameters and bindings")
            helps.append(f"add a parameter, e.g. `{e.name.lower()}: int`, and pass the value "
                         "at the call")
        self.sink.report(Diagnostic(
            "E0201", f"cannot find value `{e.name}` in this scope", e.span,
            f"not found in {self.owner}", notes=notes, help=tuple(helps)))


@cache
def _std_defs() -> dict[str, str]:
    """Def names of the bundled library, for "add this import" hints."""
    out: dict[str, str] = {}
    for path in sorted(STD_ROOT.glob("*.cgraph")):
        for name in re.findall(r"^def\s+([A-Za-z_][A-Za-z0-9_]*)", path.read_text(), re.M):
            out.setdefault(name, f"std/{path.name}")
    return out


def _root(e: ast.Expr) -> ast.Expr:
    while isinstance(e, ast.Member):
        e = e.target
    return e


def _next_name(name: str) -> str:
    stem = name.rstrip("0123456789")
    digits = name[len(stem):]
    return f"{stem}{int(digits) + 1}" if digits else f"{name}2"


def _bound_names(stmt: ast.Stmt) -> list[ast.Ident]:
    match stmt:
        case ast.DimFixed(name=n) | ast.DimRange(name=n) | ast.Input(name=n) | ast.ParamStmt(name=n):
            return [n]
        case ast.Let(targets=targets):
            return list(targets)
        case ast.Output(name=n, rhs=rhs) if rhs is not None:
            return [n]
    return []


def _report_cycles(calls: dict[tuple[str, str], list[tuple[DefRef, Span]]],
                   order: dict[tuple[str, str], tuple[int, int]], sink: Sink) -> None:
    """E0701 once per cycle of the def call graph (Tarjan's strongly connected components)."""
    index: dict[tuple[str, str], int] = {}
    low: dict[tuple[str, str], int] = {}
    stack: list[tuple[str, str]] = []
    on_stack: set[tuple[str, str]] = set()
    components: list[list[tuple[str, str]]] = []

    def visit(v: tuple[str, str]) -> None:
        # Iterative, so a long chain of defs cannot exhaust Python's recursion limit.
        work = [(v, 0)]
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        while work:
            node, i = work[-1]
            edges = calls.get(node, [])
            if i < len(edges):
                work[-1] = (node, i + 1)
                w = edges[i][0].key
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, 0))
                elif w in on_stack:
                    low[node] = min(low[node], index[w])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == node:
                        break
                components.append(comp)

    for v in calls:
        if v not in index:
            visit(v)
    for comp in components:
        members = set(comp)
        first = min(comp, key=lambda k: order.get(k, (0, 0)))  # the def written first
        if len(comp) == 1 and not any(ref.key == first for ref, _ in calls.get(first, [])):
            continue
        path, spans = _shortest_cycle(first, members, calls)
        names = [p[1] for p in path]
        labels = tuple(Label(s, f"...which calls `{names[i + 1]}`" + (" again" if i + 2 == len(names)
                                                                          else ""))
                       for i, s in enumerate(spans[1:], start=1))
        sink.report(Diagnostic(
            "E0701", f"def `{names[0]}` calls itself: {' -> '.join(names)}", spans[0],
            f"`{names[0]}` calls `{names[1]}` here", labels,
            notes=("defs are expanded inline at compile time, so a call cycle never terminates",),
            help=(f"to apply a block several times, use `repeat N {names[0]}(x)`",)))


def _shortest_cycle(first: tuple[str, str], members: set[tuple[str, str]],
                    calls: dict[tuple[str, str], list[tuple[DefRef, Span]]],
                    ) -> tuple[list[tuple[str, str]], list[Span]]:
    """Breadth-first: the shortest call path from `first` back to itself, with its call spans."""
    previous: dict[tuple[str, str], tuple[tuple[str, str], Span]] = {}
    frontier = [first]
    while frontier and first not in previous:
        reached: list[tuple[str, str]] = []
        for node in frontier:
            for ref, span in calls.get(node, []):
                if ref.key in members and ref.key not in previous:
                    previous[ref.key] = (node, span)
                    reached.append(ref.key)
        frontier = reached
    path, spans = [first], []
    node = first
    while True:
        prev, span = previous[node]
        path.append(prev)
        spans.append(span)
        node = prev
        if node == first:
            break
    return list(reversed(path)), list(reversed(spans))


def _has_params(ref: DefRef, calls: dict[tuple[str, str], list[tuple[DefRef, Span]]],
                memo: dict[tuple[str, str], bool]) -> bool:
    """Whether a def declares params or inputs (each instance's own), directly or through the
    defs it calls. A depth-first walk with its own stack (a long chain of defs must not exhaust
    Python's); a call cycle (E0701) counts as none."""
    if ref.key in memo:
        return memo[ref.key]
    active = {ref.key}
    stack: list[list[Any]] = [[ref, iter(calls.get(ref.key, [])), _declares_per_instance(ref)]]
    while stack:
        frame = stack[-1]
        node, callees, found = frame
        if not found:
            edge = next(callees, None)
            if edge is not None:
                callee = edge[0]
                if callee.key in memo:
                    frame[2] = memo[callee.key]
                elif callee.key not in active:
                    active.add(callee.key)
                    stack.append([callee, iter(calls.get(callee.key, [])),
                                  _declares_per_instance(callee)])
                continue
        stack.pop()
        active.discard(node.key)
        memo[node.key] = found
        if stack:
            stack[-1][2] = stack[-1][2] or found
    return memo[ref.key]


def _declares_per_instance(ref: DefRef) -> bool:
    """A `param` or an `input` in the body: each instance has its own, named by its path."""
    return any(isinstance(s, ast.ParamStmt | ast.Input) for s in ref.node.body)
