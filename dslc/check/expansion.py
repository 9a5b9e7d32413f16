"""How many operations and def instances a def call would create, estimated from the call graph
before it is expanded (resolved program -> `Estimate` per def).

Defs are expanded inline, so defs that each call the previous one twice grow exponentially: 40
lines of them would build a trillion nodes. The elaborator asks for a def's estimate before it
expands a call or a `repeat`, and refuses (E0705, naming the chain of defs that multiplies) when
the model would grow past `context.MAX_NODES`, instead of building nodes until it does.

The estimate counts the instance itself, every operation call and operator written in the def's
body (dim arithmetic too, and both branches of an `if`: an upper bound) and, for each call of a
def, that def's estimate times the call's literal `repeat` count. A `repeat` count given by a name is unknown
here and counts once; the elaborator checks such a `repeat` again when it knows the count.
"""

from __future__ import annotations

from dataclasses import dataclass

from dslc.check.resolve import DefRef, Resolved
from dslc.parse import ast

Key = tuple[str, str]


@dataclass(frozen=True)
class Estimate:
    ops: int  # operations and def instances one instance creates, itself and its callees' included
    heaviest: tuple[DefRef, int] | None  # the callee that contributes most, and how many times


def estimate(resolved: Resolved, ref: DefRef, memo: dict[Key, Estimate]) -> Estimate:
    """The estimate of `ref`, computed for it and its callees once (a walk with its own stack:
    a long chain of defs must not exhaust Python's). A call cycle (E0701) counts nothing."""
    if ref.key in memo:
        return memo[ref.key]
    active = {ref.key}
    calls = _calls(resolved, ref)
    stack = [(ref, calls, iter(calls.values()))]
    while stack:
        node, calls, todo = stack[-1]
        callee = next((c for c, _ in todo if c.key not in memo and c.key not in active), None)
        if callee is not None:
            active.add(callee.key)
            more = _calls(resolved, callee)
            stack.append((callee, more, iter(more.values())))
            continue
        stack.pop()
        active.discard(node.key)
        memo[node.key] = _combine(resolved, node, calls, memo)
    return memo[ref.key]


def _combine(resolved: Resolved, ref: DefRef, calls: dict[Key, tuple[DefRef, int]],
             memo: dict[Key, Estimate]) -> Estimate:
    ops = 1 + _own_ops(resolved, ref)  # the instance itself: expanding one costs like an op
    heaviest: tuple[DefRef, int] | None = None
    most = -1
    for callee, times in calls.values():
        done = memo.get(callee.key)
        if done is None:  # part of a call cycle
            continue
        ops += times * done.ops
        if times * done.ops > most:
            most, heaviest = times * done.ops, (callee, times)
    return Estimate(ops, heaviest)


def _calls(resolved: Resolved, ref: DefRef) -> dict[Key, tuple[DefRef, int]]:
    """The defs `ref`'s body calls, each with the number of times one instance expands it."""
    ns = resolved.namespaces.get(ref.module.path)
    out: dict[Key, tuple[DefRef, int]] = {}
    if ns is None:
        return out
    for stmt in ref.node.body:
        repeat = _literal_repeat(stmt)
        for expr in ast.stmt_exprs(stmt):
            top = expr if isinstance(stmt, (ast.Let, ast.Output)) and stmt.rhs is not None \
                and expr is stmt.rhs.expr else None
            for e in ast.walk(expr):
                if isinstance(e, ast.Call):
                    callee = ns.lookup(e.func)
                    if isinstance(callee, DefRef):
                        before = out.get(callee.key, (callee, 0))[1]
                        out[callee.key] = (callee, before + (repeat if e is top else 1))
    return out


def _literal_repeat(stmt: ast.Stmt) -> int:
    if isinstance(stmt, (ast.Let, ast.Output)) and stmt.rhs is not None \
            and isinstance(stmt.rhs.repeat, ast.Int):
        return max(stmt.rhs.repeat.value, 1)
    return 1


def _own_ops(resolved: Resolved, ref: DefRef) -> int:
    """Operations a body writes itself: calls of built-in ops, operators, indexing, params."""
    ns = resolved.namespaces.get(ref.module.path)
    ops = 0
    for stmt in ref.node.body:
        ops += isinstance(stmt, ast.ParamStmt)
        for expr in ast.stmt_exprs(stmt):
            for e in ast.walk(expr):
                if isinstance(e, (ast.Binary, ast.Neg)) or (
                        isinstance(e, ast.Call) and ns is not None
                        and isinstance(ns.lookup(e.func), str)):
                    ops += 1
                elif isinstance(e, ast.Index):
                    ops += 2  # a slice, and a reshape when an axis is dropped
    return ops


def chain_text(ref: DefRef, memo: dict[Key, Estimate], steps: int = 4) -> str:
    """`f` calls `g` 2 times, which calls `h` 2 times, ...: the path that multiplies most."""
    parts: list[str] = []
    node: DefRef | None = ref
    seen: set[Key] = set()
    while node is not None and node.key not in seen:
        seen.add(node.key)
        est = memo.get(node.key)
        if est is None or est.heaviest is None:
            break
        callee, times = est.heaviest
        verb = "calls" if not parts else "which calls"
        parts.append(f"{verb} `{callee.node.name.name}` {times} time{'s' if times != 1 else ''}")
        node = callee
    if len(parts) > steps:
        parts = [*parts[:steps], f"... ({len(parts) - steps} more defs)"]
    return f"`{ref.node.name.name}` " + ", ".join(parts) if parts else f"`{ref.node.name.name}`"
