"""Weights at start-up: read the safetensors file, check it against the manifest (R0202), compute
the load-time values (batchnorm folding and the like: the bundle's load-time IR), and upload what
the steps read, each in its dtype and memory layout.

The load-time values are computed on the GPU after the params go up (`upload`): in numpy on the
CPU, ResNet-50's folding took 0.3-0.6 s of a cold start, most of it f16 <-> f32 conversions.
`load_time_values` (numpy) stays the oracle the GPU path is tested against, and the route for
dtypes CuPy cannot hold (fp8).

Loading checks what the pointers given to cuDNN will read: each param's shape and dtype, each
prepared value's byte count; and it reports NaN or infinite values once per file (W0202, logged:
they are legitimate in some weights, such as -inf attention masks, so loading goes on)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from dslc import fsutil
from dslc.core.errors import RunnerError
from dslc.ir.graph import CALIBRATED, Node
from dslc.ir.interp import NUMPY_DTYPES, apply_view, concrete_attrs, evaluate_node
from dslc.runtime.calibration import weights_digest
from dslc.runtime.manifest import Manifest
from dslc.runtime.schedule import Schedule

LOG = logging.getLogger("dslc.runtime")
Warn = Callable[[str], None]  # takes one sentence about NaN or infinite values
PREPARED = "dslc.prepared"  # the `format` of a prepared weights file's safetensors metadata


def read(path: Path, manifest: Manifest, warn: Warn | None = None,
         ) -> dict[str, np.ndarray]:
    """The model's params from a safetensors file, checked against the manifest. NaN or infinite
    values are told in one sentence, to `warn` (default: the `dslc.runtime` log, as W0202)."""
    from safetensors.numpy import load_file

    if _metadata(path).get("format") == PREPARED:
        raise RunnerError("R0202", f"`{path}` holds weights prepared for one bundle (`dslc weights "
                          "prepare`); give the model's own weights here")
    try:
        tensors = dict(load_file(str(path)))
    except Exception as err:
        raise RunnerError("R0202", f"cannot read weights `{path}`: {err}") from err
    problems = []
    for p in manifest.params:  # a param's shape is static (E0605): ints
        a = tensors.get(p.name)
        if a is None:
            problems.append((f"weight `{p.name}` is missing from `{path}`", p.span.to_data()))
        elif list(a.shape) != list(p.shape):
            problems.append((f"weight `{p.name}` has shape {list(a.shape)}, the model declares "
                             f"{list(p.shape)}", p.span.to_data()))
        elif a.dtype != np.dtype(NUMPY_DTYPES[p.dtype]):
            problems.append((f"weight `{p.name}` is {a.dtype}, the model declares {p.dtype} "
                             "(convert with `dslc weights from-torch`)", p.span.to_data()))
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise RunnerError("R0202", problems[0][0] + more, problems[0][1])
    _warn_nonfinite(path, {p.name: tensors[p.name] for p in manifest.params}, warn)
    return tensors


def _metadata(path: Path) -> dict[str, str]:
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="np") as f:
            return dict(f.metadata() or {})
    except Exception as err:
        raise RunnerError("R0202", f"cannot read weights `{path}`: {err}") from err


# -- prepared weights: the load-time values computed once, in their dtype and memory layout ----
def digest(program: Schedule) -> str:
    """What prepared weights depend on: the load-time values the steps read, the nodes they are
    computed from, and their dtypes, shapes and layouts (not the plans: tuning keeps it)."""
    import hashlib
    import json

    wanted = program.weights_used()
    amax = amaxes(program)
    text = json.dumps([wanted] + [[n.name, n.op, n.inputs, n.type.dtype, str(n.type.shape),
                                   str(n.precision),
                                   memory_order(program, n.name, len(n.type.shape)),
                                   json.dumps(n.attrs, sort_keys=True, default=str),
                                   # fp8: the calibrated amax its scales are computed from
                                   amax.get(str(n.attrs.get("tensor"))) if n.op == CALIBRATED
                                   else None]
                                  for n in _needed(program, wanted)], default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def prepare(program: Schedule, tensors: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The bytes each load-time value has on the device (computed with the numpy oracle)."""
    values = load_time_values(program, tensors, program.weights_used())
    return {name: physical(a, memory_order(program, name, a.ndim)).reshape(-1).view(np.uint8)
            for name, a in values.items()}


