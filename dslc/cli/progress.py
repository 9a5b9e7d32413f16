"""The progress line of long work (`dslc compile`, `dslc tune`): one line on stderr, rewritten in
place, with the seconds elapsed. Only on a terminal and never with `-q`: a log or a pipe gets
none. Cut to the terminal's width, since a line that wraps can no longer be rewritten."""

from __future__ import annotations

import shutil
import sys
import time

CLEAR = "\r\x1b[K"  # back to the start of the line, and erase it


class Progress:
    def __init__(self, quiet: bool) -> None:
        self.on = not quiet and sys.stderr.isatty()
        self.started = time.perf_counter()
        self.shown = False

    def __call__(self, text: str) -> None:
        if not self.on:
            return
        line = f"  {time.perf_counter() - self.started:5.1f} s  {text}"
        width = shutil.get_terminal_size().columns
        print(CLEAR + line[:max(width - 1, 1)], end="", file=sys.stderr, flush=True)
        self.shown = True

    def clear(self) -> None:
        """Erase the line, before anything else is written to the terminal."""
        if self.shown:
            print(CLEAR, end="", file=sys.stderr, flush=True)
            self.shown = False
