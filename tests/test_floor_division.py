"""`//` on dims and integers: floor division by a positive integer (`pad = k // 2`), a dim of
its own where the dim's alignment does not make it exact; tensors and floats are refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import check_source


def _shape_of(text: str, tmp_path: Path, output: str = "y") -> tuple[object, ...]:
    checked = check_source(text, tmp_path)
    model = checked.model
    node = dict((n.name, n) for n in model.graph.nodes)[dict(model.graph.outputs)[output]]
    return node.type.shape


def test_same_padding_written_as_k_floor_2_keeps_the_size(tmp_path: Path) -> None:
    text = """import "std/nn.cgraph"
def block(x: [N, C, H, W], k: int) -> [N, C, H, W] {
  let c = conv2d(x, out=C, k=k, pad=k // 2)
  return c
}
model m {
  input x: [2, 4, 9, 9]
  output y = block(x, k=5) as "b"
}
"""
    assert _shape_of(text, tmp_path) == (2, 4, 9, 9)


@pytest.mark.parametrize(("expr", "value"), [("7 // 2", 3), ("8 // 2", 4), ("(0 - 7) // 2", -4 + 5),
                                             ("9 // 3 * 2", 6), ("1 // 4 + 1", 1)])
def test_integer_floor_division_rounds_down(expr: str, value: int, tmp_path: Path) -> None:
    # (0 - 7) // 2 is -4: one more than that is shown as a size by adding 5.
    text = f"model m {{\n  input x: [{expr}{' + 5' if expr.startswith('(0') else ''}]\n" \
           "  output y = relu(x)\n}\n"
    assert _shape_of(text, tmp_path) == (value,)


def test_an_aligned_dim_halves_exactly_and_others_get_a_floor(tmp_path: Path) -> None:
    text = """model m {
  dim H = 8..32 align 2
  dim L = 3..9
  input x: [H, L]
  input w: [L // 2]
  output y = reshape(x, [H // 2, 2, L])
  output z = relu(w)
}
"""
    checked = check_source(text, tmp_path)
    assert checked.codes == []
    assert "⌊" in str(_shape_of(text, tmp_path, "z")[0])
    assert str(_shape_of(text, tmp_path, "y")[0]) != str(_shape_of(text, tmp_path, "z")[0])


@pytest.mark.parametrize(("body", "code"), [("x // 2", "E0209"), ("1.5 // 2", "E0209"),
                                            ("x[0:4 // 0]", "E0305"), ("x[0:4 // (0 - 2)]", "E0305")])
def test_floor_division_of_tensors_floats_or_by_a_non_positive_number_is_refused(
        body: str, code: str, tmp_path: Path) -> None:
    checked = check_source(f"model m {{\n  input x: [4]\n  output y = {body}\n}}\n", tmp_path)
    assert code in checked.codes, checked.codes