def save_prepared(path: Path, program: Schedule, data: Mapping[str, np.ndarray],
                  source: str) -> None:
    from safetensors.numpy import save_file

    meta = {"format": PREPARED, "model": program.bundle.model,
            "program": digest(program), "source": source}
    fsutil.atomic_write(path, lambda tmp: save_file(dict(data), tmp, metadata=meta))


def read_prepared(path: Path, program: Schedule, warn: Warn | None = None,
                  ) -> dict[str, np.ndarray] | None:
    """The device bytes from a prepared weights file made for this bundle's program; None when
    `path` is a plain weights file; R0202 when it was prepared for another build, or when a value
    does not hold the bytes this bundle reads (the digest names the build, it does not prove the
    bytes)."""
    from safetensors.numpy import load_file

    meta = _metadata(path)
    if meta.get("format") != PREPARED:
        return None
    if meta.get("program") != digest(program):
        raise RunnerError("R0202", f"`{path}` was prepared for another build of "
                          f"`{meta.get('model')}` (its load-time values differ from this "
                          "bundle's); prepare it again: `dslc weights prepare BUNDLE W.safetensors`")
    try:
        data = dict(load_file(str(path)))
    except Exception as err:
        raise RunnerError("R0202", f"cannot read weights `{path}`: {err}") from err
    values = {}
    for name in program.weights_used():
        a = data.get(name)
        if a is None:
            raise RunnerError("R0202", f"`{path}` lacks the prepared value `{name}`")
        storage = program.storage(name, {})
        if a.dtype != np.uint8 or a.ndim != 1 or a.size != storage.nbytes:
            raise RunnerError("R0202", f"the prepared value `{name}` in `{path}` is "
                              f"{a.dtype}{list(a.shape)}, but this bundle reads it as "
                              f"{storage.nbytes:,} bytes ({storage.dtype}{list(storage.shape)}); "
                              "prepare it again: `dslc weights prepare BUNDLE W.safetensors`")
        if storage.dtype in _NOT_FINITE:  # the floats
            values[name] = a.view(NUMPY_DTYPES[storage.dtype])
    _warn_nonfinite(path, values, warn)
    return data


# -- NaN and infinity: found by the exponent bits, which is fast enough for every load ----------
# (the integer type of a float's bits, every bit but the sign, the lowest of those not finite)
_NOT_FINITE: dict[str, tuple[type[np.unsignedinteger[Any]], int, int]] = {
    "f32": (np.uint32, 0x7FFFFFFF, 0x7F800000), "f16": (np.uint16, 0x7FFF, 0x7C00),
    "bf16": (np.uint16, 0x7FFF, 0x7F80), "f8e5m2": (np.uint8, 0x7F, 0x7C),
    "f8e4m3": (np.uint8, 0x7F, 0x7F)}  # f8e4m3 (fn) has no infinity; 0x7F is its NaN
_CHUNK = 1 << 20  # elements per pass: the masked copy stays in the cache


def nonfinite(a: np.ndarray) -> tuple[int, int]:
    """How many NaN and how many infinite values `a` holds (0, 0 for integer arrays)."""
    name = next((k for k, dt in NUMPY_DTYPES.items() if a.dtype == np.dtype(dt)), None)
    if name not in _NOT_FINITE:
        if a.dtype.kind != "f":
            return 0, 0
        return int(np.isnan(a).sum()), int(np.isinf(a).sum())
    uint, magnitude, lowest = _NOT_FINITE[name]
    bits = np.ascontiguousarray(a).reshape(-1).view(uint)
    if not any(int((bits[i:i + _CHUNK] & magnitude).max()) >= lowest
               for i in range(0, bits.size, _CHUNK)):
        return 0, 0
    wide = a.astype(np.float32)  # only for a tensor that has some
    return int(np.isnan(wide).sum()), int(np.isinf(wide).sum())


