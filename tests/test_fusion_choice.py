"""Fusion as a measured choice (dslc/tune/fusion.py): which steps may split after their anchor's
bias, when the measured parts win (by more than the noise, over every bucket), which graphs of
pointwise ops may run as one fallback kernel instead and when they do, and the bundle either
makes: valid as a bundle, its schedule computing what the fused one computes (the arena
oracle runs both as the runtime lays memory out), and every measured step saying what was
measured. The times are given here as numbers: measuring them needs a GPU
(tests/gpu/test_tune_gpu.py measures real ones)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dslc.backend.spec import group_spec
from dslc.fuzz import arena
from dslc.fuzz.oracle import relative_error
from dslc.runtime.records import Bundle, PlanRecord
from dslc.runtime.schedule import Schedule
from dslc.tune.fusion import (
    KernelMeasured,
    Measured,
    kernel_steps,
    split_is_faster,
    splits,
    with_fusion,
)
from dslc.tune.joins import every_kernel
from dslc.weights import random_weights
from tests.helpers import deviceless_program, rng, run_cli

RESIDUAL = """import "std/nn.cgraph"
model m {
  layout NHWC
  dim N = 1..8 tune [2, 4]
  input x: [N, 8, 6, 6]
  let a = relu(conv2d(x, out=8, k=1, has_bias=true)) as "c1"    # 1x1: written in place
  let b = relu(conv2d(a, out=8, k=3, pad=1, has_bias=true) + x) as "c2"
  output y = conv2d(b, out=8, k=1, has_bias=true) as "c3"
}
"""


def test_a_conv_with_a_pointwise_tail_splits_after_its_bias(tmp_path: Path) -> None:
    _, program = deviceless_program(RESIDUAL, tmp_path)
    found = {s.step.name: ([program.nodes[n].op for n in s.head.nodes],
                           [program.nodes[n].op for n in s.tail.nodes]) for s in splits(program)}
    # c3 is a conv and its bias only: nothing to split off; c2's residual, added before its
    # bias (cuDNN's order, `lower.canonical.residual_before_bias`), stays with the anchor
    assert found == {"c1+bias_add+relu": (["conv", "bias_add"], ["relu"]),
                     "c2+add+bias_add+relu": (["conv", "add", "bias_add"], ["relu"])}


def test_a_matmul_with_a_residual_then_a_scale_splits_after_the_matmul(tmp_path: Path) -> None:
    """Only a conv's residual comes before its bias (`residual_before_bias`): a matmul's sum
    is its tail's, the scale after it too."""
    _, program = deviceless_program("""model m {
  input x: [16, 32]
  input r: [16, 8]
  param w: [32, 8]
  param s: [8]
  output y = (matmul(x, w) + r) * s
}
""", tmp_path)
    found = [([program.nodes[n].op for n in s.head.nodes], [program.nodes[n].op for n in s.tail.nodes])
             for s in splits(program)]
    assert found == [(["matmul"], ["add", "scale_mul"])]


def test_a_depthwise_conv_splits_before_its_bias(tmp_path: Path) -> None:
    """Its 3x3 groups stay fused at compile time; the tuner may measure them apart. A 7x7
    is compiled apart already (compile/stage.py): nothing left to split."""
    _, program = deviceless_program("""model m {
  layout NHWC
  input x: [2, 16, 8, 8]
  param w3: [16, 1, 3, 3]
  param w7: [16, 1, 7, 7]
  param b: [16]
  let a = bias_add(conv(x, w3, pad=1, groups=16), b) as "dw3"
  let c = relu(bias_add(conv(a, w7, pad=3, groups=16), b)) as "dw7"
  param w4: [16, 4, 3, 3]
  output y = bias_add(conv(c, w4, pad=1, groups=4), b) as "grouped"
}
""", tmp_path)
    found = {s.step.name: ([program.nodes[n].op for n in s.head.nodes],
                           [program.nodes[n].op for n in s.tail.nodes]) for s in splits(program)}
    assert found == {"w3+b": (["conv"], ["bias_add"])}  # the step named by its params


