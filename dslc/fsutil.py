"""Atomic file writes: write a temporary file beside the target, then rename it over the target,
so a failed build never leaves a half-written artifact and keeps the previous one intact."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path


def atomic_write(path: Path, write: Callable[[str], object]) -> None:
    """`write(tmp_path)` fills a temporary file, which then replaces `path` in one step."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes the file private; artifacts are not
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_bytes(path: Path, data: bytes) -> None:
    atomic_write(path, lambda tmp: Path(tmp).write_bytes(data))


def write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def replace_together(files: list[tuple[Path, Callable[[str], object]]]) -> None:
    """Write files that belong together (a bundle and its runner): each is written to a temporary
    file beside its target before any target is replaced, so a failed write replaces none. The
    targets are then replaced last file first, by the tail of `atomic_write` (its rename, and what
    it does to make the data durable). A crash, or a failure of that tail, between the first and
    the last rename still leaves a mix of old and new files: that window is a few renames, not
    the writing. The file that matters most belongs first: it is replaced last."""
    if not files:
        return
    (path, write), rest = files[0], files[1:]

    def write_all(tmp: str) -> None:
        write(tmp)
        replace_together(rest)  # written and renamed before `path` is renamed

    atomic_write(path, write_all)
