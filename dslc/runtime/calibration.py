"""fp8 in a bundle, as a typed record read from untrusted data: the calibration (each quantised
tensor's amax over the samples `dslc calibrate` ran, and the digests of those samples and of the
weights they ran with).

A calibration is checked against the graph it calibrates: exactly one finite, non-negative amax
per `amax` node's tensor. The weights' digest (`weights_digest`) lets the runtime refuse weights
the model was not calibrated with: activation ranges are a property of the weights too.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from dslc.core.types import FP8
from dslc.ir.graph import CALIBRATED, Graph
from dslc.runtime import fields as f

HEX = "0123456789abcdef"


def _digest_field(v: Any, path: str) -> str:
    text = f.text(v, path, hi=64)
    if len(text) != 64 or any(c not in HEX for c in text):
        f.fail(path, "a sha256 digest (64 hex digits)", v)
    return text


@dataclass(frozen=True)
class Calibration:
    """The largest magnitude each quantised tensor took over the calibration samples."""

    amax: Mapping[str, float]
    samples: int  # how many runs of the model the amaxes are over
    data: str  # sha256 of the samples (`arrays_digest`)
    weights: str  # sha256 of the weights they ran with (`weights_digest`)

    def to_data(self) -> dict[str, Any]:
        return {"amax": dict(self.amax), "samples": self.samples, "data": self.data,
                "weights": self.weights}

    @staticmethod
    def from_data(d: Any, graph: Graph, path: str = "calibration") -> Calibration:
        d = f.mapping(d, path, ("amax", "samples", "data", "weights"), ())
        wanted = quantised(graph)
        amax: dict[str, float] = {}
        for name, value in f.mapping(d["amax"], f"{path}.amax").items():
            at = f"{path}.amax.{str(name)[:60]}"
            if name not in wanted:
                f.wrong(at, "not a tensor the graph quantises")
            number = f.number(value, at)
            if not 0 <= number < float("inf"):
                f.fail(at, "a finite amax, at least 0", value)
            amax[name] = number
        missing = [t for t in wanted if t not in amax]
        if missing:
            f.wrong(f"{path}.amax", f"no amax for `{missing[0][:60]}`, which the graph quantises")
        return Calibration(amax, f.integer(d["samples"], f"{path}.samples", 1, 2**40),
                           _digest_field(d["data"], f"{path}.data"),
                           _digest_field(d["weights"], f"{path}.weights"))


def quantised(graph: Graph) -> list[str]:
    """The tensors whose amax a calibration must hold (one per `amax` node)."""
    return [str(n.attrs["tensor"]) for n in graph.nodes if n.op == CALIBRATED]


def quantised_dtypes(graph: Graph) -> dict[str, set[str]]:
    """The fp8 dtypes each tensor is quantised to: the casts lowering makes of it,
    `cast(x * scale)` or, for e4m3, `cast(min(max(x * scale, -448), 448))`
    (`lower.quantize._cast`), traced through the graph to the `x` the multiply reads."""
    nodes = graph.by_name()
    out: dict[str, set[str]] = {}
    for node in graph.nodes:
        if node.op == "cast" and node.inputs and node.attrs.get("dtype") in FP8:
            value = nodes[node.inputs[0]]
            while value.op in ("max", "min"):
                value = nodes[value.inputs[0]]
            if value.op == "mul":
                out.setdefault(value.inputs[0], set()).add(str(node.attrs["dtype"]))
    return out


def arrays_digest(arrays: Mapping[str, np.ndarray]) -> str:
    """sha256 over the arrays by name: each name, dtype, shape and bytes (not how they were
    stored), so the same samples give the same digest whatever file held them."""
    h = hashlib.sha256()
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        h.update(f"{name}\0{a.dtype.str}\0{list(a.shape)}\0".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def weights_digest(tensors: Mapping[str, np.ndarray], paths: list[str]) -> str:
    """sha256 over the model's params (`paths`, in the manifest's order), as `arrays_digest`."""
    return arrays_digest({p: tensors[p] for p in paths})
