"""When plain calls replay a CUDA graph (`dslc.runtime.replay.Replays`): never at the first call
of a size (its plans are built then), from the second on, one graph per input kind and size, at
most `limit` of them, and never for a size whose recording failed, nor for torch and CuPy inputs
mixed. Recording needs a GPU, which CI has not: `Captured` is replaced here by a fake that
records nothing and counts (tests/gpu/test_runtime_gpu.py runs the real one)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest

from dslc.backend.device import ArrayRef
from dslc.runtime import replay


@dataclass
class FakeExe:
    key: str


class FakeCaptured:
    made: ClassVar[list[str]] = []
    fail: ClassVar[set[str]] = set()

    def __init__(self, model: Any, inputs: Any, bound: Any) -> None:
        exe = bound[1]
        if exe.key in self.fail:
            raise RuntimeError("the stream refused the capture")
        FakeCaptured.made.append(exe.key)
        self.key = exe.key
        self.computed = frozenset({"y"})

    def __call__(self, inputs: Any) -> dict[str, Any]:
        return {"y": FakeArray(self.key), "same": None}


class FakeArray:
    def __init__(self, key: str) -> None:
        self.key = key

    def clone(self) -> FakeArray:
        return FakeArray(f"copy of {self.key}")


class FakeModel:
    log = logging.getLogger("dslc.runtime")

    class bundle:
        model = "m"

    class program:  # no input written in place
        @staticmethod
        def written_inputs() -> frozenset[str]:
            return frozenset()

    def _output_view(self, exe: Any, name: str, outputs: Any, kind: str, refs: Any) -> Any:
        return refs["x"].obj  # the plain path's view: here the input itself


@pytest.fixture(autouse=True)
def fake_recording(monkeypatch: pytest.MonkeyPatch) -> None:
    FakeCaptured.made, FakeCaptured.fail = [], set()
    monkeypatch.setattr(replay, "Captured", FakeCaptured)


def ref(kind: str = "torch") -> dict[str, ArrayRef]:
    return {"x": ArrayRef(0, (2,), (1,), "f32", kind, "the input")}


def call(r: replay.Replays, refs: dict[str, ArrayRef], key: str, kind: str) -> Any:
    return r.call(FakeModel(), refs, FakeExe(key), kind)  # type: ignore[arg-type]


def test_the_first_call_of_a_size_runs_step_by_step_the_second_replays() -> None:
    r = replay.Replays()
    assert call(r, ref(), "N=4", "torch") is None
    assert FakeCaptured.made == []
    out = call(r, ref(), "N=4", "torch")
    assert out is not None and FakeCaptured.made == ["N=4"]
    # a computed output is a copy of the graph's static buffer; a view of an input is the input
    assert out["y"].key == "copy of N=4" and out["same"] == "the input"
    again = call(r, ref(), "N=4", "torch")
    assert again is not None and FakeCaptured.made == ["N=4"]  # recorded once


def test_each_kind_and_size_has_its_graph_and_the_oldest_goes_past_the_limit() -> None:
    r = replay.Replays(limit=2)
    for key in ("N=1", "N=2", "N=1", "N=3"):
        for _ in range(2):
            call(r, ref(), key, "torch")
    assert FakeCaptured.made == ["N=1", "N=2", "N=3"]
    assert list(r.graphs) == [("torch", "N=1"), ("torch", "N=3")]  # N=2 used longest ago
    call(r, ref("cupy"), "N=1", "cupy")
    assert call(r, ref("cupy"), "N=1", "cupy") is not None
    assert FakeCaptured.made[-1] == "N=1" and len(FakeCaptured.made) == 4


def test_a_size_that_cannot_be_recorded_runs_step_by_step_from_then_on(
        caplog: pytest.LogCaptureFixture) -> None:
    FakeCaptured.fail = {"N=4"}
    r = replay.Replays()
    with caplog.at_level(logging.INFO, logger="dslc.runtime"):
        for _ in range(4):
            assert call(r, ref(), "N=4", "torch") is None
    assert caplog.text.count("m at N=4 runs step by step: the stream refused") == 1


def test_torch_and_cupy_inputs_mixed_run_step_by_step() -> None:
    r = replay.Replays()
    mixed = {**ref("torch"), "z": ArrayRef(0, (2,), (1,), "f32", "cupy", None)}
    for _ in range(3):
        assert call(r, mixed, "N=4", "torch") is None
    assert FakeCaptured.made == []


def test_clear_forgets_the_graphs_and_the_sizes_seen() -> None:
    r = replay.Replays()
    for _ in range(2):
        call(r, ref(), "N=4", "torch")
    r.clear()
    assert call(r, ref(), "N=4", "torch") is None
    assert FakeCaptured.made == ["N=4"]


def test_the_sizes_met_once_are_bounded() -> None:
    r = replay.Replays(limit=2)
    for n in range(100):  # a caller with a new size (or new caches) at every call
        assert call(r, ref(), f"N={n}", "torch") is None
    assert len(r.seen) == 8 and ("torch", "N=99") in r.seen and FakeCaptured.made == []
