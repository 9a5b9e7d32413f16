"""The ops' rules and references where the mutation run of the `ops` group found them untested
(docs/mutation.md): each refusal whole (code, message, the text it points at, its label, the
secondary labels and the text under them, notes, help), the sizes at which a rule starts to
refuse, and references checked against values written out by hand or computed in plain NumPy in
the test."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.helpers import Said, check_source, whole

HEAD = "cgraph 0.1\nmodel m {\n  precision io=f16, intermediate=f32, compute=f32\n"
HEAD_F16 = HEAD.replace("compute=f32", "compute=f16")

def _said(body: str, tmp_path: Path, head: str = HEAD) -> list[Said]:
    """Every error of a model, whole: (code, message, text under it, label, secondary labels as
    (text, text under it), notes, help)."""
    source = head + body + "\n}\n"
    return [whole(d, source) for d in check_source(source, tmp_path).diagnostics if d.is_error]


# --- select -------------------------------------------------------------------------------------

def test_a_select_mask_that_is_not_bool_is_refused_at_the_mask(tmp_path: Path) -> None:
    assert _said("  input m: i32[2, 3]\n  input x: [2, 3]\n  output y = select(m, x, x)",
                 tmp_path) == [
        ("E0401", "the mask of `select` must be bool", "m", "i32", (), (),
         ("build the mask with a comparison, e.g. `x > 0`",))]


@pytest.mark.parametrize("call", ["select(x > 0.0, x, i)", "select(x > 0.0, i, x)"])
def test_select_mixing_an_integer_and_a_float_branch_points_at_the_integer_one(
        call: str, tmp_path: Path) -> None:
    assert _said(f"  input x: [2, 3]\n  input i: i32[2, 3]\n  output y = {call}", tmp_path) == [
        ("E0402", "`select` mixes f16 and i32 operands", "i", "i32", (("f16", "x"),),
         ("integer and float tensors are never converted implicitly",),
         ("convert explicitly: `cast(i, f16)`",))]


@pytest.mark.parametrize(("call", "other"), [("select(x > 0.0, z, x)", "z"),
                                             ("select(x > 0.0, x, z)", "z")])
def test_a_select_branch_that_does_not_broadcast_with_the_mask_is_named_beside_it(
        call: str, other: str, tmp_path: Path) -> None:
    assert _said(f"  input x: [2, 3]\n  input z: [4, 3]\n  output y = {call}", tmp_path) == [
        ("E0301", "the operands of `select` have incompatible shapes", "x > 0.0", "bool[2, 3]",
         (("f16[4, 3]", other),),
         ("axis 0 differs: 2 vs 4; each axis must be equal or 1 to broadcast",), ())]


# --- groupnorm, instancenorm, genstats ----------------------------------------------------------

GN = "  input x: %s\n  param s: [%d]\n  param b: [%d]\n  output y = groupnorm(x, s, b, groups=%d)"
IN = "  input x: %s\n  param s: [%d]\n  param b: [%d]\n  output y = instancenorm(x, s, b)"
FLOATS_ONLY = "`%s` takes floating-point tensors (f32, f16, bf16)"
STATS = "per-channel statistics have shape [C], C being axis 1 of x"


def test_groupnorm_and_instancenorm_take_the_smallest_ranks_they_document(tmp_path: Path) -> None:
    """groupnorm: x [N, C] (no spatial axes) is enough; instancenorm: one spatial axis."""
    assert _said(GN % ("[2, 4]", 4, 4, 2), tmp_path) == []
    assert _said(IN % ("[2, 4, 3]", 4, 4), tmp_path) == []
    assert _said("  input x: [2, 4]\n  let s = genstats(x)\n  output y = x", tmp_path) == []


def test_a_groupnorm_of_too_low_a_rank_is_refused_at_x(tmp_path: Path) -> None:
    assert _said(GN % ("[4]", 4, 4, 2), tmp_path) == [
        ("E0301", "`groupnorm` expects x [N, C, *S]", "x", "f16[4]", (), (), ())]


def test_an_instancenorm_without_spatial_axes_is_refused_at_x(tmp_path: Path) -> None:
    assert _said(IN % ("[2, 4]", 4, 4), tmp_path) == [
        ("E0301", "`instancenorm` expects x [N, C, *S] with spatial axes", "x", "f16[2, 4]", (),
         (), ())]


@pytest.mark.parametrize("op", ["groupnorm", "instancenorm"])
def test_a_norm_of_integers_is_refused_at_x(op: str, tmp_path: Path) -> None:
    body = (GN % ("i32[2, 4, 3]", 4, 4, 2)) if op == "groupnorm" else (IN % ("i32[2, 4, 3]", 4, 4))
    assert _said(body, tmp_path) == [
        ("E0401", f"`{op}` does not support i32 inputs", "x", "i32 here", (),
         (FLOATS_ONLY % op,), ("convert first: `cast(x, f32)`",))]


@pytest.mark.parametrize("op", ["groupnorm", "instancenorm"])
@pytest.mark.parametrize(("s", "b", "name", "under"), [(3, 4, "scale", "s"), (4, 3, "bias", "b")])
def test_a_norms_scale_or_bias_not_one_per_channel_is_refused_at_it(
        op: str, s: int, b: int, name: str, under: str, tmp_path: Path) -> None:
    body = (GN % ("[2, 4, 3]", s, b, 2)) if op == "groupnorm" else (IN % ("[2, 4, 3]", s, b))
    assert _said(body, tmp_path) == [
        ("E0301", f"`{name}` of `{op}` must be a vector of the 4 channels", under, "f16[3]",
         (("f16[2, 4, 3]", "x"),), (STATS,), ())]


@pytest.mark.parametrize("op", ["groupnorm", "instancenorm"])
def test_a_norm_computed_in_f16_is_refused_it_needs_f32(op: str, tmp_path: Path) -> None:
    body = (GN % ("[2, 4, 3]", 4, 4, 2)) if op == "groupnorm" else (IN % ("[2, 4, 3]", 4, 4))
    assert _said(body, tmp_path, HEAD_F16) == [
        ("E0403", f"`{op}` needs compute=f32, but compute is f16 here", op, "computed in f16",
         (("compute=f16 set here", "compute=f16"),), (f"cuDNN runs `{op}` with f32 math",),
         ("set `precision compute=f32` in the model, or in the def that holds this op",))]


BN = ("  input x: %s\n  param m: [%d]\n  param v: [%d]\n  param s: [%d]\n  param b: [%d]\n"
      "  output y = batchnorm(x, m, v, s, b)")


def _bn(x: str, m: int = 4, v: int = 4, s: int = 4, b: int = 4) -> str:
    return BN % (x, m, v, s, b)


def test_batchnorm_takes_x_of_rank_2_and_refuses_rank_1_at_x(tmp_path: Path) -> None:
    assert _said(_bn("[2, 4]"), tmp_path) == []
    assert _said(_bn("[4]"), tmp_path) == [
        ("E0301", "`batchnorm` expects x [N, C, *S]", "x", "f16[4]", (), (), ())]


def test_a_batchnorm_of_integers_is_refused_at_x(tmp_path: Path) -> None:
    assert _said(_bn("i32[2, 4, 3]"), tmp_path) == [
        ("E0401", "`batchnorm` does not support i32 inputs", "x", "i32 here", (),
         (FLOATS_ONLY % "batchnorm",), ("convert first: `cast(x, f32)`",))]


@pytest.mark.parametrize(("name", "under"), [("mean", "m"), ("var", "v"), ("scale", "s"),
                                             ("bias", "b")])
def test_each_batchnorm_statistic_not_one_per_channel_is_refused_at_it(
        name: str, under: str, tmp_path: Path) -> None:
    sizes = {"m": 4, "v": 4, "s": 4, "b": 4, under: 3}
    assert _said(_bn("[2, 4, 3]", **sizes), tmp_path) == [
        ("E0301", f"`{name}` of `batchnorm` must be a vector of the 4 channels", under, "f16[3]",
         (("f16[2, 4, 3]", "x"),), (STATS,), ())]


def test_a_batchnorm_computed_in_f16_is_refused_it_needs_f32(tmp_path: Path) -> None:
    assert _said(_bn("[2, 4, 3]"), tmp_path, HEAD_F16) == [
        ("E0403", "`batchnorm` needs compute=f32, but compute is f16 here", "batchnorm",
         "computed in f16", (("compute=f16 set here", "compute=f16"),),
         ("cuDNN runs `batchnorm` with f32 math",),
         ("set `precision compute=f32` in the model, or in the def that holds this op",))]


@pytest.mark.parametrize(("m", "first"), [("i32[4]", "E0401"), ("[3]", "E0301")])
def test_a_refused_norm_statistic_ends_the_check_of_the_norm(m: str, first: str,
                                                              tmp_path: Path) -> None:
    """In an f16 model the compute rule would refuse the norm too: a refused statistic is the
    only error."""
    body = _bn("[2, 4, 3]").replace("param m: [4]", f"param m: {m}")
    assert [d[0] for d in _said(body, tmp_path, HEAD_F16)] == [first]


def test_groupnorm_with_no_group_is_refused_at_groups(tmp_path: Path) -> None:
    assert _said(GN % ("[2, 4, 3]", 4, 4, 0), tmp_path) == [
        ("E0305", "`groups` of `groupnorm` must be at least 1", "groups=0", "", (), (), ())]


def test_groupnorm_with_channels_not_a_multiple_of_groups_is_refused_at_groups(
        tmp_path: Path) -> None:
    assert _said(GN % ("[2, 4, 3]", 4, 4, 3), tmp_path) == [
        ("E0301", "`groupnorm` splits the 4 channels into 3 groups: the channels must be a "
         "multiple of `groups`", "groups=3", "", (("f16[2, 4, 3]", "x"),), (), ())]


def test_genstats_of_a_vector_or_of_integers_is_refused_at_x(tmp_path: Path) -> None:
    assert _said("  input x: [4]\n  let s = genstats(x)\n  output y = x", tmp_path) == [
        ("E0301", "`genstats` expects x [N, C, *S]", "x", "f16[4] has rank 1", (), (), ())]
    assert _said("  input x: i32[2, 4]\n  let s = genstats(x)\n  output y = x", tmp_path) == [
        ("E0401", "`genstats` does not support i32 inputs", "x", "i32 here", (),
         (FLOATS_ONLY % "genstats",), ("convert first: `cast(x, f32)`",))]


# --- cache_write --------------------------------------------------------------------------------

CW = "  input c: %s\n  input n: %s\n  input at: i32[1]\n  output y = cache_write(c, n, at)"


@pytest.mark.parametrize(("cache", "new", "name", "under", "label"), [
    ("[1, 2, 8]", "[1, 2, 2, 4]", "cache", "c", "f16[1, 2, 8] has rank 3"),
    ("[1, 2, 8, 4]", "[1, 2, 4]", "new", "n", "f16[1, 2, 4] has rank 3"),
])
def test_a_cache_write_operand_not_of_rank_4_is_refused_at_it(
        cache: str, new: str, name: str, under: str, label: str, tmp_path: Path) -> None:
    assert _said(CW % (cache, new), tmp_path) == [
        ("E0301", f"`{name}` of `cache_write` must be rank 4: [B, H, S, D]", under, label, (),
         (), ())]


def test_an_integer_cache_is_refused_at_the_cache(tmp_path: Path) -> None:
    assert _said(CW % ("i32[1, 2, 8, 4]", "i32[1, 2, 2, 4]"), tmp_path) == [
        ("E0401", "`cache_write` keeps f32, f16 or bf16 caches, not i32", "c", "i32[1, 2, 8, 4]",
         (), (), ())]


def test_new_rows_of_another_dtype_than_the_cache_are_refused_at_them(tmp_path: Path) -> None:
    assert _said(CW % ("f16[1, 2, 8, 4]", "f32[1, 2, 2, 4]"), tmp_path) == [
        ("E0401", "the operands of `cache_write` have different dtypes", "n", "f32",
         (("f16", "c"),), (), ("cast one of them: `cast(n, f16)`",))]


@pytest.mark.parametrize(("new", "what", "expected", "found"), [
    ("[2, 2, 2, 4]", "batch", 1, 2),
    ("[1, 3, 2, 4]", "head count", 2, 3),
    ("[1, 2, 2, 5]", "head dimension", 4, 5),
])
def test_new_rows_of_another_batch_head_count_or_head_dimension_are_refused_naming_which(
        new: str, what: str, expected: int, found: int, tmp_path: Path) -> None:
    assert _said(CW % ("[1, 2, 8, 4]", new), tmp_path) == [
        ("E0301", f"the {what} of `new` is not the cache's", "n", f"f16{new}",
         (("f16[1, 2, 8, 4]", "c"),), (f"expected {expected}, found {found}",), ())]


def test_more_new_rows_than_the_cache_holds_are_refused_and_as_many_are_taken(
        tmp_path: Path) -> None:
    assert _said(CW % ("[1, 2, 8, 4]", "[1, 2, 9, 4]"), tmp_path) == [
        ("E0301", "`cache_write` of 9 rows into a cache of 8", "n", "f16[1, 2, 9, 4]",
         (("f16[1, 2, 8, 4]", "c"),), (), ())]
    assert _said(CW % ("[1, 2, 8, 4]", "[1, 2, 8, 4]"), tmp_path) == []


def test_a_cache_write_keeps_the_memory_order_of_its_cache(tmp_path: Path) -> None:
    source = HEAD + (CW % ("[1, 2, 8, 4] @NHWC", "[1, 2, 2, 4]")) + "\n}\n"
    [node] = [n for n in check_source(source, tmp_path).model.graph.nodes
              if n.op == "cache_write"]
    assert str(node.type) == "f16[1, 2, 8, 4] @NHWC"


# --- arange, gather -----------------------------------------------------------------------------

def test_arange_of_one_value_is_taken_and_of_none_refused_at_n(tmp_path: Path) -> None:
    assert _said("  input x: [1]\n  output y = cast(arange(1), f16) + x", tmp_path) == []
    assert _said("  input x: [1]\n  output y = cast(arange(0), f16) + x", tmp_path) == [
        ("E0305", "`arange` of 0 values", "0", "n must be at least 1", (), (), ())]


def test_arange_of_floats_is_refused_at_the_dtype(tmp_path: Path) -> None:
    assert _said("  input x: [4]\n  output y = arange(4, dtype=f16) + x", tmp_path) == [
        ("E0401", "`arange` makes i32 or i64 values, not f16", "dtype=f16", "", (), (),
         ("`cast` the result for another dtype",))]


def test_gather_gives_nan_for_an_index_below_minus_the_table_size() -> None:
    """-5 is outside a table of 4 rows as -1 is (no wrapping): a NaN row, no IndexError."""
    from dslc.ops import OPS

    reference = OPS["gather"].reference
    assert reference is not None
    table = np.arange(12, dtype=np.float32).reshape(4, 3)
    out = reference([table, np.array([-5, 1], np.int64)], {"axis": 0})
    assert np.isnan(out[0]).all()
    np.testing.assert_array_equal(out[1], [3.0, 4.0, 5.0])


def test_gather_of_a_bf16_table_gives_nan_rows_in_bf16() -> None:
    import ml_dtypes

    from dslc.ops import OPS

    reference = OPS["gather"].reference
    assert reference is not None
    table = np.array([[1.0, 2.0], [3.0, 4.0]], ml_dtypes.bfloat16)
    out = reference([table, np.array([1, 2], np.int64)], {"axis": 0})
    assert out.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(out[0].astype(np.float32), [3.0, 4.0])
    assert np.isnan(out[1].astype(np.float32)).all()


# --- expand, reshape ----------------------------------------------------------------------------

def test_expand_to_a_lower_rank_is_refused_at_the_shape(tmp_path: Path) -> None:
    assert _said("  input x: [2, 3]\n  output y = expand(x, [3])", tmp_path) == [
        ("E0301", "`expand` to rank 1 from a tensor of rank 2", "[3]", "",
         (("f16[2, 3]", "x"),), ("expand adds leading axes; it never drops one",), ())]


def test_a_reshape_of_a_slice_merging_an_axis_of_two_has_no_layout(tmp_path: Path) -> None:
    """[4, 2, 4] (a slice of [4, 2, 8]) to [4, 8] merges its axes of 2 and 4: not a view."""
    checked = check_source(HEAD + "  input x: [4, 2, 8]\n"
                           "  output y = relu(reshape(x[:, :, 0:4], [4, 8]))\n}\n", tmp_path)
    [node] = [n for n in checked.model.graph.nodes if n.op == "reshape"]
    assert node.type.layout is None


# --- maxpool, avgpool ---------------------------------------------------------------------------

AT_LEAST_ONE = ("every output size must be at least 1 for every admissible input size",)
SMALLER = ("use a smaller kernel or stride, more padding, or raise the dim's lower bound",)


@pytest.mark.parametrize(("x", "call", "said"), [
    ("[2, 3]", "maxpool(x, window=2)",
     ("E0301", "`maxpool` expects x [N, C, *S] with 1 to 3 spatial axes", "x",
      "f16[2, 3] has rank 2", (), ("the first two axes are batch and channels",), ())),
    ("i32[1, 2, 4, 4]", "avgpool(x, window=2)",
     ("E0401", "`avgpool` does not support i32 inputs", "x", "i32 here", (),
      (FLOATS_ONLY % "avgpool",), ("convert first: `cast(x, f32)`",))),
    # the stride defaults to the window: its refusal is said once, of the window
    ("[1, 2, 4, 4]", "maxpool(x, window=[2, 2, 2])",
     ("E0305", "`window` of `maxpool` needs 2 values, one per spatial axis", "window=[2, 2, 2]",
      "3 given", (), (), ())),
    ("[1, 2, 4, 4]", "maxpool(x, window=0)",
     ("E0305", "`window` of `maxpool` must be at least 1", "window=0", "0 here", (), (), ())),
    ("[1, 2, 4, 4]", "maxpool(x, window=2, stride=[1, 2, 3])",
     ("E0305", "`stride` of `maxpool` needs 2 values, one per spatial axis", "stride=[1, 2, 3]",
      "3 given", (), (), ())),
    ("[1, 2, 4, 4]", "maxpool(x, window=2, stride=0)",
     ("E0305", "`stride` of `maxpool` must be at least 1", "stride=0", "0 here", (), (), ())),
    ("[1, 2, 4, 4]", "maxpool(x, window=2, pad=-1)",
     ("E0305", "`pad` of `maxpool` must be at least 0", "pad=-1", "-1 here", (), (), ())),
    # 2 * pad past the window, on the axis where it is (the second)
    ("[1, 2, 4, 4]", "avgpool(x, window=[3, 4], pad=[1, 3])",
     ("E0305", "the padding of `avgpool` must be at most half the window", "pad=[1, 3]",
      "pad 3, window 4", (), (), ())),
    ("[1, 2, 4, 4]", "avgpool(x, window=3, pad=2)",
     ("E0305", "the padding of `avgpool` must be at most half the window", "pad=2",
      "pad 2, window 3", (), (), ())),
    # (4 + 0 - 5) // 5 + 1 = 0 on H; W is refused after H
    ("[1, 2, 4, 4]", "avgpool(x, window=5)",
     ("E0603", "the output of `avgpool` has size below 1 on axis 2", "x", "output size is 0", (),
      AT_LEAST_ONE, SMALLER)),
    ("[1, 2, 4, 6]", "maxpool(x, window=[1, 7])",
     ("E0603", "the output of `maxpool` has size below 1 on axis 3", "x", "output size is 0", (),
      AT_LEAST_ONE, SMALLER)),
])
def test_a_pool_refusal_is_said_whole_and_once(x: str, call: str, said: Said,
                                               tmp_path: Path) -> None:
    assert _said(f"  input x: {x}\n  output y = {call}", tmp_path) == [said]


@pytest.mark.parametrize(("x", "call", "shape", "attrs"), [
    # floor((7 + 2 - 3) / 2) + 1 = 4, floor((9 + 0 - 2) / 1) + 1 = 8
    ("[1, 2, 7, 9]", "maxpool(x, window=[3, 2], stride=[2, 1], pad=[1, 0])", "f16[1, 2, 4, 8]",
     ((3, 2), (2, 1), (1, 0))),
    # the stride is the window's: floor((7 - 3) / 3) + 1 = 2, floor((9 - 3) / 3) + 1 = 3
    ("[1, 2, 7, 9]", "avgpool(x, window=3)", "f16[1, 2, 2, 3]", ((3, 3), (3, 3), (0, 0))),
    # padding exactly half the window is taken: floor((5 + 2 - 2) / 2) + 1 = 3
    ("[2, 3, 5]", "maxpool(x, window=2, pad=1)", "f16[2, 3, 3]", ((2,), (2,), (1,))),
    # int8 data pools as it is (quantised models), max and mean alike
    ("i8[1, 2, 4, 4]", "maxpool(x, window=2)", "i8[1, 2, 2, 2]", ((2, 2), (2, 2), (0, 0))),
    ("i8[1, 2, 4, 4]", "avgpool(x, window=2)", "i8[1, 2, 2, 2]", ((2, 2), (2, 2), (0, 0))),
])
def test_a_pool_writes_its_size_and_attributes_per_axis(
        x: str, call: str, shape: str, attrs: tuple[tuple[int, ...], ...],
        tmp_path: Path) -> None:
    checked = check_source(HEAD + f"  input x: {x}\n  output y = {call}\n}}\n", tmp_path)
    assert not [d for d in checked.diagnostics if d.is_error]
    [node] = [n for n in checked.model.graph.nodes if n.op in ("maxpool", "avgpool")]
    assert str(node.type) == shape
    assert tuple(tuple(node.attrs[k]) for k in ("window", "stride", "pad")) == attrs


# --- upsample -----------------------------------------------------------------------------------

@pytest.mark.parametrize(("x", "factor", "said"), [
    ("[2, 3]", "2", ("E0301", "`upsample` expects x [N, C, *S] with 1 to 3 spatial axes", "x",
                     "f16[2, 3] has rank 2", (), ("the first two axes are batch and channels",),
                     ())),
    ("i32[1, 2, 3]", "2", ("E0401", "`upsample` does not support i32 inputs", "x", "i32 here", (),
                           (FLOATS_ONLY % "upsample",), ("convert first: `cast(x, f32)`",))),
    ("[1, 2, 3, 3]", "[2, 2, 2]", ("E0305", "`factor` of `upsample` needs 2 values, one per "
                                   "spatial axis", "[2, 2, 2]", "3 given", (), (), ())),
    ("[1, 2, 3, 3]", "0", ("E0305", "`factor` of `upsample` must be at least 1", "0", "0 here", (),
                           (), ())),
])
def test_an_upsample_refusal_is_said_whole(x: str, factor: str, said: Said,
                                           tmp_path: Path) -> None:
    assert _said(f"  input x: {x}\n  output y = upsample(x, {factor})", tmp_path) == [said]


def test_upsample_by_one_along_an_axis_is_taken(tmp_path: Path) -> None:
    checked = check_source(HEAD + "  input x: [1, 2, 3, 3]\n  output y = upsample(x, [1, 2])\n}\n",
                           tmp_path)
    [node] = [n for n in checked.model.graph.nodes if n.op == "upsample"]
    assert str(node.type) == "f16[1, 2, 3, 6]"


# --- matmul ------------------------------------------------------------------------------------

RESHAPE = ("reshape a vector to a matrix first, e.g. `reshape(v, [1, K])`",)
K_HELP = ("if `b` is stored [.., N, K] (as PyTorch's Linear weight), use `transpose(b, %s)`, "
          "which costs nothing",)


@pytest.mark.parametrize(("a", "b", "said"), [
    ("[4]", "[4, 3]", ("E0301", "`matmul` needs operands of rank 2 or more", "a",
                       "f16[4] has rank 1", (), (), RESHAPE)),
    ("[2, 4]", "[3]", ("E0301", "`matmul` needs operands of rank 2 or more", "b",
                       "f16[3] has rank 1", (), (), RESHAPE)),
    ("[2, 4]", "[5, 3]", ("E0302", "the inner dimensions of `matmul` differ", "b",
                          "f16[5, 3]: K = 5 (axis 0)", (("f16[2, 4]: K = 4 (last axis)", "a"),),
                          ("a is [.., M, K] and b is [.., K, N]; here 4 vs 5",),
                          (K_HELP[0] % "[1, 0]",))),
    # the transpose offered swaps b's last two axes, whatever its rank
    ("[2, 2, 4]", "[3, 5, 4]", ("E0302", "the inner dimensions of `matmul` differ", "b",
                                "f16[3, 5, 4]: K = 5 (axis 1)",
                                (("f16[2, 2, 4]: K = 4 (last axis)", "a"),),
                                ("a is [.., M, K] and b is [.., K, N]; here 4 vs 5",),
                                (K_HELP[0] % "[0, 2, 1]",))),
    ("[2, 4]", "i32[4, 3]", ("E0401", "the operands of `matmul` have different dtypes", "b",
                             "i32", (("f16", "a"),), (), ("cast one of them: `cast(b, f16)`",))),
    ("[2, 4]", "f32[4, 3]", ("E0401", "the operands of `matmul` have different dtypes", "b",
                             "f32", (("f16", "a"),), (), ("cast one of them: `cast(b, f16)`",))),
    ("i32[2, 4]", "i32[4, 3]", ("E0401", "`matmul` does not support i32 inputs", "a",
                                "i32 here", (), (FLOATS_ONLY % "matmul",),
                                ("convert first: `cast(a, f32)`",))),
    # batch axes broadcast as numpy's: 3 against 2 does not
    ("[3, 2, 4]", "[2, 4, 3]", ("E0301", "the operands of `matmul` have incompatible shapes",
                                "a", "f16[3]", (("f16[2]", "b"),),
                                ("axis 0 differs: 3 vs 2; each axis must be equal or 1 to "
                                 "broadcast",), ())),
])
def test_a_matmul_refusal_is_said_whole(a: str, b: str, said: Said, tmp_path: Path) -> None:
    assert _said(f"  input a: {a}\n  input b: {b}\n  output y = matmul(a, b)", tmp_path) == \
        [said]


@pytest.mark.parametrize(("a", "b", "result"), [
    ("i8[2, 4]", "i8[4, 3]", "i32[2, 3]"),  # int8 accumulates in i32
    ("[3, 1, 2, 4]", "[5, 4, 3]", "f16[3, 5, 2, 3]"),  # batch axes broadcast
    ("[2, 4]", "[7, 4, 3]", "f16[7, 2, 3]"),  # a matrix against a batch
])
def test_a_matmul_types_its_result(a: str, b: str, result: str, tmp_path: Path) -> None:
    checked = check_source(HEAD + f"  input a: {a}\n  input b: {b}\n"
                           "  let y = matmul(a, b)\n  output o = y\n}\n", tmp_path)
    assert not [d for d in checked.diagnostics if d.is_error]
    [node] = [n for n in checked.model.graph.nodes if n.op == "matmul"]
    assert str(node.type) == result


# --- conv, conv_transpose ----------------------------------------------------------------------

HEAD_NHWC = HEAD + "  layout NHWC\n"
X = "f16[2, 4, 6, 6] @NHWC"


@pytest.mark.parametrize(("w", "call", "said"), [
    ("[8, 4, 3]", "conv(x, w)",
     ("E0301", "the weight of `conv` must have rank 4", "w", "f16[8, 4, 3]", ((X, "x"),),
      ("w is [K, C / groups, *R], one kernel axis per spatial axis of x",), ())),
    ("[8, 4, 3, 3]", "conv(x, w, groups=0)",
     ("E0305", "`groups` of `conv` must be at least 1", "groups=0", "0 here", (), (), ())),
    ("[6, 4, 3, 3]", "conv(x, w, groups=4)",
     ("E0301", "`groups=4` must divide both the input and output channels", "groups=4", "",
      ((X, "x"), ("f16[6, 4, 3, 3]", "w")), ("C = 4, K = 6",), ())),
    ("[8, 2, 3, 3]", "conv(x, w)",
     ("E0301", "the weight's input channels do not match the input", "w", "f16[8, 2, 3, 3]",
      ((X, "x"),), ("axis 1 of w must be C / groups = 4, found 2",), ())),
    ("[8, 4, 3, 3]", "conv(x, w, stride=[1, 2, 3])",
     ("E0305", "`stride` of `conv` needs 2 values, one per spatial axis", "stride=[1, 2, 3]",
      "3 given", (), (), ())),
    ("[8, 4, 3, 3]", "conv(x, w, dilation=0)",
     ("E0305", "`dilation` of `conv` must be at least 1", "dilation=0", "0 here", (), (), ())),
    ("[8, 4, 3, 3]", "conv(x, w, pre_pad=[1, -1])",
     ("E0305", "`pre_pad` of `conv` must be at least 0", "pre_pad=[1, -1]", "-1 here", (), (),
      ())),
    ("[8, 4, 3, 3]", "conv(x, w, post_pad=-2)",
     ("E0305", "`post_pad` of `conv` must be at least 0", "post_pad=-2", "-2 here", (), (),
      ())),
    # floor((6 - 7) / 1) + 1 = 0 on H
    ("[8, 4, 7, 3]", "conv(x, w)",
     ("E0603", "the output of `conv` has size below 1 on axis 2", "x", "output size is 0", (),
      AT_LEAST_ONE, SMALLER)),
    ("[4, 8, 3]", "conv_transpose(x, w)",
     ("E0301", "the weight of `conv_transpose` must have rank 4", "w", "f16[4, 8, 3]", (),
      ("w is [K, C, *R] (PyTorch's ConvTranspose layout)",), ())),
    ("[5, 8, 3, 3]", "conv_transpose(x, w)",
     ("E0301", "the weight's first axis must match the input channels", "w", "f16[5, 8, 3, 3]",
      ((X, "x"),), ("x has 4 channels, w.shape[0] is 5",), ())),
    # output_pad must be below max(stride, dilation): 2 is not below 2
    ("[4, 8, 3, 3]", "conv_transpose(x, w, stride=2, output_pad=2)",
     ("E0305", "`output_pad` must be smaller than the stride or the dilation", "output_pad=2",
      "2 here", (), (), ())),
    # (6 - 1) * 1 - 2 * 4 + 1 * (3 - 1) + 1 + 0 = 0: less padding makes a transposed conv larger
    ("[4, 8, 3, 3]", "conv_transpose(x, w, pad=4)",
     ("E0603", "the output of `conv_transpose` has size below 1 on axis 2", "x",
      "output size is 0", (), AT_LEAST_ONE,
      ("use less padding, a larger kernel, stride or output_pad, or raise the dim's lower "
       "bound",))),
    # the same on W only: the axis named is 3
    ("[4, 8, 3, 3]", "conv_transpose(x, w, pad=[0, 4])",
     ("E0603", "the output of `conv_transpose` has size below 1 on axis 3", "x",
      "output size is 0", (), AT_LEAST_ONE,
      ("use less padding, a larger kernel, stride or output_pad, or raise the dim's lower "
       "bound",))),
])
def test_a_conv_refusal_is_said_whole(w: str, call: str, said: Said, tmp_path: Path) -> None:
    assert _said(f"  input x: [2, 4, 6, 6]\n  param w: {w}\n  output y = {call}", tmp_path,
                 HEAD_NHWC) == [said]


@pytest.mark.parametrize(("w", "call", "result", "attrs"), [
    # H: floor((6 + 1 + 2 - 2 * (3 - 1) - 1) / 2) + 1 = 3; W: floor((6 - 2 * (2 - 1) - 1) / 1)
    # + 1 = 4 (the dilation, one number, is each axis's)
    ("[8, 4, 3, 2]", "conv(x, w, stride=[2, 1], dilation=2, pre_pad=[1, 0], post_pad=[2, 0])",
     "f16[2, 8, 3, 4]", {"stride": (2, 1), "dilation": (2, 2), "pre_pad": (1, 0),
                         "post_pad": (2, 0), "pad": None}),
    # groups: w [K, C / groups, R, S]; pad on both sides
    ("[8, 2, 3, 3]", "conv(x, w, groups=2, pad=1)", "f16[2, 8, 6, 6]",
     {"stride": (1, 1), "dilation": (1, 1), "pre_pad": (1, 1), "post_pad": (1, 1), "pad": None}),
    # (6 - 1) * 2 - 2 * 1 + 1 * (3 - 1) + 1 + 1 = 12
    ("[4, 8, 3, 3]", "conv_transpose(x, w, stride=2, pad=1, output_pad=1)", "f16[2, 8, 12, 12]",
     {"stride": (2, 2), "dilation": (1, 1), "pad": (1, 1), "output_pad": (1, 1)}),
])
def test_a_conv_types_its_result_and_attributes(w: str, call: str, result: str,
                                                attrs: dict[str, object],
                                                tmp_path: Path) -> None:
    checked = check_source(HEAD_NHWC + f"  input x: [2, 4, 6, 6]\n  param w: {w}\n"
                           f"  output y = {call}\n}}\n", tmp_path)
    assert not [d for d in checked.diagnostics if d.is_error]
    [node] = [n for n in checked.model.graph.nodes if n.op in ("conv", "conv_transpose")]
    assert f"{node.type.dtype}{list(node.type.shape)}" == result
    got = {k: (tuple(node.attrs[k]) if node.attrs[k] is not None else None) for k in attrs}
    assert got == attrs


# --- reductions --------------------------------------------------------------------------------

@pytest.mark.parametrize(("body", "said"), [
    ("  input x: i32[2, 3]\n  output y = reduce_sum(x, axes=[0])",
     ("E0401", "`reduce_sum` does not support i32 inputs", "x", "i32 here", (),
      (FLOATS_ONLY % "reduce_sum",), ("convert first: `cast(x, f32)`",))),
    ("  input x: [2, 3]\n  output y = reduce_max(x, axes=[2])",
     ("E0304", "axis 2 is out of range for a rank-2 tensor", "axes=[2]",
      "valid axes are 0..1 (or -2..-1)", (), (), ())),
    ("  input x: [2, 3]\n  output y = reduce_max(x, axes=[-3])",
     ("E0304", "axis -3 is out of range for a rank-2 tensor", "axes=[-3]",
      "valid axes are 0..1 (or -2..-1)", (), (), ())),
    # -2 is axis 0 of a rank-2 tensor: given twice
    ("  input x: [2, 3]\n  output y = reduce_min(x, axes=[0, -2])",
     ("E0304", "axis 0 is given twice", "axes=[0, -2]", "repeated axis", (), (), ())),
    ("  input x: [2, 3]\n  output y = reduce_mean(x, axes=[])",
     ("E0304", "`reduce_mean` needs at least one axis", "axes=[]", "no axis given", (), (), ())),
])
def test_a_reduction_refusal_is_said_whole(body: str, said: Said, tmp_path: Path) -> None:
    assert _said(body, tmp_path) == [said]


@pytest.mark.parametrize(("call", "result", "axes"), [
    ("reduce_sum(x, axes=[-1, 0])", "f16[3]", (0, 2)),  # sorted, negative counted from the end
    ("reduce_amax(x, axes=[1], keepdims=true)", "f16[2, 1, 4]", (1,)),
    ("reduce_prod(x, axes=2)", "f16[2, 3]", (2,)),  # one axis as a number
])
def test_a_reduction_types_its_result_and_sorts_its_axes(call: str, result: str,
                                                         axes: tuple[int, ...],
                                                         tmp_path: Path) -> None:
    checked = check_source(HEAD + f"  input x: [2, 3, 4]\n  output y = {call}\n}}\n", tmp_path)
    assert not [d for d in checked.diagnostics if d.is_error]
    [node] = [n for n in checked.model.graph.nodes if n.op.startswith("reduce_")]
    assert (str(node.type), tuple(node.attrs["axes"])) == (result, axes)


def test_genstats_gives_two_f32_channel_vectors_at_the_inputs_rank(tmp_path: Path) -> None:
    checked = check_source(HEAD + "  input x: [2, 5, 3, 4]\n  let (s, q) = genstats(x)\n"
                           "  output a = s\n  output b = q\n}\n", tmp_path)
    assert not [d for d in checked.diagnostics if d.is_error]
    stats = [n for n in checked.model.graph.nodes if n.op == "genstats"]
    assert [str(n.type) for n in stats] == ["f32[1, 5, 1, 1]"] * 2


# --- reshape, transpose ------------------------------------------------------------------------

@pytest.mark.parametrize(("call", "said"), [
    ("reshape(x, [-1, 2, -1])",
     ("E0305", "at most one axis of a reshape may be -1", "[-1, 2, -1]", "2 given", (), (), ())),
    ("reshape(x, [0, 12])",
     ("E0305", "reshape to a size of 0", "[0, 12]", "sizes must be positive (or -1, inferred)",
      (), (), ())),
    ("reshape(x, [-2, 12])",
     ("E0305", "reshape to a size of -2", "[-2, 12]", "sizes must be positive (or -1, inferred)",
      (), (), ())),
    ("reshape(x, [5, -1])",
     ("E0301", "cannot infer the `-1` axis of this reshape", "[5, -1]",
      "12 elements do not divide by 5", (("f16[2, 6]", "x"),), (), ())),
    ("reshape(x, [5, 3])",
     ("E0301", "reshape changes the number of elements", "[5, 3]", "[5, 3] has 15 elements",
      (("f16[2, 6] has 12", "x"),),
      ("the products must be equal for every admissible value of the dims",), ())),
    ("transpose(x, [1])",
     ("E0304", "`perm` must list all 2 axes once", "[1]", "1 axes given", (), (), ())),
    ("transpose(x, [1, 2])",
     ("E0304", "axis 2 is out of range for a rank-2 tensor", "[1, 2]",
      "valid axes are 0..1 (or -2..-1)", (), (), ())),
    ("transpose(x, [-1, 1])",
     ("E0304", "axis 1 is given twice", "[-1, 1]", "repeated axis", (), (), ())),
])
def test_a_reshape_or_transpose_refusal_is_said_whole(call: str, said: Said,
                                                      tmp_path: Path) -> None:
    assert _said(f"  input x: [2, 6]\n  output y = {call}", tmp_path) == [said]


@pytest.mark.parametrize(("call", "result", "attr"), [
    ("reshape(x, [3, -1, 2])", "f16[3, 8, 2]", ("shape", (3, 8, 2))),  # -1: 48 / 6
    ("transpose(x, [-1, 0, 1])", "f16[4, 2, 6]", ("perm", (2, 0, 1))),  # negatives counted
])
def test_a_reshape_or_transpose_types_its_result(call: str, result: str,
                                                 attr: tuple[str, tuple[int, ...]],
                                                 tmp_path: Path) -> None:
    checked = check_source(HEAD + f"  input x: [2, 6, 4]\n  output y = relu({call})\n}}\n",
                           tmp_path)
    assert not [d for d in checked.diagnostics if d.is_error]
    [node] = [n for n in checked.model.graph.nodes if n.op in ("reshape", "transpose")]
    assert (str(node.type).split(" @")[0], tuple(node.attrs[attr[0]])) == (result, attr[1])


# --- pointwise ---------------------------------------------------------------------------------

BOOL_NOTE = ("a comparison's result is a mask, for `select`",)
BOOL_HELP = ("for 0/1 values, cast it first: `cast(x, f32)`",)


@pytest.mark.parametrize(("inputs", "expr", "said"), [
    ("  input x: [2, 3]\n", "clamp(x, lo=2.0, hi=1.0)",
     ("E0305", "`clamp` needs lo <= hi", "hi=1.0", "hi=1.0 is below lo=2.0", (), (), ())),
    ("  input x: [2, 3]\n  input z: [4, 3]\n", "x + z",
     ("E0301", "the operands of `+` have incompatible shapes", "x", "f16[2, 3]",
      (("f16[4, 3]", "z"),),
      ("axis 0 differs: 2 vs 4; each axis must be equal or 1 to broadcast",), ())),
    ("  input x: bool[2, 3]\n", "neg(x)",
     ("E0401", "`neg` does not take bool inputs", "x", "bool here", (), BOOL_NOTE, BOOL_HELP)),
    # the second operand is checked too
    ("  input x: [2, 3]\n  input m: bool[2, 3]\n", "x * m",
     ("E0401", "`*` does not take bool inputs", "m", "bool here", (), BOOL_NOTE,
      ("for 0/1 values, cast it first: `cast(m, f32)`",))),
    ("  input x: i32[2, 3]\n", "sigmoid(x)",
     ("E0401", "`sigmoid` does not support i32 inputs", "x", "i32 here", (),
      (FLOATS_ONLY % "sigmoid",), ("convert first: `cast(x, f32)`",))),
    ("  input x: [2, 3]\n  input b: [4]\n", "bias_add(x, b, axis=1)",
     ("E0301", "`bias_add` needs a vector of 3 values along axis 1", "b", "f16[4]",
      (("f16[2, 3]", "x"),), ("axis 1 of x has size 3",), ())),
    ("  input x: [2, 3]\n  input b: [3]\n", "scale_mul(x, b, axis=2)",
     ("E0304", "axis 2 is out of range for a rank-2 tensor", "axis=2",
      "valid axes are 0..1 (or -2..-1)", (), (), ())),
])
def test_a_pointwise_refusal_is_said_whole(inputs: str, expr: str, said: Said,
                                           tmp_path: Path) -> None:
    assert _said(f"{inputs}  output y = {expr}", tmp_path) == [said]


@pytest.mark.parametrize(("inputs", "expr", "result"), [
    ("  input x: [2, 3]\n", "clamp(x, lo=1.0, hi=1.0)", "f16[2, 3]"),  # lo == hi is taken
    ("  input x: i32[2, 3]\n", "abs(x)", "i32[2, 3]"),  # abs is not float-only
    ("  input x: bool[2, 3]\n  input z: bool[2, 3]\n", "x == z", "bool[2, 3]"),  # masks compare
    ("  input x: [2, 3]\n  input b: [1]\n", "scale_mul(x, b, axis=-2)", "f16[2, 3]"),  # a 1 spreads
    ("  input x: [2, 1, 3]\n  input z: [4, 1]\n", "x - z", "f16[2, 4, 3]"),  # right-aligned
])
def test_a_pointwise_op_types_its_result(inputs: str, expr: str, result: str,
                                         tmp_path: Path) -> None:
    checked = check_source(HEAD + f"{inputs}  let y = {expr}\n  output o = y\n}}\n", tmp_path)
    assert not [d for d in checked.diagnostics if d.is_error]
    node = checked.model.graph.by_name()["y"]
    assert str(node.type).split(" @")[0] == result


# --- sdpa --------------------------------------------------------------------------------------

Q4 = "f16[2, 4, 8, 16]"
KV_HELP = ("`cast` the lengths to i32, or `expand` one length over the batch",)
KV_NOTE = ("cuDNN's padding mask reads one 32-bit length per batch row",)


@pytest.mark.parametrize(("k", "v", "extra", "args", "said"), [
    ("[2, 4, 8]", "[2, 4, 8, 16]", "", "",
     ("E0301", "`sdpa` expects rank-4 q, k and v: [B, H, S, D]", "k", "f16[2, 4, 8] has rank 3",
      (), (), ())),
    ("[3, 4, 8, 16]", "[2, 4, 8, 16]", "", "",
     ("E0301", "the batch of `k` does not match", "k", "f16[3, 4, 8, 16]", ((Q4, "q"),),
      ("expected 2, found 3",), ())),
    ("[2, 4, 8, 8]", "[2, 4, 8, 16]", "", "",
     ("E0301", "the head dimension of `k` does not match", "k", "f16[2, 4, 8, 8]", ((Q4, "q"),),
      ("expected 16, found 8",), ())),
    ("[2, 4, 8, 16]", "[2, 2, 8, 16]", "", "",
     ("E0301", "the head count of `v` does not match", "v", "f16[2, 2, 8, 16]", ((Q4, "q"),),
      ("expected 4, found 2",), ())),
    ("[2, 4, 8, 16]", "[2, 4, 6, 16]", "", "",
     ("E0301", "the sequence length of `v` does not match", "v", "f16[2, 4, 6, 16]",
      ((Q4, "q"),), ("expected 8, found 6",), ())),
    ("[2, 3, 8, 16]", "[2, 3, 8, 16]", "", "",
     ("E0301", "the query heads must be a multiple of the key/value heads", "k",
      "f16[2, 3, 8, 16]", ((Q4, "q"),), (), ())),
    ("[2, 4, 8, 16]", "[2, 4, 8, 16]", "", ", window=0",
     ("E0305", "`window` of `sdpa` must be at least 1", "window=0", "0 here", (), (), ())),
    ("[2, 4, 6, 16]", "[2, 4, 6, 16]", "", ", causal=true, align=\"bottom_right\"",
     ("E0305", "a bottom-right causal mask leaves the first 2 queries no key",
      "align=\"bottom_right\"", "more queries than keys", (),
      ("8 queries, 6 keys: the last query sees every key, each earlier one a key fewer",), ())),
    ("[2, 4, 8, 16]", "[2, 4, 8, 16]", "  input n: i64[2]\n", ", kv_len=n",
     ("E0301", "`kv_len` of `sdpa` must be i32 [2]: a count of valid keys per batch row",
      "kv_len=n", "i64[2]", (), KV_NOTE, KV_HELP)),
    ("[2, 4, 8, 16]", "[2, 4, 8, 16]", "  input n: i32[3]\n", ", kv_len=n",
     ("E0301", "`kv_len` of `sdpa` must be i32 [2]: a count of valid keys per batch row",
      "kv_len=n", "i32[3]", (), KV_NOTE, KV_HELP)),
    ("[2, 4, 8, 16]", "[2, 4, 8, 16]", "  input m: [2, 4, 3, 8]\n", ", bias=m",
     ("E0301", "the bias of `sdpa` does not broadcast to the scores [2, 4, 8, 8]", "bias=m",
      "f16[2, 4, 3, 8]", (), ("the scores are [B, H, Sq, Skv]: axis 2 of the scores is 8, the "
                              "bias has 3; each axis must be equal or 1",), ())),
    ("[2, 4, 8, 16]", "[2, 4, 8, 16]", "  input m: [1, 2, 4, 8, 8]\n", ", bias=m",
     ("E0301", "the bias of `sdpa` does not broadcast to the scores [2, 4, 8, 8]", "bias=m",
      "f16[1, 2, 4, 8, 8]", (), ("the scores are [B, H, Sq, Skv]: the bias has rank 5; each "
                                 "axis must be equal or 1",), ())),
])
def test_an_sdpa_refusal_is_said_whole(k: str, v: str, extra: str, args: str, said: Said,
                                       tmp_path: Path) -> None:
    body = (f"  input q: [2, 4, 8, 16]\n  input k: {k}\n  input v: {v}\n{extra}"
            f"  output y = sdpa(q, k, v{args})")
    assert _said(body, tmp_path) == [said]


HEAD_DIM_NOTE = "cuDNN SDPA needs head dimensions that are multiples of %d%s, at most 256"


@pytest.mark.parametrize(("qk", "v", "said"), [
    # refused at q, then v is not looked at (both would be refused): one error
    ("[2, 4, 8, D]", "[2, 4, 8, D]",
     ("E0305", "the head dimension of `sdpa` must be static", "q", "D varies", (), (), ())),
    ("[2, 4, 8, 12]", "[2, 4, 8, 20]",
     ("E0305", "head dimension 12 is not supported by `sdpa`", "q", "head dimension 12", (),
      (HEAD_DIM_NOTE % (8, ""),), ())),
    # a multiple of 8 above 256 (either side of `or` refuses alone)
    ("[2, 4, 8, 264]", "[2, 4, 8, 272]",
     ("E0305", "head dimension 264 is not supported by `sdpa`", "q", "head dimension 264", (),
      (HEAD_DIM_NOTE % (8, ""),), ())),
    ("[2, 4, 8, 16]", "[2, 4, 8, 264]",
     ("E0305", "head dimension 264 is not supported by `sdpa`", "v", "head dimension 264", (),
      (HEAD_DIM_NOTE % (8, ""),), ())),
])
def test_an_sdpa_head_dimension_cudnn_cannot_run_is_refused_once_at_q_or_v(
        qk: str, v: str, said: Said, tmp_path: Path) -> None:
    body = (f"  dim D = 8..64\n  input q: {qk}\n  input k: {qk}\n  input v: {v}\n"
            "  output y = sdpa(q, k, v)")
    assert _said(body, tmp_path) == [said]


def test_an_fp8_sdpa_head_dimension_must_be_a_multiple_of_16(tmp_path: Path) -> None:
    body = ("  input q: f8e4m3[1, 2, 16, 24]\n  input k: f8e4m3[1, 2, 16, 24]\n"
            "  input v: f8e4m3[1, 2, 16, 40]\n"
            "  input a: f32[1]\n  input b: f32[1]\n  input c: f32[1]\n"
            "  output y = sdpa(q, k, v, descale_q=a, descale_k=b, descale_v=c)")
    assert _said(body, tmp_path) == [
        ("E0305", "head dimension 24 is not supported by `sdpa`", "q", "head dimension 24", (),
         (HEAD_DIM_NOTE % (16, " (fp8)"),), ())]


@pytest.mark.parametrize("bias", ["[8, 8]", "[2, 1, 1, 8]", "[1, 4, 8, 1]"])
def test_an_sdpa_bias_that_broadcasts_to_the_scores_is_taken(bias: str, tmp_path: Path) -> None:
    body = ("  input q: [2, 4, 8, 16]\n  input k: [2, 4, 8, 16]\n  input v: [2, 4, 8, 16]\n"
            f"  input m: {bias}\n  output y = sdpa(q, k, v, bias=m)")
    assert _said(body, tmp_path) == []


# --- matmul in fp8 ------------------------------------------------------------------------------

def test_a_batched_fp8_matmul_checks_the_output_width_of_b_not_its_inner_size(
        tmp_path: Path) -> None:
    """b [2, 32, 24]: K 32 is a multiple of 16, N 24 is not (b's last axis, not its second)."""
    assert _said("  input x: [2, 8, 32]\n  param w: [2, 32, 24]\n"
                 "  output y = matmul(x, w, precision=f8e4m3)", tmp_path) == [
        ("E0404", "`matmul` cannot compute in f8e4m3 with output width N 24", "w",
         "output width N 24", (("f8e4m3 asked for here", "precision=f8e4m3"),),
         ("cuDNN's fp8 kernels need the output width N to be a multiple of 16",),
         ("pad the tensor to a multiple of 16, or leave this op unquantised",))]


# --- fp8 rounding -------------------------------------------------------------------------------

def test_round_fp8_reads_a_double_as_its_f32_value_first() -> None:
    """1.0625 + 2**-30 is 1.0625 in f32: halfway between the e4m3 values 1 and 1.125, which
    rounds to even (1.0); rounded from the double it would go up to 1.125."""
    from dslc.ops.fp8 import round_fp8

    out = round_fp8(np, np.array([1.0625 + 2.0**-30, -(1.0625 + 2.0**-30)]), "f8e4m3")
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, [1.0, -1.0])


