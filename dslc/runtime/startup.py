"""Start-up policy: compare the environment a bundle was tuned in with this one, field by field,
and decide what to do with the saved plans.

| what changed                             | decision                                           |
|------------------------------------------|----------------------------------------------------|
| nothing (or only the memory size)        | restore the serialized plans (milliseconds)        |
| cuDNN backend, frontend or CUDA runtime  | restore; if that fails, replay (engine_id, knobs)  |
| the driver                               | re-time the saved top candidates, keep the fastest |
| the GPU (name, compute capability, SMs)  | re-tune                                            |

The user's policy (`on_mismatch`) applies where saved plans cannot be trusted as they are:
"retune" (the default) measures, "heuristic" takes the heuristics' choice, "error" refuses to
start (R0802). Re-timed and re-tuned plans are checked against the reference before use.

Where plans are replayed, re-tuned or taken from the heuristics, the tuning database is asked
first (`dslc.runtime.fleet`): a plan measured in an equal environment is taken as it is, and on
re-tune only what nobody has measured is measured, once per fleet.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dslc.core.errors import RunnerError
from dslc.runtime.records import Environment

RANK = {"restore": 0, "replay": 1, "retime": 2, "retune": 3}
FIELD_ACTION = {"cudnn_backend": "replay", "cudnn_frontend": "replay", "cuda_runtime": "replay",
                "driver": "retime", "driver_release": "retime",
                "device_name": "retune", "compute_capability": "retune",
                "sm_count": "retune", "memory_bytes": "restore"}
POLICIES = ("retune", "heuristic", "error")


@dataclass
class Decision:
    action: str  # restore | replay | retime | retune | heuristic
    changes: list[tuple[str, Any, Any, str]] = field(default_factory=list)  # field, was, is, act

    def explain(self) -> str:
        if not self.changes:
            return "same environment as the bundle's: restore the saved plans"
        parts = [f"{f}: {was} -> {now} ({act})" for f, was, now, act in self.changes]
        return f"{'; '.join(parts)}: {self.action}"


def decide(recorded: Environment, live: Environment, policy: str = "retune") -> Decision:
    """What start-up does with a bundle tuned in `recorded`, running in `live`."""
    if policy not in POLICIES:
        raise ValueError(f"on_mismatch must be one of {', '.join(POLICIES)}, not {policy!r}")
    changes = []
    action = "restore"
    untuned = not recorded.live  # compiled deviceless: plans were never measured
    for name, act in FIELD_ACTION.items():
        was, now = getattr(recorded, name), getattr(live, name)
        if was is None or now is None or str(was) == str(now):
            continue
        changes.append((name, was, now, act))
        if RANK[act] > RANK[action]:
            action = act
    if untuned and action == "restore":
        return Decision("restore", changes)
    if action in ("retime", "retune") and policy != "retune":
        if policy == "error":
            fields = ", ".join(f"{f} ({was} -> {now})" for f, was, now, _ in changes)
            raise RunnerError("R0802", f"the bundle was tuned in another environment ({fields}) "
                              "and on_mismatch='error'")
        action = "heuristic"
    return Decision(action, changes)