@pytest.mark.parametrize(("fused", "head", "tail", "split"), [
    ({"N=2": 1.0, "N=4": 2.0}, {"N=2": 0.5, "N=4": 1.0}, {"N=2": 0.4, "N=4": 0.9}, True),
    # 2.9 against 3.0: faster by 3.3%, past the 3% of noise
    ({"N=2": 1.0, "N=4": 2.0}, {"N=2": 0.5, "N=4": 1.5}, {"N=2": 0.4, "N=4": 0.5}, True),
    # 2.95 against 3.0: within the noise, fused stays
    ({"N=2": 1.0, "N=4": 2.0}, {"N=2": 0.5, "N=4": 1.5}, {"N=2": 0.45, "N=4": 0.5}, False),
    # faster at one bucket, slower in sum
    ({"N=2": 1.0, "N=4": 2.0}, {"N=2": 0.1, "N=4": 2.0}, {"N=2": 0.1, "N=4": 1.0}, False),
    # a part that did not tune at one bucket
    ({"N=2": 1.0, "N=4": 2.0}, {"N=2": 0.1, "N=4": None}, {"N=2": 0.1, "N=4": 0.1}, False),
    ({}, {}, {}, False),
])
def test_a_split_is_kept_only_where_its_parts_win_beyond_the_noise(
        fused: dict, head: dict, tail: dict, split: bool) -> None:
    assert split_is_faster(fused, head, tail) is split


def _measured(program: Schedule, times: dict[str, tuple[float, float, float]]) -> list[Measured]:
    """Each split with the given (fused, head, tail) milliseconds at every bucket, and the
    parts' specs with plan records as a deviceless build leaves them (no engine yet)."""
    out = []
    for s in splits(program):
        m = Measured(s)
        fused, head, tail = times[s.step.name]
        for bucket in program.bundle.buckets:
            m.fused_ms[bucket.key], m.head_ms[bucket.key], m.tail_ms[bucket.key] = fused, head, tail
            specs = [group_spec(program.graph, g, dict(bucket.dims), program.env,
                                program.placement) for g in (s.head, s.tail)]
            plans = [PlanRecord(None, {}, 0, None, ms=ms) for ms in (head, tail)]
            m.parts[bucket.key] = ((specs[0], plans[0]), (specs[1], plans[1]))
        out.append(m)
    return out


def test_a_split_bundle_is_valid_and_computes_what_the_fused_one_does(tmp_path: Path) -> None:
    model, program = deviceless_program(RESIDUAL, tmp_path)
    measured = _measured(program, {"c1+bias_add+relu": (1.0, 0.9, 0.2),  # 1.1: kept fused
                                   "c2+add+bias_add+relu": (1.0, 0.5, 0.3)})  # 0.8: split
    split = with_fusion(program.bundle, measured)
    again = Bundle.from_data(split.to_data())  # every record valid, every bucket checked
    steps = {s.name: s for s in again.steps}
    assert [s.name for s in again.steps] == ["c1+bias_add+relu", "c2+add+bias_add", "b",
                                             "c3+bias_add"]
    assert "kept fused" in steps["c1+bias_add+relu"].reason
    assert "split from the fused group c2+add+bias_add+relu by measurement" in \
        steps["c2+add+bias_add"].reason
    assert "N=2: fused 1.0000 ms, split 0.5000 + 0.3000 ms; N=4: fused 1.0000 ms" in \
        steps["b"].reason
    fused_sig = next(s.signature for s in program.steps if s.name == "c2+add+bias_add+relu")
    for bucket in again.buckets:  # the parts' graphs in, the fused one out
        assert fused_sig not in bucket.graphs
        assert {steps["c2+add+bias_add"].signature, steps["b"].signature} <= \
            set(bucket.graphs)
    weights = random_weights(model.params, 3)
    for bucket in again.buckets:
        dims = dict(bucket.dims)
        x = rng("fusion choice", bucket.key).standard_normal((dims["N"], 8, 6, 6))
        want = arena.run(program, dims, {"x": x.astype(np.float32)}, weights)["y"]
        got = arena.run(Schedule(again), dims, {"x": x.astype(np.float32)}, weights)["y"]
        assert relative_error(got, want) < 1e-6, bucket.key


def test_nothing_chosen_leaves_the_schedule_and_says_what_was_measured(tmp_path: Path) -> None:
    _, program = deviceless_program(RESIDUAL, tmp_path)
    kept = with_fusion(program.bundle, _measured(program, {"c1+bias_add+relu": (1.0, 0.9, 0.2),
                                                           "c2+add+bias_add+relu": (1.0, 0.9, 0.3)}))
    assert [s.name for s in kept.steps] == [s.name for s in program.steps]
    assert [b.graphs.keys() for b in kept.buckets] == \
        [b.graphs.keys() for b in program.bundle.buckets]
    assert ["kept fused" in s.reason for s in kept.steps] == [True, True, False]


