"""Plans at start-up, most to least direct: restore the serialized plan (milliseconds); if that
fails, rebuild the graph and replay the recorded (engine_id, knobs); if that fails, take the
heuristics' choice. Each fallback is logged with its reason and recorded in `startup`."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dslc.compile.spec import GroupSpec
from dslc.runtime.errors import RunnerError


@dataclass
class Ready:
    """An executable cuDNN graph for one group signature at one size."""

    graph: Any
    spec: GroupSpec
    workspace: int
    how: str  # restored | replayed | heuristics
    seconds: float
    engine_id: int | None = None
    knobs: dict[str, int] | None = None


def prepare(spec: GroupSpec, plan: Mapping[str, Any] | None, handle: Any, where: str,
            log: logging.Logger, seed: tuple[int, dict[str, int]] | None = None) -> Ready:
    """The graph for `spec`: from its recorded plan if there is one, else built (seeded with
    `seed`, the (engine_id, knobs) of a neighbouring bucket, when given)."""
    from dslc.compile import graphs as cbuild

    start = time.perf_counter()
    reasons = []
    if plan is not None and plan.get("serialized"):
        try:
            g = cbuild.restore(plan["serialized"], handle)
            return Ready(g, spec, int(plan["workspace"]), "restored", time.perf_counter() - start,
                         plan.get("engine_id"), plan.get("knobs"))
        except Exception as err:
            reasons.append(f"the serialized plan did not load ({_short(err)})")
    engine = None
    if plan is not None and plan.get("engine_id") is not None:
        engine = (int(plan["engine_id"]), dict(plan["knobs"]))
    elif seed is not None:
        engine = seed
    if engine is not None:
        try:
            built = cbuild.build(spec, handle, engine=engine)
            if built.has_plan:
                if reasons:
                    log.info("%s: %s; replayed engine %s", where, reasons[-1], engine[0])
                return Ready(built.graph, spec, built.workspace, "replayed",
                             time.perf_counter() - start, built.engine_id, built.knobs)
            reasons.append(f"engine {engine[0]} did not build ({built.note})")
        except Exception as err:
            reasons.append(f"engine {engine[0]} did not build ({_short(err)})")
    try:
        built = cbuild.build(spec, handle)
    except Exception as err:
        raise RunnerError("R0802", f"{where}: cuDNN rejects this graph here ({_short(err)})") from err
    if not built.has_plan:
        raise RunnerError("R0802", f"{where}: no cuDNN plan builds here ({built.note})")
    why = "; ".join(reasons) if reasons else "no plan was recorded for it"
    log.info("%s: %s; took the heuristics' choice (engine %s)", where, why, built.engine_id)
    return Ready(built.graph, spec, built.workspace, "heuristics", time.perf_counter() - start,
                 built.engine_id, built.knobs)


def _short(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return (text[0] if text else type(err).__name__)[:200]
