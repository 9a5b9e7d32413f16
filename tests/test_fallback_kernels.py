"""What the fallback kernels' choice of route rests on, checked without a GPU (the kernels'
numbers are checked on the H200: `tests/gpu/test_ops_gpu.py`,
`test_every_pointwise_fallback_kernel_equals_the_ops_reference`)."""

from __future__ import annotations

import re

from dslc.backend import fused, kernels
from dslc.ops import OPS


def test_every_one_kernel_pointwise_form_is_a_pointwise_op_with_a_reference() -> None:
    for op in fused.POINTWISE:
        assert OPS[op].family == "pointwise" and OPS[op].reference is not None, op


def test_every_attribute_a_form_reads_is_a_param_of_its_op() -> None:
    for op, expr in fused.POINTWISE.items():
        for name in re.findall(r"\{(\w+)\}", expr):
            param = OPS[op].param(name)
            assert param is not None and not param.is_tensor, (op, name)


def test_a_form_reads_as_many_operands_as_its_op_takes() -> None:
    for op, expr in fused.POINTWISE.items():
        used = {v for v in "abc" if re.search(rf"\b{v}\b", expr)}
        arity = len(OPS[op].tensor_params)
        assert used == set("abc"[:arity]), (op, used, arity)


def test_attribute_values_are_written_as_exact_float_literals() -> None:
    assert fused._literal(0.01) == "0.01f" and fused._literal(3) == "3.0f"
    assert float(fused._literal(1 / 3)[:-1]) == 1 / 3  # repr: the shortest exact digits
    assert fused._literal(float("nan")) == "__int_as_float(0x7fc00000)"
    assert fused._literal(float("-inf")) == "__uint_as_float(0xff800000u)"


def test_only_value_moving_ops_of_one_dtype_skip_the_conversion_to_f32() -> None:
    class Arr:
        def __init__(self, dtype: str) -> None:
            self.dtype = dtype

    assert kernels._moves_values("contiguous", [Arr("uint16")], Arr("uint16"))
    assert not kernels._moves_values("contiguous", [Arr("float16")], Arr("float32"))
    assert not kernels._moves_values("add", [Arr("float16"), Arr("float16")], Arr("float16"))
