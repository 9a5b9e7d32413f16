"""Fusion: the groups the example models form, and a reason for every op left alone. Expected
counts come from the models' structure: the checked (unfused) graph, or the independent PyTorch
modules of tests/torch_models.py built on the meta device (shapes only)."""

from __future__ import annotations

from collections import Counter
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import torch

from dslc.check.checker import CheckedModel
from dslc.diag.diagnostic import Sink
from dslc.fuse import FusionPlan, format_plan
from dslc.fuse.patterns import EPILOGUE, PATTERNS
from dslc.pipeline import Options, front_end, lower_and_fuse
from tests import torch_models
from tests.conftest import ROOT


@cache
def _model(name: str) -> CheckedModel:
    result = front_end(ROOT / "models" / f"{name}.cgraph", Options(), Sink())
    assert result.model is not None
    return result.model


def _plan(name: str) -> FusionPlan:
    return lower_and_fuse(_model(name))[1]


def _ops_of(name: str, op: str, rank: int | None = None) -> int:
    """How many `op` nodes the checked model has (of that result rank)."""
    return sum(n.op == op and (rank is None or len(n.type.shape) == rank)
               for n in _model(name).graph.nodes)


def _ops(plan: FusionPlan, group_index: int) -> list[str]:
    nodes = plan.graph.by_name()
    return [nodes[n].op for n in plan.groups[group_index].nodes]


@pytest.mark.parametrize("name", ["resnet18", "resnet50"])
def test_every_resnet_conv_chain_is_one_group(name: str) -> None:
    plan = _plan(name)
    convs = _ops_of(name, "conv")
    blocks = _ops_of(name, "add", rank=4)  # each residual block ends in one add
    assert convs and blocks
    conv_groups = [i for i, g in enumerate(plan.groups) if g.pattern == "conv_epilogue"]
    assert len(conv_groups) == convs
    chains = Counter(tuple(_ops(plan, i)) for i in conv_groups)
    # conv + folded batchnorm (bias) + relu; the last conv of a block also takes the residual add,
    # before its bias (cuDNN's order); a projection shortcut is conv + bias, read by the block's
    # last group.
    assert chains[("conv", "add", "bias_add", "relu")] == blocks
    assert set(chains) == {("conv", "bias_add", "relu"), ("conv", "add", "bias_add", "relu"),
                           ("conv", "bias_add")}
    assert not any(n.op == "batchnorm" for n in plan.graph.nodes)


def _resnet50_convs() -> list[tuple[Any, ...]]:
    """Each conv of PyTorch's ResNet-50 as the graph it compiles to: channels, kernel, stride,
    input size and epilogue (the last conv of a block takes the residual, a projection has no
    relu, the others end in relu)."""
    with torch.device("meta"):
        net = torch_models.resnet50()
    keys: list[tuple[Any, ...]] = []
    for name, conv in net.named_modules():
        if isinstance(conv, torch.nn.Conv2d):
            role = ("projection" if name.endswith("downsample.0") else
                    "residual" if name.endswith("conv3") else "relu")
            conv.register_forward_hook(lambda m, xs, y, role=role: keys.append(
                (m.in_channels, m.out_channels, m.kernel_size, m.stride, tuple(xs[0].shape[2:]),
                 role)))
    with torch.no_grad():
        net(torch.empty(1, 3, 224, 224, device="meta"))
    return keys


def test_resnet50_repeated_blocks_share_signatures() -> None:
    plan = _plan("resnet50")
    counts = plan.shared_signatures()
    convs = Counter(_resnet50_convs())
    # besides the convs: the stem's max pooling, the global average, the classifier (matmul+bias)
    others = 3
    assert len(plan.groups) == sum(convs.values()) + others
    assert len(counts) == len(convs) + others
    # e.g. layer3's six conv3 groups (1x1 + bias + residual + relu) are one graph: the residual
    # is read from outside, whether it is the projection or the block's input.
    assert max(counts.values()) == max(convs.values())


def test_encoder_groups() -> None:
    plan = _plan("encoder")
    chains = Counter(tuple(_ops(plan, i)) for i in range(len(plan.groups)))
    with torch.device("meta"):
        net = torch_models.Encoder()
    layers = len(net.encoder.layer)
    assert layers == _ops_of("encoder", "sdpa")
    assert chains[("matmul", "bias_add")] == layers  # q, k, v packed into one (lower/packing.py)
    assert chains[("matmul", "bias_add", "add")] == 2 * layers  # out_proj and fc2 + residual
    assert chains[("matmul", "bias_add", "gelu")] == layers  # fc1 + bias + GELU
    assert chains[("sdpa",)] == layers
    assert chains[("layernorm",)] == 2 * layers + 1
    assert sum(chains.values()) == len(plan.groups) == (1 + 2 + 1 + 1 + 2) * layers + 1
    # one layer's distinct graphs, from its Linear shapes: q/k/v are one (packed); out_proj and fc2
    # (with the residual) differ in shape; fc1 ends in GELU; plus attention and layer norm
    layer = net.encoder.layer[0]
    linear = {(name.rsplit(".", 1)[-1] in ("out_proj", "fc2"), name.endswith("fc1"),
               tuple(m.weight.shape)) for name, m in layer.named_modules()
              if isinstance(m, torch.nn.Linear)}
    assert len(plan.shared_signatures()) == len(linear) + 2  # every layer compiles to these


