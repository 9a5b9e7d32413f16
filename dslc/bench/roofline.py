"""The roofline of a schedule: per step, the time its FLOPs and bytes (`dslc.ir.cost`) need at
the GPU's peak rates, against the time it took; sorted by the time lost to that bound.

A step with a tensor-core op (conv, matmul, sdpa) is held to the tensor cores' rate for its
operands' dtype, any other to the vector units' f32 rate; every step to the memory bandwidth.
Its bound is the larger of the two times (compute- or memory-bound).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from dslc.ir.cost import Cost


@dataclass(frozen=True)
class Peaks:
    device: str
    tensor_tflops: Mapping[str, float]  # by operand dtype
    vector_tflops: float
    memory_gbps: float

    @staticmethod
    def from_data(device: str, data: Mapping[str, Any]) -> Peaks:
        return Peaks(device, {str(k): float(v) for k, v in data["tensor_tflops"].items()},
                     float(data["vector_tflops"]), float(data["memory_gbps"]))

    def tflops(self, tensor_dtype: str | None) -> float:
        if tensor_dtype is None:
            return self.vector_tflops
        return self.tensor_tflops.get(tensor_dtype, self.vector_tflops)


@dataclass(frozen=True)
class StepLine:
    step: str
    kind: str  # graph | kernel
    ms: float  # measured
    flops: int
    bytes: int
    tflops: float  # achieved
    gbps: float  # achieved
    bound_ms: float  # at the peaks
    bound_by: str  # compute | memory
    fraction: float  # bound_ms / ms: the share of the peak reached
    lost_ms: float  # ms - bound_ms

    def to_data(self) -> dict[str, Any]:
        return asdict(self)


def step_line(step: str, kind: str, ms: float, cost: Cost, peaks: Peaks) -> StepLine:
    compute_ms = cost.flops / (peaks.tflops(cost.tensor_dtype) * 1e9)  # TFLOP/s = 1e9 FLOP/ms
    memory_ms = cost.bytes / (peaks.memory_gbps * 1e6)  # GB/s = 1e6 B/ms
    bound = max(compute_ms, memory_ms)
    seconds = ms / 1e3
    return StepLine(step, kind, ms, cost.flops, cost.bytes,
                    cost.flops / seconds / 1e12 if ms > 0 else 0.0,
                    cost.bytes / seconds / 1e9 if ms > 0 else 0.0,
                    bound, "compute" if compute_ms >= memory_ms else "memory",
                    bound / ms if ms > 0 else 0.0, ms - bound)


def by_time_lost(lines: Iterable[StepLine]) -> list[StepLine]:
    """Most time lost first; ties in schedule order."""
    return sorted(lines, key=lambda line: -line.lost_ms)


@dataclass(frozen=True)
class Totals:
    ms: float
    bound_ms: float
    flops: int
    bytes: int

    @property
    def fraction(self) -> float:
        return self.bound_ms / self.ms if self.ms > 0 else 0.0

    def to_data(self) -> dict[str, Any]:
        return {**asdict(self), "fraction": self.fraction}


def totals(lines: Iterable[StepLine]) -> Totals:
    items = list(lines)
    return Totals(sum(x.ms for x in items), sum(x.bound_ms for x in items),
                  sum(x.flops for x in items), sum(x.bytes for x in items))
