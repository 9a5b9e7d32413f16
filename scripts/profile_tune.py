"""Where tuning's time goes (a GPU script, not a test): compiles a model for this GPU at one
bucket, tunes it with the measuring functions of `dslc.backend.measure` and the cuDNN graph's
plan building wrapped in timers, and prints the seconds per kind of work; `--out DIR` also keeps
every graph's candidates (index, engine, ms) as JSON, from which a cap on the candidates timed
can be judged against timing all of them.

    python scripts/profile_tune.py models/resnet50.cgraph --bucket N=32 --budget 2 --out DIR
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dslc.backend import graphs, measure  # noqa: E402

SECONDS: collections.defaultdict[str, float] = collections.defaultdict(float)
CALLS: collections.Counter[str] = collections.Counter()
TIMED = ("build_plan_at_index", "create_execution_plans", "execute", "serialize")


def timed(name: str, fn: Any) -> Any:
    def run(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            SECONDS[name] += time.perf_counter() - start
            CALLS[name] += 1
    return run


class Timed:
    """A cuDNN graph whose plan building and execution are timed."""

    def __init__(self, graph: Any) -> None:
        object.__setattr__(self, "_graph", graph)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._graph, name)
        return timed(name, attr) if name in TIMED else attr


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--bucket", default="N=32", help="DIM=V[,DIM=V]")
    ap.add_argument("--budget", type=float, default=2.0, help="seconds per graph")
    ap.add_argument("--first", type=int, default=None,
                    help="candidates timed (default: all, to judge a cap against)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    from dslc.runtime.bundle import load
    from dslc.tune import format_report, tune
    from tests.gpu.common import compile_file

    make = graphs.make_graph
    graphs.make_graph = lambda *a, **k: Timed(timed("make_graph", make)(*a, **k))  # type: ignore[assignment]
    measure.check_and_time = timed("check_and_time", measure.check_and_time)  # type: ignore[assignment]
    for name in ("reference", "__init__"):
        setattr(measure.Bench, name, timed(f"Bench.{name}", getattr(measure.Bench, name)))
    measure.FIRST = args.first if args.first is not None else 10**9  # type: ignore[misc]
    found: list[dict[str, Any]] = []
    tune_graph = measure.tune_graph

    def kept(*a: Any, **k: Any) -> Any:
        result = tune_graph(*a, **k)
        found.append({"candidates": [(c.index, c.engine_id, c.ms if math.isfinite(c.ms) else None)
                                     for c in result.candidates],
                      "heuristic": result.heuristic.index if result.heuristic else None})
        return result

    measure.tune_graph = kept  # type: ignore[assignment]
    dims = {k: int(v) for k, v in (p.split("=") for p in args.bucket.split(","))}
    out = args.out or Path("profile-tune")
    bundle = compile_file(args.model, out / "bundle", dims)
    start = time.perf_counter()
    done = tune(load(bundle), None, budget_s=args.budget, model_budget_s=3600)
    print(format_report(done.report).splitlines()[-1])
    print(f"tuned {len(found)} graphs in {time.perf_counter() - start:.1f} s")
    for name in sorted(SECONDS, key=lambda n: -SECONDS[n]):
        print(f"  {name:26} {SECONDS[name]:8.2f} s {CALLS[name]:7d} calls")
    for first in (1, 2, 4, 6, 8, 16):
        print(f"  first {first:2}: the fastest {_within(found, first)}")
    (out / "candidates.json").write_text(json.dumps(found))
    return 0


def _within(found: list[dict[str, Any]], first: int) -> str:
    """How much slower the fastest of the first candidates is than the fastest of all."""
    ratios = []
    for g in found:
        times = [ms for _, _, ms in g["candidates"] if ms is not None]
        head = [ms for _, _, ms in g["candidates"][:first] if ms is not None]
        if times and head:
            ratios.append(min(head) / min(times))
    if not ratios:
        return "-"
    mean = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
    return f"is {100 * (mean - 1):.2f}% slower on geomean, {100 * (max(ratios) - 1):.1f}% at worst"


if __name__ == "__main__":
    sys.exit(main())