def test_mlp_is_three_matmul_epilogues() -> None:
    plan = _plan("mlp")
    assert [tuple(_ops(plan, i)) for i in range(3)] == [
        ("matmul", "bias_add", "relu"), ("matmul", "bias_add", "gelu"), ("matmul", "bias_add")]


@pytest.mark.parametrize("name", ["mlp", "resnet18", "resnet50", "encoder", "unet"])
def test_every_op_running_alone_has_a_reason(name: str) -> None:
    plan = _plan(name)
    alone = [g for g in plan.groups if len(g.nodes) == 1]
    for g in alone:
        if g.pattern != "sdpa":
            assert g.reason, f"{name}: %{g.nodes[0]} runs alone without a reason"
    assert format_plan(plan).count("why alone:") == len(alone)  # mlp: none, and none printed


def test_groups_are_in_dependency_order() -> None:
    for name in ("resnet50", "unet", "encoder", "llama_decode", "sd_down_block"):
        plan = _plan(name)
        produced = {n.name for n in plan.graph.nodes if n.op in ("input", "param", "scalar")}
        produced |= set(plan.load_time) | set(plan.views)
        for g in plan.groups:
            for value in g.inputs:
                assert value in produced, f"{name}: group {g.name} reads %{value} too early"
            produced |= set(g.nodes)


def test_pattern_table_takes_its_ops_from_the_op_table() -> None:
    # Written out by hand from what cuDNN fuses: the anchors of each pattern, and the epilogue
    # ops (cuDNN's pointwise modes, bias, scale, identity; no comparisons, select or copies).
    unary = {"relu", "leaky_relu", "clamp", "gelu", "gelu_tanh", "silu", "swish", "sigmoid",
             "tanh", "elu", "softplus", "exp", "log", "sqrt", "rsqrt", "abs", "neg", "reciprocal",
             "sin", "cos", "erf", "floor", "ceil", "hardsigmoid", "hardswish"}
    binary = {"add", "sub", "mul", "div", "max", "min", "pow"}
    assert unary | binary | {"bias_add", "scale_mul", "cast"} == EPILOGUE
    reductions = {"reduce_sum", "reduce_mean", "reduce_max", "reduce_min", "reduce_amax",
                  "reduce_prod", "reduce_l1", "reduce_l2"}
    assert {p.name: set(p.anchors) for p in PATTERNS} == {
        "sdpa": {"sdpa"}, "conv_epilogue": {"conv", "conv_transpose"},
        "matmul_epilogue": {"matmul"},
        "norm_epilogue": {"layernorm", "rmsnorm", "instancenorm", "batchnorm"},
        "reduce_epilogue": reductions, "pointwise": EPILOGUE}


def _snippet_plan(body: str, tmp_path: Path) -> FusionPlan:
    from tests.helpers import check_source, model_snippet

    model = check_source(model_snippet(body), tmp_path).model
    assert model is not None
    return lower_and_fuse(model)[1]


def test_pointwise_values_computed_only_for_one_op_join_its_group(tmp_path: Path) -> None:
    """`a * b + c * d` is one step: the product beside the chain joins it (before the add that
    reads it); so do the values it alone reads (`-c`)."""
    plan = _snippet_plan("""  input a: [4, 8]
  input b: [4, 8]
  input c: [4, 8]
  output y = a * b + (-c) * relu(a)""", tmp_path)
    [group] = plan.groups
    nodes = plan.graph.by_name()
    ops = [nodes[n].op for n in group.nodes]
    assert sorted(ops) == ["add", "mul", "mul", "neg", "relu"] and ops[-1] == "add"
    done: set[str] = set()
    for n in group.nodes:  # each member after the members it reads
        assert all(i in done or i not in group.nodes for i in nodes[n].inputs), group.nodes
        done.add(n)
    assert group.outputs == (group.nodes[-1],)


