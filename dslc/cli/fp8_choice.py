"""`dslc compile --fp8 auto`: the fp8 requests kept where they make the model faster on this GPU,
within the error budget on the samples (`dslc.pipeline.choose_fp8`, `dslc.tune.precision`), and
the bundle built with them calibrated and saying what was measured."""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path

import numpy as np

from dslc import fsutil
from dslc.backend.target import Target
from dslc.cli import paths
from dslc.cli.calibrate import read_samples
from dslc.cli.front import options
from dslc.cli.paths import UsageError
from dslc.lower.quantize import requested
from dslc.pipeline import FrontEnd, choose_fp8, with_fp8
from dslc.runtime import bundle as bundle_file
from dslc.runtime.bundle import load
from dslc.runtime.calibrate import calibrate, calibrated
from dslc.runtime.schedule import Schedule
from dslc.tune.precision import Decision


def usage(args: argparse.Namespace, target: Target) -> None:
    """`--fp8 auto` measures on this GPU, with weights and samples: said before any work."""
    if args.fp8 != "auto":
        if args.data is not None:
            raise UsageError("`--data` goes with `--fp8 auto` (to calibrate a bundle: `dslc "
                             "calibrate BUNDLE --weights W --data SAMPLES.npz`)")
        return
    if not 0 <= args.max_error < float("inf"):  # NaN too
        raise UsageError(f"`--max-error` is a relative error, a number of 0 or more, not "
                         f"`{args.max_error}`")
    if not target.live:
        raise UsageError(f"`--fp8 auto` times each fp8 op on this GPU, and the target is "
                         f"`{target.name}`: compile with `--target device` on a GPU machine")
    for option, value in (("--weights", args.weights), ("--data", args.data)):
        if value is None:
            raise UsageError(f"`--fp8 auto` needs `{option}`: the model is calibrated and its "
                             "error measured on the samples, with the weights")


def choose(result: FrontEnd, args: argparse.Namespace, target: Target,
           tensors: Mapping[str, np.ndarray], buckets: list[dict[str, int]] | None,
           progress: Callable[[str], None]) -> tuple[FrontEnd, Decision]:
    """The model with the fp8 requests measured to pay here, and what was measured."""
    assert result.model is not None
    if not requested(result.model.graph):
        raise UsageError(f"`{args.file}` asks for no fp8: `--fp8 auto` has nothing to "
                         "choose from (ask for it in the model: `precision matmul=f8e4m3`)")
    samples = read_samples(args.data)
    with tempfile.TemporaryDirectory(prefix="dslc-fp8-") as tmp:
        decision = choose_fp8(result, options(args), target, tensors, samples, args.max_error,
                              Path(tmp), buckets, progress)
    return with_fp8(result, decision.chosen), decision


def record(path: Path, decision: Decision, tensors: Mapping[str, np.ndarray],
           samples: Mapping[str, np.ndarray]) -> None:
    """The bundle `--fp8 auto` built: calibrated on the samples where it computes in fp8, and
    each step that runs an op asking for fp8 saying what was measured (`dslc inspect`)."""
    bundle = load(path)
    if decision.chosen:
        bundle = calibrated(bundle, calibrate(Schedule(bundle), tensors, samples))
    measured = decision.measured  # every op of every kind, not only the one named for it
    steps = tuple(replace(s, reason="; ".join(filter(None, [s.reason, *(
        decision.reason(op) for op in s.nodes if op in measured)])))
        for s in bundle.steps)
    with paths.writing(path):
        fsutil.write_bytes(path, bundle_file.pack(replace(bundle, steps=steps)))