def test_measuring_fusion_across_gpus_is_a_usage_error_said_first(tmp_path: Path) -> None:
    assert run_cli("compile", "models/mlp.cgraph", "-o", str(tmp_path), "-q").code == 0
    run = run_cli("tune", str(tmp_path / "mnist_mlp.bundle"), "--fusion", "measure",
                  "--gpus", "all")  # before the missing GPU (R0801, exit 3) is noticed
    assert run.code == 2 and "`--fusion measure` measures on one GPU" in run.stderr
    assert "Traceback" not in run.stderr


# -- a graph of pointwise ops against one fallback kernel ----------------------------------------
POINTWISE = """model m {
  dim N = 1..8 tune [2, 4]
  input x: [N, 64]
  input s: [64]
  let a = sigmoid(x * s + 1.0)
  output y = matmul(a, transpose(a, [1, 0])) as "mm"
}
"""


def _kernels(program: Schedule, times: dict[str, tuple[float, float | None]],
             ) -> list[KernelMeasured]:
    """Each pointwise graph step with the given (graph, kernel) milliseconds at every bucket
    (a GPU measures them: tests/gpu/test_tune_gpu.py)."""
    out = []
    for step in kernel_steps(program):
        m = KernelMeasured(step)
        for bucket in program.bundle.buckets:
            m.graph_ms[bucket.key], m.kernel_ms[bucket.key] = times[step.name]
        out.append(m)
    return out


def test_only_graphs_of_pointwise_ops_one_kernel_computes_are_measured_as_one(
        tmp_path: Path) -> None:
    _, program = deviceless_program(POINTWISE, tmp_path)
    found = [[program.nodes[n].op for n in s.nodes] for s in kernel_steps(program)]
    assert found == [["mul", "add", "sigmoid"]]  # not the matmul's step


@pytest.mark.parametrize(("graph", "kernel", "taken"), [
    (1.0, 0.5, True), (1.0, 0.975, False),  # within the 3% of noise: the graph stays
    (1.0, None, False),  # the kernel failed its check
])
def test_a_pointwise_step_becomes_one_kernel_where_it_is_faster_and_computes_the_same(
        graph: float, kernel: float | None, taken: bool, tmp_path: Path) -> None:
    _, program = deviceless_program(POINTWISE, tmp_path)
    measured = _kernels(program, {"a.mul+add+sigmoid": (graph, kernel)})
    out = Bundle.from_data(with_fusion(program.bundle, [], measured).to_data())  # valid
    step = next(s for s in out.steps if s.name == "a.mul+add+sigmoid")
    assert step.kind == ("kernel" if taken else "graph")
    assert ("one kernel is faster" if taken else "kept the graph") in step.reason
    assert "cuDNN graph 1.0000 ms, one kernel" in step.reason
    for bucket in out.buckets:  # the graph dropped where the kernel runs the step
        assert (step.signature in bucket.graphs) is not taken
        dims = dict(bucket.dims)
        g = rng("kernel choice", bucket.key)
        inputs = {"x": g.standard_normal((dims["N"], 64)).astype(np.float32),
                  "s": g.standard_normal(64).astype(np.float32)}
        want = arena.run(program, dims, inputs, {})["y"]
        got = arena.run(Schedule(out), dims, inputs, {})["y"]
        assert relative_error(got, want) < 1e-6, bucket.key


ATTENTION_AND_POINTWISE = """model m {
  precision io=f16
  dim B = 1..4 tune [1, 2]
  input q: [B, 8, 1, 64]
  input k: [B, 4, 96, 64]
  input v: [B, 4, 96, 64]
  input lens: i32[B]
  let a = sdpa(q, k, v, causal=true, align="bottom_right", kv_len=lens)
  output y = sigmoid(a * 2.0 + 1.0) as "tail"
}
"""


