"""Small grid-stride kernels of independent steps as one launch. A decoder step at batch 1 runs
a handful of kernels of a few thousand elements each between its projections (rotary embeddings
of q and k in halves, the cache writes): each costs a launch and a wait on the one before
(~1.5-2 us on the H200) for well under a microsecond of work. Steps that neither read what the
others write nor write what they read (`runtime.batches` decides which) run as the parts of one
kernel: each part's loop over its elements is a device function, its blocks a range of the
grid, the arguments of every part passed together.

A part's body loops `i` from `BLOCK * blockDim.x + threadIdx.x` by `BLOCKS * blockDim.x`:
alone, BLOCK is blockIdx.x and BLOCKS gridDim.x (`source` of one part); merged, the block's
index within its part's range and the range's length. Every part waits for the kernels ahead
before it reads (the launch is early: `backend.launch`)."""

from __future__ import annotations

import re
import zlib
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np

from dslc.backend import launch

THREADS = 256  # a block's threads, every part alike
MOST_ARGUMENT_BYTES = 4096  # a kernel's parameters (every GPU since sm_20 takes this many)


@dataclass(frozen=True)
class Kernel:
    """What a part computes, apart from its arguments: a key naming its source (equal keys, equal
    sources), its parameters as C declarations, its loop, and the source it needs before it (the
    conversions of `backend.fused`, a typedef)."""

    key: Hashable
    params: tuple[str, ...]
    body: str
    needs: str = ""


@dataclass(frozen=True)
class Part:
    """One step's kernel with its arguments (in the order of `kernel.params`) and its blocks."""

    kernel: Kernel
    args: tuple[Any, ...]
    blocks: int


def source(kernels: Sequence[Kernel], name: str) -> str:
    """One kernel computing each of `kernels` over its range of blocks: part k's blocks end at
    argument `e{k}` (a running sum: one compiled kernel serves every size)."""
    needs = list(dict.fromkeys(k.needs for k in kernels if k.needs))
    functions = [f"__device__ __forceinline__ void part{k}({', '.join(kern.params)}, "
                 f"const long long BLOCK, const long long BLOCKS) {{\n{kern.body}\n}}\n"
                 for k, kern in enumerate(kernels)]
    params: list[str] = []
    calls: list[str] = []
    for k, kern in enumerate(kernels):
        names = [_name(p) for p in kern.params]
        params += [_renamed(p, f"a{k}_{n}") for p, n in zip(kern.params, names, strict=True)]
        start = f"e{k - 1}" if k else "0"
        forward = ", ".join(f"a{k}_{n}" for n in names)
        calls.append(f"if (b < e{k}) {{ part{k}({forward}, b - {start}, e{k} - {start}); return; }}")
    params += [f"const long long e{k}" for k in range(len(kernels))]
    nl = "\n"
    return (f"{nl.join(needs)}\n{launch.DEVICE}{''.join(functions)}"
            f'extern "C" __global__ void {name}({", ".join(params)}) {{\n'
            "let_next_start();\nwait_for_previous();\n"
            "const long long b = blockIdx.x;\n"
            f"{nl.join(calls)}\n}}\n")


def argument_bytes(parts: Sequence[Part]) -> int:
    """The bytes the merged kernel's parameters take (every one 8: a pointer or a long long)."""
    return 8 * sum(len(p.args) + 1 for p in parts)


def run(parts: Sequence[Part]) -> None:
    """The parts as one kernel launched early on the current stream (`launches`)."""
    for batch in launches(parts):
        _launch(batch)


def launches(parts: Sequence[Part]) -> list[list[Part]]:
    """The parts in launches, in order: as many together as their arguments fit one launch."""
    out: list[list[Part]] = []
    for part in parts:
        if not out or argument_bytes([*out[-1], part]) > MOST_ARGUMENT_BYTES:
            out.append([])
        out[-1].append(part)
    return out


def _launch(parts: Sequence[Part]) -> None:
    kernel = _compiled(tuple(p.kernel for p in parts))
    ends = np.cumsum([p.blocks for p in parts]).tolist()
    args = [a for p in parts for a in p.args] + [np.int64(e) for e in ends]
    launch.early(kernel, (int(ends[-1]),), (THREADS,), args)


@cache
def _compiled(kernels: tuple[Kernel, ...]) -> Any:
    import cupy

    from dslc.backend.cuda import PREAMBLE

    text = source(kernels, "dslc_merged")
    name = f"dslc_merged_{zlib.crc32(text.encode()):08x}"
    return cupy.RawKernel(PREAMBLE + text.replace("dslc_merged(", f"{name}(", 1), name)


def _name(param: str) -> str:
    match = re.search(r"(\w+)\s*$", param)
    assert match is not None, param
    return match.group(1)


def _renamed(param: str, name: str) -> str:
    return re.sub(r"\w+\s*$", name, param)