def nonfinite_phrase(nan: int, inf: int) -> str:
    """`3 NaN and 1 infinite value`, `2 NaN values`, `1 infinite value`."""
    infinite = f"{inf} infinite value{'s' if inf != 1 else ''}"
    if not nan:
        return infinite
    return f"{nan} NaN and {infinite}" if inf else f"{nan} NaN value{'s' if nan != 1 else ''}"


def _warn_nonfinite(path: Path, tensors: Mapping[str, np.ndarray], warn: Warn | None) -> None:
    """One sentence for the whole file: the first tensor with NaN or infinite values, and how many
    more there are."""
    found = [(name, *nonfinite(a), a.size) for name, a in tensors.items()]
    found = [f for f in found if f[1] or f[2]]
    if not found:
        return
    name, nan, inf, size = found[0]
    others = len(found) - 1
    more = f" ({others} more weight{'s hold' if others > 1 else ' holds'} some too)" if others else ""
    (warn or _log_warning)(f"weight `{name}` holds {nonfinite_phrase(nan, inf)} of {size:,} in "
                           f"`{path}`{more}; the outputs that depend on it may be NaN or "
                           "infinite too")


def _log_warning(text: str) -> None:
    LOG.warning("warning[W0202]: %s", text)


def _needed(program: Schedule, wanted: list[str]) -> list[Node]:
    """The nodes the values `wanted` are computed from, in program order."""
    needed: set[str] = set()
    stack = list(wanted)
    while stack:
        name = stack.pop()
        if name not in needed:
            needed.add(name)
            stack.extend(program.nodes[name].inputs)
    return [node for node in program.graph.nodes if node.name in needed]


def amaxes(program: Schedule) -> Mapping[str, float]:
    """Each quantised tensor's calibrated amax (R0203 when the bundle quantises tensors to fp8
    and holds no calibration)."""
    bundle = program.bundle
    if bundle.calibration is not None:
        return bundle.calibration.amax
    if bundle.uncalibrated:
        raise RunnerError("R0203", f"`{bundle.model}` computes in fp8 and its bundle holds no "
                          "scales: calibrate it on representative inputs first, `dslc calibrate "
                          "BUNDLE --weights W --data SAMPLES.npz`")
    return {}


def check_calibrated_with(program: Schedule, tensors: Mapping[str, np.ndarray],
                          path: Path) -> None:
    """R0203 when the bundle was calibrated with other weights than these: the scales of its
    activations are the ranges they took with those weights."""
    calibration = program.bundle.calibration
    if calibration is None:
        return
    params = [p.name for p in program.bundle.manifest.params]
    if weights_digest(tensors, params) != calibration.weights:
        raise RunnerError("R0203", f"`{program.bundle.model}` was calibrated with other weights "
                          f"than `{path}`: its fp8 scales fit those; calibrate it again with "
                          f"these (`dslc calibrate BUNDLE --weights {path} --data SAMPLES.npz`)")


def load_time_values(program: Schedule, tensors: Mapping[str, np.ndarray],
                     wanted: list[str]) -> dict[str, np.ndarray]:
    """The load-time values `wanted`, computed from the params (and the calibration's amaxes)
    with the numpy references."""
    values: dict[str, np.ndarray] = {}
    needed = _needed(program, wanted)
    amax = amaxes(program) if any(n.op == CALIBRATED for n in needed) else {}
    for node in needed:
        if node.op == "param":
            values[node.name] = np.asarray(tensors[node.attrs["path"]]).astype(
                NUMPY_DTYPES[node.type.dtype], copy=False)
        elif node.op == "scalar":
            values[node.name] = np.asarray(node.attrs["value"], dtype=NUMPY_DTYPES[node.type.dtype])
        elif node.op == CALIBRATED:
            values[node.name] = np.asarray(amax[node.attrs["tensor"]], dtype=np.float32)
        else:
            values[node.name] = evaluate_node(node, [values[i] for i in node.inputs],
                                              concrete_attrs(node, {}), node.type.dtype)
    return {w: values[w] for w in wanted}


