"""The canonical layout of `.cgraph` source, comments kept (text -> text): `dslc fmt`. The rules
are written down in docs/LANGUAGE.md §2.7.

As gofmt does, it keeps where the author broke a statement over lines, at the places a line may
break (after a comma or an opening bracket, before a closing one, around an operator, after a
statement's `=`, before `->`, `if`, `else`, `as` and `when`), and decides everything else: one
statement a line, indentation, the spaces between tokens, blank lines, the `=` of neighbouring
`let`s and trailing comments lined up.

What it returns has been read back: the same tokens and the same comments in the same order, or
FormatError (a bug in dslc: a program is never changed by formatting it).
"""

from __future__ import annotations

import re
from bisect import bisect_right
from dataclasses import dataclass
from itertools import pairwise

from dslc.diag.diagnostic import Sink
from dslc.parse import ast
from dslc.parse.lalr import Tok
from dslc.parse.parser import parse_text
from dslc.parse.roles import CLOSE, DECL, Roles, Unit, roles

INDENT = 2  # per block
CONTINUATION = 4  # a statement's next line, where no bracket is open
COMMENT_COLUMN = 46  # a trailing comment starts in column 47 (or two spaces after the code)
_BREAK_BEFORE_WORD = ("IF", "ELSE", "AS", "WHEN")


class FormatError(Exception):
    """The formatted text does not read back as the same program: a bug in dslc."""


@dataclass(frozen=True, slots=True)
class _Comment:
    text: str
    line: int
    trailing: bool  # after code on its line (else on a line of its own)


Event = int | _Comment  # a token (its index) or a comment


@dataclass
class _Item:
    """A unit (a statement, a header, a `}`...) or a comment on a line of its own between units."""

    unit: Unit | None
    depth: int
    events: list[Event]
    blank: bool  # a blank line before it


@dataclass
class _Line:
    indent: int
    code: str = ""
    comment: str = ""


@dataclass
class _Open:
    """An open bracket: where it is, the indent of its line, whether a line break follows it."""

    col: int
    line_indent: int
    hanging: bool | None = None


def format_text(text: str, file: str, sink: Sink) -> str | None:
    """`text` in the canonical layout; None once its syntax errors are reported to `sink`."""
    tokens: list[Tok] = []
    module = parse_text(text, file, sink, tokens=tokens)
    if module is None:
        return None
    out = _Layout(text, tokens, roles(module, tokens)).render()
    _check(text, tokens, out, file)
    return out


def def_signatures(text: str, file: str, sink: Sink) -> list[tuple[ast.Def, str]] | None:
    """Each def of `text` with its signature on one line, spaced as the layout spaces it:
    `linear(x: [*L, K], out: int, has_bias: bool = true) -> [*L, out]`. None once syntax errors
    are reported."""
    tokens: list[Tok] = []
    module = parse_text(text, file, sink, tokens=tokens)
    if module is None:
        return None
    layout = _Layout(text, tokens, roles(module, tokens))
    index = {(t[2], t[3]): i for i, t in enumerate(tokens)}
    out = []
    for d in module.defs:
        brace = index[(d.header_span.end_line, d.header_span.end_col)]  # the header ends at `{`
        out.append((d, layout.one_line(index[(d.name.span.line, d.name.span.col)], brace - 1)))
    return out


def _check(text: str, tokens: list[Tok], out: str, file: str) -> None:
    again: list[Tok] = []
    sink = Sink()
    if parse_text(out, file, sink, tokens=again) is None:
        raise FormatError(f"the formatted `{file}` no longer parses: {sink.diagnostics[0].message}")
    if _significant(tokens) != _significant(again):
        raise FormatError(f"formatting `{file}` changed its tokens")
    if [c.text for _, c in _comments(text, tokens)] != [c.text for _, c in _comments(out, again)]:
        raise FormatError(f"formatting `{file}` changed its comments")


def _trailing_comma(tokens: list[Tok], i: int) -> bool:
    return tokens[i][1] == "," and i + 1 < len(tokens) and tokens[i + 1][1] in (")", "]")


def _significant(tokens: list[Tok]) -> list[tuple[str, str]]:
    """The tokens that make the program: all but trailing commas (`f(a,)` is `f(a)`)."""
    return [t[:2] for i, t in enumerate(tokens) if not _trailing_comma(tokens, i)]


def _comments(text: str, tokens: list[Tok]) -> list[tuple[int, _Comment]]:
    """Each comment with the index of the token after it (len(tokens) at the end of the file).
    Between two tokens there are only blanks and comments: the lexer ignores nothing else."""
    starts = [0, *(m.end() for m in re.finditer("\n", text))]  # where each line starts
    out: list[tuple[int, _Comment]] = []
    pos, prev_line = 0, 0
    for i in range(len(tokens) + 1):
        if i < len(tokens):
            _, value, line, col = tokens[i]
            end = starts[line - 1] + col - 1
        else:
            end = len(text)
        while (j := text.find("#", pos, end)) >= 0:
            k = text.find("\n", j, end)
            k = end if k < 0 else k
            line_j = bisect_right(starts, j)
            out.append((i, _Comment(text[j:k].rstrip(), line_j, line_j == prev_line)))
            pos = k
        if i < len(tokens):
            pos, prev_line = end + len(value), line
    return out


