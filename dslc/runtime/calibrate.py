"""Calibration: representative inputs run through the reference executor to find each quantised
tensor's amax, the largest magnitude it takes (what its fp8 scale is made from).

Each run scales every quantised tensor by its own amax in that run (a calibration run of the
interpreter: `interp.run(observe=...)`), so a tensor computed downstream of fp8 ops sees the
values those ops give; the amax kept is the largest over the runs. The samples are one array per
model input, named after it: an input of its declared rank is one run, one of a rank more is
several runs stacked along its first axis.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np

from dslc.core.errors import RunnerError
from dslc.ir import interp
from dslc.runtime.calibration import Calibration, arrays_digest, quantised, weights_digest
from dslc.runtime.inputs import bind_inputs
from dslc.runtime.manifest import Manifest
from dslc.runtime.records import Bundle
from dslc.runtime.schedule import Schedule


def runs(manifest: Manifest, arrays: Mapping[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
    """The model runs the samples make (R0201 for a missing or unknown input, R0301 for a
    shape no input takes or runs of unequal counts; each run's inputs checked as a caller's)."""
    declared = {i.name: i for i in manifest.inputs}
    unknown = sorted(set(arrays) - set(declared))
    if unknown:
        raise RunnerError("R0201", f"the samples hold `{unknown[0]}`, which is no input of "
                          f"`{manifest.model}` (its inputs: {', '.join(sorted(declared))})")
    missing = [name for name in declared if name not in arrays]
    if missing:
        raise RunnerError("R0201", f"the samples lack the input `{missing[0]}`",
                          declared[missing[0]].span.to_data())
    counts = {}
    for name, spec in declared.items():
        a = arrays[name]
        rank = len(spec.shape)
        if a.ndim not in (rank, rank + 1):
            raise RunnerError("R0301", f"the samples of `{name}` have rank {a.ndim}: the input "
                              f"has rank {rank} (one run), or {rank + 1} for runs stacked along "
                              "a first axis", spec.span.to_data())
        counts[name] = a.shape[0] if a.ndim == rank + 1 else 0
    stacked = {n for n, c in counts.items() if c}
    if stacked and (len({counts[n] for n in stacked}) != 1 or len(stacked) != len(counts)):
        shown = ", ".join(f"`{n}`: {counts[n] or 'one run'}" for n in counts)
        raise RunnerError("R0301", f"the samples of the inputs make different numbers of runs "
                          f"({shown})")
    count = max(counts.values(), default=0) or 1
    out = []
    for i in range(count):
        run = {n: (arrays[n][i] if n in stacked else arrays[n]) for n in declared}
        bind_inputs(manifest, {k: (tuple(v.shape), _dtype(v)) for k, v in run.items()})
        out.append(run)
    return out


def _dtype(a: np.ndarray) -> str:
    return next((name for name, dt in interp.NUMPY_DTYPES.items() if a.dtype == np.dtype(dt)),
                str(a.dtype))


def calibrate(program: Schedule, tensors: Mapping[str, np.ndarray],
              arrays: Mapping[str, np.ndarray]) -> Calibration:
    """Each quantised tensor's amax over the runs the samples make, with the digests of the
    samples and of the weights."""
    bundle = program.bundle
    wanted = quantised(program.graph)
    virtual = program.virtual()
    seen: dict[str, float] = {}
    samples = runs(bundle.manifest, arrays)
    for run in samples:
        interp.run(program.graph, run, tensors, program.env, virtual=virtual, observe=seen)
    params = [p.name for p in bundle.manifest.params]
    return Calibration({t: seen.get(t, 0.0) for t in wanted}, len(samples),
                       arrays_digest(arrays), weights_digest(tensors, params))


def calibrated(bundle: Bundle, calibration: Calibration) -> Bundle:
    """The bundle with this calibration (validated against its graph)."""
    checked = Calibration.from_data(calibration.to_data(), bundle.graph.graph)
    return dataclasses.replace(bundle, calibration=checked)