# --- a refused fp8 request ----------------------------------------------------------------------

ATT = "  input q: %s[1, 2, 16, 16]\n  input k: %s[1, 2, 16, 16]\n  input v: %s[1, 2, 16, 16]\n"


@pytest.mark.parametrize(("body", "call", "message"), [
    (ATT % ("f16", "f16", "f16"), "sdpa(q, k, v, precision=f8e5m2)",
     "`sdpa` cannot compute in f8e5m2"),
    (ATT % ("f16", "f16", "f16") + "  input m: [1, 2, 16, 16]\n",
     "sdpa(q, k, v, bias=m, precision=f8e4m3)", "`sdpa` cannot compute in f8e4m3 with a bias"),
    ("  input x: i8[2, 16, 6, 6] @NHWC\n  param w: i8[16, 16, 3, 3]\n",
     "cast(conv(x, w, pad=1, precision=f8e4m3), f16)",
     "`conv` cannot quantise i8 operands to f8e4m3"),
    ("  input x: [2, 16, 6]\n  param w: [16, 16, 3]\n", "conv(x, w, pad=1, precision=f8e4m3)",
     "`conv` cannot compute in f8e4m3 with 1 spatial axes"),
    ("  input x: [8, 8]\n  param w: [8, 32]\n", "matmul(x, w, precision=f8e4m3)",
     "`matmul` cannot compute in f8e4m3 with inner dimension K 8"),
])
def test_an_op_refused_its_fp8_precision_gives_no_value_to_check_further(
        body: str, call: str, message: str, tmp_path: Path) -> None:
    """The refusal is the one error: a sum of its result and a tensor of another shape is not
    checked (its value is an error, not the type the op would have had)."""
    said = _said(body + f"  input z: [3]\n  output y = {call} + z", tmp_path)
    assert [(code, text) for code, text, *_ in said] == [("E0404", message)]


