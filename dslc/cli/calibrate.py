"""`dslc calibrate BUNDLE --weights W --data SAMPLES.npz`: each tensor the bundle quantises to
fp8 run over representative inputs on the reference executor, its amax recorded in the bundle
(written back atomically, or to `-o`), with the digests of the samples and the weights."""

from __future__ import annotations

import argparse
import json
import sys
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from dslc import fsutil
from dslc.cli import paths
from dslc.cli.front import EXIT_OK, add_diag_options, command
from dslc.cli.paths import UsageError
from dslc.cli.weights import bundle_weights
from dslc.core.types import FP8_MAX
from dslc.runtime import bundle as bundlefile
from dslc.runtime.calibrate import calibrate, calibrated
from dslc.runtime.calibration import Calibration, quantised, quantised_dtypes
from dslc.runtime.schedule import Schedule, check_buckets


def read_samples(path: Path) -> dict[str, np.ndarray]:
    """The arrays of an `.npz` file (no pickled objects), by name."""
    try:
        with np.load(path, allow_pickle=False) as data:
            if not isinstance(data, np.lib.npyio.NpzFile):
                raise ValueError("not an .npz archive of arrays")
            return {name: data[name] for name in data.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:
        raise UsageError(f"cannot read the samples `{path}`: {err or 'the file is empty'} "
                         "(give an .npz file: one array per model input, named after it)") from err


def cmd_calibrate(args: argparse.Namespace) -> int:
    target = args.output or args.bundle  # in place unless told otherwise
    paths.output_file(target, [args.weights, args.data],
                      option="-o" if args.output else "")
    program = Schedule(bundlefile.load(paths.bundle_file(args.bundle)))
    bundle = program.bundle
    if not quantised(program.graph):
        raise UsageError(f"`{args.bundle}` computes nothing in fp8: there is nothing to "
                         "calibrate (ask for it in the model: `precision matmul=f8e4m3`)")
    found = calibrate(program, bundle_weights(args, bundle.manifest), read_samples(args.data))
    record = calibrated(bundle, found)
    check_buckets(Schedule(record))
    with paths.writing(target):
        fsutil.write_bytes(target, bundlefile.pack(record))
    report = calibration_report(found, program)
    if args.format == "json":
        print(json.dumps({**report, "written": str(target)}, indent=2))
    else:
        print(_text(report))
    print(f"wrote {target}", file=sys.stderr)
    return EXIT_OK


def calibration_report(c: Calibration, program: Schedule) -> dict[str, Any]:
    """Each quantised tensor's amax and the scale its values are multiplied by (per fp8 dtype
    it is quantised to), the samples, the digests."""
    dtypes = quantised_dtypes(program.graph)
    tensors = []
    for name, amax in c.amax.items():
        kinds = sorted(dtypes.get(name, ()))
        scales = {d: FP8_MAX[d] / max(amax, 2.0 ** -24) for d in kinds}
        tensors.append({"tensor": name, "amax": amax, "scales": scales})
    return {"model": program.bundle.model, "samples": c.samples, "data": c.data,
            "weights": c.weights, "tensors": tensors}


def _text(r: dict[str, Any]) -> str:
    lines = [f"calibrated {r['model']} on {r['samples']} run{'s' if r['samples'] != 1 else ''} "
             f"(samples {r['data'][:12]}, weights {r['weights'][:12]}):",
             f"  {'tensor':<40} {'amax':>12}  scale"]
    for t in r["tensors"]:
        scales = ", ".join(f"{s:.6g} ({d})" for d, s in t["scales"].items()) or "-"
        lines.append(f"  {t['tensor'][:40]:<40} {t['amax']:>12.6g}  {scales}")
    return "\n".join(lines)


def add_commands(sub: Any) -> None:
    p = command(sub, "calibrate", "record the fp8 scales of a bundle from representative inputs")
    p.add_argument("bundle", type=Path, metavar="BUNDLE", help="a bundle made by `dslc compile`")
    p.add_argument("--weights", type=Path, metavar="W.safetensors",
                   help="the model's weights (the scales are those of these weights)")
    p.add_argument("--data", type=Path, required=True, metavar="SAMPLES.npz",
                   help="one array per model input, named after it: one run's input, or runs "
                        "stacked along a first axis")
    p.add_argument("-o", "--output", type=Path, metavar="BUNDLE",
                   help="write the calibrated bundle here (default: in place)")
    p.add_argument("--format", choices=("text", "json"), default="text",
                   help="the amaxes as a table (default), or as one JSON document")
    add_diag_options(p)
    p.set_defaults(run=cmd_calibrate)
