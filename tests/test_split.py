"""`runtime.split`: a conv group with a residual whose graph has no plan that runs on a GPU is
run as its conv alone, into scratch memory past the arena, then its epilogue as one kernel.
On the CPU: the epilogue is one pointwise kernel, and the scratch has the strides the conv's
graph alone writes (its spec, from the cuDNN frontend's side of dslc), past the planned arena
and aligned; the GPU run is `tests/gpu/test_ops_gpu.py`'s deviceless cases."""

from __future__ import annotations

from pathlib import Path

from dslc.backend import fused
from dslc.backend.spec import group_spec
from dslc.ir.groups import make_group
from dslc.runtime.bundle import read
from dslc.runtime.schedule import Schedule
from dslc.runtime.split import ALIGN, anchor_spec, parts_of, scratch
from tests.gpu.common import compile_source
from tests.gpu.test_ops_gpu import CASES

# the GPU case whose fused graph no engine ran on an H100 and an H200 (a 1x1 conv with its own
# input as the residual), and two such blocks of one signature (both passed deviceless on an H100, session 31)
SOURCE = CASES["conv_bn_residual_relu_f16"]
TWO_BLOCKS = CASES["two_blocks_each_with_its_input_as_residual_f16"]


def _deviceless(tmp_path: Path) -> Schedule:
    return Schedule(read(compile_source(SOURCE, tmp_path, profile="h200")))


def test_the_epilogue_is_one_kernel_and_the_scratch_is_where_the_conv_alone_writes(
        tmp_path: Path) -> None:
    program = _deviceless(tmp_path)
    [step] = [s for s in program.steps if s.kind == "graph" and len(s.nodes) > 1]
    anchor, rest = step.nodes[0], step.nodes[1:]
    assert program.nodes[anchor].op == "conv" and "add" in [program.nodes[n].op for n in rest]
    epilogue = fused.plan_of(program.nodes, rest, (*step.inputs, anchor), step.outputs)
    assert isinstance(epilogue, fused.Plan)
    assert anchor in [o.name for o in epilogue.operands]  # it reads the conv's result

    memory = program.memory_plan({})
    planned = memory.arena
    scratch(program, memory, anchor)
    s = memory.storage[anchor]
    assert memory.offsets[anchor] % ALIGN == 0 and memory.offsets[anchor] >= planned
    assert memory.arena == memory.offsets[anchor] + s.nbytes
    assert s.nbytes == 2 * 64 * 14 * 14 * 2  # f16
    group = make_group(program.graph, [anchor], step.pattern, placement=program.placement)
    spec = group_spec(program.graph, group, {}, program.env, program.placement)
    [out] = [t for t in spec.tensors if t.role == "output"]
    assert (tuple(out.dims), tuple(out.strides)) == (s.shape, s.strides)  # NHWC: C innermost
    assert s.strides == (64 * 14 * 14, 1, 14 * 64, 64)
    assert (s.base, s.offset) == (anchor, 0)  # a buffer of its own, from its first element




def test_steps_of_one_signature_bind_their_own_values_and_share_one_scratch(
        tmp_path: Path) -> None:
    """Repeated blocks share a signature, and so the anchor's graph; each step must still read
    its own input, weights and residual (a review found the first step's bindings reused)."""
    program = Schedule(read(compile_source(TWO_BLOCKS, tmp_path, profile="h200")))
    steps = [s for s in program.steps if s.kind == "graph" and len(s.nodes) > 1]
    assert len(steps) == 2 and steps[0].signature == steps[1].signature
    memory = program.memory_plan({})
    planned = memory.arena
    parts = parts_of(program, memory, steps, anchor_spec(program, memory, steps[0]))
    assert parts is not None
    (a1, b1, e1), (a2, b2, e2) = parts[steps[0].name], parts[steps[1].name]
    assert [u for u, _ in b1] == [u for u, _ in b2]  # one graph, bound by position
    v1, v2 = dict(b1), dict(b2)
    assert set(v1.values()) & set(v2.values()) == set()  # no value of one block in the other
    assert a1 in v1.values() and a2 in v2.values()  # each writes its own anchor's result
    assert {o.name for o in e1.operands} >= {a1, "x"} and a2 in {o.name for o in e2.operands}
    assert memory.offsets[a1] == memory.offsets[a2] >= planned  # one scratch past the plan
    assert memory.arena == memory.offsets[a1] + memory.storage[a1].nbytes


def test_the_anchor_s_graph_is_its_conv_alone_at_sizes_of_derived_dims(tmp_path: Path) -> None:
    """The batch a dim made of another (M = N // 2: only the dims' environment gives it), the
    anchor's graph at N=12: the conv alone, writing the scratch of M=6 images."""
    source = SOURCE.replace("input x: [2, 64, 14, 14]",
                            "dim N = 2..16\n  dim M = N // 2\n  input x: [M, 64, 14, 14]")
    assert source != SOURCE
    program = Schedule(read(compile_source(source, tmp_path, profile="h200")))
    [step] = [s for s in program.steps if s.kind == "graph" and len(s.nodes) > 1]
    memory = program.memory_plan({"N": 12})
    spec = anchor_spec(program, memory, step)
    assert [(o.op, o.node) for o in spec.ops] == [("conv", step.nodes[0])]
    scratch(program, memory, step.nodes[0])
    s = memory.storage[step.nodes[0]]
    assert s.shape == (6, 64, 14, 14)
    [out] = [t for t in spec.tensors if t.role == "output"]
    assert (tuple(out.dims), tuple(out.strides)) == (s.shape, s.strides)


PLACED_INPUT = CASES["conv_bn_residual_relu_f16"].split("model m")[0] + """model m {
  precision io=f16
  layout NHWC
  input x: [2, 64, 14, 14]
  let a = relu(x * 2.0)
  let c = conv2d(a, out=64, k=1)
  output y = relu(c)
  output both = concat([a, x], axis=1)
}"""


def test_an_anchor_reading_a_value_written_into_a_concat_reads_it_through_the_slice(
        tmp_path: Path) -> None:
    """`a` is written in place into the first 64 of `both`'s 128 channels (NHWC): the conv
    alone reads it at a pitch of 128 channels, as the memory holds it, not densely."""
    program = Schedule(read(compile_source(PLACED_INPUT, tmp_path, profile="h200")))
    assert program.placement["a"][0] == "both"
    [step] = [s for s in program.steps if s.kind == "graph" and program.nodes[s.nodes[0]].op
              == "conv"]
    memory = program.memory_plan({})
    spec = anchor_spec(program, memory, step)
    [a] = [t for t in spec.tensors if t.role == "input" and tuple(t.dims) == (2, 64, 14, 14)]
    assert tuple(a.strides) == memory.storage["a"].strides == (128 * 14 * 14, 1, 14 * 128, 128)
    parts = parts_of(program, memory, [step], spec)
    assert parts is not None
    [(anchor, bindings, _)] = parts.values()
    assert anchor == step.nodes[0] and "a" in dict(bindings).values()
