"""`Schedule.by_ops`: the last resort of a group with no cuDNN plan that runs on this GPU and no
kernel of its own (a deviceless bundle's reduction with its pointwise tail, where cuDNN on the
device proposes no engine) is its ops' fallback kernels one after the other. On the CPU: which
steps may run so; the GPU run is `tests/gpu/test_ops_gpu.py`'s
`test_a_model_whose_groups_have_no_plan_here_runs_on_its_fallback_kernels`."""

from __future__ import annotations

from pathlib import Path

from dslc.runtime.bundle import read
from dslc.runtime.schedule import Schedule
from tests.gpu.common import compile_source
from tests.gpu.test_ops_gpu import CASES


def _program(name: str, tmp_path: Path) -> Schedule:
    return Schedule(read(compile_source(CASES[name], tmp_path, profile="h200")))


def test_a_reduction_with_its_pointwise_tail_has_no_kernel_but_runs_op_by_op(
        tmp_path: Path) -> None:
    program = _program("reductions_f32", tmp_path)
    [step] = [s for s in program.steps if s.name == "a.reduce_l2.sum+sqrt"]
    assert [program.nodes[n].op for n in step.nodes] == ["reduce_sum", "sqrt"]
    assert not program.has_kernel(step)  # before: start-up stopped with R0802
    assert program.by_ops(step)


def test_a_conv_group_runs_op_by_op_where_it_cannot_be_split(tmp_path: Path) -> None:
    program = _program("conv_bn_residual_relu_f16", tmp_path)
    [step] = [s for s in program.steps if len(s.nodes) > 1]
    assert not program.has_kernel(step) and program.by_ops(step)


def test_a_step_of_one_op_is_not_run_op_by_op_it_has_its_kernel(tmp_path: Path) -> None:
    program = _program("reductions_f32", tmp_path)
    [step] = [s for s in program.steps if s.name == "mx"]
    assert program.has_kernel(step) and not program.by_ops(step)


def test_an_inner_value_written_into_another_s_memory_keeps_the_group_from_running_op_by_op(
        tmp_path: Path) -> None:
    """An inner value placed in a concat's slice has no memory of its own to run through."""
    program = _program("reductions_f32", tmp_path)
    [step] = [s for s in program.steps if s.name == "a.reduce_l2.sum+sqrt"]
    program.placement[step.nodes[0]] = program.placement.get(step.nodes[0], ("x", ()))
    assert not program.by_ops(step)


def test_only_ops_without_a_kernel_of_their_own_are_said_to_run_on_the_reference() -> None:
    """R0803 names the fallback ops that compute on CuPy's reference (a matmul on cuBLAS, which
    a CUDA graph's capture refuses); a pointwise op of a group run op by op is one kernel."""
    from dslc.backend.kernels import on_the_reference

    assert on_the_reference("matmul", [(4, 8), (8, 2)], "f16", {})
    assert not on_the_reference("relu", [(4, 8)], "f16", {})
    assert not on_the_reference("reduce_max", [(4, 8)], "f16", {"axes": (1,)})  # its kernel


def test_a_group_with_an_fp8_value_is_not_run_op_by_op(tmp_path: Path) -> None:
    """The ops' kernels take no fp8 (an op's reference would read an e4m3 tensor's bytes as
    integers): a group that makes or reads one runs its own kernel or stops with R0802."""
    from tests.test_fp8_deviceless import FP8_CONV

    program = Schedule(read(compile_source(FP8_CONV, tmp_path, profile="h200")))
    [step] = [s for s in program.steps if program.nodes[s.nodes[-1]].type.dtype == "f8e4m3"
              and len(s.nodes) > 1]  # the activation's quantising cast
    assert program.has_kernel(step) and not program.by_ops(step)