class _Layout:
    def __init__(self, text: str, tokens: list[Tok], roles: Roles) -> None:
        self.tokens = tokens
        self.roles = roles
        self.items = self._items(_comments(text, tokens))
        _blank_lines(self.items)
        self.pads = self._aligned_lets()

    # -- the units, and the comments between them ----------------------------------------------
    def _items(self, comments: list[tuple[int, _Comment]]) -> list[_Item]:
        units = self.roles.units
        items: list[_Item] = []
        current: _Item | None = None
        prev_line = 0
        c = 0
        for i in range(len(self.tokens) + 1):
            while c < len(comments) and comments[c][0] == i:
                comment = comments[c][1]
                blank = prev_line > 0 and comment.line - prev_line > 1
                if comment.trailing:
                    assert current is not None
                    current.events.append(comment)
                elif i == len(self.tokens) or i in units:  # between units
                    # before a `}`: still inside the block
                    depth = 0 if i == len(self.tokens) else (
                        1 if units[i].kind == CLOSE else units[i].depth)
                    items.append(_Item(None, depth, [comment], blank))
                else:  # inside a statement
                    assert current is not None
                    current.events.append(comment)
                prev_line = comment.line
                c += 1
            if i == len(self.tokens):
                break
            line = self.tokens[i][2]
            unit = units.get(i)
            if unit is not None:
                current = _Item(unit, unit.depth, [i], prev_line > 0 and line - prev_line > 1)
                items.append(current)
            else:
                assert current is not None
                current.events.append(i)
            prev_line = line
        return items

    # -- where lines break, and the spaces between tokens -------------------------------------
    def breakable(self, a: int, b: int) -> bool:
        """Whether a line may break between tokens `a` and `b` of one statement."""
        ta, tb, r = self.tokens[a][1], self.tokens[b][1], self.roles
        return (ta in (",", "(", "[") or tb in (")", "]") or tb == "->"
                or (ta == "=" and a not in r.keyword_eq) or a in r.binary or b in r.binary
                or self.tokens[b][0] in _BREAK_BEFORE_WORD)

    def kept_break(self, a: int, b: int) -> bool:
        """The author broke the line between `a` and `b`, where a line may break."""
        return self.tokens[a][2] != self.tokens[b][2] and self.breakable(a, b)

    def space(self, a: int, b: int) -> str:
        ta, tb, r = self.tokens[a][1], self.tokens[b][1], self.roles
        if b in r.slice_colon:
            return " " if ta == "," else ""
        if a in r.slice_colon or tb == ":" or a in r.keyword_eq or b in r.keyword_eq:
            return ""
        if tb in (")", "]", ",", ".", "..") or b in r.tight_before:
            return ""
        if ta in ("(", "[", ".", "..", "@") or a in r.tight_after:
            return ""
        return " " * (1 + self.pads.get(b, 0))

    def without_trailing_commas(self, events: list[Event]) -> list[Event]:
        """A comma before a closing bracket on the same line says nothing: left out. Kept where
        the bracket starts a line of its own (a list written one item a line)."""
        out: list[Event] = []
        for k, e in enumerate(events):
            nxt = events[k + 1] if k + 1 < len(events) else None
            if (isinstance(e, int) and isinstance(nxt, int) and _trailing_comma(self.tokens, e)
                    and not self.kept_break(e, nxt)):
                continue
            out.append(e)
        return out

    def one_line(self, first: int, last: int) -> str:
        """Tokens `first`..`last` on one line."""
        toks: list[Event] = list(range(first, last + 1))
        kept = [e for e in self.without_trailing_commas(toks) if isinstance(e, int)]
        return "".join((self.space(a, b) if a is not None else "") + self.tokens[b][1]
                       for a, b in zip([None, *kept], kept))

    def fits_one_line(self, item: _Item) -> bool:
        """A unit printed on one line: no comment inside it, no line break kept."""
        last = len(item.events) - 1
        if any(isinstance(e, _Comment) and k != last for k, e in enumerate(item.events)):
            return False
        toks = [e for e in item.events if isinstance(e, int)]
        return not any(self.kept_break(a, b) for a, b in pairwise(toks))

    def _aligned_lets(self) -> dict[int, int]:
        """The `=` of neighbouring one-line `let NAME = ...` statements (no blank line or comment
        line between them) lined up: extra spaces before each `=`."""
        pads: dict[int, int] = {}
        run: list[tuple[int, int]] = []
        for item in [*self.items, None]:
            first = item.events[0] if item is not None and item.unit is not None else None
            let = self.roles.lets.get(first) if isinstance(first, int) else None
            if let is not None and item is not None and not self.fits_one_line(item):
                let = None
            if item is None or item.blank or let is None:
                width = max((n for _, n in run), default=0)
                pads.update((eq, width - n) for eq, n in run if n < width)
                run = []
            if let is not None:
                run.append(let)
        return pads

    # -- printing -------------------------------------------------------------------------------
    def render(self) -> str:
        lines: list[_Line | None] = []
        for item in self.items:
            if item.blank:
                lines.append(None)
            if item.unit is None:
                comment = item.events[0]
                assert isinstance(comment, _Comment)
                lines.append(_Line(item.depth * INDENT, "", comment.text))
            else:
                lines.extend(_UnitPrinter(self, item.depth * INDENT).print(item.events))
        return "".join(text + "\n" for text in _with_comments(lines))


