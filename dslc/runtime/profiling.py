"""Where a model's time goes: each step timed as it runs inside a replayed CUDA graph.

A step timed alone from Python counts its launch as its work: cuDNN's `execute` and a CuPy call
cost 20-400 us of host time, against 2-10 us of GPU time for the small steps of a transformer
(the BERT front's gathers showed 0.36-0.48 ms each, its whole CUDA graph 0.21 ms). So each step
is recorded `launches` times in a row as one CUDA graph, and the graph's replay time over
`launches` is the step's time: its kernels and the gaps between kernels, as in the model's own
graph. The steps then add up to about the model's graph time, and a roofline's "time lost"
names kernels, not Python.

A step CuPy will not record (a fallback computing on cuBLAS) is timed as one launch between
CUDA events, as it runs in a plain call; its row says so (`timed: "launch"`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from dslc.backend import device
from dslc.runtime.replay import Bound, stream_of
from dslc.runtime.schedule import Schedule


class Model(Protocol):
    """What profiling needs of a `dslc.runtime.model.Model` (which imports this module)."""

    program: Schedule
    _gpu: tuple[Any, Any] | None

    @property
    def cupy(self) -> Any: ...

    @property
    def handle(self) -> Any: ...

    def _bind(self, inputs: Mapping[str, Any]) -> Bound: ...

    def _allocate_outputs(self, exe: Any, kind: str) -> dict[str, device.ArrayRef]: ...

    def _step(self, exe: Any, step: Any, refs: Mapping[str, device.ArrayRef],
              outputs: Mapping[str, device.ArrayRef], workspace: int) -> None: ...

    def _handle_on_null_stream(self) -> None: ...


LAUNCHES = 20  # copies of a step in its graph: a 2 us kernel then takes 40 us a replay


def profile(model: Model, inputs: Mapping[str, Any], repeats: int = 10,
            launches: int = LAUNCHES) -> list[dict[str, Any]]:
    """Milliseconds per step (median over `repeats` replays), in schedule order; each row
    says how it was timed: `graph` (recorded `launches` times, time / launches) or `launch`."""
    refs, exe, kind = model._bind(inputs)
    outputs = model._allocate_outputs(exe, kind)
    cupy = model.cupy
    stream_of(kind, cupy).synchronize()  # the inputs are ready before the side stream reads
    stream = cupy.cuda.Stream(non_blocking=True)  # a capture needs a stream of its own
    _, cudnn = model._gpu or device.require()
    cudnn.set_stream(handle=model.handle, stream=stream.ptr)
    workspace = int(exe.workspace.data.ptr)
    rows = []
    try:
        with stream:
            for step in model.program.steps:
                def once(step: Any = step) -> None:
                    model._step(exe, step, refs, outputs, workspace)

                once()  # warm: kernels compiled, plans loaded, outside any capture
                graph = _recorded(stream, once, launches)
                if graph is None:
                    ms, how = _median(cupy, stream, once, repeats), "launch"
                else:
                    ms, how = _median(cupy, stream, _replay(graph, stream), repeats) / \
                        launches, "graph"
                kind = ("split" if step.name in exe.splits  # as it ran here
                        else "graph" if model.program.graph_here(step, exe.bucket)
                        else "kernel")
                rows.append({"step": step.name, "kind": kind, "pattern": step.pattern,
                             "ms": ms, "timed": how})
        stream.synchronize()
    finally:  # the stream dies with this call: the handle must not keep it
        model._handle_on_null_stream()
    return rows


def _recorded(stream: Any, once: Callable[[], None], launches: int) -> Any:
    """`launches` copies of the step as one CUDA graph, or None where CuPy refuses to record."""
    stream.begin_capture()
    refused = False
    try:
        for _ in range(launches):
            once()
    except NotImplementedError:  # CuPy refuses cuBLAS calls while capturing
        refused = True
    finally:
        graph = stream.end_capture()
    return None if refused else graph


def _replay(graph: Any, stream: Any) -> Callable[[], None]:
    return lambda: graph.launch(stream)


def _median(cupy: Any, stream: Any, call: Callable[[], None], repeats: int) -> float:
    """The median of `repeats` timings of `call` between CUDA events, after one warm-up."""
    times = []
    for _ in range(repeats + 1):
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record(stream)
        call()
        end.record(stream)
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, end))
    ordered = sorted(times[1:])
    return float(ordered[len(ordered) // 2])

