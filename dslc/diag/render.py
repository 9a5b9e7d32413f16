"""Render diagnostics as text: `human` (the rustc layout), `json` (one object per line), `github`
(workflow commands that annotate a pull request).

Human layout: header, `--> file:line:col`, the source lines with `^^^` under the primary span and
`---` under secondary ones, then `= note:` and `= help:` lines. Labels in other files get a
`::: file:line:col` header; lines that are not adjacent are separated by `...`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

from dslc.diag.diagnostic import Diagnostic
from dslc.diag.span import SourceMap, Span

MAX_SHOWN = 160  # characters of a source line shown under a diagnostic


@dataclass(frozen=True)
class _Style:
    color: bool

    def paint(self, text: str, code: str) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if self.color and text else text

    def severity(self, sev: str) -> str:
        return self.paint(sev, "1;31" if sev == "error" else "1;33")

    def gutter(self, text: str) -> str:
        return self.paint(text, "1;34")

    def mark(self, text: str, primary: bool, sev: str) -> str:
        if primary:
            return self.paint(text, "1;31" if sev == "error" else "1;33")
        return self.paint(text, "1;34")


@dataclass(frozen=True)
class _Mark:
    line: int
    start: int  # 0-based column
    end: int  # exclusive, > start
    text: str
    primary: bool


def render_human(diag: Diagnostic, sources: SourceMap, color: bool = False) -> str:
    st = _Style(color)
    head = f"{st.severity(diag.severity)}{st.paint('[' + diag.code + ']', '1')}: {diag.message}"
    out = [st.paint(head, "1") if color else head]
    by_file = _group_marks(diag, sources)
    width = max((len(str(m.line)) for marks in by_file.values() for m in marks), default=1)
    pad = " " * width
    for index, (fname, marks) in enumerate(by_file.items()):
        first = min(marks, key=lambda m: (not m.primary, m.line, m.start))
        arrow = "-->" if index == 0 else ":::"
        if index > 0:
            out.append(st.gutter(f"{pad} |"))
        out.append(f"{pad}{st.gutter(arrow)} {fname}:{first.line}:{first.start + 1}")
        out.append(st.gutter(f"{pad} |"))
        lines = sorted({m.line for m in marks})
        previous = None
        for ln in lines:
            if previous is not None and ln > previous + 1:
                out.append(st.gutter("..."))
            previous = ln
            text, shown = _window(sources.line(fname, ln) or "", [m for m in marks if m.line == ln])
            out.append(f"{st.gutter(f'{ln:>{width}} |')} {text}".rstrip())
            out.extend(_underlines(shown, pad, st, diag.severity))
    if not by_file:  # a file without lines to show (a weight file, an ONNX model)
        where = diag.span.file if diag.span.line < 1 else str(diag.span)
        out.append(f"{pad}{st.gutter('-->')} {where}")
    if diag.notes or diag.help:
        out.append(st.gutter(f"{pad} |"))
        for note in diag.notes:
            out.append(f"{pad} {st.gutter('=')} {st.paint('note', '1')}: {note}")
        for hint in diag.help:
            out.append(f"{pad} {st.gutter('=')} {st.paint('help', '1')}: {hint}")
    return "\n".join(out) + "\n"


def _group_marks(diag: Diagnostic, sources: SourceMap) -> dict[str, list[_Mark]]:
    """Marks by file, the primary span's file first; spans with no known source are dropped."""
    spans = [(diag.span, diag.label, True)] + [(lb.span, lb.text, False) for lb in diag.labels]
    by_file: dict[str, list[_Mark]] = {}
    for span, text, primary in spans:
        mark = _mark(span, text, primary, sources)
        if mark is not None:
            by_file.setdefault(span.file, []).append(mark)
    return by_file


def _mark(span: Span, text: str, primary: bool, sources: SourceMap) -> _Mark | None:
    line = sources.line(span.file, span.line)
    if line is None or span.line < 1:
        return None
    start = max(span.col - 1, 0)
    end = span.end_col - 1 if span.end_line == span.line else len(line)
    end = max(end, start + 1)
    return _Mark(span.line, start, end, text, primary)