@pytest.mark.parametrize(("body", "groups"), [
    # the product is also an output: it is stored, and the add reads it
    ("""  let r = relu(a)
  output p = a * b
  output y = r + p""", [["relu", "add"], ["mul"]]),
    # the product is read twice: it is stored once
    ("""  let r = relu(a)
  let p = a * b
  output y = r + p
  output z = relu(p)""", [["relu", "add"], ["mul"], ["relu"]]),
    # the product broadcasts to the add's shape: it keeps a step of its own
    ("""  let r = relu(a)
  let p = a[0:1, :] * b[0:1, :]
  output y = r + p""", [["relu", "add"], ["mul"]]),
    # the negation is stored column-major (it reads a transposed view), the sum row-major
    ("""  let r = relu(a)
  let p = -transpose(c, [1, 0])
  output y = r + p""", [["relu", "add"], ["neg"]]),
    # a concatenation is no pointwise op
    ("""  let r = relu(a)
  let p = concat([a[:, 0:4], b[:, 4:8]], axis=1)
  output y = r + p""", [["relu", "add"], ["concat"]]),
    # a value of the params alone is computed at load time
    ("""  let r = relu(a)
  output y = r + w * 2.0""", [["relu", "add"]]),
    # the product comes first: its chain reaches the add and takes the relu beside it
    ("""  let p = a * b
  let r = relu(a)
  output y = r + p""", [["mul", "relu", "add"]]),
])
def test_a_value_read_elsewhere_or_unlike_its_reader_keeps_its_own_step(
        body: str, groups: list[list[str]], tmp_path: Path) -> None:
    plan = _snippet_plan("  input a: [4, 8]\n  input b: [4, 8]\n  input c: [8, 4]\n"
                         "  param w: [4, 8]\n" + body, tmp_path)
    nodes = plan.graph.by_name()
    got = sorted([nodes[n].op for n in g.nodes] for g in plan.groups)
    assert got == sorted(groups), [g.nodes for g in plan.groups]
    members = [n for g in plan.groups for n in g.nodes]
    assert len(members) == len(set(members))  # each op in one group


@pytest.mark.parametrize(("body", "groups"), [
    # a float chain read by the expand alone ends in it: one group (one kernel)
    ("""  output y = expand(relu(a) * 2.0, [3, 4, 8])""", [["relu", "mul", "expand"]]),
    # the chain's value is also an output: stored, and the expand reads it
    ("""  let r = relu(a)
  output s = r
  output y = expand(r, [3, 4, 8])""", [["relu"], ["expand"]]),
    # an expand is a chain's last op: what reads it starts another group
    ("""  output y = expand(relu(a), [3, 4, 8]) + 1.0""", [["relu", "expand"], ["add"]]),
    # an integer broadcast runs on its own, exactly
    ("""  output y = expand(i + 1, [3, 4, 8])""", [["add"], ["expand"]]),
    # a matmul keeps the epilogues cuDNN measured: no broadcast tail
    ("""  output y = expand(matmul(a, v), [3, 4, 2])""", [["matmul"], ["expand"]]),
])
def test_a_pointwise_chain_may_end_in_an_expand(body: str, groups: list[list[str]],
                                                tmp_path: Path) -> None:
    plan = _snippet_plan("  input a: [4, 8]\n  input i: i32[4, 8]\n  param v: [8, 2]\n" + body,
                         tmp_path)
    nodes = plan.graph.by_name()
    got = sorted([nodes[n].op for n in g.nodes] for g in plan.groups)
    assert got == sorted(groups), [g.nodes for g in plan.groups]


def test_a_matmul_keeps_its_chain() -> None:
    """Only pointwise groups take values beside their chain: cuDNN's matmul and conv graphs
    keep the epilogues they were measured with (the decoder's SwiGLU `silu(gate) * up`)."""
    plan = _plan("llama_decode")
    nodes = plan.graph.by_name()
    for g in plan.groups:
        if g.pattern in ("matmul_epilogue", "conv_epilogue"):
            for a, b in zip(g.nodes, g.nodes[1:], strict=False):
                assert a in nodes[b].inputs, g.nodes


def test_rotary_is_two_steps_writing_its_halves_in_place() -> None:
    """`x * cos + rotate_half(x) * sin` per half of x (`lower/concat.py`): each half's products
    and sum one step (the values beside the chain join it), written into the concatenation in
    place, which then copies nothing."""
    plan = _plan("llama_decode")
    nodes = plan.graph.by_name()
    halves = [sorted(nodes[n].op for n in g.nodes) for g in plan.groups
              if len(g.nodes) > 1 and all(nodes[n].op in EPILOGUE for n in g.nodes)]
    layers = _ops_of("llama_decode", "sdpa")
    assert sorted(halves) == sorted([["add", "mul", "mul"], ["add", "mul", "mul", "neg"]] * 2
                                    * layers)
    concats = [n for n in plan.graph.nodes if n.op == "concat" and n.name.endswith((".q", "k_new"))]
    assert len(concats) == 2 * layers
    assert all(set(c.inputs) <= set(plan.placement) for c in concats)
