"""Concatenation in place (dslc/ir/placement.py): producers write straight into their slice of
the concat's buffer, so a YOLO neck's SPPF copies nothing; the memory plan, the saved graphs and
the fallback kernels all address the slices (the arena oracle runs it as the runtime lays memory
out); and each case where an operand must keep its own buffer does."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dslc.backend.target import load_target
from dslc.compile.stage import compile_model
from dslc.emit import bundle as emit_bundle
from dslc.fuzz import arena
from dslc.fuzz.oracle import relative_error
from dslc.ir import interp
from dslc.ir.groups import make_group
from dslc.ir.placement import in_place
from dslc.pipeline import lower_and_fuse
from dslc.runtime.bundle import read
from dslc.runtime.schedule import Schedule
from dslc.weights import random_weights
from tests.helpers import check_source, rng, run_cli

SPPF = """import "std/nn.cgraph"
model neck {
  layout NHWC
  input x: [2, 16, 10, 10]
  let cv1 = relu(conv2d(x, out=8, k=1, has_bias=true))
  let m1 = maxpool(cv1, window=5, stride=1, pad=2)
  let m2 = maxpool(m1, window=5, stride=1, pad=2)
  let m3 = maxpool(m2, window=5, stride=1, pad=2)
  output y = relu(conv2d(concat([cv1, m1, m2, m3], axis=1), out=16, k=1, has_bias=true))
}
"""


def _placement(text: str, tmp_path: Path) -> dict[str, str]:
    model = check_source(text, tmp_path).model
    lowered, plan = lower_and_fuse(model)
    return {v: c for v, (c, _) in in_place(lowered, plan.load_time).items()}


def test_an_sppf_copies_nothing_and_keeps_one_buffer_for_the_four(tmp_path: Path) -> None:
    model = check_source(SPPF, tmp_path).model
    lowered, plan = lower_and_fuse(model)
    path = tmp_path / "neck.bundle"
    emit_bundle.write(path, emit_bundle.payload(compile_model(model, lowered, plan,
                                                              load_target("h200"))))
    program = Schedule(read(path))
    concat = next(n.name for n in program.graph.nodes if n.op == "concat")
    assert {v: c for v, (c, _) in program.placement.items()} == \
        {v: concat for v in ("cv1", "m1", "m2", "m3")}
    offsets = program.memory_plan({}).offsets
    assert not {"cv1", "m1", "m2", "m3"} & set(offsets) and concat in offsets
    g = rng("concat in place")
    x = g.standard_normal((2, 16, 10, 10)).astype(np.float32)
    weights = random_weights(model.params, 3)
    virtual = program.virtual()
    want = interp.run(program.graph, {"x": x}, weights, program.env, virtual=virtual)
    assert relative_error(arena.run(program, {}, {"x": x}, weights)["y"], want["y"]) < 1e-6
    shown = run_cli("inspect", str(path)).stdout
    assert "copies nothing: every operand was written in place" in shown
    assert "writes %m2 in place into its slice of" in shown


@pytest.mark.parametrize(("body", "copied"), [
    # a model input, and a value given twice: each keeps (or gets) its own copy
    ("let a = relu(x)\n  output y = concat([x, a, a], axis=1)", {"x", "a"}),
    # a model output has its own buffer
    ("let a = relu(x)\n  output o = a\n  output y = concat([a, x * 2.0], axis=1)", {"a", "x"}),
    # the base of a view (its strides were planned in its own memory)
    ("let a = relu(x)\n  output t = transpose(a, [0, 1, 3, 2])\n"
     "  output y = concat([a, x * 2.0], axis=1)", {"a", "x"}),
    # an operand of two concats
    ("let a = relu(x)\n  output y = concat([a, x], axis=1)\n  output z = concat([x, a], axis=1)",
     {"a", "x"}),
])
def test_an_operand_that_must_keep_its_buffer_does(body: str, copied: set[str],
                                                   tmp_path: Path) -> None:
    placed = _placement(f"model m {{\n  input x: [2, 8, 4, 4]\n  {body}\n}}\n", tmp_path)
    assert not copied & set(placed)


def test_a_slice_off_a_16_byte_boundary_is_not_written_in_place(tmp_path: Path) -> None:
    """f16 row-major: the second slice of [1, 6, 4, 4] starts 96 bytes in (aligned), the
    second of [1, 1, 1, 6] 6 bytes in (not)."""
    placed = _placement("""model m {
  precision io=f16
  input x: [1, 3, 4, 4]
  input z: [1, 1, 1, 3]
  output y = concat([relu(x), relu(x * 2.0)], axis=1)
  output w = concat([relu(z), relu(z * 2.0)], axis=3)
}
""", tmp_path)
    assert placed == {"y.relu": "y", "y.relu_1": "y", "w.relu": "w"}  # not w.relu_1, at 6 B



@pytest.mark.parametrize(("shapes", "axis", "placed"), [
    # NHWC f16: 16 channels of 19 (a pixel every 38 bytes; generated program seed 29 #174)
    (("[2, 16, 4, 2]", "[2, 3, 4, 2]"), 1, set()),
    # NHWC f16: 4 channels, the first 4 columns of 6 (a pixel every 8 bytes; seed 31 #161)
    (("[3, 4, 2, 4]", "[3, 4, 2, 2]"), 3, set()),
    # NHWC f16: 8 channels of 16 (every stride a multiple of 16 bytes): both in place
    (("[2, 8, 4, 2]", "[2, 8, 4, 2]"), 1, {"a", "b"}),
])
def test_a_slice_with_a_stride_off_16_bytes_is_not_written_in_place(
        shapes: tuple[str, str], axis: int, placed: set[str], tmp_path: Path) -> None:
    """cuDNN's graphs on the H200 read and wrote such slices wrongly where the same values
    dense were right: those operands keep their own buffers (`placement._aligned`)."""
    got = _placement(f"""model m {{
  precision io=f16
  layout NHWC
  input x: {shapes[0]}
  input z: {shapes[1]}
  let a = relu(x)
  let b = relu(z)
  output y = concat([a, b], axis={axis})
}}
""", tmp_path)
    assert set(got) == placed


@pytest.mark.parametrize(("shapes", "placed"), [
    # batch 1: each slice is dense (a buffer of its own would be no other): both in place,
    # though the channel stride, 49 halves, is off 16 bytes
    (("[1, 8, 7, 7]", "[1, 8, 7, 7]"), {"a", "b"}),
    # batch 2: dense but for the batch axis, whose stride (16 * 49 halves) is a multiple of 16
    (("[2, 8, 7, 7]", "[2, 8, 7, 7]"), {"a", "b"}),
    # batch 2, 3 + 4 channels of 7x7: batch strides of 7 * 49 halves, off 16 bytes: refused
    (("[2, 3, 7, 7]", "[2, 4, 7, 7]"), set()),
])
def test_an_nchw_channel_slice_is_in_place_where_dense_but_for_an_aligned_batch_stride(
        shapes: tuple[str, str], placed: set[str], tmp_path: Path) -> None:
    got = _placement(f"""model m {{
  precision io=f16
  input x: {shapes[0]}
  input z: {shapes[1]}
  let a = relu(x)
  let b = relu(z)
  output y = concat([a, b], axis=1)
}}
""", tmp_path)
    assert set(got) == placed

TWINS = """import "std/nn.cgraph"
model m {
  precision io=f16
  layout NHWC
  input x: [2, 16, 8, 8]
  let a = relu(conv2d(x, out=16, k=1, has_bias=true))
  let b = relu(conv2d(a, out=16, k=1, has_bias=true))
  output y = concat([b, x], axis=1)
}
"""


def test_a_placed_group_and_its_unplaced_twin_get_other_signatures(tmp_path: Path) -> None:
    """Two 1x1 conv groups of the same ops and shapes, the second writing into a concat's slice
    (other strides): blind to placement the two would share one graph."""
    model = check_source(TWINS, tmp_path).model
    lowered, plan = lower_and_fuse(model)
    blind = {g.name: make_group(lowered, list(g.nodes), g.pattern).signature for g in plan.groups}
    seen = {g.name: g.signature for g in plan.groups}
    placed = [g.name for g in plan.groups if set(g.outputs) & set(plan.placement)]
    twins = [(a, b) for a in placed for b in seen if b not in placed and blind[a] == blind[b]]
    assert twins, "no placed group with an unplaced twin"
    assert all(seen[a] != seen[b] for a, b in twins)


def test_a_3x3_conv_keeps_its_own_buffer_where_its_slice_has_gaps(tmp_path: Path) -> None:
    """cuDNN wrote a 3x3 conv's output into a channel slice of an NHWC concat through a
    workspace of the output's size, 1.4-1.8x slower than writing it densely (the UNet's skip
    concats on an H100): the conv writes its own buffer and the concat copies it. Into a
    batch slice (dense but for its outermost axis) it still writes in place, as does a 1x1
    conv (an SPPF's first, above)."""
    unet = check_source((Path("models") / "unet.cgraph").read_text(), tmp_path).model
    lowered, plan = lower_and_fuse(unet)
    placed = set(in_place(lowered, plan.load_time))
    assert not {"inc", "down1"} & placed  # 3x3 convs into the skip concats' channel slices
    assert "up1.upconv.row0.bias_add" in placed  # a matmul's rows: dense but outermost
    got = _placement("""import "std/nn.cgraph"
model m {
  precision io=f16
  layout NHWC
  input x: [2, 16, 8, 8]
  let a = relu(conv2d(x, out=16, k=3, pad=1, has_bias=true))
  output y = concat([a, x], axis=0)
}
""", tmp_path)
    assert set(got) == {"a"}
    got = _placement("""import "std/nn.cgraph"
model m {
  precision io=f16
  layout NHWC
  input x: [2, 16, 8, 8]
  let c = conv2d(x, out=16, k=3, pad=1, has_bias=true)
  let a = relu(c)
  output y = concat([a, x], axis=1)
  output z = c * 2.0
}
""", tmp_path)
    assert set(got) == {"a"}  # the conv's result is stored: a pointwise step writes `a`
    got = _placement("""import "std/nn.cgraph"
model m {
  precision io=f16
  layout NHWC
  input x: [2, 16, 8, 8]
  input r: [2, 16, 8, 8]
  let a = relu(r + conv2d(x, out=16, k=3, pad=1))
  output y = concat([a, x], axis=1)
}
""", tmp_path)
    assert got == {}  # the conv is the sum's second operand
    got = _placement("""model m {
  precision io=f16
  layout NHWC
  input x: [2, 16, 8, 8]
  param w: [16, 16, 3, 1]
  let a = relu(conv(x, w, pad=[1, 0]))
  output y = concat([x, a], axis=1)
}
""", tmp_path)
    assert got == {}  # a 3x1 kernel is spatial too; the input before it changes nothing
    got = _placement("""model m {
  precision io=f16
  input x: [2, 16, 8] @NWC
  param w: [16, 16, 3]
  let a: [2, 16, 8] @NWC = relu(conv(x, w, pad=1))
  output y: [2, 32, 8] @NWC = concat([x, a], axis=1)
}
""", tmp_path)
    assert got == {}  # so is a 1-d one


def test_an_operand_after_one_that_keeps_its_buffer_is_still_placed(tmp_path: Path) -> None:
    got = _placement("""model m {
  precision io=f16
  layout NHWC
  input x: [2, 8, 4, 2]
  input z: [2, 8, 4, 2]
  let b = relu(z)
  output y = concat([x, b], axis=1)
}
""", tmp_path)
    assert set(got) == {"b"}


def test_inspect_json_says_what_is_written_in_place(tmp_path: Path) -> None:
    import json

    (tmp_path / "neck.cgraph").write_text(SPPF)
    assert run_cli("compile", str(tmp_path / "neck.cgraph"), "-o", str(tmp_path / "b"),
                   "-q").code == 0
    doc = json.loads(run_cli("inspect", str(tmp_path / "b" / "neck.bundle"), "--format",
                             "json").stdout)
    concat = next(s for s in doc["steps"] if s["ops"] == ["concat"])
    assert list(concat["in_place"]["concat_copies"].values()) == [[]]
    writes = {v: c for s in doc["steps"] for v, c in s["in_place"]["writes"].items()}
    assert set(writes) == {"cv1", "m1", "m2", "m3"}


def test_inspect_says_why_a_concat_copies_each_operand_it_copies(tmp_path: Path) -> None:
    import json

    (tmp_path / "m.cgraph").write_text("""import "std/nn.cgraph"
model m {
  precision io=f16
  layout NHWC
  input x: [2, 16, 8, 8]
  let a = relu(conv2d(x, out=16, k=3, pad=1, has_bias=true))
  let b = relu(conv2d(x, out=16, k=1, has_bias=true))
  output y = concat([a, x, b], axis=1)
}
""")
    assert run_cli("compile", str(tmp_path / "m.cgraph"), "-o", str(tmp_path / "b"),
                   "-q").code == 0
    bundle = str(tmp_path / "b" / "m.bundle")
    doc = json.loads(run_cli("inspect", bundle, "--format", "json").stdout)
    concat = next(s for s in doc["steps"] if s["ops"] == ["concat"])
    assert list(concat["in_place"]["concat_copies"].values()) == [["a", "x"]]  # b in place
    why = concat["in_place"]["why_copied"]
    assert why == {"a": "a convolution's result into a slice with gaps (cuDNN writes it through "
                        "a workspace, slower than this copy)",
                   "x": "a model input (the caller's memory)"}
    text = run_cli("inspect", bundle).stdout
    assert "copies %a, %x; any other operand was written in place" in text
    assert "%x: a model input (the caller's memory)" in text


def _why(body: str, tmp_path: Path) -> dict[str, str]:
    from dslc.ir.placement import why_copied

    model = check_source(f"model m {{\n  precision io=f16\n  layout NHWC\n{body}\n}}\n",
                         tmp_path).model
    lowered, plan = lower_and_fuse(model)
    return why_copied(lowered, plan.load_time)


@pytest.mark.parametrize(("body", "name", "reason"), [
    ("  input x: [2, 8, 4, 2]\n  param p: [2, 8, 4, 2]\n  output y = concat([relu(x), p], axis=1)",
     "p", "a weight"),
    ("  input x: [2, 8, 4, 2]\n  param p: [2, 8, 4, 2]\n  let t = p * 2.0\n"
     "  output y = concat([relu(x), t], axis=1)", "t", "a load-time value"),
    ("  input x: [2, 8, 4, 2]\n  let a = relu(x)\n  output z = a\n"
     "  output y = concat([a, x], axis=1)", "a", "a model output"),
    ("  input x: [2, 8, 4, 2]\n  let a = relu(x)\n  output z = relu(a[:, 0:4, :, :])\n"
     "  output y = concat([a, x], axis=1)", "a", "the base of a view"),
    ("  input x: [2, 8, 4, 2]\n  let a = relu(x)\n  output y = concat([a, a], axis=1)", "a",
     "an operand of another concat too, or twice of this one"),
    ("  input x: [2, 16, 4, 2]\n  input z: [2, 3, 4, 2]\n  let a = relu(x)\n"
     "  output y = concat([a, relu(z)], axis=1)", "a",
     "its slice could start or step off 16 bytes (cuDNN's vector loads)"),
    ("  input x: [2, 8, 4, 2] @NCHW\n  input z: [2, 8, 4, 2]\n"
     "  output y = concat([relu(x), relu(z)], axis=1)", "y.relu",
     "in another dtype or memory order than the concat"),
    ("  input cache: [1, 2, 8, 4]\n  input new: [1, 2, 1, 4]\n  input at: i32[1]\n"
     "  let k = cache_write(cache, new, at=at)\n  output y = concat([k, relu(new)], axis=2)",
     "k", "a write in place into another value's memory (a cache)"),
])
def test_why_a_concat_copies_an_operand_is_said_for_each_reason(
        body: str, name: str, reason: str, tmp_path: Path) -> None:
    assert _why(body, tmp_path).get(name) == reason
