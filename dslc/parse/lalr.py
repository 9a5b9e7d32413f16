"""The parse loop: Lark compiles `grammar/cgraph.lark` into LALR(1) tables once; this module lexes
and parses a text with those tables (text + builder -> whatever the builder makes of `start`).

Why not Lark's own loop: it builds a tree with positions that is then transformed, and the
transformation recurses once per nesting level (a deep expression exhausted Python's stack).
This loop is iterative, calls the builder once per rule that makes a node, and passes the
one-child rules of the precedence chain (`?sum: product`) through without a call.

The builder gets every child of a rule in source order, tokens included (so a node's span starts
at its keyword), with the repetitions of `x*` spliced in. A token is a tuple
`(terminal, text, line, column)`; columns are 1-based and a token never spans lines.

Lexing is Lark's contextual lexing (in each parser state only the terminals that state accepts
are tried, so `dim=1` is a keyword argument named `dim`), with one difference: a keyword is a
whole word, so `letter` is an identifier, never `let` followed by `ter`. Errors are Lark's
exception types holding what Lark would put in them (the state's terminals, and those that the
parser would accept, found by trying each), for `parse.syntax` to report.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from lark import Lark, Token, UnexpectedCharacters, UnexpectedToken
from lark.lexer import PatternStr, TerminalDef
from lark.parsers.lalr_analysis import Shift

Tok = tuple[str, str, int, int]  # (terminal, text, line, column)
_WORD_END = r"(?!\w)"  # a keyword is a whole word
_BLANKS = re.compile(r"[ \t\f\r]*")

PASS, SPLICE, BUILD = 0, 1, 2  # what reducing a rule does with its children


class Splice(list[Any]):
    """The items of a repetition (`x*`, `("," x)*`), spliced into the rule that holds it."""


@dataclass
class Tables:
    """Lark's LALR tables, re-indexed for a tight loop."""

    actions: list[dict[str, int]]  # per state: symbol -> next state (>= 0) or ~rule index
    rules: list[tuple[int, str, int, str]]  # (size, origin, PASS/SPLICE/BUILD, builder method)
    has_splice: list[bool]  # whether a rule's children may hold a Splice
    start: int
    end: int
    terminals: dict[str, TerminalDef]
    ignore: frozenset[str]
    master: re.Pattern[str]  # every terminal, in Lark's order: what the root lexer would match
    keywords: dict[str, dict[str, str]]  # regex terminal -> {keyword text: keyword terminal}
    _state_lexers: dict[frozenset[str], re.Pattern[str]] = field(default_factory=dict)
    chains: dict[tuple[int, int, str], int] = field(default_factory=dict)  # see `parse`

    @staticmethod
    def from_lark(lark: Lark) -> Tables:
        table = lark.parser.parser.parser.parse_table
        index = {state: i for i, state in enumerate(table.states)}
        rule_index: dict[Any, int] = {}
        actions: list[dict[str, int]] = []
        for row in table.states.values():  # in the order of `index`
            out: dict[str, int] = {}
            for symbol, (action, arg) in row.items():
                if action is Shift:
                    out[str(symbol)] = index[arg]
                else:
                    out[str(symbol)] = ~rule_index.setdefault(arg, len(rule_index))
            actions.append(out)
        rules: list[tuple[int, str, int, str]] = [(0, "", PASS, "")] * len(rule_index)
        has_splice = [False] * len(rule_index)
        for rule, i in rule_index.items():
            origin = str(rule.origin.name)
            size = len(rule.expansion)
            if origin.startswith("_"):
                kind = SPLICE
            elif rule.alias is None and rule.options.expand1 and size == 1:
                kind = PASS
            else:
                kind = BUILD
            rules[i] = (size, origin, kind, str(rule.alias or origin))
            has_splice[i] = any(not s.is_term and s.name.startswith("_") for s in rule.expansion)
        terminals = {t.name: t for t in lark.terminals}
        ignore = frozenset(lark.lexer_conf.ignore)
        return Tables(actions, rules, has_splice, index[table.start_states["start"]],
                      index[table.end_states["start"]], terminals, ignore,
                      _lexer(list(terminals.values())), _keywords(terminals))

    def state_lexer(self, accepts: frozenset[str]) -> re.Pattern[str]:
        """What Lark's contextual lexer tries in a state accepting `accepts` (keywords whole)."""
        lexer = self._state_lexers.get(accepts)
        if lexer is None:
            names = accepts | self.ignore
            lexer = _lexer([t for n, t in self.terminals.items() if n in names])
            self._state_lexers[accepts] = lexer
        return lexer

    def allowed(self, accepts: frozenset[str]) -> set[str]:
        """The terminals Lark's contextual lexer names when nothing matches in a state: those the
        state accepts, less the keywords its identifier pattern covers."""
        names = {n for n in accepts if n in self.terminals} - self.ignore
        for regex, words in self.keywords.items():
            if regex in names:
                names -= set(words.values())
        return names or {"<END-OF-FILE>"}


