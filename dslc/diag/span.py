"""Source positions: a `Span` names a range of one file, 1-based lines and columns, end exclusive.

`SourceMap` holds the text of every file read, so a diagnostic can be rendered long after parsing.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dslc.diag.records import quick_init


@quick_init
@dataclass(frozen=True, slots=True)
class Span:
    file: str  # the file as shown to the user (relative to the cwd, or `std/...`)
    line: int
    col: int
    end_line: int
    end_col: int  # exclusive, as in Lark's `end_column`

    def to(self, other: Span) -> Span:
        """The smallest span covering `self` and `other` (same file)."""
        start = min((self.line, self.col), (other.line, other.col))
        end = max((self.end_line, self.end_col), (other.end_line, other.end_col))
        return Span(self.file, start[0], start[1], end[0], end[1])

    def json(self) -> dict[str, object]:
        return {
            "file": self.file,
            "line": self.line,
            "col": self.col,
            "end_line": self.end_line,
            "end_col": self.end_col,
        }

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"


NO_SPAN = Span("<unknown>", 0, 0, 0, 0)


class SourceMap:
    """The text of each file by its display name; filled by the parser, read by the renderer."""

    def __init__(self) -> None:
        self._texts: dict[str, str] = {}
        self._lines: dict[str, list[str]] = {}

    def add(self, name: str, text: str) -> None:
        self._texts[name] = text
        self._lines.pop(name, None)

    def text(self, name: str) -> str | None:
        return self._texts.get(name)

    def line(self, name: str, lineno: int) -> str | None:
        if name not in self._texts:
            return None
        lines = self._lines.get(name)
        if lines is None:
            lines = self._texts[name].split("\n")
            self._lines[name] = lines
        if 1 <= lineno <= len(lines):
            return lines[lineno - 1].rstrip("\r")
        return None

    def snippet(self, span: Span) -> str:
        """The source text under `span` (single or multi-line)."""
        if span.line == span.end_line:
            text = self.line(span.file, span.line) or ""
            return text[span.col - 1 : span.end_col - 1]
        parts = []
        for n in range(span.line, span.end_line + 1):
            text = self.line(span.file, n) or ""
            if n == span.line:
                text = text[span.col - 1 :]
            elif n == span.end_line:
                text = text[: span.end_col - 1]
            parts.append(text.strip())
        return " ".join(p for p in parts if p)


def display_name(path: Path, std_root: Path) -> str:
    """How a file is named in diagnostics: `std/...` for the bundled library, else relative to the
    cwd when below it, else absolute. Never the installed package's path. Printable (see
    `printable`): the name goes to the terminal, JSON and the bundle."""
    path = path.resolve()
    try:
        return "std/" + path.relative_to(std_root.resolve()).as_posix()
    except ValueError:
        pass
    try:
        return printable(path.relative_to(Path.cwd().resolve()).as_posix())
    except ValueError:
        return printable(path.as_posix())


def printable(text: str | Path) -> str:
    """A file name as it can be printed and stored: the bytes of a name that are not UTF-8 (which
    Python keeps as lone surrogates) become `\\xff` escapes."""
    s = str(text)
    try:
        return s.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:  # a surrogate that is no escaped byte
        return s.encode("utf-8", "backslashreplace").decode("utf-8")