def physical(a: np.ndarray, order: tuple[int, ...]) -> np.ndarray:
    """The array's bytes in its memory order (outermost axis first)."""
    return np.ascontiguousarray(a.transpose(order))


def memory_order(program: Schedule, name: str, ndim: int) -> tuple[int, ...]:
    layout = program.nodes[name].type.layout
    return layout.order if layout is not None else tuple(range(ndim))


def upload(program: Schedule, tensors: Mapping[str, np.ndarray],
           wanted: list[str]) -> dict[str, Any]:
    """Device buffers (raw bytes) of the load-time values `wanted`, in each value's layout: the
    params go up as they are, and the values computed from them are computed there, by the
    ops' references on CuPy in f32, each result rounded to its dtype as the numpy path does."""
    import cupy

    from dslc.backend.device import CUPY_DTYPES, decode, encode, run_reference

    nodes = _needed(program, wanted)
    if any(n.type.dtype not in (*CUPY_DTYPES, "bf16") for n in nodes):
        return _upload_host(program, load_time_values(program, tensors, wanted))
    amax = amaxes(program) if any(n.op == CALIBRATED for n in nodes) else {}
    operands = {i for n in nodes for i in n.inputs}  # what the computed values read
    values: dict[str, Any] = {}  # f32 (floats) or int64 logical arrays on the device
    out: dict[str, Any] = {}
    for node in nodes:
        dtype = node.type.dtype
        if node.op == "param":
            host = np.asarray(tensors[node.attrs["path"]])
            if node.name in wanted:  # used as it is: its bytes, in its layout
                order = memory_order(program, node.name, host.ndim)
                out[node.name] = _device_bytes(cupy, physical(host, order))
            if node.name in operands:  # read by a computed value: its logical f32 or int64 form
                bits = host.view(np.uint16) if dtype == "bf16" else host
                values[node.name] = decode(cupy, cupy.asarray(bits), dtype)
                if values[node.name].dtype.kind in "iub":
                    values[node.name] = values[node.name].astype(cupy.int64)
        elif node.op == "scalar":
            values[node.name] = cupy.asarray(node.attrs["value"],
                                             dtype=NUMPY_DTYPES[node.type.dtype])
        elif node.op == CALIBRATED:
            values[node.name] = cupy.asarray(amax[node.attrs["tensor"]], dtype=cupy.float32)
        else:
            xs = [values[i] for i in node.inputs]
            attrs = concrete_attrs(node, {})
            values[node.name] = apply_view(xs[0], attrs["steps"]) if node.op == "view" else \
                run_reference(cupy, node.op, xs, attrs, dtype)
        if node.name in wanted and node.name not in out:
            logical = values[node.name]
            stored = encode(cupy, logical, dtype)
            out[node.name] = _device_bytes(cupy, cupy.ascontiguousarray(
                stored.transpose(memory_order(program, node.name, logical.ndim))))
    return out


def _device_bytes(cupy: Any, a: Any) -> Any:
    """An array's bytes on the device; a host array goes up as bytes (CuPy takes no fp8
    dtype: a weight quantised at load time on the host is ml_dtypes' e4m3)."""
    if isinstance(a, np.ndarray):
        return cupy.asarray(np.ascontiguousarray(a).reshape(-1).view(np.uint8))
    return cupy.asarray(a).reshape(-1).view(cupy.uint8)


def _upload_host(program: Schedule, values: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """Device buffers of values computed on the host, in each value's layout."""
    import cupy

    return {name: _device_bytes(cupy, physical(a, memory_order(program, name, a.ndim)))
            for name, a in values.items()}
