"""`model.decoder(batch=, max_len=)` (dslc.runtime.decoder) on the CPU: the caches it allocates
(zeroed, in the declared dtype and layout), the position it passes and advances, and its
refusals. A GPU runs the schedule; here the bundle's graph is run by the reference executor,
whose writes are copied into the decoder's buffers as the in-place kernel writes them, and
buffers are CPU tensors (tests/gpu/test_decode_gpu.py runs the real thing)."""

from __future__ import annotations

from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from dslc.backend import device
from dslc.backend.target import load_target
from dslc.compile.stage import compile_model
from dslc.core.errors import RunnerError
from dslc.core.types import PrecisionSpec
from dslc.diag.diagnostic import Sink
from dslc.emit import bundle as emit_bundle
from dslc.ir import interp
from dslc.pipeline import Options, front_end, lower_and_fuse
from dslc.runtime.bundle import read
from dslc.runtime.decoder import Decoder
from dslc.runtime.inputs import bind_inputs
from dslc.runtime.schedule import Schedule
from tests.conftest import ROOT
from tests.helpers import rel_error
from tests.test_llama_decode import (
    CACHES,
    DslcLoop,
    _tokens,
    random_weights,
    small_model_text,
)

NAMES = {v: k for k, v in device.TORCH_DTYPES.items()}


class ReferenceModel:
    """What a decoder calls of a `Model`, over a real bundle: `_bind` checks the inputs against
    the manifest and binds the dims as the runtime does; `_run` computes with the reference and
    writes each input written in place back into the buffer the decoder passed."""

    def __init__(self, program: Schedule, weights: dict[str, np.ndarray]) -> None:
        self.program, self.manifest, self.weights = program, program.bundle.manifest, weights
        self.passed: list[dict[str, Any]] = []

    def _bind(self, inputs: Mapping[str, Any]) -> tuple[dict[str, Any], Any, str]:
        given = {k: (tuple(v.shape), NAMES[str(v.dtype).replace("torch.", "")])
                 for k, v in inputs.items()}
        dims = bind_inputs(self.manifest, given)
        return dict(inputs), SimpleNamespace(dims=dims), "torch"

    def _run(self, refs: dict[str, Any], exe: Any, kind: str) -> dict[str, Any]:
        self.passed.append({k: v.clone() for k, v in refs.items()})
        out, written = interp.run_in_place(self.program.graph,
                                           {k: v.numpy() for k, v in refs.items()},
                                           self.weights, self.program.env)
        for name, value in written.items():
            refs[name].copy_(torch.from_numpy(value))
        return out


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> tuple[Schedule, Any]:
    """The small llama_decode in f32, compiled deviceless, read back from its bundle."""
    tmp = tmp_path_factory.mktemp("decoder")
    path = tmp / "llama_decode.cgraph"
    path.write_text(small_model_text())
    sink = Sink()
    model = front_end(path, Options(include_dirs=[ROOT / "models"], precision=PrecisionSpec()),
                      sink).model
    assert model is not None, [d.message for d in sink.diagnostics]
    lowered, plan = lower_and_fuse(model)
    c = compile_model(model, lowered, plan, load_target("h200"),
                      buckets=[{"B": 1, "S": 1, "MAX": 4096}])
    emit_bundle.write(tmp / "d.bundle", emit_bundle.records(c))
    return Schedule(read(tmp / "d.bundle")), model


@pytest.fixture(autouse=True)
def cpu_buffers(monkeypatch: pytest.MonkeyPatch) -> None:
    def empty(shape: tuple[int, ...], strides: tuple[int, ...], dtype: str,
              kind: str) -> device.ArrayRef:
        t = torch.full(shape, float("nan") if dtype == "f32" else -1,
                       dtype=getattr(torch, device.TORCH_DTYPES[dtype]))
        t = t.as_strided(shape, strides)
        return device.ArrayRef(t.data_ptr(), shape, strides, dtype, kind, t)

    monkeypatch.setattr(device, "empty", empty)


def test_caches_are_allocated_zeroed_in_the_declared_layout(compiled: tuple[Schedule, Any],
                                                             ) -> None:
    program, model = compiled
    dec = Decoder(ReferenceModel(program, random_weights(model)), batch=2, max_len=64)
    assert sorted(dec.caches) == sorted(CACHES) and dec.position_input == "position"
    for cache in dec.caches.values():
        t = cache.obj
        assert tuple(t.shape) == (2, 2, 64, 16) and t.stride() == (2048, 1024, 16, 1)
        assert t.dtype == torch.float32 and not t.any()


def test_steps_pass_the_caches_and_advance_the_position(compiled: tuple[Schedule, Any]) -> None:
    """A prompt of 5 then two tokens: positions 0, 5, 6 passed; the same buffers every step;
    the outputs those of the reference decode loop of tests/test_llama_decode.py."""
    program, model = compiled
    weights = random_weights(model)
    runner = ReferenceModel(program, weights)
    dec = Decoder(runner, batch=2, max_len=64)
    loop = DslcLoop(program.graph, model, weights)
    for i, n in enumerate([5, 1, 1]):
        x = _tokens(n, f"decoder {i}")
        got = dec.step({"hidden_states": torch.from_numpy(x)})["out"]
        assert rel_error(got, loop.step(x)) <= 1e-6
    assert [int(p["position"][0]) for p in runner.passed] == [0, 5, 6] and dec.position == 7
    for name in CACHES:
        np.testing.assert_array_equal(dec.caches[name].obj.numpy(), loop.caches[name])
    dec.reset()
    assert dec.position == 0 and not any(c.obj.any() for c in dec.caches.values())


def test_a_step_past_the_caches_is_refused_before_it_runs(compiled: tuple[Schedule, Any]) -> None:
    program, model = compiled
    runner = ReferenceModel(program, random_weights(model))
    dec = Decoder(runner, batch=1, max_len=64)
    dec.position = 62
    with pytest.raises(RunnerError, match=r"hold 64 positions.*write \[62, 65\)") as err:
        dec.step({"hidden_states": torch.zeros(1, 3, 64)})
    assert err.value.code == "R0301" and runner.passed == [] and dec.position == 62


def test_a_model_without_caches_has_no_decoder(compiled: tuple[Schedule, Any]) -> None:
    program, _ = compiled
    fake = SimpleNamespace(manifest=SimpleNamespace(written=(), model="mlp"), program=program)
    with pytest.raises(RunnerError, match="writes no cache in place") as err:
        Decoder(fake, batch=1, max_len=64)  # type: ignore[arg-type]
    assert err.value.code == "R0201"
