"""Reading plain data that may be anything (a bundle's payload, a plan-cache file): typed getters
that either return the value or raise `BundleError` naming the field's path and what was found,
e.g. `buckets[0].graphs.9f2c.plan.workspace: expected an int in 0..1099511627776, got "x"`.

The bounds are those of what the numbers reach: cuDNN takes at most `MAX_SPEC_RANK` dims per
tensor (CUDNN_DIM_MAX), sizes are 31-bit, byte counts at most `MAX_BYTES`.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from typing import Any, NoReturn

MAX_DIM = 2**31 - 1  # one axis of a tensor, one dim value
MAX_ELEMENTS = 2**40  # a stride, an offset, in elements
MAX_BYTES = 2**40  # a workspace, an arena, a tensor (1 TiB: more than any GPU holds)
MAX_RANK = 16  # an IR value's rank
MAX_SPEC_RANK = 8  # a cuDNN tensor's rank (CUDNN_DIM_MAX)
MAX_ITEMS = 1 << 20  # entries of any one list or map
MAX_TEXT = 1 << 16  # characters of a name or a note
MAX_BLOB = 1 << 28  # bytes of a serialized plan or a profile


class BundleError(Exception):
    """The data is not a usable bundle (or plan record): one sentence naming the field."""


def show(v: Any) -> str:
    """A found value, briefly, as the message quotes it."""
    if v is None:
        return "none"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return json.dumps(v[:40] + ("..." if len(v) > 40 else ""))
    if isinstance(v, (int, float)):
        text = repr(v)
        return text if len(text) <= 24 else f"a {len(text)}-digit number"
    if isinstance(v, (bytes, bytearray)):
        return f"{len(v)} bytes"
    if isinstance(v, (list, tuple)):
        return f"a list of {len(v)}"
    if isinstance(v, dict):
        return "a map"
    return f"a {type(v).__name__}"


def fail(path: str, want: str, got: Any) -> NoReturn:
    raise BundleError(f"{path}: expected {want}, got {show(got)}")


def wrong(path: str, problem: str) -> NoReturn:
    raise BundleError(f"{path}: {problem}")


def mapping(v: Any, path: str, required: Collection[str] = (),
            optional: Collection[str] | None = None) -> Mapping[str, Any]:
    """A map with string keys; with `optional` given, exactly `required` plus some of those."""
    if type(v) is not dict:
        fail(path, "a map", v)
    if len(v) > MAX_ITEMS:
        wrong(path, f"{len(v)} entries, more than {MAX_ITEMS}")
    if not all(type(k) is str for k in v):
        wrong(path, f"a key {show(next(k for k in v if type(k) is not str))} is not a string")
    for k in required:
        if k not in v:
            wrong(path, f"missing field `{k}`")
    if optional is not None:
        for k in v:
            if k not in required and k not in optional:
                wrong(path, f"unknown field `{k[:40]}`")
    return v


def items(v: Any, path: str, lo: int = 0, hi: int = MAX_ITEMS) -> list[Any]:
    if type(v) is not list:
        fail(path, "a list", v)
    if not lo <= len(v) <= hi:
        wrong(path, f"{len(v)} entries, expected {lo}..{hi}")
    return v


def integer(v: Any, path: str, lo: int = 0, hi: int = MAX_ELEMENTS) -> int:
    if type(v) is not int:
        fail(path, "a non-negative int" if lo == 0 else "an int", v)
    if not lo <= v <= hi:
        fail(path, f"an int in {lo}..{hi}", v)
    return v


def opt_integer(v: Any, path: str, lo: int = 0, hi: int = MAX_ELEMENTS) -> int | None:
    return None if v is None else integer(v, path, lo, hi)


def number(v: Any, path: str) -> float:
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        fail(path, "a number", v)
    return float(v)


def opt_number(v: Any, path: str) -> float | None:
    return None if v is None else number(v, path)


def text(v: Any, path: str, choices: Collection[str] | None = None, hi: int = MAX_TEXT) -> str:
    if type(v) is not str or len(v) > hi:
        fail(path, f"a string of at most {hi} characters", v)
    if choices is not None and v not in choices:
        fail(path, "one of " + ", ".join(sorted(choices)), v)
    return v


def opt_text(v: Any, path: str, choices: Collection[str] | None = None) -> str | None:
    return None if v is None else text(v, path, choices)


def flag(v: Any, path: str) -> bool:
    if not isinstance(v, bool):
        fail(path, "true or false", v)
    return v


def opt_flag(v: Any, path: str) -> bool | None:
    return None if v is None else flag(v, path)


def blob(v: Any, path: str) -> bytes | None:
    if v is None:
        return None
    if not isinstance(v, bytes) or len(v) > MAX_BLOB:
        fail(path, f"bytes (at most {MAX_BLOB})", v)
    return v


def name_of(v: Any, path: str, known: Collection[str], what: str = "a value of the graph") -> str:
    """A name that must be one of `known` (a cross-reference)."""
    name = text(v, path)
    if name not in known:
        wrong(path, f"`{name[:60]}` is not {what}")
    return name


def names(v: Any, path: str, known: Collection[str], what: str = "a value of the graph",
          lo: int = 0) -> tuple[str, ...]:
    if type(v) is list and lo <= len(v) <= MAX_ITEMS and \
            all(type(x) is str and x in known for x in v):
        return tuple(v)
    return tuple(name_of(x, f"{path}[{i}]", known, what) for i, x in enumerate(items(v, path, lo)))


def ints(v: Any, path: str, lo: int = 0, hi: int = MAX_ELEMENTS, n_lo: int = 0,
         n_hi: int = MAX_RANK) -> tuple[int, ...]:
    if type(v) is list and n_lo <= len(v) <= n_hi and \
            all(type(x) is int and lo <= x <= hi for x in v):
        return tuple(v)  # the common case, without a path per element
    return tuple(integer(x, f"{path}[{i}]", lo, hi)
                 for i, x in enumerate(items(v, path, n_lo, n_hi)))


def int_map(v: Any, path: str, lo: int = -(2**31), hi: int = 2**31 - 1) -> dict[str, int]:
    d = mapping(v, path)
    return {text(k, path, hi=128): integer(x, f"{path}.{k}", lo, hi) for k, x in d.items()}


def plain(v: Any, path: str, depth: int = 4) -> Any:
    """An attribute value: a number, string, bool, none, or a list of those (nested a little)."""
    if v is None or isinstance(v, (bool, int, float)):
        if isinstance(v, int) and not isinstance(v, bool) and abs(v) > MAX_ELEMENTS:
            fail(path, f"an int of magnitude at most {MAX_ELEMENTS}", v)
        return v
    if isinstance(v, str):
        return text(v, path)
    if isinstance(v, list) and depth > 0:
        return [plain(x, f"{path}[{i}]", depth - 1) for i, x in enumerate(items(v, path, 0, 4096))]
    fail(path, "a number, string, bool, none or list", v)
