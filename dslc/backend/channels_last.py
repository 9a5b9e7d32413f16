"""A pointwise group in the one memory form cuDNN's pointwise engine takes: channels-last.

Measured on the H200 (cuDNN 9.19, `scripts/probe_gpu.py` part `matrix`): a graph of pointwise
ops alone (`x * b` over [8, 64, 16, 16], f16 and f32) gets an engine only where every tensor is
packed with axis 1 innermost (NHWC strides), and each operand is full-size, per-channel
[1, C, 1, 1], per-pixel [N, 1, H, W] or one element; every row-major form, every other
broadcast ([N, C, 1, 1], [1, 1, H, W], [1, C, H, W], [N, 1, 1, 1], [1, 1, 1, W]) and every
stride-0 form got "No valid engine configs", and each form that got one computed right.

Pointwise ops do not care which axis is which, so a group whose tensors share one memory order
is put in that form by naming axes anew: the result's axes in memory order, runs of them that
every tensor keeps or broadcasts alike merged into one, the innermost run named axis 1. A
row-major [8, 197, 768] plus position embeddings [1, 197, 768] becomes [8, 151296, 1, 1] plus
[1, 151296, 1, 1], a per-channel operand cuDNN takes. The same addresses, other names; where no
such form exists the group keeps its form (cuDNN declines it, a fallback kernel runs it).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace

from dslc.backend.spec import GroupSpec, TensorSpec
from dslc.ops import OPS

RANK = 4  # the rank measured; other ranks keep their form
# The longest axis 1 a renamed group gets, the longest measured: 151,296 ran (ViT's position
# embeddings, 197 x 768). A Llama layer at S = 1024 failed to launch a renamed graph on the
# H200 (CUDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER); its one renamed group was an outer product,
# positions [1024, 1] times frequencies [1, 64] (no operand full-size, unlike every form
# measured), so such groups keep their form since; full-size groups keep their axes rather than
# merge into one long axis 1, and a longer axis 1 keeps the group's form. That layer at that
# size has not run on the H200 since.
MAX_CHANNELS = 197 * 768


def _dense_in(t: TensorSpec, order: list[int]) -> bool:
    """`t` is packed, innermost last of `order` (its size-1 axes aside)."""
    step = 1
    for axis in reversed(order):
        if t.dims[axis] > 1:
            if t.strides[axis] != step:
                return False
            step *= t.dims[axis]
    return True


def packed_strides(dims: Sequence[int], memory: Sequence[int]) -> tuple[int, ...]:
    """Packed strides of `dims`, its axes laid out outermost first as `memory` lists them."""
    strides = [0] * len(dims)
    step = 1
    for axis in reversed(memory):
        strides[axis] = step
        step *= dims[axis]
    return tuple(strides)


def _held(t: TensorSpec) -> set[int]:
    return {i for i, d in enumerate(t.dims) if d > 1}


def _taken_as_it_is(result: TensorSpec, tensors: list[TensorSpec]) -> bool:
    """Already channels-last with more than one channel, each operand full, per-channel,
    per-pixel or one element: left as it is (the forms measured right on the H200 are not
    renamed)."""
    full = _held(result)
    # a row-major [8, 1, 1, 128] is packed channels-last with one channel: cuDNN declined it
    return 1 in full and all(_dense_in(t, [0, *range(2, RANK), 1]) for t in tensors) and all(
        _held(t) in (full, {1}, full - {1}, set()) for t in tensors if t.role == "input")


def _applies(spec: GroupSpec) -> bool:
    """A group of pointwise ops alone, in the rank measured."""
    return bool(spec.ops) and all(OPS[op.op].family == "pointwise" for op in spec.ops) and \
        all(len(t.dims) == RANK for t in spec.tensors if t.role != "scalar")


def channels_last_form(spec: GroupSpec) -> GroupSpec:
    """`spec` with its axes named as cuDNN's pointwise engine takes them, or `spec` itself."""
    return _form(spec) or spec


def _form(spec: GroupSpec) -> GroupSpec | None:
    """The form cuDNN's pointwise engine takes (`spec` itself where it is one already, or any
    group it does not apply to), or None."""
    if not _applies(spec):
        return spec
    result = spec.tensor(spec.ops[-1].node)
    tensors = [t for t in spec.tensors if t.role != "scalar"]
    big = sorted((i for i, d in enumerate(result.dims) if d > 1), key=lambda i: -result.strides[i])
    if not big or any(t.dims[i] not in (1, result.dims[i]) for t in tensors for i in range(RANK)) \
            or any(not _dense_in(t, big) for t in tensors):
        return None

    if _taken_as_it_is(result, tensors):
        return spec
    if not any(t.role == "input" and t.dims == result.dims for t in tensors):
        return None  # an outer product: every form measured had a full-size operand

    def kept(axis: int) -> tuple[bool, ...]:
        return tuple(t.dims[axis] > 1 for t in tensors)

    runs: list[list[int]] = []
    for axis in big:
        if runs and kept(runs[-1][-1]) == kept(axis):
            runs[-1].append(axis)
        else:
            runs.append([axis])
    if len(runs) == 1:  # every operand full or one element: no axes need merging
        runs = [[axis] for axis in big]
    # named anew: the outermost run axis 0, the innermost axis 1 (a single axis: axis 1 alone),
    # the others 2 and 3 in memory order
    names = [runs[0], runs[-1], *runs[1:-1]] if len(runs) > 1 else [[], runs[0]]
    if math.prod(result.dims[a] for a in names[1]) > MAX_CHANNELS:
        return None
    named = {p for p, run in enumerate(names) if run}
    # full, per-channel, per-pixel, one element
    allowed: tuple[set[int], ...] = (named, {1}, named - {1}, set())
    memory = [0, *range(2, RANK), 1]
    out: list[TensorSpec] = []
    for t in spec.tensors:
        if t.role == "scalar":
            out.append(t)
            continue
        dims = [math.prod(t.dims[a] for a in run) for run in names]
        dims += [1] * (RANK - len(dims))
        if {p for p, d in enumerate(dims) if d > 1} not in allowed:
            return None  # a broadcast cuDNN's pointwise engine does not take
        out.append(replace(t, dims=tuple(dims), strides=packed_strides(dims, memory)))
    return replace(spec, tensors=tuple(out))


def form_holds_at_every_size(at_bucket: GroupSpec,
                             everywhere: Callable[[], GroupSpec | None]) -> bool:
    """Whether a group cuDNN's pointwise engine takes at a bucket is taken at other sizes too.
    `everywhere()`: the group's spec with every dim longer than 1 (None: no such spec). The form
    hangs on which axes are 1: a decoder's [B, S, H, D] times [B, 1, H, D] at S = 1 is
    channels-last with every operand full, and at S = 5 no form at all; a group that ran on
    cuDNN at its bucket had no engine for a prefill between buckets (on the H200). Axes that
    are 1 only merge runs of the form, and merging keeps each operand full, per-channel,
    per-pixel or one element; so a form with no axis of 1 holds at every size."""
    if not _applies(at_bucket) or _form(at_bucket) is None:
        return True  # not this engine's, or no form here either: nothing to hold
    spec = everywhere()
    return spec is not None and _form(spec) is not None
