"""GroupSpec -> cuDNN graph: tensors named after IR values, with the spec's uids, each op through
its OpDef's `lower`; then validate, operation graph, execution plans. With a device, plans are
built; deviceless (a target's device properties), what the library can build without a driver.

This and `dslc.backend.target` are the only modules that import `cudnn`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import cudnn
import numpy as np

from dslc.backend.channels_last import channels_last_form
from dslc.backend.spec import GroupSpec
from dslc.ir.storage import Storage
from dslc.ops import OPS

DATA_TYPES = {
    "f32": cudnn.data_type.FLOAT, "f16": cudnn.data_type.HALF, "bf16": cudnn.data_type.BFLOAT16,
    "f8e4m3": cudnn.data_type.FP8_E4M3, "f8e5m2": cudnn.data_type.FP8_E5M2,
    "i8": cudnn.data_type.INT8, "u8": cudnn.data_type.UINT8, "i32": cudnn.data_type.INT32,
    "i64": cudnn.data_type.INT64, "bool": cudnn.data_type.BOOLEAN,
}
HEURISTICS = [cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK]

# Engines that build a conv whose result takes a residual before its bias (conv -> add ->
# bias_add, `lower.canonical.residual_before_bias`) but fail when it runs: "execute ...
# !getAlpha2().isZero(), CUDNN_STATUS_BAD_PARAM" (cuDNN 9.19 on an H100, session 27: the
# heuristics' first choice for a 3-channel f32 conv and a 4-channel f16 one, in generated
# programs). The tuner times each candidate and drops one that fails; the heuristics' choice
# is never run before it is used, so these are passed over for such graphs.
FAILS_WITH_A_RESIDUAL = frozenset({11, 32})


class GraphError(Exception):
    """cuDNN rejected the graph (validate or operation graph): the group must be split."""


@dataclass
class Built:
    """A cuDNN graph for one GroupSpec, and what became of its plans."""

    graph: Any
    spec: GroupSpec
    candidates: int = 0
    plan_index: int | None = None  # the plan built and selected, if any
    engine_id: int | None = None
    knobs: dict[str, int] = field(default_factory=dict)
    workspace: int = 0
    serialized: bytes | None = None
    build_s: float = 0.0
    note: str = ""  # why no plan was built (deviceless engines needing the driver, ...)

    @property
    def has_plan(self) -> bool:
        return self.plan_index is not None


class _Lowering:
    """The `LowerCtx` an op's `lower` sees."""

    def __init__(self, g: Any, spec: GroupSpec) -> None:
        self.g = g
        self.spec = spec
        self.current = ""

    def enum(self, kind: str, member: str) -> Any:
        return getattr(getattr(cudnn, kind), member)

    def scalar(self, value: float) -> Any:
        return scalar(self.g, value)

    def result_dims(self) -> list[int]:
        return list(self.spec.tensor(self.current).dims)

    def result_strides(self) -> list[int]:
        return list(self.spec.tensor(self.current).strides)


def scalar(g: Any, value: float) -> Any:
    """A pass-by-value f32 scalar. From a Python float the frontend makes a double, which a
    fused f32 epilogue misreads (on the H200 `matmul(a, b) * 0.1` gave zeros; 0.5 and 3.0, whose
    doubles end in zero bits, looked right): give it a float32."""
    return g.tensor_scalar(np.float32(value), cudnn.scalar_type.RUNTIME_PARAM)


