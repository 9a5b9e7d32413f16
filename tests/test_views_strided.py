"""Views are stride-honest: each view the compiler plans, read through its strides and offset from
its base's memory (`as_strided`, as cuDNN reads it), equals what its steps mean; and the reference
executor, which reads views that way, equals PyTorch on transposes and reshapes of computed values
and of inputs (the two defects that reached users: a transpose dropped after a copy, and a
reshape of a transposed input refused)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from dslc.core import dims
from dslc.ir import interp
from dslc.ir.graph import Graph
from dslc.pipeline import Options, lower_and_fuse
from tests.helpers import check_source

# Every example model that plans views (mlp plans none: its matmuls read the weights as stored).
MODELS = ["encoder", "resnet18", "resnet50", "unet"]
SEED = 20261201


def _lowered(path: Path) -> tuple[Graph, object, list[dict[str, int]]]:
    from dslc.diag.diagnostic import Sink
    from dslc.pipeline import front_end

    sink = Sink()
    result = front_end(path, Options(backend="reference"), sink)
    assert result.model is not None, [d.message for d in sink.diagnostics]
    lowered, _ = lower_and_fuse(result.model)
    return lowered, result.model.env, [dict(b) for b in result.model.buckets]


@pytest.mark.parametrize("name", MODELS)
def test_every_planned_view_of_the_example_models_reads_what_its_steps_mean(name: str) -> None:
    graph, env, buckets = _lowered(Path(f"models/{name}.cgraph"))
    nodes = graph.by_name()
    views = [n for n in graph.nodes if n.op == "view"]
    assert views, f"{name} plans no view: the test would prove nothing"
    seen = set()
    for values in buckets:
        for view in views:
            base = nodes[view.inputs[0]]
            shape = tuple(dims.evaluate(d, values, env) for d in base.type.shape)
            attrs = interp.concrete_attrs(view, values, env)
            key = (shape, base.type.layout, attrs["steps"], attrs["strides"], attrs["offset"])
            if key in seen:  # the same view in another layer or block
                continue
            seen.add(key)
            # Every element distinct: a view that reads one wrong element cannot pass.
            x = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
            out_shape = tuple(dims.evaluate(d, values, env) for d in view.type.shape)
            interp.planned_view(view, base, x, attrs, out_shape, check=True)  # raises ViewError
    print(f"{name}: {len(seen)} distinct planned views checked over {len(buckets)} buckets")


def test_a_wrong_stride_is_caught() -> None:
    """The check is not vacuous: one planned stride changed makes it fail."""
    text = "model m {\n  input x: [2, 3, 4]\n  output y: [2, 4, 3] = transpose(relu(x), [0, 2, 1])\n}\n"
    graph = _graph(text)
    nodes = graph.by_name()
    [view] = [n for n in graph.nodes if n.op == "view"]
    base = nodes[view.inputs[0]]
    x = np.random.default_rng(SEED).standard_normal((2, 3, 4)).astype(np.float32)
    attrs = dict(interp.concrete_attrs(view, {}))
    attrs["strides"] = (12, 3, 1)  # row-major strides of the transposed shape: wrong
    with pytest.raises(interp.ViewError, match="do not read"):
        interp.planned_view(view, base, x, attrs, (2, 4, 3), check=True)


def _graph(text: str) -> Graph:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        checked = check_source(text, Path(d))
        lowered, _ = lower_and_fuse(checked.model)
    return lowered


def _run(text: str, x: np.ndarray) -> np.ndarray:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        checked = check_source(text, Path(d))
        lowered, plan = lower_and_fuse(checked.model)
    out = interp.run(lowered, {"x": x}, {}, checked.model.env, virtual=plan.virtual(),
                     check_views=True)
    return next(iter(out.values()))


def test_transpose_then_reshape_of_a_computed_value_equals_pytorch() -> None:
    text = """model min_repro {
  dim B = 2
  dim S = 3
  input x: [B, 4, S, 5]
  let c = relu(x)
  output y: [B, S, 20] = reshape(transpose(c, [0, 2, 1, 3]), [B, S, 20])
}
"""
    x = np.random.default_rng(SEED).standard_normal((2, 4, 3, 5)).astype(np.float32)
    expected = torch.relu(torch.from_numpy(x)).permute(0, 2, 1, 3).reshape(2, 3, 20).numpy()
    np.testing.assert_array_equal(_run(text, x), expected)


def test_reshape_of_a_transposed_input_copies_and_equals_pytorch() -> None:
    text = """model merge {
  input x: [2, 4, 3, 5]
  output y: [2, 3, 20] = reshape(transpose(x, [0, 2, 1, 3]), [2, 3, 20])
}
"""
    x = np.random.default_rng(SEED + 1).standard_normal((2, 4, 3, 5)).astype(np.float32)
    expected = torch.from_numpy(x).permute(0, 2, 1, 3).reshape(2, 3, 20).numpy()
    np.testing.assert_array_equal(_run(text, x), expected)
    graph = _graph(text)
    copies = [n for n in graph.nodes if n.op == "contiguous"]
    assert [n.name for n in copies] == ["y.copy"], "the copy is one visible step named after y"


SPACE_TO_DEPTH = """model m {
  layout NHWC
  input x: [2, 3, 16, 16]
  param w: [8, 3, 7, 7]
  let w1 = concat([cast(full([8, 3, 1, 7], 0), f32), w], axis=2)
  let w2 = concat([cast(full([8, 3, 8, 1], 0), f32), w1], axis=3)
  let ws = reshape(transpose(reshape(w2, [8, 3, 4, 2, 4, 2]), [0, 3, 5, 1, 2, 4]), [8, 12, 4, 4])
  let xs = reshape(transpose(reshape(x, [2, 3, 8, 2, 8, 2]), [0, 3, 5, 1, 2, 4]), [2, 12, 8, 8])
  output y = conv(xs, ws, pre_pad=2, post_pad=1)
}
"""


def test_a_space_to_depth_read_by_a_conv_is_one_channels_last_copy_and_equals_pytorch() -> None:
    """A 7x7 stride-2 conv written as a 4x4 stride-1 conv over the 2x2 space-to-depth of its
    input (the kernel padded to 8x8 in front, pad 3 becoming 4): the rearranged input is one
    copy, written in the order in which its reshape is the channels-last tensor the conv reads
    (a row-major copy would need a channels-last copy after it), and the result is PyTorch's."""
    rng = np.random.default_rng(SEED + 3)
    x = rng.standard_normal((2, 3, 16, 16)).astype(np.float32)
    w = rng.standard_normal((8, 3, 7, 7)).astype(np.float32)
    graph = _graph(SPACE_TO_DEPTH)
    copies = [n for n in graph.nodes if n.op == "contiguous" and n.name.startswith("xs")]
    assert [(n.name, n.type.layout.order if n.type.layout else None) for n in copies] == \
        [("xs.copy", (0, 4, 5, 1, 2, 3))]
    with __import__("tempfile").TemporaryDirectory() as d:
        checked = check_source(SPACE_TO_DEPTH, Path(d))
        lowered, plan = lower_and_fuse(checked.model)
    [out] = interp.run(lowered, {"x": x}, {"w": w}, checked.model.env, virtual=plan.virtual(),
                       check_views=True).values()
    expected = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w), stride=2,
                                          padding=3).numpy()
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-4)


