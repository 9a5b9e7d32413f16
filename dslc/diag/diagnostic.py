"""A `Diagnostic` is one coded message with a primary span, secondary labels, notes and help.

Stages never print: they report into a `Sink`, which deduplicates (a mistake inside a def used by
sixteen instances is one message), applies `--allow` / `--deny-warnings`, and stops at
`--max-errors`. `Failed` is raised once a stage cannot go on; it carries no message of its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from dslc.diag.codes import CODES, CodeId
from dslc.diag.span import Span


@dataclass(frozen=True, slots=True)
class Label:
    span: Span
    text: str = ""


@dataclass(frozen=True, slots=True)
class Diagnostic:
    code: CodeId
    message: str
    span: Span
    label: str = ""  # text under the primary span
    labels: tuple[Label, ...] = ()  # secondary spans, in any file
    notes: tuple[str, ...] = ()
    help: tuple[str, ...] = ()
    instance: str | None = None  # the def instance the error arose in, if any
    severity: str = ""

    def __post_init__(self) -> None:
        if self.code not in CODES:
            raise ValueError(f"unregistered diagnostic code {self.code}")
        if not self.severity:
            object.__setattr__(self, "severity", CODES[self.code].severity)

    @property
    def is_error(self) -> bool:
        return self.severity == "error"

    def key(self) -> tuple[object, ...]:
        return (self.code, self.span, self.message)

    def json(self) -> dict[str, object]:
        return {
            "severity": self.severity,
            "code": self.code,
            "message": self.message,
            "span": self.span.json(),
            "label": self.label,
            "labels": [{"span": lb.span.json(), "text": lb.text} for lb in self.labels],
            "instance": self.instance,
            "notes": list(self.notes),
            "help": list(self.help),
        }


class Failed(Exception):
    """A stage stopped because of errors already reported to the sink."""


class TooManyErrors(Failed):
    """`--max-errors` was reached."""


@dataclass
class Sink:
    max_errors: int = 50
    allow: frozenset[str] = frozenset()
    deny_warnings: bool = False
    diagnostics: list[Diagnostic] = field(default_factory=list)
    _seen: dict[tuple[object, ...], int] = field(default_factory=dict)
    _errors: int = 0  # counted as reported: a model with 10^5 warnings stays linear

    def report(self, diag: Diagnostic) -> None:
        if diag.code in self.allow and not diag.is_error:
            return
        if self.deny_warnings and not diag.is_error:
            diag = replace(diag, severity="error")
        key = diag.key()
        if key in self._seen:
            return
        self._seen[key] = len(self.diagnostics)
        self.diagnostics.append(diag)
        self._errors += diag.is_error
        if self._errors >= self.max_errors:
            raise TooManyErrors()

    @property
    def error_count(self) -> int:
        return self._errors

    @property
    def warning_count(self) -> int:
        return len(self.diagnostics) - self._errors

    def check(self) -> None:
        """Raise `Failed` if any error has been reported."""
        if self.error_count:
            raise Failed()