def make_graph(spec: GroupSpec, handle: Any = None, properties: Any = None,
               kernel_cache: Any = None, as_given: bool = False) -> Any:
    """The cuDNN graph of `spec`, validated and lowered to an operation graph (GraphError).
    With a `kernel_cache` (`new_kernel_cache()`), the graph is built with dynamic shapes, so a
    graph of the same form at another size reuses the kernels compiled for the first. A
    pointwise group is named in channels-last form first (`channels_last_form`), unless
    `as_given` (a probe of the forms cuDNN takes)."""
    if not as_given:
        spec = channels_last_form(spec)
    extra = {"kernel_cache": kernel_cache, "is_dynamic_shape_enabled": True} if kernel_cache \
        else {}
    g = cudnn.pygraph(io_data_type=DATA_TYPES[spec.io],
                      intermediate_data_type=DATA_TYPES[spec.intermediate],
                      compute_data_type=DATA_TYPES[spec.compute], handle=handle,
                      device_property=properties, **extra)
    tensors: dict[str, Any] = {}
    for t in spec.tensors:
        if t.role == "scalar":
            tensors[t.name] = scalar(g, t.value)
        elif t.role == "input":
            tensors[t.name] = g.tensor(name=t.name, dim=list(t.dims), stride=list(t.strides),
                                       data_type=DATA_TYPES[t.dtype], uid=t.uid)
    ctx = _Lowering(g, spec)
    try:
        for op in spec.ops:
            ctx.current = op.node
            lower = OPS[op.op].lower
            if lower is None:
                raise GraphError(f"`{op.op}` has no cuDNN graph node")
            result = lower(ctx, [tensors[i] for i in op.inputs], op.attrs)
            t = spec.tensor(op.node)
            result.set_name(t.name).set_data_type(DATA_TYPES[t.dtype])
            result.set_dim(list(t.dims)).set_stride(list(t.strides))
            if t.role == "output":
                result.set_output(True).set_uid(t.uid)
            tensors[op.node] = result
        g.validate()
        g.build_operation_graph()
    except GraphError:
        raise
    except Exception as err:  # cuDNN's own errors come in several types
        raise GraphError(_first_line(err)) from err
    return g


# Why a graph compiled without a GPU has no plan in the bundle, as `dslc inspect` says it.
DEVICELESS_NOTE = ("built at start-up: without the GPU's driver cuDNN proposes no engine for this "
                   "graph (its kernels are compiled at run time)")


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return (text[0] if text else type(err).__name__)[:300]


def build(spec: GroupSpec, handle: Any = None, properties: Any = None,
          engine: tuple[int, dict[str, int]] | None = None, kernel_cache: Any = None,
          as_given: bool = False) -> Built:
    """Graph and plan: `engine` replays a recorded (engine_id, knobs); otherwise the
    heuristics' list, the first candidate that builds. GraphError if cuDNN rejects the graph.
    `as_given`: the spec's own form, not renamed (`make_graph`)."""
    start = time.perf_counter()
    g = make_graph(spec, handle, properties, kernel_cache, as_given)
    out = Built(g, spec)
    try:
        if engine is not None:
            g.create_execution_plan(engine[0], _knobs_in(engine[1]))
        else:
            g.create_execution_plans(HEURISTICS)
        out.candidates = g.get_execution_plan_count()
    except Exception as err:
        out.note = (DEVICELESS_NOTE if handle is None
                    else f"no candidate plan: {_first_line(err)}")
        out.build_s = time.perf_counter() - start
        return out
    residual = adds_a_residual_to_a_conv(spec)
    for index in range(out.candidates):
        if residual and int(g.get_engine_and_knobs_at_index(index)[0]) in FAILS_WITH_A_RESIDUAL:
            out.note = "no plan built: the engines proposed fail with a residual"
            continue
        try:
            g.build_plan_at_index(index)
        except Exception as err:
            out.note = f"no plan built: {_first_line(err)}"
            continue
        failed = fails_to_run(g, spec, handle) if residual and handle is not None else None
        if failed:
            out.note = f"no plan built: the engines proposed fail when they run ({failed})"
            continue
        out.plan_index = index
        engine_id, knobs = g.get_engine_and_knobs_at_index(index)
        out.engine_id = int(engine_id)
        out.knobs = knobs_out(knobs)
        out.workspace = int(g.get_workspace_size())
        try:
            out.serialized = bytes(g.serialize(as_bytes=True))
        except Exception as err:
            out.note = f"plan not serializable: {_first_line(err)}"
        out.note = "" if out.serialized else out.note
        break
    out.build_s = time.perf_counter() - start
    return out


