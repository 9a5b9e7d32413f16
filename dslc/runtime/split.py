"""A fused group whose graph has no cuDNN plan that runs on this GPU, split at start-up: its
anchor (a convolution) alone as a cuDNN graph writing scratch memory past the arena's plan, then
its epilogue as one pointwise kernel (`backend.fused`). A compile on the GPU splits such a group
itself; a deviceless compile could not try its plans: on an H100 and an H200 every engine cuDNN
proposed for a 1x1 conv whose residual is its own input failed when run (`!getAlpha2().isZero()`,
session 30). The split costs the anchor's result one write and one read."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dslc.backend import fused
from dslc.backend.spec import group_spec, own_strides
from dslc.ir.groups import make_group
from dslc.ir.interp import concrete
from dslc.ir.storage import Storage
from dslc.runtime.plans import Ready, prepare
from dslc.runtime.records import StepRecord
from dslc.runtime.schedule import MemoryPlan, Schedule

ALIGN = 256  # bytes: where the scratch of a split's anchor starts past the planned arena


@dataclass
class Split:
    """One step of the group: the anchor's graph (`ready`, shared by the steps of one signature,
    bound by this step's `bindings`: uid -> value) and its epilogue's kernel, which reads the
    anchor's result from the scratch memory `MemoryPlan` now holds."""

    anchor: str
    ready: Ready
    bindings: list[tuple[int, str]]
    epilogue: fused.Plan


def split(program: Schedule, memory: MemoryPlan, steps: list[StepRecord], handle: Any,
          where: str, log: logging.Logger) -> dict[str, Split] | None:
    """The steps of one signature (repeated blocks share it) each as the anchor's graph and its
    epilogue's kernel, by step name (`parts_of`); None where an epilogue is no one pointwise
    kernel. The anchor's graph is prepared once: RunnerError where it has no plan here either."""
    spec = anchor_spec(program, memory, steps[0])
    parts = parts_of(program, memory, steps, spec)
    if parts is None:
        return None
    ready = prepare(spec, None, handle, f"{where}, its anchor alone", log)
    log.warning("%s: no cuDNN plan of the fused group runs here; its anchor (%s) runs alone and "
                "its epilogue as one kernel", where, steps[0].nodes[0])
    return {name: Split(anchor, ready, bindings, epilogue)
            for name, (anchor, bindings, epilogue) in parts.items()}


def parts_of(program: Schedule, memory: MemoryPlan, steps: list[StepRecord], spec: Any,
             ) -> dict[str, tuple[str, list[tuple[int, str]], fused.Plan]] | None:
    """Per step name: its anchor, the anchor graph's bindings (uid -> this step's value, by
    position, as `Executable.bindings` binds the steps of one signature) and its epilogue's
    kernel; each anchor's result in the one scratch of the signature (a split step runs alone,
    and only it reads its scratch). None where an epilogue is no one pointwise kernel."""
    epilogues = {}
    for step in steps:
        anchor, rest = step.nodes[0], step.nodes[1:]
        plan = fused.plan_of(program.nodes, rest, (*step.inputs, anchor), step.outputs)
        if not rest or not isinstance(plan, fused.Plan):
            return None
        epilogues[step.name] = plan
    offset = _past_arena(memory)
    out = {}
    for step in steps:
        anchor = step.nodes[0]
        group = make_group(program.graph, [anchor], step.pattern, placement=program.placement)
        scratch(program, memory, anchor, offset)
        out[step.name] = (anchor, spec.bound([*group.inputs, *group.nodes]),
                          epilogues[step.name])
    return out


def anchor_spec(program: Schedule, memory: MemoryPlan, step: StepRecord) -> Any:
    group = make_group(program.graph, [step.nodes[0]], step.pattern,
                       placement=program.placement)
    return group_spec(program.graph, group, memory.dims, program.env, program.placement)


def scratch(program: Schedule, memory: MemoryPlan, value: str, offset: int | None = None,
            ) -> None:
    """Memory for `value` (a group's virtual tensor until now) past the planned arena, at
    `offset` (bytes; default: the arena's end, aligned), the arena grown to hold it."""
    t = program.nodes[value].type
    shape = tuple(int(concrete(d, memory.dims, program.env)) for d in t.shape)
    s = Storage(shape, tuple(own_strides(list(shape), t.layout)), t.dtype, value, 0)
    if offset is None:
        offset = _past_arena(memory)
    memory.storage[value] = s
    memory.offsets[value] = offset
    memory.arena = max(memory.arena, offset + s.nbytes)


def _past_arena(memory: MemoryPlan) -> int:
    """The planned arena's end, rounded up to ALIGN bytes."""
    return -(-memory.arena // ALIGN) * ALIGN


def views(split: Split, view: Any, outputs: Mapping[str, Any]) -> tuple[list[Any], list[Any]]:
    """The epilogue kernel's operands and results as `view(name)` gives them."""
    return [view(o.name) for o in split.epilogue.operands], [view(v) for v in outputs]
