"""The cuDNN backend without a GPU: every group of every example model becomes a real cuDNN graph
for the H200 profile (validated and lowered to an operation graph by the cuDNN library), the
graphs served by precompiled engines also get plans, and a group cuDNN rejects is split."""

from __future__ import annotations

from collections import Counter
from functools import cache

import pytest

from dslc.backend.graphs import HEURISTICS
from dslc.backend.target import load_target
from dslc.compile.stage import Compiled, compile_model
from dslc.diag.diagnostic import Sink
from dslc.ir.groups import FusionPlan, make_group
from dslc.pipeline import Options, front_end, lower_and_fuse
from tests.conftest import ROOT
from tests.helpers import check_source

MODELS = ["mlp", "resnet18", "resnet50", "encoder", "unet"]


@cache
def compiled(name: str) -> Compiled:
    result = front_end(ROOT / "models" / f"{name}.cgraph", Options(), Sink())
    assert result.model is not None
    lowered, plan = lower_and_fuse(result.model)
    return compile_model(result.model, lowered, plan, load_target("h200"))


@pytest.mark.parametrize("name", MODELS)
def test_every_group_is_a_cudnn_graph_deviceless(name: str) -> None:
    c = compiled(name)
    assert len(c.steps) == len(c.plan.groups)  # nothing rejected, nothing split
    kernels = Counter(c.graph.by_name()[s.group.nodes[0]].op for s in c.steps if s.kind == "kernel")
    expected = {"mlp": {}, "encoder": {}, "resnet18": {"maxpool": 1}, "resnet50": {"maxpool": 1},
                # the UNet's: its two skip concats, and the two of its upsamples' kernel rows
                # (`lower.upconv`), whose matmuls write every row in place: they copy nothing
                "unet": {"maxpool": 2, "concat": 4}}[name]
    assert dict(kernels) == expected
    graph_signatures = {s.group.signature for s in c.steps if s.kind == "graph"}
    assert len(c.builds) == len(graph_signatures) * len(c.model.buckets)


@pytest.mark.parametrize("name", ["resnet18", "resnet50", "unet", "sd_down_block", "mobilenet_v3"])
def test_precompiled_conv_engines_build_plans_deviceless(name: str) -> None:
    """Every graph of a conv and its bias, adds and relu, at every bucket, gets a plan without a
    device: conv + bias (+ relu), and a residual block's end, its residual added before the
    bias (`residual_before_bias`: with the bias first cuDNN proposes no precompiled engine).
    The SD block's end adds two convs with their biases: the shortcut keeps its bias, the last
    conv takes the residual."""
    c = compiled(name)
    nodes = c.graph.by_name()
    forms = {s.group.signature: [nodes[n].op for n in s.group.nodes] for s in c.steps
             if s.kind == "graph"}
    served = {sig for sig, ops in forms.items()
              if ops[0] == "conv" and set(ops[1:]) <= {"bias_add", "add", "relu"}}
    residual = {sig for sig, ops in forms.items() if ops[:3] == ["conv", "add", "bias_add"]}
    assert bool(residual) == (name != "unet")  # each ResNet block ends so
    assert served  # each of these models has such convs
    checked = 0
    for (bucket, signature), built in c.builds.items():
        if signature in served:
            assert built.has_plan and built.serialized, (bucket, signature, built.note)
            assert built.engine_id is not None and built.candidates > 0
            checked += 1
    assert checked == len(served) * len(c.model.buckets)


@pytest.mark.parametrize("io, channels, engines", [("f32", 3, {11}), ("f16", 4, {32})])
def test_engines_that_fail_with_a_residual_are_passed_over(tmp_path, io: str, channels: int,  # type: ignore[no-untyped-def]
                                                            engines: set[int]) -> None:
    """A conv over few channels whose result takes its input as a residual before its bias: the
    heuristics put first an engine that builds but fails when it runs (generated programs on an
    H100, `graphs.FAILS_WITH_A_RESIDUAL`); the plan saved is another engine's."""
    from dslc.backend.graphs import FAILS_WITH_A_RESIDUAL, make_graph

    src = f"""import "std/nn.cgraph"
model m {{
  precision io={io}, intermediate=f32, compute=f32
  layout NHWC
  input x: [2, {channels}, 8, 12]
  let c = conv2d(x, out={channels}, k=3, pad=1, has_bias=true)
  output y = relu(c + x)
}}"""
    model = check_source(src, tmp_path).model
    lowered, plan = lower_and_fuse(model)
    c = compile_model(model, lowered, plan, load_target("h200"))
    [built] = [b for b in c.builds.values() if "add" in {o.op for o in b.spec.ops}]
    g = make_graph(built.spec, properties=c.target.properties())
    g.create_execution_plans(HEURISTICS)
    first = int(g.get_engine_and_knobs_at_index(0)[0])
    assert first in engines <= FAILS_WITH_A_RESIDUAL  # what the guard is for
    assert built.has_plan and built.serialized, built.note
    assert built.engine_id not in FAILS_WITH_A_RESIDUAL


def test_a_group_cudnn_rejects_is_split_and_retried(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """matmul then layernorm, fused by hand (fusion never proposes it): cuDNN rejects the graph,
    the compiler splits it, and each half is a graph of its own."""
    src = """import "std/nn.cgraph"
model m {
  precision io=f16
  input x: [64, 256]
  param w: [256, 256]
  output y = layer_norm(matmul(x, w)) as "ln"
}"""
    model = check_source(src, tmp_path).model
    lowered, plan = lower_and_fuse(model)
    runs = [n.name for n in lowered.nodes if n.op in ("matmul", "layernorm")]
    fused = make_group(lowered, runs, "by hand")
    hand = FusionPlan(lowered, (fused,), plan.load_time, plan.views)
    c = compile_model(model, lowered, hand, load_target("h200"))
    assert [s.group.nodes for s in c.steps] == [(runs[0],), (runs[1],)]
    assert [s.group.name for s in c.steps] == ["w", "ln"]  # each half after its own anchor
    assert all(s.kind == "graph" for s in c.steps)
    assert "split from the fused group w+ln" in c.steps[0].reason and "cuDNN rejected it" in c.steps[0].reason


def test_exhaustive_search_space_covers_every_engine_and_kernel_config() -> None:
    """`--search exhaustive` candidates from the real library, deviceless: the mlp's matmul group
    offers several engines, each with its kernel configurations, interleaved by engine."""
    from dslc.backend.graphs import knob_space, make_graph

    c = compiled("mlp")
    spec = next(iter(c.specs.values()))
    space = knob_space(make_graph(spec, properties=c.target.properties()), limit=10_000)
    engines = {engine for engine, _ in space}
    assert len(engines) >= 3
    assert len(space) > 10 * len(engines)  # knob values, not one default per engine
    assert len({(e, tuple(sorted(k.items()))) for e, k in space}) == len(space)
    assert [e for e, _ in space[:len(engines)]] == sorted(engines)  # round robin
    assert all(k.get("SPLIT_K_SLC", 1) in (1, 2, 4, 8) for _, k in space)
    assert len(knob_space(make_graph(spec, properties=c.target.properties()), limit=7)) == 7
