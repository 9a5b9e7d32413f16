"""CUDA graphs of a model. `Captured` is one, at fixed sizes (`Model.capture`): calls copy the
inputs into its static buffers and replay it, and its outputs are static too. `Replays` is the
cache behind plain calls (`Model.run`): the first call at a size runs step by step (plans are
restored or built then), the second records the schedule as a graph, and later calls at that
size replay it and return fresh outputs, so a plain call costs about what a replay does (as
torch's `reduce-overhead` does; ResNet-50 at batch 1 took 2.2 ms step by step against 0.34 ms
replayed on the H200, the difference being Python per step).

A size whose schedule CuPy will not record (fallback kernels on cuBLAS, R0803) runs step by
step from then on, said once.

Inputs written in place (a KV cache: `Schedule.written_inputs`) are never copied: a static copy
would be written instead of the caller's buffer. A graph records the caller's own pointers for
them, and plain calls keep one graph per (kind, size, those pointers): a decode loop passes the
same caches at every step, so it records once and replays from then on.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, Protocol

from dslc.backend import device
from dslc.backend.kernels import on_the_reference
from dslc.core.errors import RunnerError
from dslc.ir.graph import Node
from dslc.runtime.records import Bundle
from dslc.runtime.schedule import Schedule

LIMIT = 8  # graphs kept per model: each holds static copies of its inputs and outputs
Bound = tuple[dict[str, device.ArrayRef], Any, str]  # inputs, `model.Executable`, array kind


class Model(Protocol):
    """What recording needs of a `dslc.runtime.model.Model` (which imports this module)."""

    program: Schedule
    bundle: Bundle
    log: logging.Logger

    @property
    def cupy(self) -> Any: ...

    def _bind(self, inputs: Mapping[str, Any]) -> Bound: ...

    def _allocate_outputs(self, exe: Any, kind: str) -> dict[str, device.ArrayRef]: ...

    def _launch(self, exe: Any, refs: Mapping[str, device.ArrayRef],
                outputs: Mapping[str, device.ArrayRef], stream: Any) -> None: ...

    def _output_view(self, exe: Any, name: str, outputs: dict[str, device.ArrayRef], kind: str,
                     refs: Mapping[str, device.ArrayRef]) -> Any: ...


class Captured:
    """A CUDA graph of the model at fixed sizes: calls copy the inputs into static buffers and
    replay the graph on the caller's current stream, without waiting (as a torch CUDA graph
    does): read the outputs on that stream, or synchronize. The outputs are static too: the
    next call overwrites them; calls on different streams must not overlap."""

    def __init__(self, model: Model, inputs: Mapping[str, Any], bound: Bound | None = None) -> None:
        self.model = model
        refs, self.exe, kind = bound if bound is not None else model._bind(inputs)
        self.kind = kind
        inputs = {name: r.obj for name, r in refs.items()}
        # Written in place: the caller's buffer itself, recorded by its pointer.
        self.written = model.program.written_inputs()
        self.inputs = {name: r if name in self.written else
                       device.empty(r.shape, r.strides, r.dtype, kind)
                       for name, r in refs.items()}
        self.outputs = model._allocate_outputs(self.exe, kind)
        cupy = model.cupy
        stream_of(kind, cupy).synchronize()  # the inputs are ready before the side stream reads
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self._copy_in(inputs, self.stream)
        model._launch(self.exe, self.inputs, self.outputs, self.stream)  # warm, outside capture
        self.stream.begin_capture()
        refused: NotImplementedError | None = None
        try:
            model._launch(self.exe, self.inputs, self.outputs, self.stream)
        except NotImplementedError as err:  # CuPy refuses cuBLAS calls while capturing
            refused = err
        finally:
            self.graph = self.stream.end_capture()
        if refused is not None:
            nodes = model.program.nodes
            program = model.program  # a step one pointwise kernel runs never refuses
            fallbacks = sorted({nodes[n].op for s in program.steps
                                if not program.graph_here(s, self.exe.bucket)
                                and program.pointwise_kernel(s) is None
                                for n in s.nodes if _on_the_reference(nodes, n)})
            raise RunnerError("R0803", "this model cannot be captured as a CUDA graph: its "
                              f"fallback kernels ({', '.join(f'`{op}`' for op in fallbacks)}) "
                              f"compute on CuPy, which refuses ({refused}); call the model "
                              "directly instead") from refused
        self.stream.synchronize()
        self._results = {name: model._output_view(self.exe, name, self.outputs, kind, self.inputs)
                         for name in model.program.outputs}
        # Outputs computed into the graph's own buffers (the others are views of the inputs
        # or of the weights): what a plain call copies out.
        self.computed = frozenset(
            name for name, value in model.program.outputs.items()
            if self.exe.storage(value).base in self.outputs)
        self._streams: dict[int, Any] = {}  # CuPy handles of the caller's torch streams

    def _copy_in(self, inputs: Mapping[str, Any], stream: Any) -> None:
        for name, obj in inputs.items():
            if name in self.written:
                self._same_buffer(name, obj)
                continue
            dst = self.inputs[name].obj
            if self.kind == "torch":
                import torch

                with torch.cuda.stream(torch.cuda.ExternalStream(stream.ptr)):
                    dst.copy_(obj)
            else:
                with stream:
                    dst[...] = obj

    def _same_buffer(self, name: str, obj: Any) -> None:
        """A written input must be the buffer the graph recorded: it writes there."""
        if _pointer(obj) != self.inputs[name].ptr:
            raise RunnerError("R0201", f"input `{name}` is written in place, and this graph was "
                              "recorded with another buffer: pass the same tensor at every "
                              "call (a decoder's caches), or capture again")

    def __call__(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        # The per-call path is kept short: with a small model the GPU waits on it (measured
        # ~40 us of Python per call on a 0.3 ms encoder layer before it was).
        stream = self._caller_stream()
        if self.kind == "torch":
            for name, obj in inputs.items():  # on the caller's current stream
                if name in self.written:
                    self._same_buffer(name, obj)
                else:
                    self.inputs[name].obj.copy_(obj)
        else:
            self._copy_in(inputs, stream)
        self.graph.launch(stream)
        return dict(self._results)

    def replay(self) -> dict[str, Any]:
        """The graph again on the caller's current stream over the inputs it holds (the last
        call's, or values the caller wrote into `inputs`), as a PyTorch CUDA graph replays:
        no copies. On BERT's front (three inputs, H200) a call with its copies took 0.119 ms
        where the replay alone took 0.093: `dslc bench` times both."""
        self.graph.launch(self._caller_stream())
        return dict(self._results)

    def _caller_stream(self) -> Any:
        if self.kind != "torch":
            return self.model.cupy.cuda.get_current_stream()
        import torch

        ptr = torch.cuda.current_stream().cuda_stream
        stream = self._streams.get(ptr)
        if stream is None:
            stream = self._streams[ptr] = stream_of("torch", self.model.cupy)
        return stream


class Replays:
    """The graphs of a model's plain calls, by input kind and size; at most `limit`, the one
    used longest ago dropped first."""

    def __init__(self, limit: int = LIMIT) -> None:
        self.limit = limit
        # (kind, size, then each input written in place with its pointer) -> its graph
        self.graphs: OrderedDict[tuple[Any, ...], Captured | None] = OrderedDict()
        # sizes met once (their next call records); bounded: a caller handing new caches at
        # every call would make a key per call
        self.seen: OrderedDict[tuple[Any, ...], None] = OrderedDict()

    def clear(self) -> None:
        """Forget every graph (they hold pointers to the weights and arenas they recorded)."""
        self.graphs.clear()
        self.seen.clear()

    def call(self, model: Model, refs: dict[str, device.ArrayRef], exe: Any,
             kind: str) -> dict[str, Any] | None:
        """The outputs of a replay, fresh buffers the next call does not touch; None where this
        call runs step by step (the first at its size, or a size that cannot be recorded)."""
        if any(r.kind != kind for r in refs.values()):  # torch and CuPy mixed: step by step
            return None
        written = model.program.written_inputs()
        key = (kind, exe.key, *sorted((n, r.ptr) for n, r in refs.items() if n in written))
        if key not in self.graphs:
            if key not in self.seen:  # the first call at this size builds its plans
                self.seen[key] = None
                while len(self.seen) > 4 * self.limit:
                    self.seen.popitem(last=False)
                return None
            try:
                self.graphs[key] = Captured(model, {}, (refs, exe, kind))
            except Exception as err:  # a plain call never fails for want of a graph
                model.log.info("%s at %s runs step by step: %s", model.bundle.model, exe.key,
                               err)
                self.graphs[key] = None
            while len(self.graphs) > self.limit:
                self.graphs.popitem(last=False)
        captured = self.graphs[key]
        self.graphs.move_to_end(key)
        if captured is None:
            return None
        static = captured({name: r.obj for name, r in refs.items()})
        return {name: _fresh(static[name]) if name in captured.computed else
                model._output_view(exe, name, {}, kind, refs) for name in static}


def _pointer(obj: Any) -> int:
    """The device address of a torch tensor or a CuPy array."""
    return int(obj.data_ptr()) if hasattr(obj, "data_ptr") else int(obj.data.ptr)


def _fresh(array: Any) -> Any:
    """A copy on the caller's current stream (torch or CuPy), in the same memory order."""
    return array.clone() if hasattr(array, "clone") else array.copy(order="K")


def stream_of(kind: str, cupy: Any) -> Any:
    """The caller's current stream: work is ordered after what it queued."""
    if kind == "torch":
        import torch

        current = torch.cuda.current_stream()
        if hasattr(cupy.cuda.Stream, "from_external"):
            return cupy.cuda.Stream.from_external(current)
        return cupy.cuda.ExternalStream(current.cuda_stream)
    return cupy.cuda.get_current_stream()


def _on_the_reference(nodes: Mapping[str, Node], name: str) -> bool:
    node = nodes[name]
    return on_the_reference(node.op, [nodes[i].type.shape for i in node.inputs],
                            node.type.dtype, node.attrs)
