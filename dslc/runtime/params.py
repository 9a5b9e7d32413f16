"""Weights at start-up: read the safetensors file, check it against the manifest (R0202), compute
the load-time values (batchnorm folding and the like: the bundle's load-time IR, in numpy), and
upload what the steps read, each in its dtype and memory layout."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from dslc.ir.interp import NUMPY_DTYPES, concrete_attrs, evaluate_node
from dslc.runtime.errors import RunnerError
from dslc.runtime.schedule import Program


def read(path: Path, manifest: Mapping[str, Any]) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    try:
        tensors = dict(load_file(str(path)))
    except Exception as err:
        raise RunnerError("R0202", f"cannot read weights `{path}`: {err}") from err
    problems = []
    for p in manifest["params"]:
        a = tensors.get(p["path"])
        if a is None:
            problems.append((f"weight `{p['path']}` is missing from `{path}`", p["span"]))
        elif list(a.shape) != list(p["shape"]):
            problems.append((f"weight `{p['path']}` has shape {list(a.shape)}, the model declares "
                             f"{p['shape']}", p["span"]))
        elif a.dtype != np.dtype(NUMPY_DTYPES[p["dtype"]]):
            problems.append((f"weight `{p['path']}` is {a.dtype}, the model declares {p['dtype']} "
                             "(convert with `dslc weights from-torch`)", p["span"]))
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise RunnerError("R0202", problems[0][0] + more, problems[0][1])
    return tensors


def load_time_values(program: Program, tensors: Mapping[str, np.ndarray],
                     wanted: list[str]) -> dict[str, np.ndarray]:
    """The load-time values `wanted`, computed from the params with the numpy references."""
    needed: set[str] = set()
    stack = list(wanted)
    while stack:
        name = stack.pop()
        if name not in needed:
            needed.add(name)
            stack.extend(program.nodes[name].inputs)
    values: dict[str, np.ndarray] = {}
    for node in program.graph.nodes:
        if node.name not in needed:
            continue
        if node.op == "param":
            values[node.name] = np.asarray(tensors[node.attrs["path"]]).astype(
                NUMPY_DTYPES[node.type.dtype], copy=False)
        elif node.op == "scalar":
            values[node.name] = np.asarray(node.attrs["value"], dtype=np.float32)
        else:
            values[node.name] = evaluate_node(node, [values[i] for i in node.inputs],
                                              concrete_attrs(node, {}), node.type.dtype)
    return {w: values[w] for w in wanted}


def physical(a: np.ndarray, order: tuple[int, ...]) -> np.ndarray:
    """The array's bytes in its memory order (outermost axis first)."""
    return np.ascontiguousarray(a.transpose(order))


def upload(program: Program, values: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """Device buffers (raw bytes) of the load-time values, in each value's layout."""
    import cupy

    out = {}
    for name, a in values.items():
        layout = program.nodes[name].type.layout
        order = layout.order if layout is not None else tuple(range(a.ndim))
        host = physical(a, order)
        out[name] = cupy.asarray(host.reshape(-1).view(np.uint8))
    return out