# --- expand -------------------------------------------------------------------------------------

EXPAND_SIZES = "sizes must be positive (or -1 where x has the axis: kept)"


@pytest.mark.parametrize(("x", "shape", "size"), [("[2, 3]", "[2, 0]", 0),
                                                  ("[2, 3]", "[2, -2]", -2),
                                                  ("[3]", "[-1, 3]", -1)])  # -1: no axis to keep
def test_expand_to_a_size_below_one_is_refused_at_the_shape(x: str, shape: str, size: int,
                                                            tmp_path: Path) -> None:
    assert _said(f"  input x: {x}\n  output y = expand(x, {shape})", tmp_path) == [
        ("E0305", f"`expand` to a size of {size}", shape, EXPAND_SIZES, (), (), ())]


def test_expand_of_an_axis_not_of_size_one_to_another_size_is_refused(tmp_path: Path) -> None:
    assert _said("  input x: [2, 3]\n  output y = expand(x, [2, 4])", tmp_path) == [
        ("E0301", "`expand` cannot make axis 1 of size 3 into 4", "[2, 4]", "",
         (("f16[2, 3]", "x"),), ("only axes of size 1 are repeated",), ())]


@pytest.mark.parametrize(("x", "shape", "result", "stored"), [
    ("[2, 1]", "[4, 2, -1]", "f16[4, 2, 1]", (4, 2, 1)),  # -1 keeps x's size, even 1
    ("[2, 1]", "[4, -1, 5]", "f16[4, 2, 5]", (4, 2, 5)),
    ("[1, 3]", "[5, 3]", "f16[5, 3]", (5, 3)),
])
def test_expand_keeps_an_axis_given_as_minus_one_and_repeats_axes_of_one(
        x: str, shape: str, result: str, stored: tuple[int, ...], tmp_path: Path) -> None:
    """The shape is stored with each -1 replaced by the size it keeps."""
    checked = check_source(HEAD + f"  input x: {x}\n  output y = expand(x, {shape})\n}}\n",
                           tmp_path)
    [node] = [n for n in checked.model.graph.nodes if n.op == "expand"]
    assert (str(node.type), dict(node.attrs)) == (result, {"shape": stored})


