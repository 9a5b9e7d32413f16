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
from dslc.runtime.split import ALIGN, scratch
from tests.gpu.common import compile_source

# the GPU case whose every engine failed on an H100 and an H200 (a 1x1 conv, its own input
# as the residual)
SOURCE = """import "std/nn.cgraph"
model m {
  precision io=f16
  layout NHWC
  input x: [2, 64, 14, 14]
  let c = conv2d(x, out=64, k=1)
  let b = batchnorm2d(c)
  output y = relu(b + x)
}
"""


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