class _UnitPrinter:
    """One unit's lines: the breaks the author made where a line may break, each next line
    aligned after the innermost open bracket (or 4 deeper than its line where the bracket ends
    a line, or 4 deeper than the statement where none is open; a closing bracket that starts a
    line goes back to its opening line's indent)."""

    def __init__(self, layout: _Layout, indent: int) -> None:
        self.layout = layout
        self.indent = indent
        self.lines: list[_Line] = []
        self.line: _Line | None = None
        self.stack: list[_Open] = []

    def print(self, events: list[Event]) -> list[_Line]:
        prev: int | None = None
        ended = False  # a comment ended the line
        for e in self.layout.without_trailing_commas(events):
            if isinstance(e, _Comment):
                if e.trailing and self.line is not None:
                    self.line.comment = e.text
                else:
                    self._end()
                    self.lines.append(_Line(self._continuation(False), "", e.text))
                ended = True
                continue
            text = self.layout.tokens[e][1]
            if prev is None:
                self.line = _Line(self.indent)
            elif ended or self.layout.kept_break(prev, e):
                self._end()
                self.line = _Line(self._continuation(text in (")", "]")))
            else:
                assert self.line is not None
                self.line.code += self.layout.space(prev, e)
            self._put(text)
            prev, ended = e, False
        self._end()
        return self.lines

    def _put(self, text: str) -> None:
        line = self.line
        assert line is not None
        if self.stack and self.stack[-1].hanging is None:
            self.stack[-1].hanging = False  # a token follows the bracket on its line
        col = line.indent + len(line.code)
        line.code += text
        if text in ("(", "["):
            self.stack.append(_Open(col, line.indent))
        elif text in (")", "]") and self.stack:
            self.stack.pop()

    def _end(self) -> None:
        if self.line is not None and (self.line.code or self.line.comment):
            self.lines.append(self.line)
        self.line = None

    def _continuation(self, closing: bool) -> int:
        if not self.stack:
            return self.indent + CONTINUATION
        top = self.stack[-1]
        if top.hanging is None:
            top.hanging = True  # the line breaks right after the bracket
        if closing:
            return top.line_indent
        return top.line_indent + CONTINUATION if top.hanging else top.col + 1


def _blank_lines(items: list[_Item]) -> None:
    """At most one blank line where the author left any, none at the start of the file or of a
    block, nor before a `}`; a def or model (with the comments directly above it) apart from
    what comes before and after it."""
    for k, item in enumerate(items):
        prev = items[k - 1].unit if k else None
        if k == 0 or (prev is not None and prev.kind == DECL) or (
                item.unit is not None and item.unit.kind == CLOSE):
            item.blank = False
        elif prev is not None and prev.kind == CLOSE:
            item.blank = True
    for k, item in enumerate(items):
        if item.unit is None or item.unit.kind != DECL:
            continue
        j = k
        while j > 0 and items[j - 1].unit is None and not items[j].blank:
            j -= 1
        if j > 0:
            items[j].blank = True


def _with_comments(lines: list[_Line | None]) -> list[str]:
    """The lines as text, trailing comments of neighbouring lines lined up in one column."""
    out: list[str] = []
    k = 0
    while k < len(lines):
        line = lines[k]
        if line is None:
            out.append("")
            k += 1
            continue
        if not (line.code and line.comment):
            out.append(" " * line.indent + line.code if line.code else " " * line.indent
                       + line.comment)
            k += 1
            continue
        run = [line]
        while k + len(run) < len(lines):
            nxt = lines[k + len(run)]
            if nxt is None or not (nxt.code and nxt.comment):
                break
            run.append(nxt)
        column = max(COMMENT_COLUMN, *(r.indent + len(r.code) + 2 for r in run))
        out.extend((" " * r.indent + r.code).ljust(column) + r.comment for r in run)
        k += len(run)
    return out