def _order(t: TerminalDef) -> tuple[int, int, int, str]:
    return (-t.priority, -t.pattern.max_width, -len(t.pattern.value), t.name)


def _keywords(terminals: dict[str, TerminalDef]) -> dict[str, dict[str, str]]:
    """For each regex terminal, the string terminals it matches whole (NAME: the keywords)."""
    out: dict[str, dict[str, str]] = {}
    for r in terminals.values():
        if isinstance(r.pattern, PatternStr):
            continue
        regex = re.compile(r.pattern.to_regexp())
        words = {t.pattern.value: t.name for t in terminals.values()
                 if isinstance(t.pattern, PatternStr) and t.priority == r.priority
                 and regex.fullmatch(t.pattern.value)}
        if words:
            out[r.name] = words
    return out


def _lexer(terminals: list[TerminalDef]) -> re.Pattern[str]:
    """One regex of named alternatives, tried in Lark's order, after any blanks (spaces and tabs:
    a newline stays a token of its own, for the line count). A keyword is left to the identifier
    pattern when that is present (the token is retyped after matching); otherwise it must end at
    a word boundary."""
    regexes = [re.compile(t.pattern.to_regexp()) for t in terminals
               if not isinstance(t.pattern, PatternStr)]
    parts = []
    for t in sorted(terminals, key=_order):
        if isinstance(t.pattern, PatternStr):
            text = t.pattern.value
            word = re.fullmatch(r"\w+", text) is not None
            if word and any(r.fullmatch(text) for r in regexes):
                continue  # matched as an identifier, then retyped
            boundary = _WORD_END if word else ""
            parts.append(f"(?P<{t.name}>{re.escape(text)}{boundary})")
        else:
            parts.append(f"(?P<{t.name}>{t.pattern.to_regexp()})")
    return re.compile(f"{_BLANKS.pattern}(?:{'|'.join(parts)})")


class _Accepts:
    """What Lark's interactive parser offers an error: the terminals that would be accepted."""

    def __init__(self, accepts: set[str]) -> None:
        self._accepts = accepts

    def accepts(self) -> set[str]:
        return self._accepts


