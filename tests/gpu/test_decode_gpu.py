"""Decoding on the GPU: `sdpa(..., kv_len=)` through cuDNN's padding mask, `cache_write`'s
kernel writing the caller's buffer in place (bf16 and f16), and models/llama_decode.cgraph at
small sizes decoded by `model.decoder` (plain calls, which replay one CUDA graph from the second
step of a size, with the caches recorded by pointer) and by a captured graph, each against the
reference executor (`interp.run_in_place`) on the same random data. Small: about 30 s."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from dslc.core.errors import RunnerError
from dslc.ir import interp
from dslc.runtime.bundle import read
from dslc.runtime.params import read as read_weights
from dslc.runtime.schedule import Schedule
from tests.conftest import ROOT
from tests.gpu.common import (
    TOLERANCE,
    compile_file,
    compile_source,
    random_inputs,
    reference,
    rel_error,
    to_device,
    to_host,
)

pytestmark = pytest.mark.gpu


def _model(bundle: Path):  # type: ignore[no-untyped-def]
    from dslc.runtime import Model

    return Model(bundle, bundle.with_suffix(".safetensors"), plan_cache=None)


@pytest.mark.parametrize("mask", ["", ", causal=true", ', causal=true, align="bottom_right"'])
def test_sdpa_with_valid_lengths_runs_on_cudnn(mask: str, tmp_path: Path) -> None:
    bundle = compile_source(f"""model m {{
  precision io=f16
  input q: [3, 8, 4, 64]
  input k: [3, 2, 96, 64]
  input v: [3, 2, 96, 64]
  input lens: i32[3]
  output y = sdpa(q, k, v{mask}, kv_len=lens)
}}""", tmp_path)
    program = Schedule(read(bundle))
    kinds = {program.nodes[s.nodes[0]].op: s.kind for s in program.steps}
    # the attention on cuDNN; the clamp of the lengths to the keys, min(lens, 96), a kernel
    # (integer math); the query lengths a load-time value (static B and Sq)
    assert kinds == {"sdpa": "graph", "min": "kernel"}
    inputs = random_inputs(bundle, seed=21)
    # one row of exactly Sq keys, one past the keys there are (every key, as the reference reads)
    inputs["lens"] = np.array([4, 37, 130], np.int32)
    got = to_host(_model(bundle).run(to_device(inputs, bundle)))["y"]
    assert rel_error(got, reference(bundle, inputs)["y"]) <= TOLERANCE["f16"]


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_cache_write_writes_the_callers_buffer_in_place(dtype: str, tmp_path: Path) -> None:
    """The new rows land at the position read on the device; every other byte of the caller's
    cache is as it was; the output read the written cache."""
    import torch

    bundle = compile_source(f"""model m {{
  precision io={dtype}
  input cache: [2, 4, 32, 16] @BSHD
  input new: [2, 4, 3, 16]
  input pos: i32[1]
  let k = cache_write(cache, new, at=pos)
  output total = reduce_sum(cast(k, f32), axes=[2])
}}""", tmp_path)
    model = _model(bundle)
    inputs = random_inputs(bundle, seed=22)
    for pos in (0, 11, 30):  # 30: the last row falls outside and is dropped
        inputs["pos"] = np.array([pos], np.int32)
        dev = to_device(inputs, bundle)
        cache = dev["cache"]
        before, ptr = cache.clone(), cache.data_ptr()
        out = to_host(model.run(dev))["total"]
        assert cache.data_ptr() == ptr
        rows = [r for r in range(pos, pos + 3) if r < 32]
        untouched = [r for r in range(32) if r not in rows]
        assert torch.equal(cache[:, :, untouched], before[:, :, untouched])
        assert torch.equal(cache[:, :, rows], dev["new"][:, :, : len(rows)])
        assert rel_error(out, reference(bundle, inputs)["total"]) <= TOLERANCE["f32"]


SMALL = {"D": 64, "HEADS": 4, "KV_HEADS": 2, "FFN": 96}


def _llama(tmp_path: Path) -> Path:
    text = (ROOT / "models" / "llama_decode.cgraph").read_text()
    for dim, size in SMALL.items():
        text = re.sub(rf"^(\s*dim {dim} = )[^\s#]+", rf"\g<1>{size}", text, flags=re.M)
    for name in ("encoder.cgraph", "llama_layer.cgraph"):
        (tmp_path / name).write_text((ROOT / "models" / name).read_text())
    path = tmp_path / "llama_decode.cgraph"
    path.write_text(text)
    return compile_file(path, tmp_path / "build", {"B": 2, "S": 1, "MAX": 64})


class Reference:
    """The reference decode loop: the caches carried from step to step."""

    def __init__(self, bundle: Path) -> None:
        self.program = Schedule(read(bundle))
        self.weights = read_weights(bundle.with_suffix(".safetensors"),
                                    self.program.bundle.manifest)
        self.caches = {name: np.zeros((2, 2, 64, 16), np.float32)
                       for name in self.program.written_inputs()}
        self.position = 0

    def step(self, x: np.ndarray) -> np.ndarray:
        out, self.caches = interp.run_in_place(
            self.program.graph, {"hidden_states": x, "position": np.array([self.position],
                                                                          np.int32),
                                 **self.caches}, self.weights, self.program.env)
        self.position += x.shape[1]
        return out["out"]


def _tokens(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((2, n, 64)).astype(np.float32)


def test_decode_loop_equals_the_reference_and_replays_one_graph(tmp_path: Path) -> None:
    import torch

    bundle = _llama(tmp_path)
    model = _model(bundle)
    dec = model.decoder(batch=2, max_len=64)
    ref = Reference(bundle)
    for i, n in enumerate([5, 1, 1, 1, 1]):
        x = _tokens(n, 30 + i)
        got = to_host(dec.step({"hidden_states": torch.from_numpy(x).cuda().bfloat16()}))
        assert rel_error(got["out"], ref.step(x)) <= TOLERANCE["bf16"], i
    for name, cache in dec.caches.items():
        assert rel_error(cache.obj.float().cpu().numpy(), ref.caches[name]) <= TOLERANCE["bf16"]
    # S=1 was called four times: recorded at its second call, with the caches' pointers
    graphs = {k: g for k, g in model._replays.graphs.items() if "S=1" in k[1]}
    assert len(graphs) == 1 and all(g is not None for g in graphs.values()), graphs


def test_a_captured_decode_step_replays_at_every_position(tmp_path: Path) -> None:
    """One CUDA graph, the caches recorded by pointer and the position read on the device:
    replayed at positions 0..5 it equals the reference loop; another cache buffer is refused."""
    import torch

    bundle = _llama(tmp_path)
    model = _model(bundle)
    caches = {n: torch.zeros(2, 2, 64, 16, dtype=torch.bfloat16, device="cuda")
              for n in (f"model.layers.{i}.{kv}_cache" for i in (0, 1) for kv in "kv")}
    position = torch.zeros(1, dtype=torch.int32, device="cuda")
    x = torch.zeros(2, 1, 64, dtype=torch.bfloat16, device="cuda")
    feed = {"hidden_states": x, "position": position, **caches}
    fast = model.capture(feed)
    for c in caches.values():  # capturing ran the schedule (warm-up): start again from zero
        c.zero_()
    ref = Reference(bundle)
    for step in range(6):
        tokens = _tokens(1, 40 + step)
        position.fill_(step)
        out = to_host(fast({**feed, "hidden_states": torch.from_numpy(tokens).cuda().bfloat16()}))
        assert rel_error(out["out"], ref.step(tokens)) <= TOLERANCE["bf16"], step
    with pytest.raises(RunnerError, match="written in place") as err:
        fast({**feed, "model.layers.0.k_cache": caches["model.layers.0.k_cache"].clone()})
    assert err.value.code == "R0201"
