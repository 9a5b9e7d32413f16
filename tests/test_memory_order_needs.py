"""What cuDNN needs of the memory it reads, met at compile time (found by generated programs on
the H200): an op's memory-order needs (`OpDef.needs`) are met by a row-major copy, so cuDNN runs
the op instead of a CuPy fallback; a view that starts off a 16-byte boundary is copied by a CuPy
kernel before cuDNN reads it (its 16-byte vector loads crashed the GPU)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from dslc.backend.target import load_target
from dslc.compile.stage import compile_model
from dslc.pipeline import lower_and_fuse
from tests.helpers import check_source


def _compiled(text: str, tmp_path: Path):  # type: ignore[no-untyped-def]
    model = check_source(text, tmp_path).model
    lowered, plan = lower_and_fuse(model)
    return compile_model(model, lowered, plan, load_target("h200"))


def test_a_matmul_batched_over_an_nhwc_conv_output_reads_a_copy_and_runs_on_cudnn(
        tmp_path: Path) -> None:
    c = _compiled("""model m {
  input x: [2, 1, 7, 9]
  param w: [16, 1, 5, 5]
  param p: [2, 32]
  let y = conv(x, w, stride=3)
  output o = matmul(y, p)
}
""", tmp_path)
    nodes = c.graph.by_name()
    kinds = Counter(s.kind for s in c.steps)
    assert kinds == {"graph": 3}, [(s.kind, s.reason) for s in c.steps]
    copies = [n for n in c.graph.nodes if n.op == "contiguous"]
    assert [n.name for n in copies] == ["y.row_major"]
    matmul = next(n for n in c.graph.nodes if n.op == "matmul")
    assert matmul.inputs[0] == "y.row_major" and nodes["y"].type.layout is not None


def test_a_view_starting_off_a_16_byte_boundary_is_copied_by_a_kernel_first(tmp_path: Path,
                                                                           ) -> None:
    """f32 views of a [2, 4] input starting at element 1 (4 bytes) and 2 (8 bytes) are copied
    on CuPy before cuDNN reads them; the one at element 0 is read in place."""
    c = _compiled("""model m {
  precision io=f16
  input x: f32[2, 4]
  output a = cast(x[:, 1:3], f16)
  output b = cast(x[:, 2:4], f16)
  output c = cast(x[:, 0:2], f16)
}
""", tmp_path)
    nodes = c.graph.by_name()
    kernels = [s.group.nodes for s in c.steps if s.kind == "kernel"]
    assert kernels == [("a.slice.aligned",), ("b.slice.aligned",)]
    assert all(nodes[n].op == "contiguous" and nodes[nodes[n].inputs[0]].op == "view"
               for (n,) in kernels)
    graphs = [s.group.nodes for s in c.steps if s.kind == "graph"]
    assert graphs == [("a",), ("b",), ("c",)]
    assert nodes[nodes["c"].inputs[0]].op == "view"  # aligned: read in place
