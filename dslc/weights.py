"""Weights: safetensors in and out, matched against a model's parameter manifest.

A mismatch (missing, unexpected, wrong shape, wrong dtype) is an R0202 diagnostic naming the
parameter path and pointing at the `param` declaration; NaN or infinite values are a W0202 warning
per weight (an error with `--deny-warnings`: -inf is legitimate in an attention mask, NaN almost
never is). With `convert`, float weights of another float dtype are converted to the manifest's
dtypes (PyTorch checkpoints, or a model run at another precision). `random_weights` makes test weights
with sensible scales (fan-in for kernels, positive variances for batchnorm).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file

from dslc import fsutil
from dslc.check.context import ParamSpec
from dslc.diag.diagnostic import Diagnostic, Sink
from dslc.diag.span import NO_SPAN
from dslc.ir.interp import NUMPY_DTYPES
from dslc.runtime.params import nonfinite, nonfinite_phrase

IGNORED_SUFFIXES = ("num_batches_tracked",)  # PyTorch bookkeeping buffers, not weights


class WeightError(Exception):
    """The weight file could not be read (a usage error, not a model mismatch)."""


def load(path: Path) -> dict[str, np.ndarray]:
    try:
        return dict(load_file(str(path)))
    except Exception as err:  # OSError, or safetensors' own error type for a malformed file
        raise WeightError(f"cannot read weights `{path}`: {err}") from err


def save(path: Path, tensors: Mapping[str, np.ndarray], metadata: dict[str, str] | None = None,
         ) -> None:
    """Write atomically: a failed or interrupted write leaves the previous file intact."""
    fsutil.atomic_write(path, writer(tensors, metadata))


def writer(tensors: Mapping[str, np.ndarray], metadata: dict[str, str] | None = None,
           ) -> Callable[[str], None]:
    """What writes `tensors` as a safetensors file at a given (temporary) path."""
    arrays = {k: np.ascontiguousarray(v) for k, v in tensors.items()}
    # Metadata is UTF-8 text: a value naming a file whose name is not UTF-8 keeps its bytes as
    # escapes instead of ending the write (found by the hostile-path corpus).
    text = None if metadata is None else {
        k: v.encode("utf-8", "backslashreplace").decode("utf-8") for k, v in metadata.items()}
    return lambda tmp: save_file(arrays, tmp, text)


def dtype_name(a: np.ndarray) -> str:
    for name, dt in NUMPY_DTYPES.items():
        if a.dtype == np.dtype(dt):
            return name
    return str(a.dtype)


def validate(tensors: Mapping[str, np.ndarray], params: tuple[ParamSpec, ...], sink: Sink,
             source: str, convert: bool = False, finite: bool = True) -> dict[str, np.ndarray]:
    """Match `tensors` to the manifest; report every mismatch. With `convert`, float tensors of
    another float dtype are converted (PyTorch checkpoints are f32). With `finite`, NaN and
    infinite values are reported (W0202)."""
    out: dict[str, np.ndarray] = {}
    wanted = {p.path: p for p in params}
    for p in params:
        if p.path not in tensors:
            sink.report(Diagnostic("R0202", f"weight `{p.path}` is missing from {source}", p.span,
                                   "declared here", notes=(f"expected {p.dtype}{list(p.shape)}",)))
            continue
        a = tensors[p.path]
        if tuple(a.shape) != p.shape:
            sink.report(Diagnostic(
                "R0202", f"weight `{p.path}` has shape {list(a.shape)} in {source}, but the "
                f"model declares {list(p.shape)}", p.span, "declared here"))
            continue
        have = dtype_name(a)
        if have != p.dtype:
            floats = np.issubdtype(a.dtype, np.floating) or have in ("bf16", "f8e4m3", "f8e5m2")
            if not (convert and floats):
                sink.report(Diagnostic(
                    "R0202", f"weight `{p.path}` is {have} in {source}, but the model declares "
                    f"{p.dtype}", p.span, "declared here",
                    help=("convert the file with `dslc weights from-torch` (it casts floats to "
                          "the declared dtypes)",)))
                continue
            a = a.astype(NUMPY_DTYPES[p.dtype])
        out[p.path] = a
    extra = [n for n in tensors if n not in wanted and not n.endswith(IGNORED_SUFFIXES)]
    if extra:
        # A warning: a checkpoint of a larger model (a classifier head, a pooler) is fine; a
        # file whose names are wrong also misses what the model declares, and that is R0202.
        shown = ", ".join(f"`{n}`" for n in extra[:3]) + \
            (f" and {len(extra) - 3} more" if len(extra) > 3 else "")
        sink.report(Diagnostic(
            "W0203", f"{source} holds {len(extra)} weight{'s' if len(extra) > 1 else ''} the "
            f"model does not declare: {shown}", params[0].span if params else NO_SPAN,
            "the model's parameters start here", help=(_extra_help(extra, wanted),)))
    if finite:
        report_nonfinite(out, params, sink, source)
    return out


def _extra_help(extra: list[str], wanted: Mapping[str, ParamSpec]) -> str:
    """A prefix the model's names are under (`net.w1` holds `w1`), else a name like the first."""
    for name in extra:
        for path in wanted:
            if name.endswith("." + path):
                prefix = name[:-len(path)]
                return (f"the model's weights look to be under `{prefix}`: read them with "
                        f"`dslc weights from-torch --prefix {prefix}`")
    close = [p for p in wanted if p.rsplit(".", 1)[-1] == extra[0].rsplit(".", 1)[-1]][:1]
    return (f"parameter names are instance paths, e.g. `{close[0]}`" if close else
            "`dslc weights from-torch --prefix P` reads the weights under a prefix")


