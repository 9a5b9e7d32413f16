"""Names in the written model: identifiers made from ONNX names (which may hold any character),
kept apart from the language's keywords and from each other."""

from __future__ import annotations

import re

from dslc.parse.grammar import keywords

_OTHER = re.compile(r"[^A-Za-z0-9_]+")


def identifier(text: str, fallback: str = "x") -> str:
    """`text` as an identifier: runs of other characters become `_`; one that would start with
    a digit, or be a keyword, gets a prefix or suffix."""
    name = _OTHER.sub("_", text).strip("_")
    if not name:
        return fallback
    if name[0].isdigit():
        name = f"{fallback}_{name}"
    if name in keywords():
        name += "_"
    return name


def path_segments(path: str) -> bool:
    """Whether `path` is a valid instance path (names and numbers separated by `.`)."""
    return bool(path) and all(p and all(c.isalnum() or c in "_-" for c in p)
                              for p in path.split("."))


def dotted_name(path: str) -> bool:
    """Whether a param may be declared under `path`: identifiers separated by `.`."""
    return all(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", p) and p not in keywords()
               for p in path.split("."))


class Names:
    """Hands out names unique within one scope (a model or a def): `relu`, `relu_2`, ..."""

    def __init__(self, taken: set[str] | None = None) -> None:
        self.taken: set[str] = set(taken or ())

    def fresh(self, base: str) -> str:
        base = identifier(base)
        name, n = base, 1
        while name in self.taken:
            n += 1
            name = f"{base}_{n}"
        self.taken.add(name)
        return name
