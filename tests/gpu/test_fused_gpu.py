"""One pointwise kernel per step (dslc/backend/fused.py) on the GPU: fp8 bytes decoded and
encoded as ml_dtypes does (every byte; random values and the edges of each format), a
quantising multiply and cast in one kernel, a chain with a vector along an axis and a bf16
value held inside it, two results of one kernel, and a model whose quantising cast cuDNN has
no engine for, run through the runtime against the reference executor."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.helpers import note_seed

pytestmark = pytest.mark.gpu

FP8 = {"f8e4m3": ("float8_e4m3fn", 448.0), "f8e5m2": ("float8_e5m2", 57344.0)}


def _ml(dtype: str) -> object:
    import ml_dtypes

    return getattr(ml_dtypes, FP8[dtype][0])


def _edges(dtype: str) -> np.ndarray:
    top = FP8[dtype][1]
    e = [0.0, -0.0, 1.0, 1.0625, 1.125, 1.1875, 2 ** -6, 2 ** -9, 2 ** -10, 3 * 2 ** -11,
         2 ** -14, 2 ** -16, 2 ** -17, 3 * 2 ** -18, top, top * 1.03, top * 1.0625, top * 1.07,
         top * 29 / 28, top * 15 / 14, top * 1.2, 1e30, np.inf, -np.inf, np.nan, 3.4e38, 1e-40]
    return np.array(e + [-v for v in e], np.float32)


@pytest.mark.parametrize("dtype", sorted(FP8))
def test_fp8_bytes_decode_as_ml_dtypes_does(dtype: str) -> None:
    import cupy

    from dslc.backend import fused

    member = fused.Member("a", ("x0",), "f32")
    p = fused.Plan((fused.Operand("x0", dtype),), (member,), (0,), ("f32",))
    bits = np.arange(256, dtype=np.uint8)
    y = cupy.zeros(256, np.float32)
    fused.run(p, [cupy.asarray(bits)], [y])
    want = bits.view(_ml(dtype)).astype(np.float32)
    got = cupy.asnumpy(y)
    assert np.array_equal(np.isnan(got), np.isnan(want))
    assert np.array_equal(got[~np.isnan(want)], want[~np.isnan(want)])


@pytest.mark.parametrize("dtype", sorted(FP8))
def test_fp8_encoding_rounds_as_ml_dtypes_does(dtype: str) -> None:
    """To nearest, ties to even; e4m3 saturates at 448 (as cuDNN's conversions and the
    reference do: ml_dtypes would give NaN, so its side is clipped first), e5m2 overflows to
    infinity; NaN stays NaN."""
    import cupy

    from dslc.backend import fused

    r = np.random.default_rng(note_seed("fp8 encode", 1))
    top = FP8[dtype][1]
    x = np.concatenate([_edges(dtype),
                        (r.standard_normal(200_000) * np.exp2(r.uniform(-20, 18, 200_000)))
                        .astype(np.float32)])
    member = fused.Member("a", ("x0",), dtype)
    p = fused.Plan((fused.Operand("x0", "f32"),), (member,), (0,), (dtype,))
    y = cupy.zeros(x.shape, np.uint8)
    fused.run(p, [cupy.asarray(x)], [y])
    clipped = np.clip(x, -top, top) if dtype == "f8e4m3" else x
    want = clipped.astype(_ml(dtype)).view(np.uint8)
    got = cupy.asnumpy(y)
    nan = np.isnan(x)
    assert np.array_equal(np.isnan(got.view(_ml(dtype)).astype(np.float32)), nan)
    bad = np.flatnonzero((got != want) & ~nan)
    assert bad.size == 0, [(float(x[i]), int(got[i]), int(want[i])) for i in bad[:8]]


def test_a_quantising_multiply_and_cast_are_one_kernel_equal_to_the_reference() -> None:
    import cupy
    import ml_dtypes

    from dslc.backend import fused

    r = np.random.default_rng(note_seed("fused quantise", 2))
    x = (r.standard_normal((64, 768)) * 3).astype(np.float16)
    scale = np.float32(448.0 / np.abs(x.astype(np.float32)).max())
    members = (fused.Member("a * b", ("x0", "x1"), "f32"), fused.Member("a", ("v0",), "f8e4m3"))
    p = fused.Plan((fused.Operand("x", "f16"), fused.Operand("s", "f32")), members, (1,),
                   ("f8e4m3",))
    y = cupy.zeros(x.shape, np.uint8)
    fused.run(p, [cupy.asarray(x), cupy.asarray(scale)], [y])
    want = np.clip(x.astype(np.float32) * scale, -448, 448).astype(ml_dtypes.float8_e4m3fn)
    assert np.array_equal(cupy.asnumpy(y), want.view(np.uint8))


def test_a_chain_with_a_vector_along_an_axis_rounds_its_inner_value_and_stores_two_results() -> None:
    """y1 = relu(x * s[c] rounded to bf16) and y2 = y1 + b (both [N, C, H, W], bf16 bits),
    the scale a vector along axis 1, against numpy with ml_dtypes' bf16."""
    import cupy
    import ml_dtypes

    from dslc.backend import fused

    bf = ml_dtypes.bfloat16
    r = np.random.default_rng(note_seed("fused chain", 3))
    x = r.standard_normal((2, 6, 5, 7)).astype(bf)
    s = r.standard_normal(6).astype(np.float32)
    b = r.standard_normal((5, 7)).astype(bf)
    members = (fused.Member("a * b", ("x0", "x1"), "bf16"), fused.Member("(a < 0.0f ? 0.0f : a)",
                                                                          ("v0",), "bf16"),
               fused.Member("a + b", ("v1", "x2"), "bf16"))
    p = fused.Plan((fused.Operand("x", "bf16"), fused.Operand("s", "f32", (1, 4)),
                    fused.Operand("b", "bf16")), members, (1, 2), ("bf16", "bf16"))
    y1 = cupy.zeros(x.shape, np.uint16)
    y2 = cupy.zeros(x.shape, np.uint16)
    fused.run(p, [cupy.asarray(x.view(np.uint16)), cupy.asarray(s),
                  cupy.asarray(b.view(np.uint16))], [y1, y2])
    inner = (x.astype(np.float32) * s.reshape(1, 6, 1, 1)).astype(bf).astype(np.float32)
    w1 = np.maximum(inner, 0).astype(bf)
    w2 = (w1.astype(np.float32) + b.astype(np.float32)).astype(bf)
    assert np.array_equal(cupy.asnumpy(y1), w1.view(np.uint16))
    assert np.array_equal(cupy.asnumpy(y2), w2.view(np.uint16))