S2D = "reshape(transpose(reshape(x, [2, 3, 4, 2, 4, 2]), [0, 3, 5, 1, 2, 4]), [2, 12, 4, 4])"
F = torch.nn.functional
TORCH_OF = {  # the same in PyTorch, from the space-to-depth s, the param w and the input d
    "relu": lambda s, w, d: torch.relu(s),
    "conv_transpose": lambda s, w, d: F.conv_transpose2d(s, w, stride=2),
    "weights": lambda s, w, d: F.conv2d(d, s),
    "transposed": lambda s, w, d: F.conv2d(s.transpose(2, 3), w),
    "sliced": lambda s, w, d: F.conv2d(s[:, :, 0:3, :], w),
}


@pytest.mark.parametrize(("case", "body", "want"), [
    # read by a pointwise op: row-major (the reshape after it is a view of any row-major copy)
    ("relu", f"  output y = relu({S2D})", (0, 1, 2, 3, 4, 5)),
    # read by a transposed conv's data, or by a conv as its weights: channels-last there too
    ("conv_transpose", f"  param w: [12, 5, 3, 3]\n  output y = conv_transpose({S2D}, w, stride=2)",
     (0, 4, 5, 1, 2, 3)),
    ("weights", f"  input d: [2, 12, 6, 6]\n  output y = conv(d, {S2D})", (0, 4, 5, 1, 2, 3)),
    # two steps after the copy (a reshape, then a transpose of the image's axes): the order
    # walks back through both
    ("transposed", f"  param w: [5, 12, 3, 3]\n  output y = conv(transpose({S2D}, [0, 1, 3, 2]), w)",
     (0, 5, 4, 1, 2, 3)),
    # a slice after the copy: its view has gaps, which no conv reads (a copy is made for it)
    ("sliced", f"  param w: [5, 12, 3, 3]\n  output y = conv({S2D}[:, :, 0:3, :], w)",
     (0, 1, 2, 3, 4, 5)),
])
def test_a_view_chains_copy_is_laid_out_for_what_reads_it(case: str, body: str,
                                                           want: tuple[int, ...]) -> None:
    """`lower.views._copy_order`, per reader; each case computes what PyTorch does."""
    import tempfile

    from dslc.weights import random_weights

    text = "model m {\n  layout NHWC\n  input x: [2, 3, 8, 8]\n" + body + "\n}\n"
    with tempfile.TemporaryDirectory() as tmp:
        checked = check_source(text, Path(tmp))
        lowered, plan = lower_and_fuse(checked.model)
    [copy] = [n for n in lowered.nodes if n.op == "contiguous" and n.name.endswith(".copy")]
    assert copy.type.layout is not None and copy.type.layout.order == want
    g = np.random.default_rng(SEED + 4)
    x = g.standard_normal((2, 3, 8, 8)).astype(np.float32)
    d = g.standard_normal((2, 12, 6, 6)).astype(np.float32)
    params = random_weights(checked.model.params, 5)
    inputs = {"x": x, "d": d} if "input d" in text else {"x": x}
    [out] = interp.run(lowered, inputs, params, checked.model.env, virtual=plan.virtual(),
                       check_views=True).values()
    s2d = torch.from_numpy(x).reshape(2, 3, 4, 2, 4, 2).permute(0, 3, 5, 1, 2, 4).reshape(2, 12, 4, 4)
    w = torch.from_numpy(np.asarray(params["w"], np.float32)) if "w" in params else None
    expected = TORCH_OF[case](s2d, w, torch.from_numpy(d)).numpy()
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-4)


