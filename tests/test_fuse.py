"""Fusion: the groups the example models form, and a reason for every op left alone."""

from __future__ import annotations

from collections import Counter

import pytest

from dslc.diag.diagnostic import Sink
from dslc.fuse import FusionPlan, format_plan
from dslc.pipeline import Options, front_end, middle_end
from tests.conftest import ROOT


def _plan(name: str) -> FusionPlan:
    result = front_end(ROOT / "models" / f"{name}.cgraph", Options(), Sink())
    assert result.model is not None
    return middle_end(result.model)[1]


def _ops(plan: FusionPlan, group_index: int) -> list[str]:
    nodes = plan.graph.by_name()
    return [nodes[n].op for n in plan.groups[group_index].nodes]


@pytest.mark.parametrize("name, convs, blocks", [("resnet18", 20, 8), ("resnet50", 53, 16)])
def test_every_resnet_conv_chain_is_one_group(name: str, convs: int, blocks: int) -> None:
    plan = _plan(name)
    conv_groups = [i for i, g in enumerate(plan.groups) if g.pattern == "conv_epilogue"]
    assert len(conv_groups) == convs
    chains = Counter(tuple(_ops(plan, i)) for i in conv_groups)
    # conv + folded batchnorm (bias) + relu; the last conv of a block also takes the residual add;
    # a projection shortcut is conv + bias, read by the block's last group.
    assert chains[("conv", "bias_add", "add", "relu")] == blocks
    assert set(chains) == {("conv", "bias_add", "relu"), ("conv", "bias_add", "add", "relu"),
                           ("conv", "bias_add")}
    assert not any(n.op == "batchnorm" for n in plan.graph.nodes)


def test_resnet50_repeated_blocks_share_signatures() -> None:
    plan = _plan("resnet50")
    counts = plan.shared_signatures()
    assert len(plan.groups) == 56 and len(counts) == 27
    # layer3's six conv3 groups (1x1 + bias + residual + relu) are one graph: the residual
    # is read from outside, whether it is the projection or the block's input.
    assert max(counts.values()) == 6


def test_encoder_groups() -> None:
    plan = _plan("encoder")
    chains = Counter(tuple(_ops(plan, i)) for i in range(len(plan.groups)))
    layers = 12
    assert chains[("matmul", "bias_add")] == 3 * layers  # q, k, v projections
    assert chains[("matmul", "bias_add", "add")] == 2 * layers  # out_proj and fc2 + residual
    assert chains[("matmul", "bias_add", "gelu")] == layers  # fc1 + bias + GELU
    assert chains[("sdpa",)] == layers
    assert chains[("layernorm",)] == 2 * layers + 1
    assert sum(chains.values()) == len(plan.groups) == 109
    assert len(plan.shared_signatures()) == 6  # every layer compiles to the same six graphs


def test_mlp_is_three_matmul_epilogues() -> None:
    plan = _plan("mlp")
    assert [tuple(_ops(plan, i)) for i in range(3)] == [
        ("matmul", "bias_add", "relu"), ("matmul", "bias_add", "gelu"), ("matmul", "bias_add")]


@pytest.mark.parametrize("name", ["mlp", "resnet18", "resnet50", "encoder", "unet"])
def test_every_op_running_alone_has_a_reason(name: str) -> None:
    plan = _plan(name)
    for g in plan.groups:
        if len(g.nodes) == 1 and g.pattern not in ("sdpa",):
            assert g.reason, f"{name}: %{g.nodes[0]} runs alone without a reason"
    assert "why alone:" in format_plan(plan) or name in ("mlp", "encoder")


def test_groups_are_in_dependency_order() -> None:
    for name in ("resnet50", "unet", "encoder"):
        plan = _plan(name)
        produced = {n.name for n in plan.graph.nodes if n.op in ("input", "param", "scalar")}
        produced |= set(plan.load_time) | set(plan.views)
        for g in plan.groups:
            for value in g.inputs:
                assert value in produced, f"{name}: group {g.name} reads %{value} too early"
            produced |= set(g.nodes)