@pytest.mark.parametrize("quantise", ["graph", "kernel"])
def test_an_fp8_linear_equals_the_reference_with_its_quantising_cast_a_graph_or_one_kernel(
        quantise: str, tmp_path: Path) -> None:
    """An fp8 linear compiled on the device (its input's multiply, saturation and cast to e4m3 a
    cuDNN graph
    since the channels-last naming of pointwise groups), and with that step made the one
    fallback kernel the tuner may choose (`tune.fusion.with_fusion`): either equals the
    reference executor's fp8 run (its calibration, its quantisation)."""
    import dataclasses

    from dslc.backend.target import load_target
    from dslc.compile.stage import compile_model
    from dslc.diag.diagnostic import Sink
    from dslc.emit import bundle as emit_bundle
    from dslc.ir import interp
    from dslc.pipeline import Options, front_end, lower_and_fuse
    from dslc.runtime import Model
    from dslc.runtime import bundle as bundlefile
    from dslc.runtime.calibrate import calibrate
    from dslc.runtime.schedule import Schedule
    from dslc.tune.fusion import KernelMeasured, with_fusion
    from dslc.weights import random_weights, save
    from tests.gpu.common import rel_error, to_device, to_host

    src = tmp_path / "lin.cgraph"
    src.write_text("cgraph 0.1\nimport \"std/nn.cgraph\"\n\nmodel lin {\n"
                   "  precision io=f16, intermediate=f32, compute=f32, matmul=f8e4m3\n"
                   "  input x: [64, 256]\n  output y = linear(x, out=128) as \"fc\"\n}\n")
    sink = Sink()
    result = front_end(src, Options(), sink)
    assert result.model is not None, [d.message for d in sink.diagnostics]
    lowered, plan = lower_and_fuse(result.model)
    compiled = compile_model(result.model, lowered, plan, load_target("device"))
    records = emit_bundle.records(compiled)
    program = Schedule(records)
    step = next(s for s in program.steps
                if [program.nodes[n].op for n in s.nodes] == ["mul", "max", "min", "cast"])
    if quantise == "kernel" and step.kind == "graph":
        keys = [b.key for b in records.buckets]
        records = with_fusion(records, [], [KernelMeasured(step, dict.fromkeys(keys, 1.0),
                                                           dict.fromkeys(keys, 0.5))])
    bundle = tmp_path / "lin.bundle"
    emit_bundle.write(bundle, records)
    program = Schedule(bundlefile.load(bundle))
    kinds = {s.name: s.kind for s in program.steps}
    print(quantise, kinds)
    assert kinds[step.name] == quantise or quantise == "graph"
    weights = {k: np.asarray(v) for k, v in random_weights(result.model.params, seed=5).items()}
    save(bundle.with_suffix(".safetensors"), weights)
    r = np.random.default_rng(note_seed("fp8 linear", 4))
    x = (r.standard_normal((64, 256)) * 2).astype(np.float16)
    c = calibrate(program, weights, {"x": x[None]})
    bundle.write_bytes(bundlefile.pack(dataclasses.replace(program.bundle, calibration=c)))
    program = Schedule(bundlefile.load(bundle))
    want = interp.run(program.graph, {"x": x}, weights, program.env, virtual=program.virtual(),
                      amax=c.amax)["y"]
    got = to_host(Model(bundle, bundle.with_suffix(".safetensors")).run(
        to_device({"x": x}, bundle)))["y"]
    err = rel_error(got.astype(np.float64), want.astype(np.float64))
    print(f"fp8 linear ({quantise}) against the fp8 reference: {err:.2e}")
    assert err < 2e-2


