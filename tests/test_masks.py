"""Masks between steps: cuDNN stores a bool tensor as bits (eight to a byte, seen on the H200),
numpy, CuPy, the fallback kernels and callers as bytes. A mask stays bits only from a cuDNN
graph to cuDNN graphs that read it as written; wherever else it goes, every step that writes or
reads it runs as a fallback kernel (compile.stage.masks_as_bytes)."""

from __future__ import annotations

from pathlib import Path

from dslc.backend.target import load_target
from dslc.compile.stage import MASK_AS_BYTES, compile_model
from dslc.pipeline import lower_and_fuse
from tests.helpers import check_source


def _runs(text: str, tmp_path: Path) -> dict[str, str]:
    """The op of each step -> where it runs ("graph" or "kernel")."""
    model = check_source(text, tmp_path).model
    lowered, plan = lower_and_fuse(model)
    c = compile_model(model, lowered, plan, load_target("h200"))
    nodes = c.graph.by_name()
    out: dict[str, str] = {}
    for s in c.steps:
        for n in s.group.nodes:
            out[nodes[n].op] = s.kind
            if s.kind == "kernel" and nodes[n].op in ("select", "cmp_gt", "contiguous"):
                assert s.reason == MASK_AS_BYTES or "fallback" in s.reason, s.reason
    signatures = {s.group.signature for s in c.steps if s.kind == "graph"}
    assert {sig for _, sig in c.builds} == signatures  # no graph left over for a kernel step
    return out


def test_a_mask_from_a_cudnn_comparison_to_a_select_stays_in_cudnn(tmp_path: Path) -> None:
    runs = _runs("""model m {
  input a: [2, 8, 5, 6]
  input b: [2, 8, 5, 6]
  output o = select(a > 0.5, a, b) * 2.0
}
""", tmp_path)
    assert runs == {"cmp_gt": "graph", "select": "graph", "mul": "graph"}


def test_a_mask_given_by_the_caller_is_read_by_a_fallback_kernel(tmp_path: Path) -> None:
    runs = _runs("""model m {
  input m: bool[2, 8]
  input x: [2, 8]
  output y = select(m, x, x * 2.0)
}
""", tmp_path)
    assert runs == {"mul": "graph", "select": "kernel"}


def test_a_mask_returned_to_the_caller_is_written_by_a_fallback_kernel(tmp_path: Path) -> None:
    runs = _runs("""model m {
  input x: [2, 8]
  output m: bool[2, 8] = x > 0.0
}
""", tmp_path)
    assert runs == {"cmp_gt": "kernel"}


def test_a_mask_read_through_a_view_is_bytes_from_its_comparison_on(tmp_path: Path) -> None:
    runs = _runs("""model m {
  input a: [2, 8, 4]
  input b: [2, 4, 8]
  output o = select(transpose(a > 0.0, [0, 2, 1]), b, 1.5)
}
""", tmp_path)
    assert runs == {"cmp_gt": "kernel", "contiguous": "kernel", "select": "kernel"}


def test_a_mask_computed_at_load_time_is_read_by_a_fallback_kernel(tmp_path: Path) -> None:
    runs = _runs("""model m {
  input x: [2, 8]
  param p: [8]
  output y = select(p > 0.0, x, 0.5)
}
""", tmp_path)
    assert runs["select"] == "kernel"


def test_a_cast_of_a_mask_of_bytes_leaves_the_rest_of_its_group_to_cudnn(tmp_path: Path) -> None:
    runs = _runs("""model m {
  input m: bool[2, 8]
  output y = cast(m, f32) * 3.0 + 1.0
}
""", tmp_path)
    assert runs == {"cast": "kernel", "mul": "graph", "add": "graph"}
    model = check_source("""model m {
  input m: bool[2, 8]
  output y = cast(m, f32) * 3.0 + 1.0
}
""", tmp_path).model
    lowered, plan = lower_and_fuse(model)
    c = compile_model(model, lowered, plan, load_target("h200"))
    assert [len(s.group.nodes) for s in c.steps] == [1, 2]  # mul and add stay one graph
