"""`dslc ops`: the built-in operations (the op table) and the defs of the standard library
(`dslc/std/*.cgraph`, which any file imports as `std/...`) with their signatures, as text or as
one JSON document."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from functools import cache

from dslc.cli.front import EXIT_OK
from dslc.diag.diagnostic import Sink
from dslc.diag.span import display_name
from dslc.ops import OPS
from dslc.parse.fmt import def_signatures
from dslc.parse.loader import STD_ROOT

STD = "std"  # the family `--family` names the library by


@dataclass(frozen=True)
class Entry:
    name: str
    family: str
    signature: str
    summary: str
    module: str = ""  # a std def's import path, e.g. std/nn.cgraph


def op_families() -> list[str]:
    return [*sorted({op.family for op in OPS.values()}), STD]


@cache
def std_defs() -> tuple[Entry, ...]:
    """Every def of the standard library, in file order, its doc comment as the summary."""
    out: list[Entry] = []
    for path in sorted(STD_ROOT.glob("*.cgraph")):
        name = display_name(path, STD_ROOT)
        sink = Sink()
        found = def_signatures(path.read_text(encoding="utf-8"), name, sink)
        if found is None:  # the shipped library always parses (tests/test_fmt.py)
            raise RuntimeError(f"{name} does not parse: {sink.diagnostics[0].message}")
        out.extend(Entry(d.name.name, STD, sig, " ".join(d.doc.split("\n")), name)
                   for d, sig in found)
    return tuple(out)


def entries(family: str | None) -> list[Entry]:
    ops = [Entry(op.name, op.family, op.signature(), op.summary)
           for op in sorted(OPS.values(), key=lambda o: (o.family, o.name))]
    return [e for e in (*ops, *std_defs()) if family is None or e.family == family]


def cmd_ops(args: argparse.Namespace) -> int:
    chosen = entries(args.family)
    if args.format == "json":
        print(json.dumps({
            "ops": [{"name": e.name, "family": e.family, "signature": e.signature,
                     "summary": e.summary} for e in chosen if e.family != STD],
            "defs": [{"name": e.name, "import": e.module, "signature": e.signature,
                      "summary": e.summary} for e in chosen if e.family == STD],
        }, indent=2))
        return EXIT_OK
    heading = None
    for e in chosen:
        title = f'{e.family} (import "{e.module}")' if e.family == STD else e.family
        if title != heading:
            heading = title
            print(f"\n{title}:")
        print(f"  {e.signature}")
        print(f"      {e.summary}")
    return EXIT_OK
