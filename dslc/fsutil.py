"""Files, safely. Writes are atomic and durable: a temporary file beside the target is written,
flushed to disk, then renamed over the target (and the folder flushed), so a failed or killed
build never leaves a half-written artifact and keeps the previous one intact; temporary files
that killed writers left behind are removed by later writes of the same target once stale.
Reads of files that may be anything (a FIFO, `/dev/zero`, a folder, a huge file) are bounded:
only a regular file is read, and never more than a given number of bytes."""

from __future__ import annotations

import errno
import os
import stat
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

STALE_TMP_S = 3600.0  # a writer's temporary file untouched this long belongs to a dead writer


class UnreadableFile(OSError):
    """Not a regular file, or larger than the caller accepts (`strerror` says which)."""


def atomic_write(path: Path, write: Callable[[str], object], mode: int | None = None) -> None:
    """`write(tmp_path)` fills a temporary file, which then replaces `path` in one step. Only a
    regular file is ever replaced: a device (`/dev/null`), FIFO or folder at `path` is refused
    (renaming over it as root would replace the device for the whole machine). The new file's
    permissions are `mode`, or those the umask gives a new file."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise UnreadableFile(errno.EINVAL, "not a regular file, so not replaced", str(path))
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    clean_stale_temps(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        if mode is None:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask  # mkstemp makes the file private; artifacts are not
        os.chmod(tmp, mode)
        _fsync(tmp, os.O_RDONLY)  # the bytes are on disk before the name points at them
        os.replace(tmp, path)
        _fsync(str(path.parent), os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))  # and the rename
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _fsync(name: str, flags: int) -> None:
    try:
        fd = os.open(name, flags)
    except OSError:
        return  # a folder that cannot be opened (some platforms): the rename is still atomic
    try:
        os.fsync(fd)
    except OSError:
        pass  # file systems without fsync on folders
    finally:
        os.close(fd)


def clean_stale_temps(path: Path, older_than_s: float = STALE_TMP_S) -> None:
    """Remove the temporary files of `path` (`.{name}.*.tmp` beside it) that no writer has
    touched for `older_than_s`: a live writer's file is younger. Only regular files; errors
    (another user's file, a race with another cleaner) are ignored."""
    try:
        candidates = list(path.parent.glob(f".{_glob_escape(path.name)}.*.tmp"))
    except OSError:
        return
    now = time.time()
    for tmp in candidates:
        try:
            st = tmp.lstat()
            if stat.S_ISREG(st.st_mode) and now - st.st_mtime > older_than_s:
                tmp.unlink()
        except OSError:
            continue


def _glob_escape(name: str) -> str:
    return "".join(f"[{c}]" if c in "*?[" else c for c in name)


def write_bytes(path: Path, data: bytes) -> None:
    atomic_write(path, lambda tmp: Path(tmp).write_bytes(data))


def write_text(path: Path, text: str, mode: int | None = None) -> None:
    atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"), mode)


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


def read_limited(path: Path, limit: int) -> bytes:
    """The bytes of `path`, which must be a regular file of at most `limit` bytes
    (UnreadableFile otherwise; OSError when it cannot be opened). Never blocks on a FIFO and
    never reads more than `limit + 1` bytes, whatever the file claims."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise UnreadableFile(21, "it is a folder, not a file", str(path))
        if not stat.S_ISREG(st.st_mode):
            raise UnreadableFile(22, "not a regular file (a pipe, device or socket)", str(path))
        if st.st_size > limit:
            raise UnreadableFile(27, f"larger than {limit:,} bytes ({st.st_size:,})", str(path))
        chunks: list[bytes] = []
        total = 0
        while total <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
    finally:
        os.close(fd)
    if total > limit:  # it grew while being read
        raise UnreadableFile(27, f"larger than {limit:,} bytes", str(path))
    return b"".join(chunks)
