"""`dslc bench --plot FILE.png`: per size, each step's time against its roofline bound (the
steps that lose the most time), and the totals side by side. matplotlib is optional: without
it, `plot` writes nothing and says so by returning False."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dslc import fsutil
from dslc.cli.bench_report import size_name

STEPS_SHOWN = 20  # the plot stays legible; the JSON report has every step


def totals_of(row: dict[str, Any]) -> dict[str, float]:
    """The bars of the totals panel: every time this size has, and the roofline bound."""
    d, t = row["dslc"], row["torch"] or {}
    roof = (row["roofline"] or {}).get("totals") or {}
    bars = {"dslc": d["plain_ms"], "dslc steps": d.get("steps_ms"), "dslc graph": d["graph_ms"],
            "torch": t.get("eager_ms"),
            "torch graph": t.get("graph_ms"), "torch.compile": t.get("compile_ms"),
            "roofline": roof.get("bound_ms")}
    return {k: float(v) for k, v in bars.items() if v is not None}


def plot(report: dict[str, Any], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    sizes = report["sizes"]
    fig, axes = plt.subplots(len(sizes), 2, figsize=(14, 4.5 * len(sizes)), squeeze=False,
                             gridspec_kw={"width_ratios": [3, 1]})
    for (steps_ax, totals_ax), row in zip(axes, sizes, strict=True):
        at = size_name(row["dims"])
        lines = ((row["roofline"] or {}).get("steps") or [])[:STEPS_SHOWN]
        xs = range(len(lines))
        steps_ax.bar([x - 0.2 for x in xs], [s["ms"] for s in lines], 0.4, label="measured")
        steps_ax.bar([x + 0.2 for x in xs], [s["bound_ms"] for s in lines], 0.4,
                     label="roofline bound")
        steps_ax.set_xticks(list(xs), [s["step"][:28] for s in lines], rotation=70, fontsize=7)
        steps_ax.set_ylabel("ms")
        steps_ax.set_title(f"{report['model']} {at}: steps by time lost")
        steps_ax.legend()
        bars = totals_of(row)
        totals_ax.bar(list(bars), list(bars.values()))
        totals_ax.tick_params(axis="x", rotation=60, labelsize=8)
        totals_ax.set_title(f"{at}: totals (ms)")
    fig.suptitle(f"{report['model']} on {report['device']}")
    fig.tight_layout()
    fsutil.atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110))
    plt.close(fig)
    return True