def test_every_kernel_makes_each_step_a_kernel_computes_that_kernel(tmp_path: Path) -> None:
    """The generated programs' check of the kernels (`fuzz.gpu`) runs a bundle with every step
    a fallback kernel computes made it: here the attention and the pointwise tail, whatever
    they would measure; the bundle valid (read back), their graphs dropped, and its schedule
    computing what the compiled one computes."""
    _, program = deviceless_program(ATTENTION_AND_POINTWISE, tmp_path)
    offered = {s.name for s in kernel_steps(program)}
    ops = {s.name: [program.nodes[n].op for n in s.nodes] for s in program.steps}
    assert sorted(ops[name] for name in offered) == [["mul", "add", "sigmoid"], ["sdpa"]]
    out = Bundle.from_data(every_kernel(program.bundle).to_data())
    before = {s.name: s.kind for s in program.steps}
    for step in out.steps:
        assert step.kind == ("kernel" if step.name in offered else before[step.name]), step.name
        if step.name in offered:
            assert step.reason.endswith("made its fallback kernel to check it")
            assert all(step.signature not in b.graphs for b in out.buckets)
    for bucket in out.buckets:
        dims = dict(bucket.dims)
        g = rng("every kernel", bucket.key)
        inputs = {"q": g.standard_normal((dims["B"], 8, 1, 64)).astype(np.float16),
                  "k": g.standard_normal((dims["B"], 4, 96, 64)).astype(np.float16),
                  "v": g.standard_normal((dims["B"], 4, 96, 64)).astype(np.float16),
                  "lens": np.full(dims["B"], 70, np.int32)}
        want = arena.run(program, dims, inputs, {})["y"]
        got = arena.run(Schedule(out), dims, inputs, {})["y"]
        assert np.isfinite(want).all() and relative_error(got, want) < 1e-6, bucket.key


def _timed(bundle: Any, ms: float) -> Any:
    """The bundle with every graph's plan timed at `ms` (a deviceless bundle has no times)."""
    from dataclasses import replace

    return replace(bundle, buckets=tuple(
        replace(b, graphs={sig: replace(g, plan=replace(g.plan, ms=ms))
                           for sig, g in b.graphs.items()}) for b in bundle.buckets))


def test_splits_are_measured_at_every_bucket_beside_the_fused_graphs_time(
        tmp_path: Path) -> None:
    """`measure_splits` with a stand-in for the GPU's tuning (the CPU has none; the real one:
    tests/gpu/test_tune_gpu.py): each split's parts timed at each bucket, in their own specs,
    beside the fused graph's time (from the plans tuning just made, else the bundle's), with
    progress said; a part without a plan leaves the split without its parts there."""
    from dslc.runtime.records import PlanRecord
    from dslc.tune.fusion import measure_splits

    _, program = deviceless_program(RESIDUAL, tmp_path)
    bundle = _timed(program.bundle, 0.010)
    c1 = next(s for s in bundle.steps if s.name == "c1+bias_add+relu")
    tuned = {("N=4", c1.signature): PlanRecord(None, {}, 0, None, ms=0.020)}
    said: list[str] = []
    seen: list[tuple[str, str]] = []

    def measure(spec: Any, storage: Any, where: str) -> Any:
        seen.append((where, spec.signature))
        ops = [op.op for op in spec.ops]
        if ops == ["relu"] and where == "a at N=2":
            return None  # that part did not tune
        return PlanRecord(None, {}, 0, None, ms=0.004 if "conv" in ops else 0.003)

    found = {m.split.step.name: m for m in measure_splits(bundle, tuned, measure, said.append)}
    c1m, c2m = found["c1+bias_add+relu"], found["c2+add+bias_add+relu"]
    assert c1m.fused_ms == {"N=2": 0.010, "N=4": 0.020}  # the bundle's, then the tuning's
    assert c1m.head_ms == {"N=2": 0.004, "N=4": 0.004}
    assert c1m.tail_ms == {"N=2": None, "N=4": 0.003}
    assert set(c1m.parts) == {"N=4"} and set(c2m.parts) == {"N=2", "N=4"}
    assert c2m.tail_ms == {"N=2": 0.003, "N=4": 0.003}
    assert "[1/2] N=2 c1+bias_add+relu split" in said and len(said) == 4
    # two parts of two splits at two buckets; the tails (a relu of one shape) one graph
    assert len(seen) == 8 and len({sig for _, sig in seen}) == 3
    assert not c1m.chosen and c2m.chosen  # a missing time keeps c1 fused; c2: 0.007 < 0.010
    assert c1m.summary().startswith("fusion measured: N=2: fused 0.0100 ms, split 0.0040 + - ms")


