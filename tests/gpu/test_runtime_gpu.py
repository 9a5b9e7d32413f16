"""Runtime behaviours generated programs found on the H200: inputs whose size-1 axes carry any
stride, inputs that start off a 16-byte boundary, views that start inside their base, outputs that
are inputs, and CUDA-graph capture of a model with a CuPy fallback step."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dslc.core.errors import RunnerError
from tests.gpu.common import (
    TOLERANCE,
    compile_source,
    random_inputs,
    reference,
    rel_error,
    to_device,
    to_host,
)

pytestmark = pytest.mark.gpu


def _model(text: str, tmp_path: Path):  # type: ignore[no-untyped-def]
    from dslc.runtime import Model

    bundle = compile_source(text, tmp_path)
    return bundle, Model(bundle, bundle.with_suffix(".safetensors"), plan_cache=None)


def test_size_one_axes_may_have_any_stride(tmp_path: Path) -> None:
    import torch

    bundle, model = _model("""model m {
  precision io=f16
  layout NHWC
  input x: [1, 1, 6, 4]
  output y = relu(x) * 2.0
}""", tmp_path)
    inputs = random_inputs(bundle, seed=5)
    x = to_device(inputs, bundle)["x"]
    odd = torch.as_strided(x, x.shape, (999, 7, 4, 1))  # N and C strides are free: size 1
    out = to_host(model.run({"x": odd}))["y"]
    assert rel_error(out, reference(bundle, inputs)["y"]) <= TOLERANCE["f16"]


def test_an_input_off_a_16_byte_boundary_is_r0501(tmp_path: Path) -> None:
    import torch

    _, model = _model("""model m {
  input x: f32[4, 8]
  output y = relu(x)
}""", tmp_path)
    base = torch.randn(4 * 8 + 1, device="cuda")
    with pytest.raises(RunnerError, match="16-byte aligned") as err:
        model.run({"x": base[1:].view(4, 8)})
    assert err.value.code == "R0501"


def test_a_view_starting_inside_its_base_runs_on_cudnn(tmp_path: Path) -> None:
    bundle, model = _model("""model m {
  precision io=f16
  input x: f32[6, 4]
  output a = cast(x[:, 1:3], f16)
  output b = transpose(cast(x[:, 1:3], f16), [1, 0])
}""", tmp_path)
    inputs = random_inputs(bundle, seed=6)
    ours = to_host(model.run(to_device(inputs, bundle)))
    for name, want in reference(bundle, inputs).items():
        assert rel_error(ours[name], want) <= TOLERANCE["f16"], name


def test_an_output_that_is_an_input_is_that_input(tmp_path: Path) -> None:
    bundle, model = _model("""model m {
  input x: f32[2, 4, 16]
  let r = relu(x)
  output same = x
  output y = exp(r)
}""", tmp_path)
    inputs = random_inputs(bundle, seed=7)
    device_inputs = to_device(inputs, bundle)
    out = model.run(device_inputs)
    assert out["same"].data_ptr() == device_inputs["x"].data_ptr()
    np.testing.assert_array_equal(to_host(out)["same"], inputs["x"])


def test_capture_runs_or_says_which_fallback_it_cannot_record(tmp_path: Path) -> None:
    """A 1-D transposed convolution with output padding, which cuDNN may reject: its reference
    then runs on CuPy (cuBLAS), which CuPy will not capture. Either way, never a raw error."""
    bundle, model = _model("""model m {
  precision io=bf16
  input x: [10, 1, 1]
  param w: [1, 12, 3]
  output y = conv_transpose(x, w, stride=2, output_pad=1)
}""", tmp_path)
    inputs = to_device(random_inputs(bundle, seed=8), bundle)
    plain = to_host(model.run(inputs))["y"]
    try:
        replayed = to_host(model.capture(inputs)(inputs))["y"]
    except RunnerError as err:
        assert err.code == "R0803" and "`conv_transpose`" in str(err)
        return
    np.testing.assert_array_equal(replayed, plain)


def test_plain_calls_replay_a_graph_from_the_second_call_with_fresh_outputs(
        tmp_path: Path) -> None:
    """`run` records a graph at its second call of a size and replays it after: the numbers
    of every call equal a step-by-step model's, bit for bit, and an output returned earlier is
    never overwritten by a later call."""
    from dslc.runtime import Model

    text = """model m {
  precision io=f16
  input x: [8, 64]
  param w: [64, 32]
  let h = relu(matmul(x, w))
  output y = h * 0.5
  output s = reduce_sum(h, axes=[1])
}"""
    bundle, model = _model(text, tmp_path)
    steps = Model(bundle, bundle.with_suffix(".safetensors"), plan_cache=None, cuda_graphs=False)
    a, b = (to_device(random_inputs(bundle, seed=s), bundle) for s in (9, 10))
    first = model.run(a)
    kept = {k: v.clone() for k, v in first.items()}
    later = [model.run(b), model.run(a), model.run(b)]
    assert [g is not None for g in model._replays.graphs.values()] == [True]  # one, recorded
    for got, inputs in zip(later, (b, a, b), strict=True):
        want = steps.run(inputs)
        for name in want:
            np.testing.assert_array_equal(to_host(got)[name], to_host(want)[name])
    for name, value in kept.items():  # the first outputs are still the first call's
        np.testing.assert_array_equal(to_host(first)[name], to_host({name: value})[name])
    assert later[0]["y"].data_ptr() != later[2]["y"].data_ptr()
    assert not steps._replays.graphs
    import torch

    base = torch.randn(8 * 64 + 1, device="cuda").half()  # checked once per signature, but
    with pytest.raises(RunnerError, match="16-byte aligned"):  # alignment at every call
        model.run({"x": base[1:].view(8, 64)})
    model.load_weights(bundle.with_suffix(".safetensors"))  # graphs read the old weights
    assert not model._replays.graphs


def test_a_replay_computes_over_inputs_written_into_the_captured_graph(tmp_path: Path) -> None:
    """`Captured.replay` copies nothing: values written into `captured.inputs` are what it
    reads (the form `dslc bench` times, as PyTorch's graphs are timed), equal to a call with
    them."""
    bundle, model = _model("""model m {
  precision io=f16
  input x: [8, 64]
  param w: [64, 32]
  output y = relu(matmul(x, w)) * 0.5
}""", tmp_path)
    a, b = (to_device(random_inputs(bundle, seed=s), bundle) for s in (11, 12))
    captured = model.capture(a)
    want = to_host(model.run(b))["y"]
    captured.inputs["x"].obj.copy_(b["x"])
    got = to_host(captured.replay())["y"]
    np.testing.assert_array_equal(got, want)
    assert rel_error(to_host(captured(a))["y"], to_host(model.run(a))["y"]) == 0.0


def test_plans_of_a_new_size_are_made_on_the_null_stream_after_a_profile_or_capture(
        tmp_path: Path) -> None:
    """The per-step profile and a capture each launch on a stream of their own, which dies
    with them; cuDNN restoring the next size's plans with the handle still on such a stream
    crashed (a segfault in `deserialize`: `dslc bench` at N=32 then N=256, fresh plan cache,
    on an H100). Plans are made with the handle on the null stream; the next size's numbers
    equal the reference's."""
    import gc

    from dslc.backend import device

    bundle, model = _model("""model m {
  precision io=f16
  dim N = 1..64 tune [8, 32]
  input x: [N, 64]
  param w: [64, 32]
  output y = relu(matmul(x, w)) * 0.5
}""", tmp_path)
    cudnn = device.require()[1]
    a = to_device(random_inputs(bundle, {"N": 8}, seed=13), bundle)
    model.profile(a, repeats=2)
    assert cudnn.get_stream(model.handle) == 0
    captured = model.capture(a)
    assert cudnn.get_stream(model.handle) == captured.stream.ptr != 0  # left on its stream
    del captured
    gc.collect()  # the capture's stream destroyed
    host = random_inputs(bundle, {"N": 32}, seed=14)
    model.prepare(N=32)  # the second bucket's plans restored
    assert cudnn.get_stream(model.handle) == 0
    got = to_host(model.run(to_device(host, bundle)))["y"]
    assert rel_error(got, reference(bundle, host)["y"]) < TOLERANCE["f16"]
