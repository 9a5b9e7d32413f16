"""What the tuner times (`backend.timing.gpu_ms`) is the GPU's work, not Python's: a kernel of
a few microseconds launched by a call that spends 3 ms on the host times as the kernel alone;
a large copy times as it does in a batch of launches back to back (each run's own time)."""

from __future__ import annotations

import statistics
import time

import pytest

pytestmark = pytest.mark.gpu


def test_the_hosts_time_before_a_launch_is_not_counted() -> None:
    import cupy

    from dslc.backend.timing import gpu_ms

    x = cupy.zeros(1024, dtype=cupy.float32)

    def slow_to_launch() -> None:
        time.sleep(0.003)
        x.__iadd__(1.0)

    ms = statistics.median(gpu_ms(cupy, slow_to_launch, lambda: None, 15))
    assert ms < 0.3, ms  # the sleep is 3 ms; the kernel a few microseconds


def test_a_large_copy_times_as_in_a_batch_of_launches() -> None:
    import cupy

    from dslc.backend.timing import gpu_ms

    a = cupy.ones(64 << 20, dtype=cupy.float32)  # 256 MB
    b = cupy.empty_like(a)
    ms = statistics.median(gpu_ms(cupy, lambda: b.__setitem__(Ellipsis, a), lambda: None, 15))
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    b[...] = a
    start.record()
    for _ in range(20):
        b[...] = a
    end.record()
    end.synchronize()
    batch = cupy.cuda.get_elapsed_time(start, end) / 20
    assert 0.8 * batch < ms < 1.25 * batch, (ms, batch)