def test_kernels_are_measured_at_every_bucket_beside_the_graphs_time(tmp_path: Path) -> None:
    """`measure_kernels` with a stand-in for the GPU's timing: each step one kernel computes,
    timed at each bucket in its own spec's buffers, beside its graph's time."""
    from dslc.tune.fusion import measure_kernels

    _, program = deviceless_program(
        "model m {\n  input x: [2, 8]\n  input y: [2, 8]\n  output z = sigmoid(x) * y\n}\n",
        tmp_path)
    bundle = _timed(program.bundle, 0.010)
    said: list[str] = []
    seen: list[Any] = []

    def measure(step: Any, spec: Any, storage: Any, where: str) -> float:
        seen.append((step.name, tuple(t.name for t in spec.tensors if t.role == "output")))
        return 0.002

    [m] = measure_kernels(bundle, {}, measure, said.append)
    assert m.graph_ms == {"static": 0.010} and m.kernel_ms == {"static": 0.002} and m.chosen
    assert seen == [(m.step.name, m.step.outputs)]
    assert said == [f"[1/1] static {m.step.name} as one kernel"]
    assert m.summary() == "backend measured: static: cuDNN graph 0.0100 ms, one kernel 0.0020 ms"


def test_a_split_exactly_at_the_noise_margin_is_not_taken() -> None:
    assert not split_is_faster({"a": 1.0}, {"a": 0.97}, {})  # 3% faster is not faster enough
    assert split_is_faster({"a": 1.0}, {"a": 0.96}, {})


@pytest.mark.parametrize(("body", "found"), [
    # a matmul's bias stays with it; a conv without a bias splits before its relu; steps that
    # cannot split (a pointwise op, a conv with its bias alone) before the one that can
    ("  input x: [2, 16]\n  param w: [16, 8]\n  param b: [8]\n"
     "  output y = relu(bias_add(matmul(x, w), b))",
     {"w+b+relu": (["matmul", "bias_add"], ["relu"])}),
    ("  layout NHWC\n  input x: [2, 8, 6, 6]\n  param w: [8, 8, 3, 3]\n"
     "  output y = relu(conv(relu(x), w, pad=1))",
     {"w+relu": (["conv"], ["relu"])}),
    ("  layout NHWC\n  input x: [2, 8, 6, 6]\n  param w: [8, 8, 3, 3]\n  param b: [8]\n"
     "  let a = bias_add(conv(x, w, pad=1), b)\n"
     "  output y = relu(conv(a, w, pad=1))",
     {"w+relu": (["conv"], ["relu"])}),
    # a conv's residual without a bias: the sum is the tail; a conv, its residual and its bias
    # with nothing after: nothing to split off (the relu'd conv beside it splits)
    ("  layout NHWC\n  input x: [2, 8, 6, 6]\n  param w: [8, 8, 3, 3]\n"
     "  output y = conv(x, w, pad=1) + x",
     {"w+add": (["conv"], ["add"])}),
    ("  layout NHWC\n  input x: [2, 8, 6, 6]\n  param w: [8, 8, 3, 3]\n  param b: [8]\n"
     "  output y = bias_add(conv(x, w, pad=1), b) + x\n"
     "  output z = relu(conv(x, w, pad=1))",
     {"w+relu": (["conv"], ["relu"])}),
])
def test_which_steps_split_and_where(body: str, found: dict[str, Any], tmp_path: Path) -> None:
    _, program = deviceless_program("model m {\n" + body + "\n}\n", tmp_path)
    got = {s.step.name: ([program.nodes[n].op for n in s.head.nodes],
                         [program.nodes[n].op for n in s.tail.nodes]) for s in splits(program)}
    assert got == found


def test_a_step_touching_a_mask_is_not_offered_to_one_kernel(tmp_path: Path) -> None:
    """cuDNN stores a mask as bits, a kernel as bytes (settled at compile time)."""
    from dslc.backend import fused

    _, program = deviceless_program(
        "model m {\n  input x: [2, 8]\n  input y: [2, 8]\n"
        "  output z = select(x > y, x, y) * 2.0\n}\n", tmp_path)
    masked = [s for s in program.steps if any(program.nodes[n].type.dtype == "bool"
                                              for n in (*s.inputs, *s.nodes))]
    assert masked and all(isinstance(fused.plan_of(program.nodes, s.nodes, s.inputs, s.outputs),
                                     fused.Plan) for s in masked)  # one kernel could run them
    assert not {s.name for s in kernel_steps(program)} & {s.name for s in masked}