def fails_to_run(g: Any, spec: GroupSpec, handle: Any, workspace_bytes: int | None = None,
                 ) -> str | None:
    """Run a built plan once over zeroed scratch memory: the first line of the error it raises,
    or None. On an H100 engines other than FAILS_WITH_A_RESIDUAL's failed so too (the GPU case
    `conv_bn_residual_relu_f16`, session 29): on a device each conv graph with a residual is
    run once before its plan is taken, as the tuner runs each candidate, and start-up runs a
    restored one that no device has run (`runtime.plans.prepare`)."""
    import cupy

    buffers = {t.uid: cupy.zeros(max(Storage(t.dims, t.strides, t.dtype, t.name, 0).nbytes, 1),
                                 dtype=cupy.uint8)
               for t in spec.tensors if t.role in ("input", "output")}
    if workspace_bytes is None:
        workspace_bytes = int(g.get_workspace_size())
    workspace = cupy.empty(max(workspace_bytes, 1), dtype=cupy.uint8)
    try:
        g.execute({uid: int(b.data.ptr) for uid, b in buffers.items()},
                  int(workspace.data.ptr), handle=handle)
        cupy.cuda.Device().synchronize()  # the handle's stream, whichever it is
    except Exception as err:
        return _first_line(err)
    return None


def adds_a_residual_to_a_conv(spec: GroupSpec) -> bool:
    """A conv and an `add` in one graph: the graphs FAILS_WITH_A_RESIDUAL's engines fail on."""
    return {"conv", "add"} <= {o.op for o in spec.ops}


def knobs_out(knobs: dict[Any, Any]) -> dict[str, int]:
    return {getattr(k, "name", str(k)): int(v) for k, v in knobs.items()}


def _knobs_in(knobs: dict[str, int]) -> dict[Any, int]:
    return {getattr(cudnn.knob_type, k): int(v) for k, v in knobs.items()}


def new_kernel_cache() -> Any:
    return cudnn.create_kernel_cache()


def restore(blob: bytes, handle: Any) -> Any:
    """A serialized plan back into an executable graph (executed by the recorded uids)."""
    g = cudnn.pygraph()
    g.deserialize(handle, blob)
    return g


# Values tried per knob in the exhaustive search: every kernel configuration, a few split-K
# factors (each split adds a reduction pass, so large ones rarely win at inference sizes),
# and at most `_OTHER_VALUES` values of any other knob.
_SPLIT_K = (1, 2, 4, 8)
_OTHER_VALUES = 8


def knob_space(graph: Any, limit: int = 512) -> list[tuple[int, dict[str, int]]]:
    """Every (engine_id, knobs) of the library for this graph (after `build_operation_graph`),
    engines interleaved so that a time budget that stops early has still sampled each engine;
    at most `limit`. The engine and knob lists live on the backend graph, which frontend
    1.32's Python graph keeps in `_lowered_graph` (its public class does not forward them)."""
    backend = getattr(graph, "_lowered_graph", None) or graph
    try:
        engines = int(backend.get_engine_count())
    except Exception:
        return []
    per_engine: list[list[tuple[int, dict[str, int]]]] = []
    for engine in range(engines):
        try:
            knobs = backend.get_knobs_for_engine(engine)
        except Exception:  # an engine that does not support this graph
            continue
        axes: list[tuple[str, list[int]]] = [(k.type.name, _knob_values(k)) for k in knobs]
        combos: list[dict[str, int]] = [{}]
        for name, values in axes:
            combos = [{**c, name: v} for c in combos for v in values]
        per_engine.append([(engine, c) for c in combos])
    out: list[tuple[int, dict[str, int]]] = []
    for i in range(max((len(e) for e in per_engine), default=0)):
        out.extend(e[i] for e in per_engine if i < len(e))
    return out[:limit]


def _knob_values(knob: Any) -> list[int]:
    low, high, step = int(knob.min_value), int(knob.max_value), max(1, int(knob.stride))
    values = list(range(low, high + 1, step))
    if knob.type.name == "KERNEL_CFG":
        return values
    if knob.type.name == "SPLIT_K_SLC":
        return [v for v in _SPLIT_K if low <= v <= high] or values[:1]
    return values[:_OTHER_VALUES]
