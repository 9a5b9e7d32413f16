"""The split-key attention kernel (`backend.attention`) against PyTorch's attention in f32 with
the mask written out here from its definition (keys from `kv_len[b]` on, after the query's
diagonal, `window` or more before it), on random data: decode shapes (one query, GQA, a cache
longer than its valid rows, the output stored BSHD), a query block with bottom-right
alignment and per-row lengths, a sliding window, strided keys that take the scalar loads, and
a query with no key. Then a decoder step's attention measured against cuDNN's graph by the
tuner."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import note_seed

pytestmark = pytest.mark.gpu


def _torch_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, lengths: list[int] | None,
                     causal: bool, bottom_right: bool, window: int | None) -> np.ndarray:
    import torch

    b, h, sq, d = q.shape
    kvh, skv = k.shape[1], k.shape[2]
    tq, tk, tv = (torch.from_numpy(np.asarray(t, np.float32)) for t in (q, k, v))
    tk, tv = (t.repeat_interleave(h // kvh, dim=1) for t in (tk, tv))
    allowed = torch.zeros(b, 1, sq, skv, dtype=torch.bool)
    for n in range(b):
        valid = skv if lengths is None else lengths[n]
        for i in range(sq):
            at = i + (valid - sq if bottom_right else 0)
            for j in range(skv):
                allowed[n, 0, i, j] = (j < valid and (not causal or j <= at)
                                       and (window is None or j > at - window))
    scores = tq @ tk.transpose(-1, -2) / math.sqrt(d)
    scores = scores.masked_fill(~allowed, float("-inf"))
    return (torch.softmax(scores, dim=-1) @ tv).numpy()


CASES = [  # b, h, kvh, sq, skv, d, dtype, lengths, causal, bottom_right, window
    (1, 32, 8, 1, 1024, 64, "bfloat16", [1001], True, True, None),
    (2, 8, 8, 4, 300, 128, "float16", [300, 77], True, True, None),
    (1, 4, 1, 3, 200, 32, "bfloat16", None, True, False, 50),
    (3, 16, 2, 1, 2048, 128, "float16", [5, 2048, 1500], False, False, None),
    (1, 2, 2, 2, 100, 256, "float16", [64], False, False, None),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"b{c[0]}h{c[1]}kv{c[2]}q{c[3]}k{c[4]}d{c[5]}")
def test_the_attention_kernel_equals_pytorch_with_the_mask_written_out(case: tuple) -> None:
    import cupy
    import ml_dtypes

    from dslc.backend import attention

    b, h, kvh, sq, skv, d, dtype, lengths, causal, bottom_right, window = case
    g = np.random.default_rng(note_seed(f"attention {case}", 11))
    host = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float16
    q = g.standard_normal((b, sq, h, d)).astype(host).transpose(0, 2, 1, 3)  # stored BSHD
    k = g.standard_normal((b, kvh, skv, d)).astype(host)
    v = g.standard_normal((b, kvh, skv, d)).astype(host)
    want = _torch_attention(q, k, v, lengths, causal, bottom_right, window)

    def dev(a: np.ndarray) -> object:
        return cupy.asarray(a.view(np.uint16) if dtype == "bfloat16" else a)

    xs = [dev(np.ascontiguousarray(q.transpose(0, 2, 1, 3))).transpose(0, 2, 1, 3),
          dev(k), dev(v)]
    names = ["q", "k", "v"]
    if lengths is not None:
        xs.append(cupy.asarray(np.array(lengths, np.int32)))
        names.append("kv_len")
    shapes = {n: tuple(x.shape) for n, x in zip(names, xs, strict=True)}
    assert attention.takes(shapes, "bf16" if dtype == "bfloat16" else "f16")
    y = cupy.empty((b, sq, h, d), xs[1].dtype).transpose(0, 2, 1, 3)
    attention.attend(xs, y, {"operands": tuple(names), "scale": None, "causal": causal,
                             "align": "bottom_right" if bottom_right else None, "window": window})
    first = cupy.asnumpy(y).view(np.uint16)
    got = (first.view(ml_dtypes.bfloat16) if dtype == "bfloat16" else first.view(np.float16))
    err = float(np.abs(got.astype(np.float32) - want).max() / np.abs(want).max())
    print(f"attention {case}: relative error {err:.2e}")
    assert err < (2e-2 if dtype == "bfloat16" else 4e-3)
    # a second launch (the counters its first reset) gives the same bits
    attention.attend(xs, y, {"operands": tuple(names), "scale": None, "causal": causal,
                             "align": "bottom_right" if bottom_right else None, "window": window})
    assert np.array_equal(cupy.asnumpy(y).view(np.uint16), first)

def test_strided_keys_take_the_scalar_loads_and_a_query_with_no_key_is_nan() -> None:
    """Keys and values one element off 16-byte alignment (scalar loads); the second batch row
    has no valid key: NaN there, as the reference gives."""
    import cupy

    from dslc.backend import attention

    g = np.random.default_rng(note_seed("attention strided", 12))
    b, h, kvh, sq, skv, d = 2, 4, 2, 1, 130, 64
    q = g.standard_normal((b, h, sq, d)).astype(np.float16)
    base = g.standard_normal((b * kvh * skv * d + 1,)).astype(np.float16)
    k = base[1:].reshape(b, kvh, skv, d)
    v = (base[1:] * 0.5).astype(np.float16).reshape(b, kvh, skv, d)
    want = _torch_attention(q, k, v, [97, 0], False, False, None)
    dbase = cupy.asarray(base)
    xs = [cupy.asarray(q), dbase[1:].reshape(b, kvh, skv, d),
          (dbase[1:] * 0.5).astype(cupy.float16).reshape(b, kvh, skv, d),
          cupy.asarray(np.array([97, 0], np.int32))]
    assert xs[1].data.ptr % 16 != 0
    y = cupy.empty((b, h, sq, d), cupy.float16)
    attention.attend(xs, y, {"operands": ("q", "k", "v", "kv_len"), "scale": None,
                             "causal": False, "align": None, "window": None})
    got = cupy.asnumpy(y).astype(np.float32)
    assert np.isnan(got[1]).all() and np.isnan(want[1]).all()
    err = float(np.abs(got[0] - want[0]).max() / np.abs(want[0]).max())
    print(f"strided attention: relative error {err:.2e}")
    assert err < 4e-3


DECODE = """
model m {
  precision io=bf16
  dim B = 1..4 tune [1]
  input q: [B, 32, 1, 64]
  input k: [B, 8, 1024, 64]
  input v: [B, 8, 1024, 64]
  input lens: i32[B]
  output y = sdpa(q, k, v, causal=true, align="bottom_right", kv_len=lens)
}
"""


def test_a_decoders_attention_is_measured_against_cudnn_and_the_kernel_taken_stays_right(
        tmp_path: Path) -> None:
    """`dslc tune --fusion measure` times the attention over all 1,024 keys (its lengths at the
    keys' extent: zeros once timed nothing) as cuDNN's graph and as the kernel, both checked;
    the kernel, faster on the H200 where the graph tiles one query a head, takes the step;
    the tuned model equals the reference executor at a length of 700."""
    from dslc.runtime import Model
    from dslc.runtime.bundle import read
    from tests.gpu.common import (
        TOLERANCE,
        compile_source,
        random_inputs,
        reference,
        rel_error,
        to_device,
        to_host,
    )
    from tests.helpers import run_cli

    bundle = compile_source(DECODE, tmp_path)
    run = run_cli("tune", str(bundle), "--fusion", "measure", "--budget", "2",
                  "--tuning-db", "none", "-q")
    print(run.stdout)
    assert run.code == 0, run.stderr
    times = re.findall(r"cuDNN graph ([\d.]+) ms, one kernel ([\d.]+) ms", run.stdout)
    assert len(times) == 1, run.stdout
    graph_ms, kernel_ms = map(float, times[0])
    assert graph_ms > 0.007  # 1,024 keys of 8 heads read: not an attention over none
    step = next(s for s in read(bundle)["steps"] if s["name"] == "y")
    assert step["kind"] == ("kernel" if kernel_ms < graph_ms * 0.97 else "graph")
    assert step["kind"] == "kernel"
    inputs = random_inputs(bundle, seed=23)
    inputs["lens"] = np.array([700], np.int32)
    model = Model(bundle, bundle.with_suffix(".safetensors"), tuning_db=None)
    got = to_host(model.run(to_device(inputs, bundle)))["y"]
    want = reference(bundle, inputs)["y"]
    err = rel_error(got, want)
    print(f"tuned decode attention: {step['kind']}, relative error {err:.2e}")
    assert err < TOLERANCE["bf16"]