def test_a_kernels_summary_names_each_bucket_and_a_missing_time() -> None:
    from types import SimpleNamespace

    m = KernelMeasured(SimpleNamespace(name="s"),  # type: ignore[arg-type]
                       {"N=2": 0.01, "N=4": 0.02}, {"N=2": 0.004, "N=4": None})
    assert m.summary() == ("backend measured: N=2: cuDNN graph 0.0100 ms, one kernel 0.0040 ms; "
                           "N=4: cuDNN graph 0.0200 ms, one kernel - ms")
    assert not m.chosen  # a bucket where the kernel failed its check: the graph stays


def test_a_measured_reason_follows_the_compiled_one() -> None:
    from dslc.tune.fusion import joined_reason

    assert joined_reason("split from c1: cuDNN rejected it", "one kernel is faster") == (
        "split from c1: cuDNN rejected it; one kernel is faster")
    assert joined_reason("", "one kernel is faster") == "one kernel is faster"


PLACED = """import "std/nn.cgraph"
model m {
  layout NHWC
  dim N = 1..4 tune [1, 2]
  input x: [N, 8, 6, 6]
  let a = relu(conv2d(x, out=8, k=1, has_bias=true)) as "c1"    # 1x1: written in place
  let b = relu(conv2d(a, out=8, k=3, pad=1, has_bias=true) + x) as "c2"
  let c = relu(conv2d(b, out=8, k=3, pad=1, has_bias=true) + x) as "c3"
  output y = concat([a, x], axis=1)
  output z = c
}
"""


def test_a_step_written_into_a_concat_or_a_kernel_step_is_not_split(tmp_path: Path) -> None:
    """c1's result is written in place into y's buffer: it stays whole. c2 and c3 split, and
    their heads (one shape, one computation) differ in signature: c2's reads `a` with the
    concat's strides, so the two cannot share a plan; their tails are alike. A step already a
    kernel is no graph to split."""
    from dataclasses import replace

    _, program = deviceless_program(PLACED, tmp_path)
    assert "a" in program.placement
    found = {s.step.name: s for s in splits(program)}
    assert sorted(found) == ["c2+add+bias_add+relu", "c3+add+bias_add+relu"]
    c2, c3 = found["c2+add+bias_add+relu"], found["c3+add+bias_add+relu"]
    assert "a" in c2.head.inputs and c2.head.signature != c3.head.signature
    assert c2.tail.signature == c3.tail.signature and c2.tail.pattern == "pointwise"
    kernels = replace(program.bundle, steps=tuple(replace(s, kind="kernel")
                                                  for s in program.bundle.steps))
    assert splits(Schedule(kernels)) == []


def test_split_parts_are_measured_in_the_memory_they_read(tmp_path: Path) -> None:
    """Each part's spec binds the strides its values have in the memory plan: c2's head reads
    `a` where y's concatenation holds it (16 channels a pixel, not 8). The parts recorded at
    a bucket are the head's then the tail's."""
    from dslc.runtime.records import PlanRecord
    from dslc.tune.fusion import measure_splits

    _, program = deviceless_program(PLACED, tmp_path)
    bound: list[tuple[str, tuple[int, ...], tuple[int, ...]]] = []

    def measure(spec: Any, storage: Any, where: str) -> Any:
        for t in spec.tensors:
            if t.role in ("input", "output") and t.dims == storage[t.name].shape:
                bound.append((t.name, t.strides, storage[t.name].strides))
        ops = [op.op for op in spec.ops]
        return PlanRecord(None, {}, 0, None, ms=0.004 if "conv" in ops else 0.003)

    found = {m.split.step.name: m for m in measure_splits(_timed(program.bundle, 0.01), {},
                                                         measure)}
    assert any(name == "a" and mine[3] == 16 for name, mine, _ in bound)
    assert all(mine == want for _, mine, want in bound) and len(bound) > 8
    (head, head_plan), (tail, tail_plan) = found["c2+add+bias_add+relu"].parts["N=2"]
    assert [op.op for op in head.ops] == ["conv", "add", "bias_add"] and head_plan.ms == 0.004
    assert [op.op for op in tail.ops] == ["relu"] and tail_plan.ms == 0.003


