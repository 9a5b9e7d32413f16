"""Run-time errors: one sentence with an R-code and the `.cgraph` location it comes from."""

from __future__ import annotations

from typing import Any

from dslc.diag.codes import CodeId


class RunnerError(Exception):
    def __init__(self, code: CodeId, message: str, span: dict[str, Any] | None = None) -> None:
        self.code = code
        self.message = message
        self.span = span
        where = f" (declared at {span['file']}:{span['line']}:{span['col']})" if span else ""
        super().__init__(f"error[{code}]: {message}{where}")
