"""The memory plan: every value a step stores gets an offset in one arena; values whose
lifetimes do not overlap share bytes. Greedy by size (largest first), lowest free offset that
overlaps no placed value in both time and space; offsets aligned to 256 bytes."""

from __future__ import annotations

from dataclasses import dataclass

ALIGN = 256


@dataclass(frozen=True)
class Buffer:
    name: str
    size: int  # bytes
    first: int  # the step that writes it
    last: int  # the last step that reads it (directly or through a view)


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def plan_memory(buffers: list[Buffer]) -> tuple[dict[str, int], int]:
    """Offsets by buffer name, and the arena's size in bytes."""
    placed: list[tuple[int, int, Buffer]] = []  # (offset, end, buffer)
    offsets: dict[str, int] = {}
    for buf in sorted(buffers, key=lambda b: (-b.size, b.first, b.name)):
        live = sorted((o, e) for o, e, other in placed
                      if not (other.last < buf.first or buf.last < other.first))
        offset = 0
        for start, end in live:
            if offset + buf.size <= start:
                break
            offset = max(offset, _align(end))
        offsets[buf.name] = offset
        placed.append((offset, offset + buf.size, buf))
    peak = max((e for _, e, _ in placed), default=0)
    return offsets, _align(peak)