def test_a_pointwise_kernel_is_measured_in_the_memory_it_reads(tmp_path: Path) -> None:
    from dslc.tune.fusion import measure_kernels

    _, program = deviceless_program(
        "model m {\n  layout NHWC\n  input x: [2, 8, 4, 4]\n  input w: [2, 8, 4, 4]\n"
        "  let a = x * 2.0\n  output c = concat([a, w], axis=1)\n"
        "  output z = sigmoid(a) * w\n}\n", tmp_path)
    assert "a" in program.placement
    bound: list[tuple[str, tuple[int, ...], tuple[int, ...]]] = []

    def measure(step: Any, spec: Any, storage: Any, where: str) -> float:
        bound.extend((t.name, t.strides, storage[t.name].strides) for t in spec.tensors
                     if t.role in ("input", "output") and t.dims == storage[t.name].shape)
        return 0.002

    measure_kernels(_timed(program.bundle, 0.01), {}, measure)
    assert any(name == "a" and mine[3] == 16 for name, mine, _ in bound)
    assert all(mine == want for _, mine, want in bound)


def test_split_parts_are_named_as_the_compiler_names_steps(tmp_path: Path) -> None:
    """A tail reading a weight computed at load time is named by that weight, as compiled steps
    are; parts whose names meet earlier ones get `#2`, `#3` (the runtime keys steps by name);
    the memory plans are made again (a split places each head's result in the arena)."""
    _, program = deviceless_program("""model m {
  layout NHWC
  input x: [2, 8, 6, 6]
  param w: [8, 8, 3, 3]
  param b: [8]
  param s: [8]
  let a = relu(scale_mul(bias_add(conv(x, w, pad=1), b), s * 2.0))
  let c = relu(bias_add(conv(a, w, pad=1), b) + a)
  output y = relu(bias_add(conv(c, w, pad=1), b) + c)
}
""", tmp_path)
    found = splits(program)
    assert (found[0].head.name, found[0].tail.name) == ("w+b", "s+relu")
    out = with_fusion(program.bundle, _measured(program, {s.step.name: (1.0, 0.3, 0.3)
                                                          for s in found}))
    assert [s.name for s in out.steps] == ["w+b", "s+relu", "w+add+b", "c", "w+add+b#2", "y"]
    for bucket in out.buckets:
        assert bucket.arena_bytes == Schedule(out).memory_plan(dict(bucket.dims)).arena
        assert {"a.bias_add", "c.add", "y.add"} <= set(bucket.offsets)  # the heads' results


@pytest.mark.parametrize(("kernel", "chosen", "graph_at"), [
    ({"N=2": 0.5, "N=4": 0.5}, True, set()),  # faster at both buckets
    ({"N=2": 0.5, "N=4": 2.0}, True, {"N=4"}),  # faster at one (slower in sum): both kept
    ({"N=2": 0.98, "N=4": 2.0}, False, {"N=2", "N=4"}),  # within the noise, or slower
    ({"N=2": 0.5, "N=4": None}, False, {"N=4"}),  # failed its check at one: the graph stays
])
def test_a_kernel_is_chosen_where_it_wins_at_a_bucket_and_the_graph_kept_where_not(
        kernel: dict[str, float | None], chosen: bool, graph_at: set[str]) -> None:
    from types import SimpleNamespace

    m = KernelMeasured(SimpleNamespace(name="s"), {"N=2": 1.0, "N=4": 1.0},  # type: ignore[arg-type]
                       kernel)
    assert m.chosen is chosen and m.graph_at == graph_at