# --- slice --------------------------------------------------------------------------------------

def _slices(body: str, tmp_path: Path) -> list[tuple[str, dict[str, object]]]:
    """The type and attributes of each slice of a model."""
    checked = check_source(HEAD + body + "\n}\n", tmp_path)
    return [(str(n.type), dict(n.attrs)) for n in checked.model.graph.nodes if n.op == "slice"]


@pytest.mark.parametrize(("x", "index", "result", "starts", "ends"), [
    ("[4, 5]", "x[-3:-1]", "f16[2, 5]", (1, 0), (3, 5)),  # negative bounds count from the end
    ("[4, 5]", "x[:, 2:]", "f16[4, 3]", (0, 2), (4, 5)),  # an open bound is the whole axis
    ("[4, 5, 6]", "x[1:3]", "f16[2, 5, 6]", (1, 0, 0), (3, 5, 6)),  # the axes not indexed whole
])
def test_a_slice_is_typed_with_its_bounds_counted_from_the_start(
        x: str, index: str, result: str, starts: tuple[int, ...], ends: tuple[int, ...],
        tmp_path: Path) -> None:
    assert _slices(f"  input x: {x}\n  output y = relu({index})", tmp_path) == [
        (result, {"starts": starts, "ends": ends})]


def test_a_slice_keeps_the_memory_order_of_its_operand(tmp_path: Path) -> None:
    assert _slices("  input x: [2, 3, 4, 4] @NHWC\n  output y = relu(x[:, :, 1:3])", tmp_path) == [
        ("f16[2, 3, 2, 4] @NHWC", {"starts": (0, 0, 1, 0), "ends": (2, 3, 3, 4)})]


