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
from dslc.backend.spec import group_spec
from dslc.core.dims import Dim
from dslc.ir.groups import make_group
from dslc.ir.interp import concrete
from dslc.ir.storage import Storage
from dslc.ir.views import layout_strides
from dslc.runtime.plans import Ready, prepare
from dslc.runtime.records import StepRecord
from dslc.runtime.schedule import MemoryPlan, Schedule

ALIGN = 256  # bytes: where the scratch of a split's anchor starts past the planned arena


@dataclass
class Split:
    """The anchor's graph (`ready`, bound by `bindings`: uid -> value) and the epilogue's
    kernel, which reads the anchor's result from the scratch memory `MemoryPlan` now holds."""

    anchor: str
    ready: Ready
    bindings: list[tuple[int, str]]
    epilogue: fused.Plan


def split(program: Schedule, memory: MemoryPlan, step: StepRecord, handle: Any, where: str,
          log: logging.Logger) -> Split | None:
    """The step as its anchor's graph and its epilogue's kernel, or None where the epilogue is
    no one pointwise kernel or the anchor alone has no plan here either (RunnerError)."""
    anchor, rest = step.nodes[0], step.nodes[1:]
    epilogue = fused.plan_of(program.nodes, rest, (*step.inputs, anchor), step.outputs)
    if not rest or not isinstance(epilogue, fused.Plan):
        return None
    group = make_group(program.graph, [anchor], step.pattern, placement=program.placement)
    spec = group_spec(program.graph, group, memory.dims, program.env, program.placement)
    ready = prepare(spec, None, handle, f"{where}, its anchor alone", log)
    scratch(program, memory, anchor)
    names = list(group.inputs) + list(group.nodes)
    bindings = [(t.uid, names[t.uid - 1]) for t in spec.tensors if t.role in ("input", "output")]
    log.warning("%s: no cuDNN plan of the fused group runs here; its anchor runs alone and its "
                "epilogue as one kernel", where)
    return Split(anchor, ready, bindings, epilogue)


def scratch(program: Schedule, memory: MemoryPlan, value: str) -> None:
    """Memory of its own for `value` (a group's virtual tensor until now), past the arena."""
    t = program.nodes[value].type
    shape = tuple(int(concrete(d, memory.dims, program.env)) for d in t.shape)
    strides: tuple[int, ...]
    if t.layout is not None:  # as `backend.spec` lays out a group's own values
        strides = tuple(_concrete(x) for x in layout_strides(shape, t.layout))
    else:
        dense = [1] * len(shape)
        for i in range(len(shape) - 2, -1, -1):
            dense[i] = dense[i + 1] * max(shape[i + 1], 1)
        strides = tuple(dense)
    s = Storage(shape, strides, t.dtype, value, 0)
    offset = -(-memory.arena // ALIGN) * ALIGN
    memory.storage[value] = s
    memory.offsets[value] = offset
    memory.arena = offset + s.nbytes


def _concrete(d: Dim) -> int:
    assert isinstance(d, int)  # strides of a concrete shape
    return d


def views(split: Split, view: Any, outputs: Mapping[str, Any]) -> tuple[list[Any], list[Any]]:
    """The epilogue kernel's operands and results as `view(name)` gives them."""
    return [view(o.name) for o in split.epilogue.operands], [view(v) for v in outputs]
