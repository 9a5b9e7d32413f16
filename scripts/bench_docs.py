"""docs/benchmarks.md's `dslc bench` tables, regenerated from `dslc bench --format json` reports.

    dslc bench models/resnet50.cgraph --size N=32 --against torch --format json > r50.json
    python scripts/bench_docs.py r50.json [more.json...]            # print the Markdown
    python scripts/bench_docs.py r50.json --write docs/benchmarks.md  # replace in place

With `--write`, each report's Markdown replaces the text between the lines
`<!-- bench:NAME -->` and `<!-- /bench:NAME -->` (NAME: the report's file name without
`.json`); a report whose markers are missing is an error, so nothing is written half-way.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dslc.cli.bench_report import render_markdown  # noqa: E402


def replace_region(text: str, name: str, body: str) -> str:
    """`text` with the lines between the markers of `name` replaced by `body` (ValueError if
    the markers are not there, once each)."""
    pattern = re.compile(rf"(<!-- bench:{re.escape(name)} -->\n)(.*?)(<!-- /bench:{re.escape(name)} -->)",
                         re.S)
    found = pattern.findall(text)
    if len(found) != 1:
        raise ValueError(f"expected one `<!-- bench:{name} -->` ... `<!-- /bench:{name} -->` "
                         f"region, found {len(found)}")
    return pattern.sub(lambda m: m.group(1) + body.rstrip("\n") + "\n" + m.group(3), text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("reports", nargs="+", type=Path, metavar="REPORT.json")
    ap.add_argument("--write", type=Path, metavar="DOC.md", help="replace the marked regions")
    ap.add_argument("--top", type=int, default=8, help="roofline steps per size (default 8)")
    args = ap.parse_args(argv)
    bodies = {p.stem: render_markdown(json.loads(p.read_text()), args.top) for p in args.reports}
    if args.write is None:
        print("\n\n".join(bodies.values()))
        return 0
    text = args.write.read_text()
    try:
        for name, body in bodies.items():
            text = replace_region(text, name, body)
    except ValueError as err:
        print(f"error: {args.write}: {err}", file=sys.stderr)
        return 2
    args.write.write_text(text)
    print(f"wrote {args.write} ({', '.join(bodies)})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