@pytest.mark.parametrize(("dims", "x", "index", "said"), [
    ("", "[4, 5]", "x[0:1, 0:1, 0:1]",
     ("E0607", "too many indices for a rank-2 tensor", "x", "f16[4, 5]", (), (), ())),
    ("", "[4, 5]", "x[-5:2]",
     ("E0607", "slice -1:2 is out of bounds on axis 0 of size 4", "-5:2", "needs 0 <= start",
      (("f16[4, 5]", "x"),), (), ())),
    ("", "[4, 5]", "x[3:2]",
     ("E0607", "slice 3:2 is out of bounds on axis 0 of size 4", "3:2", "needs start < stop",
      (("f16[4, 5]", "x"),), (), ())),
    ("", "[4, 5]", "x[:, 0:6]",
     ("E0607", "slice 0:6 is out of bounds on axis 1 of size 5", ":, 0:6", "needs stop <= size",
      (("f16[4, 5]", "x"),), (), ())),
    ("  dim T = 2..8\n", "[T]", "x[0:4]",
     ("E0607", "slice 0:4 is out of bounds for some admissible sizes on axis 0 of size T", "0:4",
      "needs stop <= size", (("f16[T]", "x"),), (),
      ("narrow the dim's range so the slice always fits",))),
])
def test_a_slice_out_of_bounds_is_refused_naming_the_bound_it_breaks(
        dims: str, x: str, index: str, said: Said, tmp_path: Path) -> None:
    assert _said(f"{dims}  input x: {x}\n  output y = relu({index})", tmp_path) == [said]