def report_nonfinite(tensors: Mapping[str, np.ndarray], params: tuple[ParamSpec, ...], sink: Sink,
                     source: str) -> None:
    """A W0202 warning for each weight holding NaN or infinite values, with how many."""
    for p in params:
        if p.path not in tensors:
            continue
        a = tensors[p.path]
        nan, inf = nonfinite(a)
        if nan or inf:
            sink.report(Diagnostic(
                "W0202", f"weight `{p.path}` holds {nonfinite_phrase(nan, inf)} of {a.size:,} in "
                f"{source}", p.span, "declared here",
                help=("the outputs that depend on it may be NaN or infinite too; if the values "
                      "are meant (a -inf mask), silence this with `--allow W0202`",)))


def random_weights(params: tuple[ParamSpec, ...], seed: int = 0) -> dict[str, np.ndarray]:
    """Weights with realistic scales, so deep models stay finite in f16."""
    rng = np.random.default_rng(seed)
    out = {}
    for p in params:
        leaf = p.path.rsplit(".", 1)[-1]
        shape = p.shape
        if leaf == "running_var":
            a = rng.uniform(0.5, 1.5, shape)
        elif leaf == "running_mean":
            a = rng.normal(0.0, 0.1, shape)
        elif len(shape) >= 2:
            fan_in = math.prod(shape[1:])
            a = rng.normal(0.0, 1.0 / math.sqrt(fan_in), shape)
        elif leaf == "weight":  # norm scales
            a = rng.uniform(0.8, 1.2, shape)
        else:  # biases and shifts
            a = rng.normal(0.0, 0.05, shape)
        out[p.path] = a.astype(NUMPY_DTYPES[p.dtype])
    return out


def from_torch(path: Path, prefix: str = "") -> dict[str, np.ndarray]:
    """A PyTorch checkpoint's state_dict as numpy arrays (nested under "state_dict" or "model"
    is accepted); with `prefix`, only the keys under it, the prefix taken off (`bert.` of a
    Hugging Face `BertForSequenceClassification`). Needs torch."""
    try:
        import torch
    except ImportError as err:
        raise WeightError("reading a PyTorch checkpoint needs torch (`pip install torch`)") from err
    try:
        state = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as err:
        raise WeightError(f"cannot read the PyTorch checkpoint `{path}`: {err}") from err
    for key in ("state_dict", "model"):
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
    if not isinstance(state, dict):
        raise WeightError(f"`{path}` holds no state_dict")
    out = {}
    for key, t in state.items():
        if not hasattr(t, "detach") or not str(key).startswith(prefix):
            continue
        name = str(key)[len(prefix):]
        t = t.detach().cpu()
        if t.dtype == torch.bfloat16:
            out[name] = t.float().numpy().astype(NUMPY_DTYPES["bf16"])
        else:
            out[name] = t.numpy()
    return out