def test_a_kernel_chosen_at_one_bucket_keeps_the_graph_at_the_other(tmp_path: Path) -> None:
    """The kernel faster at N=2, the graph at N=4: the step is a kernel that runs its graph at
    N=4 (a decoder's attention: the kernel at one query a step, cuDNN over a prompt). The
    bundle is valid, keeps the graph there through later rewrites (`with_joins` makes the bundle
    again), `inspect` says where cuDNN runs it, and each bucket computes what the compiled
    bundle computes, the arena running the graph at N=4 and the kernel at N=2."""
    from dslc.cli.inspect import bundle_report

    _, program = deviceless_program(POINTWISE, tmp_path)
    [m] = _kernels(program, {"a.mul+add+sigmoid": (1.0, 0.5)})
    m.kernel_ms["N=4"] = 2.0
    out = Bundle.from_data(with_fusion(program.bundle, [], [m]).to_data())
    out = Bundle.from_data(with_fusion(out, []).to_data())  # made again: the graph stays
    step = next(s for s in out.steps if s.name == "a.mul+add+sigmoid")
    assert step.kind == "kernel" and "the graph kept at N=4, where it is not" in step.reason
    assert step.graph_at == ("N=4",)
    assert {b.key: step.signature in b.graphs for b in out.buckets} == {"N=2": False,
                                                                         "N=4": True}
    [row] = [r for r in bundle_report(out)["steps"] if r["name"] == step.name]
    assert row["runs_on"] == "fallback kernel, cuDNN at N=4" and list(row["plans"]) == ["N=4"]
    schedule = Schedule(out)
    for bucket in out.buckets:
        assert schedule.runs_graph(step, bucket.key) is (bucket.key == "N=4")
        dims = dict(bucket.dims)
        g = rng("kernel at a bucket", bucket.key)
        inputs = {"x": g.standard_normal((dims["N"], 64)).astype(np.float32),
                  "s": g.standard_normal(64).astype(np.float32)}
        want = arena.run(program, dims, inputs, {})["y"]
        got = arena.run(schedule, dims, inputs, {})["y"]
        assert relative_error(got, want) < 1e-6, bucket.key


def test_a_kernels_reason_names_the_buckets_that_keep_the_graph() -> None:
    from dslc.runtime.records import StepRecord
    from dslc.tune.fusion import _kernel_or_graph

    step = StepRecord("graph", "s", "pointwise", ("a",), ("x",), ("a",), "sig", "")
    graphs = {"N=2": 1.0, "N=4": 1.0, "N=8": 1.0}
    some = _kernel_or_graph(step, KernelMeasured(step, graphs, {"N=2": 0.5, "N=4": 2.0,
                                                                "N=8": 1.0}))
    assert some.kind == "kernel" and some.reason.endswith(
        "one kernel is faster (the graph kept at N=4, N=8, where it is not)")
    every = _kernel_or_graph(step, KernelMeasured(step, graphs, dict.fromkeys(graphs, 0.5)))
    assert every.kind == "kernel" and every.reason.endswith("ms: one kernel is faster")


FLOORED = """import "std/nn.cgraph"
model m {
  layout NHWC
  dim N = 2..8 tune [3, 5]
  input x: [N // 2, 8, 6, 6]
  input y: [N // 2, 8]
  let a = relu(conv2d(x, out=8, k=3, pad=1, has_bias=true)) as "c1"
  output b = conv2d(a, out=8, k=1, has_bias=true) as "c2"
  output z = sigmoid(y) * y
}
"""


def test_splits_and_kernels_are_measured_at_the_sizes_a_floored_dim_takes(
        tmp_path: Path) -> None:
    """`N // 2` is a dim of its own that only the model's dim environment evaluates (1 at N=3,
    2 at N=5): each measured spec has the shapes of the buffers it is timed in."""
    from dslc.tune.fusion import measure_kernels, measure_splits

    _, program = deviceless_program(FLOORED, tmp_path)
    bundle = _timed(program.bundle, 0.01)
    batches: list[tuple[str, int]] = []

    def shapes(spec: Any, storage: Any, where: str) -> None:
        for t in spec.tensors:
            if t.name in ("x", "y", "a", "b", "z"):  # the values of a batch of N // 2
                assert math.prod(t.dims) == math.prod(storage[t.name].shape), where
                batches.append((where.split()[-1], storage[t.name].shape[0]))

    def split_part(spec: Any, storage: Any, where: str) -> Any:
        shapes(spec, storage, where)
        return PlanRecord(None, {}, 0, None, ms=0.004)

    def kernel(step: Any, spec: Any, storage: Any, where: str) -> float:
        shapes(spec, storage, where)
        return 0.002

    assert measure_splits(bundle, {}, split_part) and measure_kernels(bundle, {}, kernel)
    assert {b for b in batches if b[0] == "N=3"} == {("N=3", 1)}
    assert {b for b in batches if b[0] == "N=5"} == {("N=5", 2)}