def test_a_slice_to_a_dims_end_fits_for_every_size(tmp_path: Path) -> None:
    assert _said("  dim T = 2..8\n  input x: [T]\n  output y = relu(x[1:T])", tmp_path) == []


# --- conv_transpose -----------------------------------------------------------------------------

CT = "  input x: %s\n  param w: %s\n  output y = conv_transpose(x, w%s)"


@pytest.mark.parametrize(("x", "w", "args", "said"), [
    ("[2, 3]", "[3, 2]", "",
     ("E0301", "`conv_transpose` expects x [N, K, *S] with 1 to 3 spatial axes", "x",
      "f16[2, 3] has rank 2", (), ("the first two axes are batch and channels",), ())),
    ("[1, 2, 5]", "[2, 3]", "",
     ("E0301", "the weight of `conv_transpose` must have rank 3", "w", "f16[2, 3]", (),
      ("w is [K, C, *R] (PyTorch's ConvTranspose layout)",), ())),
    ("i32[1, 2, 5]", "i32[2, 3, 3]", "",
     ("E0401", "`conv_transpose` does not support i32 inputs", "x", "i32 here", (),
      (FLOATS_ONLY % "conv_transpose",), ("convert first: `cast(x, f32)`",))),
    ("[1, 2, 5]", "[4, 3, 3]", "",
     ("E0301", "the weight's first axis must match the input channels", "w", "f16[4, 3, 3]",
      (("f16[1, 2, 5]", "x"),), ("x has 2 channels, w.shape[0] is 4",), ())),
    ("[1, 2, 5]", "[2, 3, 3]", ", stride=0",
     ("E0305", "`stride` of `conv_transpose` must be at least 1", "stride=0", "0 here", (), (),
      ())),
    ("[1, 2, 5]", "[2, 3, 3]", ", dilation=0",
     ("E0305", "`dilation` of `conv_transpose` must be at least 1", "dilation=0", "0 here", (),
      (), ())),
    ("[1, 2, 5]", "[2, 3, 3]", ", pad=-1",
     ("E0305", "`pad` of `conv_transpose` must be at least 0", "pad=-1", "-1 here", (), (), ())),
    ("[1, 2, 5]", "[2, 3, 3]", ", output_pad=-1",
     ("E0305", "`output_pad` of `conv_transpose` must be at least 0", "output_pad=-1",
      "-1 here", (), (), ())),
    ("[1, 2, 5]", "[2, 3, 3]", ", stride=[1, 1]",
     ("E0305", "`stride` of `conv_transpose` needs 1 values, one per spatial axis",
      "stride=[1, 1]", "2 given", (), (), ())),
    ("[1, 2, 5]", "[2, 3, 3]", ", stride=2, output_pad=2",
     ("E0305", "`output_pad` must be smaller than the stride or the dilation", "output_pad=2",
      "2 here", (), (), ())),
    ("[1, 2, 5, 5]", "[2, 3, 3, 3]", ", stride=[2, 1], output_pad=[0, 1]",
     ("E0305", "`output_pad` must be smaller than the stride or the dilation",
      "output_pad=[0, 1]", "1 here", (), (), ())),
    ("[1, 2, 1]", "[2, 3, 1]", ", pad=1",  # (1 - 1) * 1 - 2 * 1 + 1 * (1 - 1) + 1 = -1
     ("E0603", "the output of `conv_transpose` has size below 1 on axis 2", "x",
      "output size is -1", (),
      ("every output size must be at least 1 for every admissible input size",),
      ("use less padding, a larger kernel, stride or output_pad, or raise the dim's "
       "lower bound",))),
])
def test_a_conv_transpose_refusal_is_said_whole(x: str, w: str, args: str, said: Said,
                                                tmp_path: Path) -> None:
    assert _said(CT % (x, w, args), tmp_path) == [said]


def test_a_conv_transpose_computed_in_f16_is_refused_it_needs_f32(tmp_path: Path) -> None:
    assert _said(CT % ("[1, 2, 5]", "[2, 3, 3]", ""), tmp_path, HEAD_F16) == [
        ("E0403", "`conv_transpose` needs compute=f32, but compute is f16 here", "conv_transpose",
         "computed in f16", (("compute=f16 set here", "compute=f16"),),
         ("cuDNN runs `conv_transpose` with f32 math",),
         ("set `precision compute=f32` in the model, or in the def that holds this op",))]


@pytest.mark.parametrize(("x", "w", "args", "result", "attrs"), [
    # (S - 1) * stride - 2 * pad + dilation * (R - 1) + 1 + output_pad, per axis:
    ("[1, 2, 5]", "[2, 3, 3]", "", "f16[1, 3, 7]",  # 4 + 2 + 1
     {"stride": (1,), "dilation": (1,), "pad": (0,), "output_pad": (0,)}),
    ("[1, 2, 5]", "[2, 3, 3]", ", stride=2, pad=1, dilation=2, output_pad=1",
     "f16[1, 3, 12]",  # 8 - 2 + 4 + 1 + 1
     {"stride": (2,), "dilation": (2,), "pad": (1,), "output_pad": (1,)}),
    ("[1, 2, 5, 4]", "[2, 3, 3, 2]",
     ", stride=[2, 1], pad=[1, 0], dilation=[1, 3], output_pad=[1, 0]",
     "f16[1, 3, 10, 7]",  # 8 - 2 + 2 + 1 + 1; 3 + 3 + 1
     {"stride": (2, 1), "dilation": (1, 3), "pad": (1, 0), "output_pad": (1, 0)}),
    ("[1, 2, 5]", "[2, 3, 3]", ", stride=2, dilation=3, output_pad=2",  # 2 < max(2, 3)
     "f16[1, 3, 17]",  # 8 + 6 + 1 + 2
     {"stride": (2,), "dilation": (3,), "pad": (0,), "output_pad": (2,)}),
    ("[1, 2, 1]", "[2, 3, 1]", "", "f16[1, 3, 1]",  # the smallest output, 1
     {"stride": (1,), "dilation": (1,), "pad": (0,), "output_pad": (0,)}),
])
def test_a_conv_transposes_output_size_and_attributes(
        x: str, w: str, args: str, result: str, attrs: dict[str, object],
        tmp_path: Path) -> None:
    checked = check_source(HEAD + (CT % (x, w, args)) + "\n}\n", tmp_path)
    [node] = [n for n in checked.model.graph.nodes if n.op == "conv_transpose"]
    assert (str(node.type), dict(node.attrs)) == (result, attrs)


# --- the attention reference --------------------------------------------------------------------

def _attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float,
               masked: np.ndarray, bias: np.ndarray | float = 0.0) -> np.ndarray:
    """softmax(q k^T * scale + bias) v in float64, -inf where `masked`, written out: k and v
    have as many heads as q here."""
    s = np.einsum("bhqd,bhkd->bhqk", q.astype(np.float64), k.astype(np.float64)) * scale + bias
    s = np.where(masked, -np.inf, s)
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return np.einsum("bhqk,bhkd->bhqd", e / e.sum(axis=-1, keepdims=True), v.astype(np.float64))


def _qkv(hq: int = 2, hk: int = 2, sq: int = 3, skv: int = 5, d: int = 4,
         b: int = 2) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    return (rng.standard_normal((b, hq, sq, d)).astype(np.float32),
            rng.standard_normal((b, hk, skv, d)).astype(np.float32),
            rng.standard_normal((b, hk, skv, d)).astype(np.float32))


def _sdpa(xs: list[np.ndarray], **attrs: object) -> np.ndarray:
    from dslc.ops import OPS

    reference = OPS["sdpa"].reference
    assert reference is not None
    return np.asarray(reference(xs, {"scale": None, "causal": False, "window": None, **attrs}))


I3, J5 = np.arange(3)[:, None], np.arange(5)[None, :]  # query i, key j of a 3 x 5 score


@pytest.mark.parametrize(("attrs", "masked"), [
    ({}, np.zeros((3, 5), bool)),
    ({"causal": True}, J5 > I3),  # top-left: query i sees keys 0..i
    ({"causal": True, "align": "bottom_right"}, J5 > I3 + 2),  # the last query sees every key
    ({"causal": True, "window": 2}, (J5 > I3) | (J5 <= I3 - 2)),  # keys i - 1 and i
    ({"causal": True, "window": 2, "align": "bottom_right"},
     (J5 > I3 + 2) | (J5 <= I3)),  # keys i + 1 and i + 2
])
def test_sdpa_reference_masks_the_keys_its_diagonal_and_window_leave_out(
        attrs: dict[str, object], masked: np.ndarray) -> None:
    q, k, v = _qkv()
    expected = _attention(q, k, v, 1 / 2.0, masked)  # 1 / sqrt(4)
    np.testing.assert_allclose(_sdpa([q, k, v], **attrs), expected, rtol=1e-5, atol=1e-6)


def test_sdpa_reference_takes_a_given_scale_and_adds_a_bias() -> None:
    q, k, v = _qkv()
    bias = np.linspace(-1.0, 1.0, 3 * 5, dtype=np.float32).reshape(3, 5)
    expected = _attention(q, k, v, 0.3, np.zeros((3, 5), bool), bias)
    got = _sdpa([q, k, v, bias], scale=0.3, operands=("q", "k", "v", "bias"))
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_sdpa_reference_repeats_each_key_head_for_its_group_of_query_heads() -> None:
    """GQA: 4 query heads over 2 key/value heads, query heads 0, 1 read head 0 and 2, 3 head 1."""
    q, k, v = _qkv(hq=4, hk=2)
    kr, vr = k[:, [0, 0, 1, 1]], v[:, [0, 0, 1, 1]]
    expected = _attention(q, kr, vr, 0.5, np.zeros((3, 5), bool))
    np.testing.assert_allclose(_sdpa([q, k, v]), expected, rtol=1e-5, atol=1e-6)


KV_LEN = ("q", "k", "v", "kv_len")


def test_sdpa_reference_masks_each_rows_keys_from_its_valid_length_on() -> None:
    q, k, v = _qkv()
    masked = np.stack([J5 >= 4, J5 >= 2])[:, None]  # kv_len 4 and 2
    got = _sdpa([q, k, v, np.array([4, 2], np.int32)], operands=KV_LEN)
    np.testing.assert_allclose(got, _attention(q, k, v, 0.5, masked), rtol=1e-5, atol=1e-6)


