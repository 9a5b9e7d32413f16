"""An output's declared memory order against its node's in the graph (`runtime.manifest`): two
orders that differ only where an axis has one element are the same bytes and pass; any other
difference is refused. Found by a generated program (seed 106, program 119): a pointwise op
moved through a reshape that added axes of one element took the order 1, 0, 2, 3, 4, and the
compile stopped on its own manifest."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from dslc.runtime import manifest
from dslc.runtime.fields import BundleError
from tests.helpers import deviceless_program

MODEL = """
model m {
  precision io=bf16, intermediate=f32, compute=f32
  dim N = 1..6 tune [1, 6]
  input x: [N, 1, 6, 11]
  output y = reshape(hardswish(x), shape=[N, 1, 1, 6, 11])
}
"""


def test_a_pointwise_op_moved_through_a_reshape_of_size_1_axes_compiles(tmp_path: Path) -> None:
    _, program = deviceless_program(MODEL, tmp_path)
    node = program.nodes[program.outputs["y"]]
    declared = program.bundle.manifest.outputs[0]
    assert node.type.layout is not None and declared.layout is not None
    assert tuple(node.type.layout.order) != tuple(declared.layout)  # other words, same bytes


def _node(shape: tuple[int, ...], order: tuple[int, ...]) -> SimpleNamespace:
    return SimpleNamespace(name="v", type=SimpleNamespace(dtype="f16", shape=shape,
                                                         layout=SimpleNamespace(order=order)))


def _declared(shape: tuple[int, ...], order: tuple[int, ...] | None) -> manifest.Declared:
    return manifest.Declared("y", "f16", shape, order, manifest.Where("m.cgraph", 1, 1))


def test_orders_that_differ_only_at_axes_of_one_element_are_the_same_type() -> None:
    manifest._same_type(_declared((2, 1, 3), (0, 1, 2)), _node((2, 1, 3), (1, 0, 2)), "p")


@pytest.mark.parametrize(("declared", "order"), [((0, 1, 2), (0, 2, 1)), (None, (0, 1, 2))])
def test_orders_that_lay_out_other_bytes_are_refused(
        declared: tuple[int, ...] | None, order: tuple[int, ...]) -> None:
    with pytest.raises(BundleError, match="differs from its node"):
        manifest._same_type(_declared((2, 4, 3), declared), _node((2, 4, 3), order), "p")
