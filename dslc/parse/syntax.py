"""Syntax errors: Lark's exception -> one E01xx diagnostic (LANGUAGE.md section 4.2).

Expected terminals are named by their spelling and grouped ("a statement", "or an operator").
Known mistakes (the catalogue below, one test per entry) get a curated message and help. At the
end of the file, a brace-matching pass points at the `{` that is never closed.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from lark import Token, UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken

from dslc.core.types import DTYPES
from dslc.diag.codes import CodeId
from dslc.diag.diagnostic import Diagnostic, Label, Sink
from dslc.diag.span import Span
from dslc.parse.grammar import lark_parser

_NAMED = {
    "NAME": "identifier",
    "INT": "integer",
    "FLOAT": "float",
    "STRING": "string",
    "CMP_OP": "comparison",
    "$END": "end of file",
}
STATEMENT_KEYWORDS = {"dim", "buckets", "precision", "layout", "input", "param", "let", "output",
                      "return"}
_OPERATORS = {"(", "*", "+", "-", ".", "/", "//", "[", "and", "if", "or", "comparison"}
_EXPRESSION = {"(", "[", "-", "identifier", "integer", "float", "string", "true", "false"}


def _spelling(terminal: str) -> str:
    if terminal in _NAMED:
        return _NAMED[terminal]
    try:
        pattern = lark_parser().get_terminal(terminal).pattern
    except KeyError:
        return terminal.lower()
    if pattern.type == "str":
        return str(pattern.value)
    return terminal.lower()


def describe_expected(terminals: set[str]) -> str:
    """`{COMMA, RPAR, PLUS, ...}` -> "expected `,` or `)`, or an operator"."""
    names = {_spelling(t) for t in terminals}
    groups: list[str] = []
    if names >= STATEMENT_KEYWORDS:
        names -= STATEMENT_KEYWORDS
        groups.append("a statement")
    if names >= _EXPRESSION:
        names -= _EXPRESSION | set(DTYPES) | {"not"}
        groups.append("an expression")
    operator = names >= _OPERATORS
    if operator:
        names -= _OPERATORS
    plain = {"identifier", "integer", "float", "string", "end of file", "comparison"}
    items = groups + [n if n in plain else f"`{n}`" for n in sorted(names, key=_order)]
    text = _join(items)
    if operator:
        text = f"{text}, or an operator" if text else "an operator"
    return f"expected {text}" if text else "unexpected input"


_PUNCT_ORDER = ",)]}:=([{"


def _order(name: str) -> tuple[int, int, str]:
    # Punctuation first (what is usually missing: a comma, a closing bracket), then keywords,
    # then token classes.
    if not name[0].isalnum():
        at = _PUNCT_ORDER.find(name)
        return (0, at if at >= 0 else len(_PUNCT_ORDER), name)
    return (1 if name not in _NAMED.values() else 2, 0, name)


def _join(items: list[str]) -> str:
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " or " + items[-1]


def _describe_token(tok: Token) -> str:
    if tok.type == "$END":
        return "end of file"
    kind = _NAMED.get(tok.type)
    text = str(tok)
    if kind in ("identifier", "integer", "float", "string"):
        return f"{kind} `{text}`"
    if text in STATEMENT_KEYWORDS or text.isalpha():
        return f"keyword `{text}`"
    return f"`{text}`"


@dataclass(frozen=True)
class ErrorSite:
    """What a catalogue entry may look at: the offending text, what was expected, the line."""

    token_type: str
    token_text: str
    expected: frozenset[str]
    line_text: str
    col: int  # 0-based column of the offending text

    @property
    def before(self) -> str:
        return self.line_text[: self.col]

    @property
    def after(self) -> str:
        return self.line_text[self.col + len(self.token_text) :]


@dataclass(frozen=True)
class Mistake:
    """A known mistake: `matches` recognises it, `message`/`label`/`help` explain it."""

    name: str
    code: CodeId
    matches: Callable[[ErrorSite], bool]
    message: Callable[[ErrorSite], str]
    label: Callable[[ErrorSite], str]
    help: Callable[[ErrorSite], str]
    example: str  # a snippet that makes this mistake (tested)


def _decl_keyword(site: ErrorSite) -> str:
    m = re.match(r"\s*(input|param)\b", site.line_text)
    return m.group(1) if m else "input"


def _with_colon(site: ErrorSite) -> str:
    fixed = re.sub(r"\s*=\s*", ": ", site.line_text.split("#")[0].strip(), count=1)
    return f"write `{fixed}`"


def _neighbours(site: ErrorSite) -> tuple[str, str, str]:
    """The item before the error, the one starting at it, and the bracket that holds them
    (for the missing-comma help)."""
    depth, start, opener = 0, len(site.before), "("
    for i in range(len(site.before) - 1, -1, -1):
        ch = site.before[i]
        if ch in ")]":
            depth += 1
        elif ch in "([":
            if depth == 0:
                opener = ch
                break
            depth -= 1
        elif ch == "," and depth == 0:
            break
        start = i
    depth, end, rest = 0, 0, site.line_text[site.col :]
    for i, ch in enumerate(rest):
        if ch in "([":
            depth += 1
        elif ch in ")]":
            if depth == 0:
                break
            depth -= 1
        elif (ch == "," or ch == "#") and depth == 0:
            break
        end = i + 1
    return site.before[start:].strip(), rest[:end].strip(), opener


def _is_missing_comma(site: ErrorSite) -> bool:
    return "," in site.expected and site.token_type in ("NAME", "INT", "FLOAT", "STRING")


def _missing_comma_help(site: ErrorSite) -> str:
    prev, nxt, opener = _neighbours(site)
    what = "arguments" if opener == "(" else "the items"
    if prev and nxt:
        return f"separate {what} with a comma: `{prev}, {nxt}`"
    return f"separate {what} with a comma"


CATALOGUE: tuple[Mistake, ...] = (
    Mistake(
        "declaration with `=`", "E0102",
        lambda s: s.token_text == "=" and ":" in s.expected
        and re.match(r"\s*(input|param)\b", s.line_text) is not None,
        lambda s: f"{'an' if _decl_keyword(s) == 'input' else 'a'} `{_decl_keyword(s)}` is "
                  "declared with a type, not a value",
        lambda s: "expected `:`",
        lambda s: _with_colon(s) + (" (or pin the dtype, e.g. `f16[...]`)"
                                    if _decl_keyword(s) == "input" else ""),
        "model m {\n  input x = [N, 784]\n}\n",
    ),
    Mistake(
        "semicolon", "E0101",
        lambda s: s.token_text == ";",
        lambda s: "syntax error: unexpected `;`",
        lambda s: "statements end at the end of the line",
        lambda s: "remove the `;`",
        "model m {\n  input x: [4];\n}\n",
    ),
    Mistake(
        "power operator", "E0101",
        lambda s: s.token_text == "*" and s.before.rstrip().endswith("*"),
        lambda s: "syntax error: `**` is not an operator",
        lambda s: "no power operator",
        lambda s: "use `pow(a, b)`, or `x * x` for a square",
        "model m {\n  input x: [4]\n  output y = x ** 2\n}\n",
    ),
    Mistake(
        "three-dot range", "E0101",
        lambda s: s.token_text == "." and s.before.rstrip().endswith(".."),
        lambda s: "syntax error: a range is written with two dots",
        lambda s: "one `.` too many",
        lambda s: "write the range as `lo..hi`, e.g. `1..64`",
        "model m {\n  dim N = 1...64\n}\n",
    ),
    Mistake(
        "@ as matmul", "E0101",
        lambda s: s.token_text == "@" and "@" not in s.expected,
        lambda s: "syntax error: `@` is not matrix multiplication",
        lambda s: "`@` only tags a layout, as in `f16[N, C, H, W] @NHWC`",
        lambda s: "call the op: `matmul(a, b)`",
        "model m {\n  input x: [4, 4]\n  output y = x @ x\n}\n",
    ),
    Mistake(
        "tune without brackets", "E0101",
        lambda s: s.before.rstrip().endswith("tune") and "[" in s.expected,
        lambda s: "syntax error: the tune buckets are a bracketed list",
        lambda s: "expected `[`",
        lambda s: "write the buckets in brackets, e.g. `tune [1, 8]`",
        "model m {\n  dim N = 1..64 tune 1, 8\n}\n",
    ),
    Mistake(
        "python-style def header", "E0101",
        lambda s: s.token_text == ":" and ("{" in s.expected or "->" in s.expected),
        lambda s: "syntax error: a def body is a `{ ... }` block",
        lambda s: "expected `{` or `->`",
        lambda s: "write `def name(...) {` and close the body with `}`; indentation has no meaning",
        "def f(x: [N]):\n  return x\n",
    ),
    Mistake(
        "untyped def parameter", "E0101",
        lambda s: s.token_text in (")", ",") and s.expected == frozenset({":"})
        and re.match(r"\s*def\b", s.line_text) is not None,
        lambda s: "syntax error: a def parameter needs a type",
        lambda s: "expected `:`",
        lambda s: "give each parameter a type: `x: [N, D]` for a tensor, `k: int` for a scalar",
        "def f(x) {\n  return x\n}\n",
    ),
    Mistake(
        "assignment as comparison", "E0101",
        lambda s: s.token_text == "=" and "comparison" in s.expected
        and re.search(r"\b(when|if)\b", s.before) is not None,
        lambda s: "syntax error: `=` in a condition",
        lambda s: "expected a comparison",
        lambda s: "to compare, write `==`",
        "model m {\n  dim K = 3\n  input x: [4]\n  let y = x when K = 3\n}\n",
    ),
    Mistake(
        "binding without let", "E0101",
        lambda s: s.token_type == "NAME" and {"let", "return", "output"} & s.expected != set()
        and s.after.lstrip().startswith("=") and not s.after.lstrip().startswith("=="),
        lambda s: "syntax error: a binding starts with `let`",
        lambda s: "expected a statement",
        lambda s: f"write `let {s.token_text} = ...`",
        "model m {\n  input x: [4]\n  y = relu(x)\n}\n",
    ),
    Mistake(
        "missing comma", "E0101",
        _is_missing_comma,
        lambda s: f"syntax error: unexpected {_kind(s)} `{s.token_text}`",
        lambda s: "",  # filled with the expected set
        _missing_comma_help,
        "model m {\n  input x: [4]\n  let y = relu(x, slope=1 k=3)\n}\n",
    ),
)


def _kind(site: ErrorSite) -> str:
    return _NAMED.get(site.token_type, "token")


def _site(err: UnexpectedInput, text: str) -> tuple[ErrorSite, Span, str, set[str]]:
    lines = text.split("\n")
    if isinstance(err, UnexpectedToken):
        tok = err.token
        expected = set(err.accepts or err.expected)
        if tok.type == "$END":
            return _at_end(lines, expected)
        assert tok.line is not None and tok.column is not None and tok.end_column is not None
        line_text = lines[tok.line - 1] if tok.line <= len(lines) else ""
        site = ErrorSite(tok.type, str(tok), frozenset(_spelling(t) for t in expected), line_text,
                         tok.column - 1)
        end_col = tok.end_column if tok.end_line == tok.line else len(line_text) + 1
        return site, Span("", tok.line, tok.column, tok.line, end_col), _describe_token(tok), expected
    if isinstance(err, UnexpectedCharacters):
        line_text = lines[err.line - 1] if 0 < err.line <= len(lines) else ""
        ch = err.char
        expected = set(err.allowed or ())
        site = ErrorSite("CHAR", ch, frozenset(_spelling(t) for t in expected), line_text,
                         err.column - 1)
        desc = f"character `{ch}`" if ch.isprintable() else f"character {ch!r}"
        return site, Span("", err.line, err.column, err.line, err.column + 1), desc, expected
    assert isinstance(err, UnexpectedEOF)
    return _at_end(lines, set(err.expected))


def _at_end(lines: list[str], expected: set[str]) -> tuple[ErrorSite, Span, str, set[str]]:
    """The end of file, placed just after the last code on the last line that has any."""
    line = len(lines)
    while line > 1 and not lines[line - 1].split("#")[0].strip():
        line -= 1
    text = lines[line - 1]
    col = len(text.split("#")[0].rstrip())
    site = ErrorSite("$END", "", frozenset(_spelling(t) for t in expected), text, col)
    return site, Span("", line, col + 1, line, col + 2), "end of file", expected


def _unclosed_brace(text: str, file: str) -> Label | None:
    """The innermost `{` (or `(` / `[`) never closed, ignoring strings and comments."""
    stack: list[tuple[int, int, str]] = []
    pairs = {")": "(", "]": "[", "}": "{"}
    for n, line in enumerate(text.split("\n"), start=1):
        line = re.sub(r'"([^"\\\n]|\\.)*"', lambda m: " " * len(m.group(0)), line).split("#")[0]
        for c, ch in enumerate(line, start=1):
            if ch in "([{":
                stack.append((n, c, ch))
            elif ch in pairs and stack and stack[-1][2] == pairs[ch]:
                stack.pop()
    if not stack:
        return None
    n, c, ch = stack[-1]
    return Label(Span(file, n, c, n, c + 1), f"this `{ch}` is never closed")


def report_syntax_error(err: UnexpectedInput, text: str, file: str, sink: Sink) -> None:
    site, span, found, expected = _site(err, text)
    span = Span(file, span.line, span.col, span.end_line, span.end_col)
    expected_text = describe_expected(expected)
    labels: tuple[Label, ...] = ()
    if site.token_type == "$END" or site.token_text in ("def", "model", "import"):
        before = "\n".join([*text.split("\n")[:span.line - 1], site.before])
        brace = _unclosed_brace(before, file)
        labels = (brace,) if brace else ()
    for mistake in CATALOGUE:
        if mistake.matches(site):
            label = mistake.label(site) or expected_text
            sink.report(Diagnostic(mistake.code, mistake.message(site), span, label, labels,
                                   help=(mistake.help(site),)))
            return
    sink.report(Diagnostic("E0101", f"syntax error: unexpected {found}", span, expected_text,
                           labels))