def test_reshape_of_a_channels_last_input_slice_equals_pytorch() -> None:
    """A slice of an NHWC input, then a merge of the sliced axes: no view, a copy."""
    text = """model m {
  layout NHWC
  input x: [2, 6, 4, 4]
  output y: [2, 3, 16] = reshape(x[:, 1:4, :, :], [2, 3, 16])
}
"""
    x = np.random.default_rng(SEED + 2).standard_normal((2, 6, 4, 4)).astype(np.float32)
    expected = torch.from_numpy(x)[:, 1:4].reshape(2, 3, 16).numpy()
    np.testing.assert_array_equal(_run(text, x), expected)


def test_dense_strides_are_packed_in_the_order_and_size_one_axes_may_take_any() -> None:
    from dslc.ir.views import dense

    nhwc = (0, 2, 3, 1)
    # [2, 3, 4, 5] channels-last: C innermost (1), then W (3), H (15), N (60), by hand
    assert dense((2, 3, 4, 5), (60, 1, 15, 3), nhwc)
    assert not dense((2, 3, 4, 5), (60, 1, 15, 3), (0, 1, 2, 3))  # the same strides, NCHW
    # a slice of rows 0:2 of a [2, 1, 4, 7] image: rows 7 apart, images 28 apart, not 14
    assert not dense((2, 1, 2, 7), (28, 28, 7, 1), nhwc)
    assert dense((2, 1, 2, 7), (14, 999, 7, 1), nhwc)  # the size-1 axis's stride is free
    h = dims.sym("H")  # images 7 * H apart where H rows are read of H
    assert dense((2, 1, h, 7), (dims.mul(7, h), 1, 7, 1), nhwc)
    assert not dense((2, 1, h, 7), (dims.mul(14, h), 1, 7, 1), nhwc)


def test_two_memory_orders_are_the_same_memory_only_where_they_differ_in_axes_of_one() -> None:
    from dslc.ir.views import same_memory

    assert same_memory((2, 1, 7, 9), (0, 1, 2, 3), (0, 2, 3, 1))  # C = 1: NCHW is NHWC
    assert not same_memory((2, 3, 7, 9), (0, 1, 2, 3), (0, 2, 3, 1))
    assert not same_memory((2, 3), (0, 1), (1, 0))
    assert same_memory((1, 3), (0, 1), (1, 0))