def parse(tables: Tables, text: str, builder: Any, tokens: list[Tok] | None = None) -> Any:
    """Lex and parse `text`; each BUILD rule calls `builder.<alias or rule name>(children)`.
    With `tokens`, every token read is appended to it, typed as the parser read it (the
    formatter lays them out). Raises Lark's UnexpectedToken or UnexpectedCharacters."""
    actions = tables.actions
    rules = tables.rules
    has_splice = tables.has_splice
    calls: list[Callable[[list[Any]], Any] | None] = [
        getattr(builder, name) if kind == BUILD else None for _, _, kind, name in rules]
    chains = tables.chains
    simple = [kind == BUILD and size > 0 and not spliced
              for (size, _, kind, _), spliced in zip(rules, has_splice, strict=True)]
    states = [tables.start]
    values: list[Any] = []
    last: Tok | None = None
    source = _tokens(tables, text, states)
    if tokens is not None:
        source = _recorded(source, tokens)
    for tok in source:
        last = tok
        kind = tok[0]
        # Reduce as long as the state says so, then shift the token.
        while True:
            action = actions[states[-1]].get(kind)
            if action is None:
                raise _unexpected_token(tables, tok, states)
            if action >= 0:
                states.append(action)
                values.append(tok)
                break
            rule = rules[~action]
            if rule[2] == PASS:
                # Most reductions pass one child up the precedence chain (`?sum: product`). Such
                # a run depends only on the two top states and the token: found once, then reused.
                key = (states[-2], states[-1], kind)
                top = chains.get(key)
                if top is None:
                    top = chains[key] = _pass_chain(actions, rules, states[-2], rule, kind)
                states[-1] = top
            elif simple[~action]:  # a node from a fixed number of children: inline too
                size = rule[0]
                children = values[-size:]
                del values[-size:]
                del states[-size:]
                values.append(calls[~action](children))  # type: ignore[misc]
                states.append(actions[states[-1]][rule[1]])
            else:
                _reduce(~action, rules, has_splice, calls, states, values, actions)
    return _finish(tables, rules, has_splice, calls, states, values, last)


def _tokens(tables: Tables, text: str, states: list[int]) -> Iterator[Tok]:
    """The tokens of `text`, each typed in the parser state (`states[-1]`) that reads it."""
    actions, keywords, ignore = tables.actions, tables.keywords, tables.ignore
    match = tables.master.match  # blanks before a token are part of its match
    pos, line, line_start, n = 0, 1, 0, len(text)
    while pos < n:
        m = match(text, pos)
        if m is None or m.lastgroup is None:
            pos = n - len(text[pos:].lstrip(" \t\f\r"))  # no token here: past the blanks
            if pos == n:
                return
            raise _unexpected_characters(tables, text, pos, line, pos - line_start + 1, states)
        kind = m.lastgroup
        start, pos = m.span(kind)
        value = text[start:pos]
        if kind in ignore:
            newlines = value.count("\n")
            if newlines:
                line += newlines
                line_start = start + value.rfind("\n") + 1
            continue
        row = actions[states[-1]]
        words = keywords.get(kind)
        if words is not None and value in words:
            if words[value] in row:
                kind = words[value]
            elif kind not in row:
                kind = words[value]  # as the root lexer types it, for the error
        col = start - line_start + 1
        if kind not in row:
            kind, value = _in_context(tables, text, start, line, col, states, kind, value)
            pos = start + len(value)
        yield (kind, value, line, col)


def _recorded(source: Iterator[Tok], into: list[Tok]) -> Iterator[Tok]:
    for tok in source:
        into.append(tok)
        yield tok


def _reduce(r: int, rules: list[tuple[int, str, int, str]], has_splice: list[bool],
            calls: list[Callable[[list[Any]], Any] | None], states: list[int],
            values: list[Any], actions: list[dict[str, int]]) -> None:
    size, origin, kind, _ = rules[r]
    if kind == PASS:
        del states[-1]
        states.append(actions[states[-1]][origin])
        return
    if size:
        children = values[-size:]
        del values[-size:]
        del states[-size:]
    else:
        children = []
    if has_splice[r]:
        children = _flatten(children, reuse=kind == SPLICE)
    if kind == SPLICE:
        result: Any = children if isinstance(children, Splice) else Splice(children)
    else:
        call = calls[r]
        assert call is not None
        result = call(children)
    values.append(result)
    states.append(actions[states[-1]][origin])


def _pass_chain(actions: list[dict[str, int]], rules: list[tuple[int, str, int, str]],
                below: int, rule: tuple[int, str, int, str], kind: str) -> int:
    """The top state after the run of one-child pass-through reductions that `rule` starts."""
    while True:
        top = actions[below][rule[1]]
        action = actions[top].get(kind)
        if action is None or action >= 0 or rules[~action][2] != PASS:
            return top
        rule = rules[~action]


