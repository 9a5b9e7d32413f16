"""What cuDNN needs of the memory it reads, met at compile time (found by generated programs on
the H200): an op's memory-order needs (`OpDef.needs`) are met by a row-major copy, so cuDNN runs
the op instead of a CuPy fallback; a view that starts inside its base tells cuDNN its alignment
(a misaligned 16-byte load crashed the GPU)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from dslc.compile.stage import compile_model
from dslc.compile.target import load_target
from dslc.pipeline import middle_end
from tests.helpers import check_source


def _compiled(text: str, tmp_path: Path):  # type: ignore[no-untyped-def]
    model = check_source(text, tmp_path).model
    lowered, plan = middle_end(model)
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


def test_a_view_starting_inside_its_base_gives_cudnn_its_alignment(tmp_path: Path) -> None:
    c = _compiled("""model m {
  precision io=f16
  input x: f32[2, 4]
  output a = cast(x[:, 1:3], f16)
  output b = cast(x[:, 2:4], f16)
}
""", tmp_path)
    specs = {s.signature: s for s in c.specs.values()}
    aligned = {t.name: t.alignment for s in specs.values() for t in s.tensors
               if t.role == "input"}
    assert aligned == {"a.slice": 4, "b.slice": 8}  # f32 views at element 1 and 2 of each row
    # the two views differ only in where they start: they must not share one plan
    assert len({s.group.signature for s in c.steps}) == 2
