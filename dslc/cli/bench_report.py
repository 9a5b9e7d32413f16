"""`dslc bench`'s tables, rendered from its JSON report (`dslc.bench.measure.bench`): the totals
per size, side by side with PyTorch's, and per size the roofline's steps by time lost. Also the
Markdown form of the same rows (scripts/bench_docs.py, for docs/benchmarks.md)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _ratio(theirs: float | None, ours: float | None) -> str:
    return "-" if theirs is None or not ours else f"{theirs / ours:.2f}"


def _err(value: float | None) -> str:
    return "-" if value is None else f"{value:.1e}"


def size_name(dims: dict[str, int]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(dims.items())) or "static"


def best_ms(dslc: dict[str, Any]) -> float | None:
    """dslc's faster way of calling (a CUDA graph where the model can be captured)."""
    times = [t for t in (dslc["plain_ms"], dslc["graph_ms"]) if t is not None]
    return min(times) if times else None


TOTAL_HEAD = ("size", "dslc ms", "dslc steps", "dslc graph", "graph call", "torch eager",
              "torch graph", "torch.compile",
              "x eager", "x graph", "x compile", "MiB dslc", "MiB torch", "rel err", "ok")


def total_rows(report: dict[str, Any]) -> list[tuple[str, ...]]:
    """One row per size. "dslc ms" is a plain call (a replayed CUDA graph from the second call
    at a size), "dslc steps" one with `cuda_graphs=False`, "dslc graph" the replay of its CUDA
    graph over inputs in place (as PyTorch's graphs are timed), "graph call" a call of the
    captured graph with new inputs (copied in first). "x eager" is PyTorch eager over dslc's
    best time; "x graph" and "x compile" compare CUDA-graph replays (PyTorch's, and
    torch.compile's) with dslc's."""
    rows: list[tuple[str, ...]] = []
    for row in report["sizes"]:
        d, t, outs = row["dslc"], row["torch"] or {}, row["outputs"] or []
        graph = d["graph_ms"] if d["graph_ms"] is not None else d["plain_ms"]
        worst = max((o["rel_error_eager"] for o in outs), default=None)
        ok = "-" if not outs else ("yes" if all(o["within"] for o in outs) else "NO")
        torch_mib = t.get("peak_bytes")
        rows.append((size_name(row["dims"]), _ms(d["plain_ms"]), _ms(d.get("steps_ms")),
                     _ms(d["graph_ms"]), _ms(d.get("graph_call_ms")),
                     _ms(t.get("eager_ms")), _ms(t.get("graph_ms")), _ms(t.get("compile_ms")),
                     _ratio(t.get("eager_ms"), best_ms(d)), _ratio(t.get("graph_ms"), graph),
                     _ratio(t.get("compile_ms"), graph), f"{d['activation_bytes'] / 2**20:.0f}",
                     "-" if torch_mib is None else f"{torch_mib / 2**20:.0f}", _err(worst), ok))
    return rows


STEP_HEAD = ("step", "kind", "ms", "bound ms", "bound by", "TFLOP/s", "GB/s", "% peak",
             "lost ms")


def step_rows(roofline: dict[str, Any], top: int | None) -> list[tuple[str, ...]]:
    steps = roofline["steps"] or []
    return [(s["step"], s["kind"], f"{s['ms']:.4f}", f"{s['bound_ms']:.4f}", s["bound_by"],
             f"{s['tflops']:.1f}", f"{s['gbps']:.0f}", f"{100 * s['fraction']:.0f}",
             f"{s['lost_ms']:.4f}") for s in (steps if top is None else steps[:top])]