def _flatten(children: list[Any], reuse: bool) -> list[Any]:
    """Children with any Splice opened. A repetition's own rule (`xs: xs item`) extends the
    Splice it already has, so a long list is built in linear time."""
    out: list[Any]
    if reuse and children and isinstance(children[0], Splice):
        out = children[0]
        rest = children[1:]
    else:
        out = Splice() if reuse else []
        rest = children
    for c in rest:
        if isinstance(c, Splice):
            out.extend(c)
        else:
            out.append(c)
    return out


def _finish(tables: Tables, rules: list[tuple[int, str, int, str]], has_splice: list[bool],
            calls: list[Callable[[list[Any]], Any] | None], states: list[int], values: list[Any],
            last: Tok | None) -> Any:
    actions = tables.actions
    end: Tok = ("$END", "", last[2], last[3]) if last else ("$END", "", 1, 1)
    while True:
        action = actions[states[-1]].get("$END")
        if action is None or action >= 0:
            raise _unexpected_token(tables, end, states)
        _reduce(~action, rules, has_splice, calls, states, values, actions)
        if states[-1] == tables.end:
            return values[-1]


def _in_context(tables: Tables, text: str, pos: int, line: int, col: int, states: list[int],
                kind: str, value: str) -> tuple[str, str]:
    """The token the state's own lexer finds where the longest match is not acceptable (Lark
    splits `->` into `-` and `>` where only `-` fits); an error if it finds none."""
    row = tables.actions[states[-1]]
    accepts = frozenset(k for k in row if k.isupper())
    m = tables.state_lexer(accepts).match(text, pos)
    if m is not None and m.lastgroup is not None:
        found, text_ = m.lastgroup, m.group(m.lastgroup)
        words = tables.keywords.get(found)
        if words is not None and text_ in words and words[text_] in row:
            found = words[text_]
        if found in row:
            return found, text_
    # The root lexer's token, reported against what this state expected (as Lark does).
    tok = _lark_token((kind, value, line, col), pos)
    err = UnexpectedToken(tok, tables.allowed(accepts),
                          interactive_parser=_Accepts(_accepted(tables, states)))
    raise err


def _lark_token(tok: Tok, pos: int = 0) -> Token:
    kind, value, line, col = tok
    return Token(kind, value, pos, line, col, line, col + len(value), pos + len(value))


def _unexpected_token(tables: Tables, tok: Tok, states: list[int]) -> UnexpectedToken:
    expected = {k for k in tables.actions[states[-1]] if k.isupper()}
    return UnexpectedToken(_lark_token(tok), expected,
                           interactive_parser=_Accepts(_accepted(tables, states)))


def _unexpected_characters(tables: Tables, text: str, pos: int, line: int, col: int,
                           states: list[int]) -> UnexpectedCharacters:
    accepts = frozenset(k for k in tables.actions[states[-1]] if k.isupper())
    return UnexpectedCharacters(text, pos, line, col, allowed=tables.allowed(accepts))


def _accepted(tables: Tables, states: list[int]) -> set[str]:
    """The terminals the parser would take next: each one tried on a copy of the state stack
    (reductions included), as Lark's `InteractiveParser.accepts` does."""
    actions = tables.actions
    out = set()
    for terminal in actions[states[-1]]:
        if not terminal.isupper():
            continue
        stack = list(states)
        while True:
            action = actions[stack[-1]].get(terminal)
            if action is None:
                break
            if action >= 0:
                out.add(terminal)
                break
            size, origin, _, _ = tables.rules[~action]
            if size:
                del stack[-size:]
            stack.append(actions[stack[-1]][origin])
            if terminal == "$END" and stack[-1] == tables.end:
                out.add(terminal)  # the whole file reduces: it may end here
                break
    return out