def _elementwise(p: Any) -> Any:
    """The plan's body in CuPy's elementwise kernel (`Plan.source`), as the oracle of the raw
    kernels' data movement (what ran before the strided kernel replaced it)."""
    import cupy

    from dslc.backend.cuda import PREAMBLE
    from dslc.backend.fused import CONVERSIONS

    params, outs, body = p.source()
    return cupy.ElementwiseKernel(params, outs, body, "oracle", preamble=PREAMBLE + CONVERSIONS)


def test_the_vector_kernel_runs_dense_steps_and_equals_the_elementwise_kernel() -> None:
    """A quantising cast of 1M f16 values by a one-element scale (+5, a tail) runs as the
    vector kernel and gives the elementwise kernel's bytes; a transposed operand falls back to
    the strided kernel, with the same bytes."""
    import cupy

    from dslc.backend import fused

    p = fused.Plan(
        (fused.Operand("x", "f16"), fused.Operand("s", "f32")),
        (fused.Member("a * b", ("x0", "x1"), "f32"), fused.Member("a", ("v0",), "f8e4m3")),
        (1,), ("f8e4m3",))
    g = cupy.random.default_rng(note_seed("vector kernel", 3))
    x = (g.standard_normal((1024, 1029), dtype=cupy.float32) * 3).astype(cupy.float16)
    s = cupy.asarray([40.0], dtype=cupy.float32)
    assert fused._vectorizable(p, [x, s], [cupy.empty(x.shape, cupy.uint8)]) == [False, True]
    y, want = cupy.empty(x.shape, cupy.uint8), cupy.empty(x.shape, cupy.uint8)
    fused.run(p, [x, s], [y])
    _elementwise(p)(x, s, want)
    assert bool((y == want).all()) and int(cupy.unique(y).size) > 100
    xt = x.T  # not dense: the strided kernel
    assert fused._vectorizable(p, [xt, s], [cupy.empty(xt.shape, cupy.uint8)]) is None
    yt = cupy.empty(xt.shape, cupy.uint8)
    fused.run(p, [xt, s], [yt])
    assert bool((yt == want.T).all())


def test_the_vector_kernel_runs_arrays_dense_in_another_order_alike() -> None:
    """Operand and result both dense in column-major order (a BSHD-stored attention output read
    as BHSD is this case): the vector kernel runs them in memory order and gives the
    elementwise kernel's bytes, element for element in the logical order."""
    import cupy

    from dslc.backend import fused

    p = fused.Plan(
        (fused.Operand("x", "f16"), fused.Operand("s", "f32")),
        (fused.Member("a * b", ("x0", "x1"), "f32"), fused.Member("a", ("v0",), "f8e4m3")),
        (1,), ("f8e4m3",))
    g = cupy.random.default_rng(note_seed("vector kernel order", 5))
    x = ((g.standard_normal((1029, 1024), dtype=cupy.float32) * 3).astype(cupy.float16)).T
    s = cupy.asarray([40.0], dtype=cupy.float32)
    y = cupy.empty((1029, 1024), cupy.uint8).T
    assert fused._vectorizable(p, [x, s], [y]) == [False, True]
    fused.run(p, [x, s], [y])
    want = cupy.empty(x.shape, cupy.uint8)
    _elementwise(p)(cupy.ascontiguousarray(x), s, want)
    assert bool((y == want).all()) and int(cupy.unique(y).size) > 100