def aligned(head: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Columns padded to their widest cell: the first left-aligned, numbers right-aligned."""
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths, strict=True))).rstrip()

    return [line(head), *(line(r) for r in rows)]


def markdown(head: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    rule = ["---" if i == 0 else "---:" for i in range(len(head))]
    return ["| " + " | ".join(r) + " |" for r in [head, rule, *rows]]


def render_table(report: dict[str, Any], top: int | None = 12) -> str:
    lines = [_title(report), ""]
    lines += aligned(TOTAL_HEAD, total_rows(report))
    lines += _notes(report)
    for row in report["sizes"]:
        lines += ["", *roofline_lines(row, top)]
        lines += kernel_lines(row, top)
    return "\n".join(lines)


KERNEL_HEAD = ("kernel", "us", "launches")
KERNEL_SIDES = (("dslc graph", "dslc", "kernels"), ("torch graph", "torch", "graph_kernels"),
                ("torch.compile", "torch", "compile_kernels"))


def kernel_lines(row: dict[str, Any], top: int | None) -> list[str]:
    """With `--kernels`: per side, the kernels of one replay by time (the longest first), their
    sum and launches; none where the side did not run or `--kernels` was not given."""
    at = size_name(row["dims"])
    lines: list[str] = []
    for title, side, key in KERNEL_SIDES:
        info = row.get(side) or {}
        found, error = info.get(key), info.get(f"{key}_error")
        if error:
            lines += ["", f"kernels of one {title} replay at {at}: not listed ({error})"]
        if found is None:
            continue
        if not found:
            lines += ["", f"kernels of one {title} replay at {at}: none recorded by CUPTI"]
            continue
        shown = found if top is None else found[:top]
        lines += ["", f"kernels of one {title} replay at {at}: "
                      f"{sum(k['us'] for k in found) / 1e3:.4f} ms in "
                      f"{sum(k['launches'] for k in found):.0f} launches"
                      + (f" ({len(found) - len(shown)} more kernels in --format json)"
                         if len(shown) < len(found) else ""),
                  *aligned(KERNEL_HEAD, [(k["name"][:100], f"{k['us']:.2f}",
                                          f"{k['launches']:.3g}") for k in shown])]
    return lines


def _title(report: dict[str, Any]) -> str:
    v = report["versions"]
    torch = f", torch {v['torch']}" if v.get("torch") else ""
    mode = f", torch.compile {report['torch_compile']}" if report.get("torch_compile") else ""
    return (f"{report['model']} on {report['device']} (median of {report['repeats']} calls, "
            f"CUDA events; cuDNN {v.get('cudnn_backend')}{torch}{mode})")


def _notes(report: dict[str, Any]) -> list[str]:
    """What did not run, and outputs outside the tolerance, said under the table."""
    notes = []
    for row in report["sizes"]:
        at = size_name(row["dims"])
        if row["dslc"].get("graph_error"):
            notes.append(f"{at}: dslc not captured: {row['dslc']['graph_error']}")
        for key in ("graph_error", "compile_error"):
            if (row["torch"] or {}).get(key):
                notes.append(f"{at}: torch {key.split('_')[0]} failed: {row['torch'][key]}")
        for o in row["outputs"] or []:
            if not o["within"]:
                notes.append(f"{at}: output `{o['name']}` ({o['dtype']}) differs from PyTorch by "
                             f"{_err(o['rel_error_eager'])} (compiled {_err(o['rel_error_compile'])})"
                             f", over the tolerance {o['tolerance']:.1e}")
    return [f"note: {n}" for n in notes]


def roofline_lines(row: dict[str, Any], top: int | None) -> list[str]:
    roof = row["roofline"]
    at = size_name(row["dims"])
    if roof is None or roof["totals"] is None:
        return [f"roofline at {at}: no peak rates known for this GPU "
                "(dslc/compile/targets/peaks.json)"]
    t = roof["totals"]
    steps = roof["steps"]
    shown = len(steps) if top is None else min(top, len(steps))
    head = (f"roofline at {at}: {len(steps)} steps, {t['ms']:.3f} ms profiled, bound "
            f"{t['bound_ms']:.3f} ms at the peaks ({100 * t['fraction']:.0f}%), "
            f"{t['flops'] / 1e9:.1f} GFLOP, {t['bytes'] / 2**20:.1f} MiB; by time lost")
    tail = [f"... {len(steps) - shown} more steps (--top, or --format json)"] \
        if shown < len(steps) else []
    return [head, *aligned(STEP_HEAD, step_rows(roof, top)), *tail]


def render_markdown(report: dict[str, Any], top: int = 8) -> str:
    """The report as docs/benchmarks.md shows it: the totals table, then per size the steps
    that lose the most time against the roofline."""
    lines = [_title(report) + ":", "", *markdown(TOTAL_HEAD, total_rows(report)), *_notes(report)]
    for row in report["sizes"]:
        roof = row["roofline"]
        if roof is None or roof["totals"] is None:
            continue
        t = roof["totals"]
        lines += ["", f"Roofline at {size_name(row['dims'])}: {t['ms']:.3f} ms profiled, bound "
                      f"{t['bound_ms']:.3f} ms at the peaks ({100 * t['fraction']:.0f}%); the "
                      f"{min(top, len(roof['steps']))} steps that lose the most time:", "",
                  *markdown(STEP_HEAD, step_rows(roof, top))]
    return "\n".join(lines)