def test_sdpa_reference_aligns_a_bottom_right_diagonal_to_each_rows_valid_length() -> None:
    """Query i of row b is at key L[b] - 3 + i: row 1 (L 2) leaves query 0 no key, a NaN row
    (the softmax of nothing)."""
    q, k, v = _qkv()
    masked = np.stack([(J5 >= 4) | (J5 > I3 + 1), (J5 >= 2) | (J5 > I3 - 1)])[:, None]
    with np.errstate(invalid="ignore"):
        got = _sdpa([q, k, v, np.array([4, 2], np.int32)], causal=True, align="bottom_right",
                    operands=KV_LEN)
        expected = _attention(q, k, v, 0.5, masked)
    assert np.isnan(got[1, :, 0]).all()
    np.testing.assert_allclose(got[0], expected[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got[1, :, 1:], expected[1, :, 1:], rtol=1e-5, atol=1e-6)


def test_sdpa_reference_of_fp8_operands_descales_and_rounds_the_probabilities_to_e4m3() -> None:
    """Scores times descale_q * descale_k; the probabilities times 448 rounded to e4m3 (by
    ml_dtypes here), multiplied by v, then times descale_v / 448."""
    import ml_dtypes

    q, k, v = _qkv(b=1)
    dq, dk, dv = (np.array([x], np.float32) for x in (0.5, 0.25, 2.0))
    s = np.einsum("bhqd,bhkd->bhqk", q, k).astype(np.float64) * 0.5 * (0.5 * 0.25)
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    p = (e / e.sum(axis=-1, keepdims=True)).astype(np.float32) * np.float32(448.0)
    p8 = p.astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
    expected = np.einsum("bhqk,bhkd->bhqd", p8, v) * (2.0 / 448.0)
    got = _sdpa([q, k, v, dq, dk, dv], operands=("q", "k", "v", "descale_q", "descale_k",
                                                 "descale_v"))
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


# --- concat, gather -----------------------------------------------------------------------------

def _typed(body: str, op: str, tmp_path: Path) -> list[tuple[str, dict[str, object]]]:
    """The type and attributes of each node of `op` in a model."""
    checked = check_source(HEAD + body + "\n}\n", tmp_path)
    return [(str(n.type), dict(n.attrs)) for n in checked.model.graph.nodes if n.op == op]


@pytest.mark.parametrize(("z", "items", "axis", "said"), [
    ("i32[2, 3]", "[x, x, z]", 0,
     ("E0401", "the tensors given to `concat` have different dtypes", "[x, x, z]",
      "item 2 is i32, item 0 is f16", (), (), ("cast them to one dtype first",))),
    ("[2, 4]", "[x, z]", 0,
     ("E0301", "the tensors given to `concat` differ outside the concat axis", "[x, z]",
      "item 1 is f16[2, 4], item 0 is f16[2, 3]", (), ("all axes but axis 0 must be equal",),
      ())),
    ("[2, 4, 1]", "[x, z]", 1,  # the same sizes but another rank
     ("E0301", "the tensors given to `concat` differ outside the concat axis", "[x, z]",
      "item 1 is f16[2, 4, 1], item 0 is f16[2, 3]", (), ("all axes but axis 1 must be equal",),
      ())),
])
def test_a_concat_of_unlike_tensors_is_refused_naming_the_item(
        z: str, items: str, axis: int, said: Said, tmp_path: Path) -> None:
    body = f"  input x: [2, 3]\n  input z: {z}\n  output y = concat({items}, axis={axis})"
    assert _said(body, tmp_path) == [said]


@pytest.mark.parametrize(("z", "items", "axis", "result", "stored"), [
    ("[2, 4]", "[x, z, x]", "1", "f16[2, 10]", 1),
    ("[2, 4]", "[x, z]", "-1", "f16[2, 7]", 1),  # a negative axis stored as its positive one
    ("[5, 3]", "[x, z]", "0", "f16[7, 3]", 0),
])
def test_a_concat_sums_the_sizes_along_its_axis(z: str, items: str, axis: str, result: str,
                                                stored: int, tmp_path: Path) -> None:
    body = f"  input x: [2, 3]\n  input z: {z}\n  output y = concat({items}, axis={axis})"
    [(typed, attrs)] = _typed(body, "concat", tmp_path)
    assert (typed, attrs["axis"]) == (result, stored)


@pytest.mark.parametrize(("x", "i", "axis", "said"), [
    ("i32[4, 3]", "i64[2]", "0",
     ("E0401", "`gather` reads a table of floats, not i32", "x", "i32[4, 3]", (),
      ("an index outside the table gives NaN, which only a float can hold",), ())),
    ("[4, 3]", "f32[2]", "0",
     ("E0401", "the indices of `gather` are integers (i32 or i64), not f32", "i", "f32[2]", (), (),
      ("declare them `i64` (or `cast` them)",))),
    ("[4, 3]", "i64[2]", "2",
     ("E0305", "`axis` of `gather` is 2, but x has rank 2", "axis=2", "", (), (), ())),
    ("[4, 3]", "i64[2]", "-3",
     ("E0305", "`axis` of `gather` is -3, but x has rank 2", "axis=-3", "", (), (), ())),
])
def test_a_gather_refusal_is_said_whole(x: str, i: str, axis: str, said: Said,
                                        tmp_path: Path) -> None:
    body = f"  input x: {x}\n  input i: {i}\n  output y = gather(x, i, axis={axis})"
    assert _said(body, tmp_path) == [said]


@pytest.mark.parametrize(("i", "axis", "result", "stored"), [
    ("i64[2, 6]", "1", "f16[4, 2, 6, 5]", 1),  # the indices' shape replaces the axis
    ("i32[2]", "-1", "f16[4, 3, 2]", 2),
    ("i64[2]", "-3", "f16[2, 3, 5]", 0),  # the lowest axis a rank-3 table has
])
def test_a_gather_puts_the_indices_shape_in_place_of_its_axis(
        i: str, axis: str, result: str, stored: int, tmp_path: Path) -> None:
    body = f"  input x: [4, 3, 5]\n  input i: {i}\n  output y = gather(x, i, axis={axis})"
    assert _typed(body, "gather", tmp_path) == [(result, {"axis": stored})]


def test_a_concat_of_nothing_or_along_an_axis_it_lacks_is_refused(tmp_path: Path) -> None:
    assert _said("  input x: [2, 3]\n  output y = concat([], axis=0) + x", tmp_path) == [
        ("E0204", "`concat` needs at least one tensor", "[]", "", (), (), ())]
    assert _said("  input x: [2, 3]\n  output y = concat([x, x], axis=2)", tmp_path) == [
        ("E0304", "axis 2 is out of range for a rank-2 tensor", "axis=2",
         "valid axes are 0..1 (or -2..-1)", (), (), ())]


# --- conv in fp8 over a one-pixel image ---------------------------------------------------------

@pytest.mark.parametrize(("image", "window", "pad", "shown"), [
    ("[1, 16, 1, 8]", "[16, 16, 3, 3]", "1", "[3, 3]"),  # the height one pixel, a 3-high window
    ("[1, 16, 1, 8]", "[16, 16, 2, 1]", "[1, 0]", "[2, 1]"),  # a 2-high window
    ("[1, 16, 8, 1]", "[16, 16, 1, 3]", "[0, 1]", "[1, 3]"),  # the width one pixel
])
def test_an_fp8_conv_of_a_window_wider_than_a_one_pixel_image_is_refused(
        image: str, window: str, pad: str, shown: str, tmp_path: Path) -> None:
    said = _said(f"  input x: {image}\n  param w: {window}\n"
                 f"  output y = conv(x, w, pad={pad}, precision=f8e4m3)", tmp_path)
    assert [(code, message, under) for code, message, under, *_ in said] == [
        ("E0404", f"`conv` cannot compute in f8e4m3 with a {shown} window over a one-pixel image",
         "x")]


def test_an_fp8_conv_of_a_one_pixel_window_over_a_one_pixel_image_is_taken(
        tmp_path: Path) -> None:
    assert _said("  input x: [1, 16, 1, 1]\n  param w: [16, 16, 1, 1]\n"
                 "  output y = conv(x, w, precision=f8e4m3)", tmp_path) == []


def test_sdpa_operands_named_one_to_one_with_their_values() -> None:
    """`named_operands` pairs the names with the values strictly: a list of the wrong length
    (a malformed `operands` attribute) is an error, not a silently shorter mapping."""
    from dslc.ops.attention import named_operands

    assert named_operands({}, ["a", "b", "c"]) == {"q": "a", "k": "b", "v": "c"}
    assert named_operands({"operands": ("q", "k", "v", "kv_len")}, [1, 2, 3, 4])["kv_len"] == 4
    with pytest.raises(ValueError):
        named_operands({}, ["a", "b"])
    with pytest.raises(ValueError):
        named_operands({"operands": ("q", "k", "v")}, [1, 2, 3, 4])


# --- layernorm, rmsnorm: the type rule of the feature norms -------------------------------------

FEATURE_NORMS = {"layernorm": "  input x: %s\n  param s: %s\n  param b: %s\n"
                              "  output y = layernorm(x, s, b)",
                 "rmsnorm": "  input x: %s\n  param s: %s\n  param b: %s\n"
                            "  output y = rmsnorm(x, s, bias=b)"}
TRAILING = "the rank of `scale` picks the normalised axes: x [*L, *D], scale [*D]"


@pytest.mark.parametrize("op", ["layernorm", "rmsnorm"])
def test_a_layer_or_rms_norm_of_integers_is_refused_at_x(op: str, tmp_path: Path) -> None:
    assert _said(FEATURE_NORMS[op] % ("i32[2, 4]", "[4]", "[4]"), tmp_path) == [
        ("E0401", f"`{op}` does not support i32 inputs", "x", "i32 here", (),
         (FLOATS_ONLY % op,), ("convert first: `cast(x, f32)`",))]


@pytest.mark.parametrize("op", ["layernorm", "rmsnorm"])
@pytest.mark.parametrize("scale", ["[3]",  # the rank of a trailing axis, another size
                                   "[]",  # no axis at all: nothing to normalise
                                   "[2, 2, 4]"])  # more axes than x has
def test_a_layer_or_rms_norm_scale_not_the_trailing_axes_of_x_is_refused_at_the_scale(
        op: str, scale: str, tmp_path: Path) -> None:
    assert _said(FEATURE_NORMS[op] % ("[2, 4]", scale, scale), tmp_path) == [
        ("E0301", f"the scale of `{op}` must match the trailing axes of x", "s", f"f16{scale}",
         (("f16[2, 4]", "x"),), (TRAILING,), ())]


@pytest.mark.parametrize("op", ["layernorm", "rmsnorm"])
@pytest.mark.parametrize("scale", ["[4]", "[2, 4]"])  # the last axis; every axis of x
def test_a_layer_or_rms_norm_scale_over_trailing_axes_up_to_all_of_x_is_taken(
        op: str, scale: str, tmp_path: Path) -> None:
    assert _said(FEATURE_NORMS[op] % ("[2, 4]", scale, scale), tmp_path) == []


@pytest.mark.parametrize(("op", "under"), [("layernorm", "b"), ("rmsnorm", "bias=b")])
def test_a_layer_or_rms_norm_bias_not_the_shape_of_its_scale_is_refused_at_the_bias(
        op: str, under: str, tmp_path: Path) -> None:
    assert _said(FEATURE_NORMS[op] % ("[2, 4]", "[4]", "[3]"), tmp_path) == [
        ("E0301", f"the bias of `{op}` must have the shape of its scale", under, "f16[3]",
         (("f16[4]", "s"),), (), ())]


# --- cast to fp8, unary ops on fp8 --------------------------------------------------------------

def _warned(body: str, tmp_path: Path) -> list[Said]:
    """Every warning of a model, whole, as `_said` gives its errors."""
    source = HEAD + body + "\n}\n"
    return [whole(d, source) for d in check_source(source, tmp_path).diagnostics
            if not d.is_error]


@pytest.mark.parametrize(("inputs", "expr", "under", "scaled"), [
    ("  input x: [2, 3]\n", "cast(x, %s)", "x", "x * s"),  # an input: nothing produced it
    # produced, but not by a scaling; the help writes the operand as it is written
    ("  input x: [2, 3]\n", "cast(relu(x), %s)", "relu(x)", "relu(x) * s"),
    ("  input x: [2, 3]\n", "cast(x + 1.0, %s)", "x + 1.0", "(x + 1.0) * s"),
    # one call, with calls nested inside it; a dotted name
    ("  input x: [2, 3]\n", "cast(max(relu(x), x), %s)", "max(relu(x), x)", "max(relu(x), x) * s"),
    ("  param blk.w: [2, 3]\n", "cast(blk.w, %s)", "blk.w", "blk.w * s"),
    ("  input x: [2, 3]\n", "cast(relu(x) + relu(x), %s)", "relu(x) + relu(x)",
     "(relu(x) + relu(x)) * s"),
])
@pytest.mark.parametrize("fp8", ["f8e4m3", "f8e5m2"])
def test_a_cast_to_fp8_of_an_unscaled_value_is_warned_of_whole_at_the_value(
        inputs: str, expr: str, under: str, scaled: str, fp8: str, tmp_path: Path) -> None:
    assert _warned(f"{inputs}  output y = {expr % fp8}", tmp_path) == [
        ("W0401", f"narrowing f16 to {fp8} without a scale", under, "not scaled first", (),
         (f"{fp8} has a narrow range: larger values saturate (e4m3) or become infinite (e5m2)",),
         (f"multiply by a scale before the cast: `cast({scaled}, {fp8})`",))]


@pytest.mark.parametrize(("inputs", "expr"), [
    ("  input x: [2, 3]\n  param s: [2, 3]\n", "cast(x * s, f8e4m3)"),
    ("  input x: [2, 3]\n  param s: [2, 3]\n", "cast(x / s, f8e4m3)"),
    ("  input x: [2, 3]\n  param s: [3]\n", "cast(scale_mul(x, s, axis=1), f8e4m3)"),
    ("  input x: f8e4m3[2, 3]\n", "cast(x, f8e5m2)"),  # fp8 to fp8 narrows nothing
    ("  input x: [2, 3]\n", "cast(x, f32)"),  # not to fp8
])
def test_a_cast_to_fp8_of_a_scaled_value_or_of_fp8_is_not_warned_of(
        inputs: str, expr: str, tmp_path: Path) -> None:
    assert _warned(f"{inputs}  output y = {expr}", tmp_path) == []
    assert _said(f"{inputs}  output y = {expr}", tmp_path) == []


@pytest.mark.parametrize("op", ["relu", "neg", "exp"])
def test_a_unary_op_of_fp8_is_refused_at_x(op: str, tmp_path: Path) -> None:
    assert _said(f"  input x: f8e4m3[2, 3]\n  output y = {op}(x)", tmp_path) == [
        ("E0401", f"`{op}` does not take f8e4m3 inputs", "x", "f8e4m3 here", (),
         ("fp8 tensors are taken only by `conv`, `matmul` and `cast`",),
         ("widen it first: `cast(x, f16)`",))]


# --- sdpa's fp8 operands, the lengths lowering adds -------------------------------------------------

SDPA_FP8 = ("  input q: %s[2, 4, 8, 64]\n  input k: %s[2, 4, 8, 64]\n  input v: %s[2, 4, 8, 64]\n"
            "  param d1: f32[1]\n  param d2: f32[1]\n  param d3: f32[1]\n  output y = sdpa(%s)")


@pytest.mark.parametrize(("dtypes", "descales", "with_"), [
    (("f8e4m3", "f16", "f16"), "", "no descales"),  # one fp8 operand, nothing to undo its scale
    (("f8e4m3",) * 3, ", descale_q=d1, descale_k=d2", "`descale_q`, `descale_k`"),  # one missing
    (("f16",) * 3, ", descale_q=d1, descale_k=d2, descale_v=d3",  # descales of nothing
     "`descale_q`, `descale_k`, `descale_v`"),
])
def test_an_fp8_sdpa_without_all_three_e4m3_operands_and_descales_is_refused_whole(
        dtypes: tuple[str, str, str], descales: str, with_: str, tmp_path: Path) -> None:
    body = SDPA_FP8 % (*dtypes, f"q, k, v{descales}")
    assert _said(body, tmp_path) == [
        ("E0401", "fp8 `sdpa` takes e4m3 q, k and v, each with its descale", "sdpa",
         f"q, k and v are {'/'.join(dtypes)}, with {with_}", (),
         ("write the request instead, and let calibration find the scales: "
          "`sdpa(q, k, v, precision=f8e4m3)`",), ())]


def _sdpa_silently(dtype: str = "f16", io: str = "f32", cudnn: bool = False,
                   **operands: object) -> tuple[object, list[str]]:
    """sdpa's type rule as the IR verifier runs it on lowered IR, where lowering may have added
    `q_len` (no source writes it): q, k and v [2, 4, 8, 64] of `dtype` with `operands` beside
    them, its result and the errors recorded."""
    from dslc.core.dims import DimEnv
    from dslc.core.types import PrecisionSpec, TensorType
    from dslc.diag.span import Span
    from dslc.ops import OPS
    from dslc.ops.opdef import Args, SilentCtx

    ctx = SilentCtx(DimEnv(), PrecisionSpec(io=io), {}, Span("m.cgraph", 1, 1, 1, 2), cudnn=cudnn)
    qkv = TensorType(dtype, (2, 4, 8, 64))
    args = Args({"q": qkv, "k": qkv, "v": qkv, **operands})
    return OPS["sdpa"].infer(ctx, args), ctx.errors


def test_sdpa_checks_a_q_len_lowering_added_even_without_kv_len() -> None:
    from dslc.core.types import TensorType

    good = TensorType("i32", (2,))
    assert _sdpa_silently(q_len=good)[1] == []
    assert _sdpa_silently(kv_len=good, q_len=good)[1] == []
    for lengths in ({"q_len": TensorType("f32", (2,))},
                    {"kv_len": good, "q_len": TensorType("i32", (3,))}):
        assert _sdpa_silently(**lengths) == (None, [
            "E0301 `q_len` of `sdpa` must be i32 [2]: a count of valid keys per batch row"])


def test_sdpa_with_wrong_lengths_has_no_result() -> None:
    from dslc.core.types import TensorType

    assert _sdpa_silently(kv_len=TensorType("i32", (2, 1))) == (None, [
        "E0301 `kv_len` of `sdpa` must be i32 [2]: a count of valid keys per batch row"])


SDPA_RANKS = ("  input q: f16%s\n  input k: f16%s\n  input v: f16%s\n  output y = sdpa(q, k, v)")


@pytest.mark.parametrize("at", ["q", "v"])
def test_an_sdpa_operand_of_rank_three_is_refused_at_that_operand(at: str, tmp_path: Path) -> None:
    shapes = ["[2, 8, 64]" if name == at else "[2, 4, 8, 64]" for name in "qkv"]
    assert _said(SDPA_RANKS % tuple(shapes), tmp_path) == [
        ("E0301", "`sdpa` expects rank-4 q, k and v: [B, H, S, D]", at,
         "f16[2, 8, 64] has rank 3", (), (), ())]


def test_an_integer_sdpa_is_refused_whole_naming_q_s_dtype_first(tmp_path: Path) -> None:
    body = SDPA_FP8 % ("i32", "i8", "i8", "q, k, v")
    assert _said(body, tmp_path) == [
        ("E0401", "`sdpa` does not support i32 inputs", "sdpa", "q, k and v are i32/i8 here", (),
         ("sdpa takes f16 or bf16 (cuDNN), or f32 (a fallback kernel); fp8 operands come with "
          "their descales (`descale_q=`, ...)",), ())]


def test_a_descale_of_more_than_one_value_is_refused_at_it(tmp_path: Path) -> None:
    body = (SDPA_FP8 % ("f8e4m3", "f8e4m3", "f8e4m3",
                        "q, k, v, descale_q=d1, descale_k=d2, descale_v=d3")
            ).replace("param d1: f32[1]", "param d1: f32[2]")
    assert _said(body, tmp_path) == [
        ("E0401", "`descale_q` of `sdpa` must be one f32 value", "descale_q=d1", "f32[2]", (), (),
         ())]


@pytest.mark.parametrize("at", ["k", "v"])
def test_an_sdpa_operand_of_another_float_dtype_than_q_is_refused_at_it(
        at: str, tmp_path: Path) -> None:
    dtypes = ["bf16" if name == at else "f16" for name in "qkv"]
    body = SDPA_FP8 % (*dtypes, "q, k, v")
    assert _said(body, tmp_path) == [
        ("E0401", "the operands of `sdpa` have different dtypes", at, "bf16", (("f16", "q"),), (),
         (f"cast one of them: `cast({at}, f16)`",))]


def test_an_sdpa_v_of_another_batch_than_q_is_refused_at_v(tmp_path: Path) -> None:
    body = ("  input q: f16[2, 4, 8, 64]\n  input k: f16[2, 4, 8, 64]\n"
            "  input v: f16[3, 4, 8, 64]\n  output y = sdpa(q, k, v)")
    assert _said(body, tmp_path) == [
        ("E0301", "the batch of `v` does not match", "v", "f16[3, 4, 8, 64]",
         (("f16[2, 4, 8, 64]", "q"),), ("expected 2, found 3",), ())]


@pytest.mark.parametrize(("d", "warned"), [
    (128, []),
    (136, [("W0302", "head dimension 136 is above 128", "sdpa", "head dimension 136", (),
            ("cuDNN's flash-attention engines take up to 256, but some architectures and modes "
             "stop at 128",), ())]),
])
def test_sdpa_warns_of_a_head_dimension_above_128_not_of_128(
        d: int, warned: list[Said], tmp_path: Path) -> None:
    qkv = f"[1, 2, 8, {d}]"
    body = f"  input q: {qkv}\n  input k: {qkv}\n  input v: {qkv}\n  output y = sdpa(q, k, v)"
    assert _said(body, tmp_path) == []
    assert _warned(body, tmp_path) == warned


@pytest.mark.parametrize(("io", "result"), [("f16", "f16"), ("bf16", "bf16"), ("f32", "f16")])
def test_an_fp8_sdpa_writes_the_io_dtype_where_it_is_16_bits_else_f16(io: str,
                                                                      result: str) -> None:
    """cuDNN's fp8 attention writes a 16-bit result."""
    from dslc.core.types import TensorType

    one = TensorType("f32", (1,))
    assert _sdpa_silently("f8e4m3", io, cudnn=True, descale_q=one, descale_k=one,
                          descale_v=one) == (TensorType(result, (2, 4, 8, 64)), [])


QKV16 = "  input q: [2, 4, 8, 16]\n  input k: [2, 4, 8, 16]\n  input v: [2, 4, 8, 16]\n"


@pytest.mark.parametrize("args", [", window=1", ", causal=true, align=\"bottom_right\""])
def test_sdpa_takes_a_window_of_one_key_and_a_bottom_right_mask_over_as_many_keys_as_queries(
        args: str, tmp_path: Path) -> None:
    assert _said(QKV16 + f"  output y = sdpa(q, k, v{args})", tmp_path) == []


def test_an_sdpa_computed_in_f16_is_refused_it_needs_f32(tmp_path: Path) -> None:
    assert _said(QKV16 + "  output y = sdpa(q, k, v)", tmp_path, HEAD_F16) == [
        ("E0403", "`sdpa` needs compute=f32, but compute is f16 here", "sdpa", "computed in f16",
         (("compute=f16 set here", "compute=f16"),), ("cuDNN runs `sdpa` with f32 math",),
         ("set `precision compute=f32` in the model, or in the def that holds this op",))]


def test_sdpa_records_its_scale_as_a_float_and_none_when_not_given(tmp_path: Path) -> None:
    common = {"align": "top_left", "causal": False, "operands": ("q", "k", "v"), "window": None}
    assert _typed(QKV16 + "  output y = sdpa(q, k, v, scale=1)", "sdpa", tmp_path) == [
        ("f16[2, 4, 8, 16]", {**common, "scale": 1.0})]
    (_, attrs), = _typed(QKV16 + "  output y = sdpa(q, k, v, scale=1)", "sdpa", tmp_path)
    assert isinstance(attrs["scale"], float)
    assert _typed(QKV16 + "  output y = sdpa(q, k, v)", "sdpa", tmp_path) == [
        ("f16[2, 4, 8, 16]", {**common, "scale": None})]
