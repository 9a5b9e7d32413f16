"""Where commands write. Every output path is checked before any work starts, so a bad `-o` is
one sentence and exit code 2 (not a failed write after a long compile), and an output never
replaces one of the command's inputs. A write that still fails (a full disk, a folder made
read-only meanwhile) is turned into the same kind of sentence by `writing`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path


class UsageError(Exception):
    """A wrong command line, or a file that cannot be read or written (exit code 2)."""


def output_file(path: Path, inputs: Iterable[Path | None] = (), option: str = "-o") -> None:
    """`path` can be written as a regular file (replaced atomically) and is none of `inputs`."""
    _not_an_input(path, inputs, option)
    if path.exists() and not path.is_file():  # a folder, a device such as /dev/null, a FIFO
        kind = "a folder" if path.is_dir() else "not a regular file"
        raise UsageError(f"{_named(option, path)} is {kind}; name a file to write")
    _creatable(path.parent, option, path)


def output_dir(path: Path, option: str = "-o") -> None:
    """`path` is a folder that can be written, or one that can be made."""
    if path.exists() and not path.is_dir():
        kind = "a file" if path.is_file() else "not a folder"
        raise UsageError(f"{_named(option, path)} is {kind}; name a folder to write into")
    _creatable(path, option, path)


def outputs_in(folder: Path, names: Iterable[str], inputs: Iterable[Path | None],
               option: str = "-o") -> None:
    """None of the files `names` to be written into `folder` is one of `inputs`."""
    given = list(inputs)
    for name in names:
        lead = f"{_named(option, folder)} would replace `{folder / name}`, which"
        _not_an_input(folder / name, given, option, lead)


def bundle_file(path: Path) -> Path:
    """`path`, which a command reads as a bundle: a `.cgraph` file is source, named as such
    (read as a bundle, it would only be "not msgpack")."""
    if path.suffix == ".cgraph":
        raise UsageError(f"`{path}` is .cgraph source, not a bundle: compile it first "
                         f"(`dslc compile {path}`)")
    return path


@contextmanager
def writing(path: Path) -> Iterator[None]:
    """A failed write of `path` as a usage/I/O error (the previous file is kept: writes are
    atomic)."""
    try:
        yield
    except OSError as err:
        raise UsageError(f"cannot write `{path}`: {describe(err)}") from err


def describe(err: OSError) -> str:
    """The reason of an OS error, in lower case, without the errno."""
    reason = err.strerror or str(err) or type(err).__name__
    return reason[:1].lower() + reason[1:]


def same_file(a: Path, b: Path) -> bool:
    """The same file on disk: the same inode (hard links, symlinks), or the same resolved path."""
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist (yet)
        try:
            return a.resolve() == b.resolve()
        except (OSError, RuntimeError):  # RuntimeError: a symlink loop
            return False


def _not_an_input(path: Path, inputs: Iterable[Path | None], option: str,
                  lead: str | None = None) -> None:
    for given in inputs:
        if given is not None and same_file(path, given):
            what = lead or _named(option, path)
            raise UsageError(f"{what} is the input `{given}`, and dslc never overwrites an "
                             "input: name another output")


def _creatable(folder: Path, option: str, target: Path) -> None:
    """`folder` exists and is writable, or its nearest existing ancestor is a writable folder in
    which it can be made."""
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise UsageError(f"{_named(option, target)} cannot be written: `{existing}` is a file, "
                         "not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(f"{_named(option, target)} cannot be written: the folder `{existing}` is "
                         "read-only to this user")


def _named(option: str, path: Path) -> str:
    """How a message names the path: as the option that gave it (`-o out.npz`), or alone."""
    return f"`{option} {path}`" if option else f"`{path}`"
