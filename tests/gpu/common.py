"""Helpers of the GPU tests: compile for this machine's GPU, run through the runtime, and compare
with the reference executor (the bundle's own IR, in numpy)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from dslc.backend.target import Target, capture, load_target
from dslc.compile.stage import compile_model
from dslc.diag.diagnostic import Sink
from dslc.emit import bundle as emit_bundle
from dslc.fuzz import gpu as fuzz_gpu
from dslc.fuzz.gpu import to_host  # noqa: F401 (the GPU tests take it from here)
from dslc.ir import interp
from dslc.pipeline import Options, front_end, lower_and_fuse
from dslc.runtime.bundle import read
from dslc.runtime.schedule import Schedule
from dslc.weights import random_weights, save
from tests.helpers import note_seed, rng

# Largest |ours - reference| over largest |reference|, per output dtype of the model.
TOLERANCE = {"f32": 5e-3, "f16": 1.5e-2, "bf16": 3e-2, "bool": 0.0, "i32": 0.0, "i64": 0.0}


def rel_error(a: np.ndarray, b: np.ndarray) -> float:
    a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a64 - b64).max() / max(np.abs(b64).max(), 1e-30))


def compile_file(path: Path, outdir: Path, bucket: dict[str, int] | None = None,
                 deviceless: bool = False, profile: str | None = None) -> Path:
    """`deviceless`: as a CI machine compiles, from this GPU's profile without running
    anything (the plans built there are restored at start-up as they are); `profile`: from a
    shipped profile (`h200`), on any machine."""
    sink = Sink()
    result = front_end(path, Options(), sink)
    assert result.model is not None, [d.message for d in sink.diagnostics]
    lowered, plan = lower_and_fuse(result.model)
    target = load_target(profile) if profile else Target("this-gpu", capture()) if deviceless \
        else load_target("device")
    compiled = compile_model(result.model, lowered, plan, target,
                             buckets=[bucket] if bucket else None)
    outdir.mkdir(parents=True, exist_ok=True)
    bundle = outdir / f"{result.model.name}.bundle"
    emit_bundle.write(bundle, emit_bundle.payload(compiled))
    seed = note_seed(f"random_weights of {path.name}", 7)
    save(outdir / f"{result.model.name}.safetensors", random_weights(result.model.params, seed=seed))
    return bundle


def compile_source(text: str, outdir: Path, name: str = "case.cgraph",
                   deviceless: bool = False, profile: str | None = None) -> Path:
    outdir.mkdir(parents=True, exist_ok=True)
    (outdir / name).write_text(text)
    return compile_file(outdir / name, outdir, deviceless=deviceless, profile=profile)


def random_inputs(bundle: Path, dims: dict[str, int] | None = None, seed: int = 0,
                  ) -> dict[str, np.ndarray]:
    program = Schedule(read(bundle))
    values = dict(dims or program.bundle.buckets[0].dims)
    g = rng(seed)
    out = {}
    for name, node_name in program.inputs.items():
        s = program.storage(node_name, values)
        x = g.standard_normal(s.shape)
        if s.dtype in ("i32", "i64"):  # ids: every table of the GPU cases has 8 rows or more
            out[name] = g.integers(0, 8, s.shape).astype(interp.NUMPY_DTYPES[s.dtype])
        else:
            out[name] = (x > 0) if s.dtype == "bool" else x.astype(interp.NUMPY_DTYPES[s.dtype])
    return out


def to_device(arrays: dict[str, np.ndarray], bundle: Path) -> dict[str, Any]:
    """Device arrays in each input's declared dtype and layout."""
    return fuzz_gpu.to_device(arrays, Schedule(read(bundle)))


def reference(bundle: Path, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    from dslc.runtime.params import read as read_weights

    program = Schedule(read(bundle))
    weights = read_weights(bundle.with_suffix(".safetensors"), program.bundle.manifest)
    virtual = program.virtual()
    return interp.run(program.graph, inputs, weights, program.env, virtual=virtual)


def output_dtype(bundle: Path, name: str) -> str:
    program = Schedule(read(bundle))
    return str(program.nodes[program.outputs[name]].type.dtype)


def as_cupy(t: Any, dtype: str) -> Any:
    """The tensor's memory as CuPy sees it (bf16 as uint16 bits), strides kept."""
    import cupy
    import torch

    bits = t.view(torch.int16) if dtype == "bf16" else t
    a = cupy.asarray(bits)
    return a.view(cupy.uint16) if dtype == "bf16" else a