def _window(text: str, marks: list[_Mark]) -> tuple[str, list[_Mark]]:
    """A source line too long to read (a generated or hostile file) cut to MAX_SHOWN characters
    from a little before its first mark, with `...` where text is left out; marks shifted."""
    if len(text) <= MAX_SHOWN:
        return text, marks
    lo = max(0, min(m.start for m in marks) - 20)
    hi = min(len(text), lo + MAX_SHOWN)
    head = "..." if lo > 0 else ""
    shift = lo - len(head)
    shown = head + text[lo:hi] + ("..." if hi < len(text) else "")
    clipped = []
    for m in marks:
        start = min(m.start, hi - 1) - shift
        clipped.append(_Mark(m.line, start, max(min(m.end, hi) - shift, start + 1), m.text,
                             m.primary))
    return shown, clipped


def _underlines(marks: list[_Mark], pad: str, st: _Style, sev: str) -> list[str]:
    """The underline row of one source line and the rows that hang the other labels' texts."""
    marks = sorted(marks, key=lambda m: (m.start, not m.primary))
    row: list[str] = []
    # Longer spans first, so a span nested in another stays visible; at equal length the
    # primary is drawn last.
    for m in sorted(marks, key=lambda m: (-(m.end - m.start), m.primary)):
        if len(row) < m.end:
            row.extend(" " * (m.end - len(row)))
        for c in range(m.start, m.end):
            row[c] = "^" if m.primary else "-"
    rows: list[str] = []
    last = marks[-1]
    # Paint the underline row mark by mark, so primary and secondary keep their colours.
    painted = "".join(row)
    if st.color:
        pieces, cursor = [], 0
        for m in marks:
            if m.start >= cursor:
                pieces.append(painted[cursor : m.start])
                pieces.append(st.mark(painted[m.start : m.end], m.primary, sev))
                cursor = m.end
        pieces.append(painted[cursor:])
        painted = "".join(pieces)
    inline = f" {st.mark(last.text, last.primary, sev)}" if last.text else ""
    rows.append(f"{st.gutter(pad + ' |')} {painted.rstrip()}{inline}")
    hanging = [m for m in marks[:-1] if m.text]
    while hanging:
        current = hanging.pop()
        bars = [" "] * (current.start + 1)
        for m in [*hanging, current]:
            bars[m.start] = "|"
        rows.append(f"{st.gutter(pad + ' |')} {''.join(bars).rstrip()}")
        bars = [" "] * (current.start + 1)
        for m in hanging:
            bars[m.start] = "|"
        prefix = "".join(bars[: current.start])
        rows.append(f"{st.gutter(pad + ' |')} {prefix}{st.mark(current.text, current.primary, sev)}")
    return rows


def render_json(diag: Diagnostic) -> str:
    return json.dumps(diag.json(), ensure_ascii=False)


def _gh_escape(text: str, prop: bool = False) -> str:
    text = text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    if prop:
        text = text.replace(":", "%3A").replace(",", "%2C")
    return text


def render_github(diag: Diagnostic) -> str:
    kind = "error" if diag.is_error else "warning"
    s = diag.span
    props = (
        f"file={_gh_escape(s.file, True)},line={s.line},col={s.col},"
        f"endLine={s.end_line},endColumn={s.end_col},title={diag.code}"
    )
    body = "\n".join([diag.message, *(f"note: {n}" for n in diag.notes)]
                     + [f"help: {h}" for h in diag.help])
    return f"::{kind} {props}::{_gh_escape(body)}\n"


def render(diags: Iterable[Diagnostic], fmt: str, sources: SourceMap, color: bool = False) -> str:
    parts = []
    for d in diags:
        if fmt == "json":
            parts.append(render_json(d) + "\n")
        elif fmt == "github":
            parts.append(render_github(d))
        else:
            parts.append(render_human(d, sources, color) + "\n")
    return "".join(parts)
