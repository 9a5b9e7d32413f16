"""The ops' rules as a user meets them. The fp8 forms cuDNN takes (LANGUAGE.md 3.4 rule 6,
E0404), rule by rule: each refusal said once, at the operand it is about, naming the op, the
size or dtype that stops it, where fp8 was asked for, and what to do; and the forms taken said
nothing of (the golden cases in tests/diagnostics/ show a few renderings whole; these hold every
branch). The signatures `dslc ops` prints. (Written for the survivors of the ops mutation group:
docs/mutation.md.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import Said, check_source, span_text, whole

HEAD = "cgraph 0.1\nmodel m {\n  precision io=f16, intermediate=f32, compute=f32\n"


def _e0404(body: str, tmp_path: Path) -> list[tuple[str, str, tuple[str, ...], tuple[str, ...],
                                                      tuple[str, ...]]]:
    """The E0404s of a model: (message, label, secondary labels, notes, help)."""
    checked = check_source(HEAD + body + "\n}\n", tmp_path)
    assert all(d.code in ("E0404", "W0501", "W0303") for d in checked.diagnostics), \
        [(d.code, d.message) for d in checked.diagnostics]
    return [(d.message, d.label, tuple(label.text for label in d.labels), d.notes, d.help)
            for d in checked.diagnostics if d.code == "E0404"]


MULTIPLE = ("pad the tensor to a multiple of 16, or leave this op unquantised",)


@pytest.mark.parametrize(("body", "message", "label", "note"), [
    ("  input x: [8, 8]\n  param w: [8, 32]\n  output y = matmul(x, w, precision=f8e4m3)",
     "`matmul` cannot compute in f8e4m3 with inner dimension K 8", "inner dimension K 8",
     "cuDNN's fp8 kernels need the inner dimension K to be a multiple of 16"),
    ("  input x: [8, 32]\n  param w: [32, 24]\n  output y = matmul(x, w, precision=f8e4m3)",
     "`matmul` cannot compute in f8e4m3 with output width N 24", "output width N 24",
     "cuDNN's fp8 kernels need the output width N to be a multiple of 16"),
    ("  dim K = 16..64 tune [16]\n  input x: [8, K]\n  input w: [K, 32]\n"
     "  output y = matmul(x, w, precision=f8e4m3)",
     "`matmul` cannot compute in f8e4m3 with inner dimension K K", "inner dimension K K",
     "cuDNN's fp8 kernels need the inner dimension K to be a multiple of 16 for every value "
     "of its dims"),
    ("  input x: [2, 8, 6, 6] @NHWC\n  param w: [16, 8, 3, 3]\n"
     "  output y = conv(x, w, pad=1, precision=f8e4m3)",
     "`conv` cannot compute in f8e4m3 with input channels C 8", "input channels C 8",
     "cuDNN's fp8 kernels need the input channels C to be a multiple of 16"),
    ("  input x: [2, 16, 6, 6] @NHWC\n  param w: [8, 16, 3, 3]\n"
     "  output y = conv(x, w, pad=1, precision=f8e4m3)",
     "`conv` cannot compute in f8e4m3 with output channels K 8", "output channels K 8",
     "cuDNN's fp8 kernels need the output channels K to be a multiple of 16"),
    ("  input q: [1, 2, 16, 8]\n  input k: [1, 2, 16, 8]\n  input v: [1, 2, 16, 16]\n"
     "  output y = sdpa(q, k, v, precision=f8e4m3)",
     "`sdpa` cannot compute in f8e4m3 with head dimension 8", "head dimension 8",
     "cuDNN's fp8 kernels need the head dimension to be a multiple of 16"),
    ("  input q: [1, 2, 16, 16]\n  input k: [1, 2, 16, 16]\n  input v: [1, 2, 16, 8]\n"
     "  output y = sdpa(q, k, v, precision=f8e4m3)",
     "`sdpa` cannot compute in f8e4m3 with head dimension 8", "head dimension 8",
     "cuDNN's fp8 kernels need the head dimension to be a multiple of 16"),
])
def test_a_size_fp8_kernels_cannot_take_is_said_once_with_its_name(
        body: str, message: str, label: str, note: str, tmp_path: Path) -> None:
    assert _e0404(body, tmp_path) == [(message, label, ("f8e4m3 asked for here",), (note,),
                                      MULTIPLE)]


@pytest.mark.parametrize(("body", "message", "label", "note"), [
    ("  input x: i8[8, 32]\n  param w: i8[32, 16]\n  output y = matmul(x, w, precision=f8e4m3)",
     "`matmul` cannot quantise i8 operands to f8e4m3", "i8 here",
     "`precision=f8e4m3` quantises f32, f16, bf16 operands"),
    ("  input x: i8[2, 16, 6, 6] @NHWC\n  param w: i8[16, 16, 3, 3]\n"
     "  output y = conv(x, w, pad=1, precision=f8e4m3)",
     "`conv` cannot quantise i8 operands to f8e4m3", "i8 here",
     "`precision=f8e4m3` quantises f32, f16, bf16 operands"),
    ("  input q: f32[1, 2, 16, 16]\n  input k: f32[1, 2, 16, 16]\n  input v: f32[1, 2, 16, 16]\n"
     "  output y = sdpa(q, k, v, precision=f8e4m3)",
     "`sdpa` cannot quantise f32 operands to f8e4m3", "f32 here",
     "`precision=f8e4m3` quantises f16, bf16 operands"),
])
def test_an_operand_of_a_dtype_fp8_cannot_quantise_is_said_once(
        body: str, message: str, label: str, note: str, tmp_path: Path) -> None:
    [(got, got_label, labels, notes, helps)] = _e0404(body, tmp_path)
    assert (got, got_label, labels, notes) == (message, label, ("f8e4m3 asked for here",), (note,))
    assert helps[0].startswith("drop the fp8 request, or cast first: `cast(")


@pytest.mark.parametrize(("body", "message"), [
    ("  input x: [2, 8, 6, 6] @NHWC\n  param w: [16, 4, 3, 3]\n"
     "  output y = conv(x, w, pad=1, groups=2, precision=f8e4m3)",
     "`conv` cannot compute in f8e4m3 with groups=2"),  # and not also its 8 channels
    ("  input x: [2, 16, 4, 6, 6]\n  param w: [16, 16, 3, 3, 3]\n"
     "  output y = conv(x, w, pad=1, precision=f8e4m3)",
     "`conv` cannot compute in f8e4m3 with 3 spatial axes"),
])
def test_a_convolution_fp8_kernels_do_not_run_is_said_once(body: str, message: str,
                                                           tmp_path: Path) -> None:
    assert _e0404(body, tmp_path) == [(message, "f16" + ("[2, 8, 6, 6] @NHWC" if "groups" in body
                                                         else "[2, 16, 4, 6, 6]"),
                                       ("f8e4m3 asked for here",),
                                       ("cuDNN's fp8 convolutions are 2-d and ungrouped",),
                                       ("leave this convolution unquantised",))]


@pytest.mark.parametrize(("extra", "what", "name"), [
    (", bias=m", "a bias", "bias"),
    (", window=4", "a sliding window", "window"),
    (", kv_len=n", "valid key lengths", "kv_len"),
])
def test_an_attention_fp8_does_not_run_is_said_once(extra: str, what: str, name: str,
                                                    tmp_path: Path) -> None:
    body = ("  input q: [1, 2, 16, 16]\n  input k: [1, 2, 16, 16]\n  input v: [1, 2, 16, 16]\n"
            "  input m: [1, 2, 16, 16]\n  input n: i32[1]\n"
            f"  output y = sdpa(q, k, v{extra}, precision=f8e4m3)")
    assert _e0404(body, tmp_path) == [(f"`sdpa` cannot compute in f8e4m3 with {what}",
                                       f"`{name}` given", ("f8e4m3 asked for here",),
                                       ("cuDNN's fp8 attention supports causal masks only "
                                        "(aligned top-left or bottom-right)",),
                                       ("leave this attention unquantised",))]


def test_an_attention_in_e5m2_is_said_once(tmp_path: Path) -> None:
    body = ("  input q: [1, 2, 16, 16]\n  input k: [1, 2, 16, 16]\n  input v: [1, 2, 16, 16]\n"
            "  output y = sdpa(q, k, v, precision=f8e5m2)")
    assert _e0404(body, tmp_path) == [("`sdpa` cannot compute in f8e5m2", "precision=f8e5m2",
                                       ("f8e5m2 asked for here",),
                                       ("cuDNN's fp8 attention takes e4m3 operands",),
                                       ("write `precision=f8e4m3`",))]


@pytest.mark.parametrize("body", [
    "  input x: [8, 32]\n  param w: [32, 16]\n  output y = matmul(x, w, precision=f8e4m3)",
    "  input x: [2, 16, 6, 6] @NHWC\n  param w: [32, 16, 3, 3]\n"
    "  output y = conv(x, w, pad=1, precision=f8e4m3)",
    "  input q: [1, 2, 16, 16]\n  input k: [1, 2, 16, 16]\n  input v: [1, 2, 16, 32]\n"
    "  output y = sdpa(q, k, v, causal=true, precision=f8e4m3)",
])
def test_the_forms_fp8_kernels_take_are_said_nothing_of(body: str, tmp_path: Path) -> None:
    assert _e0404(body, tmp_path) == []


@pytest.mark.parametrize(("op", "signature"), [
    ("matmul", "matmul(a: tensor, b: tensor, precision: dtype = none) -> [*B, M, N]"),
    ("cast", "cast(x: tensor, dtype: f32 | f16 | bf16 | f8e4m3 | f8e5m2 | i8 | u8 | i32 | i64 "
             "| bool) -> shape of x"),
    ("upsample", 'upsample(x: tensor, factor: int | [int, ...], mode: "nearest" | "bilinear" = '
                 '"nearest") -> [N, C, *S * factor]'),
    ("leaky_relu", "leaky_relu(x: tensor, slope: float = 0.01) -> shape of x"),
    ("reduce_sum", "reduce_sum(x: tensor, axes: [int, ...], keepdims: bool = false) -> x "
                   "without `axes` (kept as 1 with keepdims)"),
    ("full", "full(shape: [dim, ...], value: dim, dtype: dtype = i32) -> shape"),
    ("clamp", "clamp(x: tensor, lo: float = none, hi: float = none) -> shape of x"),
])
def test_an_ops_signature_reads_as_the_language_writes_a_call(op: str, signature: str) -> None:
    """What `dslc ops` prints: defaults in source syntax (none, false, a string in quotes, a
    dtype bare), choices joined by |, and `precision` where the op can compute in fp8."""
    from dslc.ops import OPS

    assert OPS[op].signature() == signature


def test_a_depthwise_convs_taps_need_static_sizes() -> None:
    """Only a conv whose channels and filter sizes are numbers is a depthwise conv of known
    taps (a symbolic size gives None: no rule keyed on the taps applies)."""
    from dslc.core import dims
    from dslc.ops.conv import depthwise_taps

    k = dims.sym("K")
    assert depthwise_taps((2, 16, 8, 8), (16, 1, 3, 5), 16) == 15
    for x, w in (((2, 16, 8, 8), (16, 1, 3, k)), ((2, 16, 8, 8), (16, 1, k, 3)),
                 ((2, k, 8, 8), (16, 1, 3, 3))):
        assert depthwise_taps(x, w, 16) is None, (x, w)
    assert depthwise_taps((2, 16, 8, 8), (16, 2, 3, 3), 8) is None  # grouped, not depthwise
    assert depthwise_taps((2, 16, 8), (16, 1, 3), 16) is None  # 1-d


def test_a_cache_writes_reference_leaves_the_callers_cache_as_it_was() -> None:
    """The reference returns the written cache as a new array: the interpreter is pure (the
    runtime writes the caller's buffer; `interp.run_in_place` reports what it holds after)."""
    import numpy as np

    from dslc.ops import OPS

    reference = OPS["cache_write"].reference
    assert reference is not None
    cache = np.zeros((1, 2, 8, 4), np.float32)
    new = np.ones((1, 2, 2, 4), np.float32)
    out = reference([cache, new, np.array([3], np.int32)], {})
    assert not np.shares_memory(out, cache) and not cache.any()
    assert out[:, :, 3:5].all() and not out[:, :, :3].any() and not out[:, :, 5:].any()


def test_a_reshape_of_a_slice_is_a_view_only_where_it_merges_no_axes(tmp_path: Path) -> None:
    """A slice is not dense: a reshape of it that only splits axes (or adds and drops axes of
    size 1) keeps a layout, one that merges two of its axes has none (lowering copies)."""
    checked = check_source(HEAD + "  input x: [4, 6, 8]\n"
                           "  let a = reshape(x[:, :, 0:4], [4, 6, 2, 2])\n"
                           "  let b = reshape(x[:, :, 0:4], [1, 4, 6, 4, 1])\n"
                           "  let c = reshape(x[:, :, 0:4], [4, 24])\n"
                           "  output y = relu(a) + relu(reshape(b, [4, 6, 2, 2])) + "
                           "reshape(relu(c), [4, 6, 2, 2])\n}\n", tmp_path)
    assert [d.code for d in checked.diagnostics if d.is_error] == []
    layouts = {n.name: n.type.layout for n in checked.model.graph.nodes if n.op == "reshape"}
    assert layouts["a"] is not None and layouts["b"] is not None and layouts["c"] is None


def test_gather_gives_nan_rows_for_indices_outside_the_table() -> None:
    import numpy as np

    from dslc.ops import OPS

    reference = OPS["gather"].reference
    assert reference is not None
    table = np.arange(12, dtype=np.float32).reshape(4, 3)
    idx = np.array([[0, 3], [4, -1]], np.int64)  # 4 and -1 are outside [0, 4)
    out = reference([table, idx], {"axis": 0})
    assert out.shape == (2, 2, 3)
    np.testing.assert_array_equal(out[0], table[[0, 3]])
    assert np.isnan(out[1]).all()
    cols = reference([table, np.array([2, 3], np.int64)], {"axis": 1})  # along the second axis
    np.testing.assert_array_equal(cols[:, 0], table[:, 2])
    assert np.isnan(cols[:, 1]).all()


@pytest.mark.parametrize(("call", "code", "message", "under", "label", "help"), [
    ("full([2, 3], 1, dtype=f32)", "E0401", "`full` makes i32 or i64 values, not f32", "dtype=f32",
     "", ("`cast` the result for another dtype",)),
    ("full([2, 0], 1)", "E0305", "`full` of an empty shape", "[2, 0]",
     "every size must be at least 1", ()),
])
def test_full_refuses_a_float_dtype_and_an_empty_shape_at_the_argument(
        call: str, code: str, message: str, under: str, label: str, help: tuple[str, ...],
        tmp_path: Path) -> None:
    source = HEAD + f"  input x: [2, 3]\n  output y = cast({call}, f16) + x\n}}\n"
    [d] = [d for d in check_source(source, tmp_path).diagnostics if d.is_error]
    assert (d.code, d.message, d.label, d.help) == (code, message, label, help)
    assert span_text(source, d.span) == under


MM = "  input x: %s[8, %d]\n  param w: %s[%d, %d]\n  output y = matmul(x, w, precision=f8e4m3)"
CV = ("  input x: %s[2, %d, 6, 6] @NHWC\n  param w: %s[%d, %d, 3, 3]\n"
      "  output y = conv(x, w, pad=1, precision=f8e4m3)")
AT = ("  input q: %s[1, 2, 16, %d]\n  input k: %s[1, 2, 16, %d]\n  input v: %s[1, 2, 16, %d]\n"
      "  output y = sdpa(q, k, v, precision=f8e4m3)")


# Operands of one op share their dtype (E0401 otherwise), so a dtype fp8 cannot quantise is
# said at the first operand.
@pytest.mark.parametrize(("body", "under"), [
    (MM % ("i8", 32, "i8", 32, 16), "x"),
    (MM % ("f16", 8, "f16", 8, 16), "x"),  # K, a size of both: said at the first
    (MM % ("f16", 32, "f16", 32, 24), "w"),  # N
    (CV % ("i8", 16, "i8", 16, 16), "x"),
    (CV % ("f16", 8, "f16", 16, 8), "x"),  # C
    (CV % ("f16", 16, "f16", 8, 16), "w"),  # K
    (AT % ("f32", 16, "f32", 16, "f32", 16), "q"),
    (AT % ("f16", 8, "f16", 8, "f16", 16), "q"),  # the head dimension of q (and k)
    (AT % ("f16", 16, "f16", 16, "f16", 8), "v"),  # of v
    (CV % ("i8", 16, "i8", 8, 16), "x"),  # the dtype said, not also the 8 output channels
])
def test_an_fp8_refusal_points_at_the_operand_it_is_about(body: str, under: str,
                                                          tmp_path: Path) -> None:
    source = HEAD + body + "\n}\n"
    errors = [d for d in check_source(source, tmp_path).diagnostics if d.code == "E0404"]
    assert len(errors) == 1, [d.message for d in errors]
    assert span_text(source, errors[0].span) == under


# --- matmul: dtypes, compute, memory order; the type rules outside the checker ------------------

def _errors(head: str, body: str, tmp_path: Path) -> list[Said]:
    """Every error of a model, whole (`tests.helpers.whole`)."""
    source = head + body + "\n}\n"
    return [whole(d, source) for d in check_source(source, tmp_path).diagnostics if d.is_error]


MIXED = "  input x: %s[2, 3]\n  param w: %s[3, 4]\n  output y = matmul(x, w)"


@pytest.mark.parametrize(("x", "w", "error"), [
    ("i8", "f16", ("E0401", "`matmul` does not support i8 inputs", "x", "i8 here", (),
                   ("`matmul` takes floating-point tensors (f32, f16, bf16)",),
                   ("convert first: `cast(x, f32)`",))),
    ("f16", "i8", ("E0401", "the operands of `matmul` have different dtypes", "w", "i8",
                   (("f16", "x"),), (), ("cast one of them: `cast(w, f16)`",))),
    ("f8e4m3", "f16", ("E0401", "the operands of `matmul` have different dtypes", "x", "f8e4m3",
                       (("f16", "w"),), (), ("cast one of them: `cast(x, f16)`",))),
    ("f8e4m3", "i8", ("E0401", "the operands of `matmul` have different dtypes", "x", "f8e4m3",
                      (("i8", "w"),), (), ("cast one of them: `cast(x, i8)`",))),
    ("i32", "f8e5m2", ("E0401", "`matmul` does not support i32 inputs", "x", "i32 here", (),
                       ("`matmul` takes floating-point tensors (f32, f16, bf16)",),
                       ("convert first: `cast(x, f32)`",))),
    ("f8e4m3", "bool", ("E0401", "`matmul` does not support bool inputs", "w", "bool here", (),
                        ("`matmul` takes floating-point tensors (f32, f16, bf16)",),
                        ("convert first: `cast(w, f32)`",))),
    ("f16", "f8e5m2", ("E0401", "the operands of `matmul` have different dtypes", "w", "f8e5m2",
                       (("f16", "x"),), (), ("cast one of them: `cast(w, f16)`",))),
])
def test_a_matmul_of_one_integer_or_fp8_operand_and_one_float_is_refused(
        x: str, w: str, error: tuple[object, ...], tmp_path: Path) -> None:
    """i8 x i8 and fp8 x fp8 have their own forms; one such operand beside an f16 one has none.
    fp8 beside i8 is a mix of two taken dtypes (said at the fp8 one); beside i32 or bool, the
    operand never taken is the fault, not the fp8 one."""
    assert _errors(HEAD, MIXED % (x, w), tmp_path) == [error]


CONV_MIXED = "  input x: %s[1, 4, 8, 8]\n  param w: %s[4, 4, 3, 3]\n  output y = conv(x, w, pad=1)"


@pytest.mark.parametrize(("x", "w", "at", "label", "other"), [
    ("f8e4m3", "f16", "x", "f8e4m3", ("f16", "w")),
    ("bf16", "f8e5m2", "w", "f8e5m2", ("bf16", "x")),
])
def test_a_conv_of_one_fp8_operand_and_one_float_says_the_dtypes_differ_at_the_fp8_one(
        x: str, w: str, at: str, label: str, other: tuple[str, str], tmp_path: Path) -> None:
    """conv takes fp8 in pairs: the mix is the fault, not fp8; widening the fp8 one is the help."""
    assert _errors(HEAD, CONV_MIXED % (x, w), tmp_path) == [
        ("E0401", "the operands of `conv` have different dtypes", at, label, (other,), (),
         (f"cast one of them: `cast({at}, {other[0]})`",))]


@pytest.mark.parametrize(("x", "w", "compute", "dtype"), [
    ("f8e4m3", "f8e5m2", "f32", "f32"),
    ("f8e5m2", "f8e5m2", "f32", "f32"),
    ("i8", "i8", "f16", "i32"),  # integer math: no f32 needed
    ("i8", "i8", "bf16", "i32"),
    ("i8", "i8", "f32", "i32"),
    ("f16", "f16", "f32", "f16"),
])
def test_a_matmul_of_fp8_gives_f32_and_of_i8_gives_i32_in_any_float_compute(
        x: str, w: str, compute: str, dtype: str, tmp_path: Path) -> None:
    """The product's own dtype, whatever the intermediate precision (f16 here) stores."""
    head = f"cgraph 0.1\nmodel m {{\n  precision io=f16, intermediate=f16, compute={compute}\n"
    checked = check_source(head + f"  input x: {x}[2, 3]\n  param w: {w}[3, 4]\n"
                           "  let z = matmul(x, w)\n  output y = cast(z, f16)\n}\n", tmp_path)
    assert [d.message for d in checked.diagnostics if d.is_error] == []
    z = checked.model.graph.by_name()["z"]
    assert (z.op, z.type.dtype, z.type.shape) == ("matmul", dtype, (2, 4))


@pytest.mark.parametrize(("compute", "dtype"), [("f16", "f16"), ("bf16", "bf16")])
def test_a_float_matmul_needs_compute_f32_said_at_the_op_and_the_setting(
        compute: str, dtype: str, tmp_path: Path) -> None:
    head = f"cgraph 0.1\nmodel m {{\n  precision io=f16, intermediate=f32, compute={compute}\n"
    assert _errors(head, MIXED % (dtype, dtype), tmp_path) == [
        ("E0403", f"`matmul` needs compute=f32, but compute is {compute} here", "matmul",
         f"computed in {compute}", ((f"compute={compute} set here", f"compute={compute}"),),
         ("cuDNN runs `matmul` with f32 math",),
         ("set `precision compute=f32` in the model, or in the def that holds this op",))]



def test_a_calls_own_compute_is_pointed_at_where_it_is_narrower_than_the_op_needs(
        tmp_path: Path) -> None:
    """`compute=` on the call overrides the model's: the label points at the keyword, not at the
    model's `precision` line (which says f32 here)."""
    head = "cgraph 0.1\nmodel m {\n  precision io=f16, intermediate=f32, compute=f32\n"
    body = (MIXED % ("f16", "f16")).replace("matmul(x, w)", "matmul(x, w, compute=bf16)")
    [(code, message, _, label, labels, _, _)] = _errors(head, body, tmp_path)
    assert (code, message, label) == (
        "E0403", "`matmul` needs compute=f32, but compute is bf16 here", "computed in bf16")
    assert labels == (("compute=bf16 set here", "compute=bf16"),)

def _laid(shape: tuple[int, ...], order: tuple[int, ...] | None) -> object:
    from dslc.core.types import Layout, TensorType

    return TensorType("f16", shape, None if order is None else Layout(order))


OUTERMOST = "the batch axes of `%s` must be outermost in memory"


@pytest.mark.parametrize(("a", "b", "reason"), [
    # a's order unknown (not yet laid out): b is still checked
    (((4, 8), None), ((2, 8, 5), (1, 0, 2)), OUTERMOST % "b"),
    (((4, 8), None), ((2, 8, 5), (0, 2, 1)), None),  # b's last two axes transposed: fine
    # a conv's NHWC output read as [N, C, H, W]: N outermost, but C (a batch axis) innermost
    (((2, 16, 3, 8), (0, 2, 3, 1)), ((8, 5), (0, 1)), OUTERMOST % "a"),
    (((2, 16, 3, 8), (1, 0, 2, 3)), ((8, 5), (0, 1)), OUTERMOST % "a"),
    (((1, 16, 3, 8), (1, 0, 3, 2)), ((8, 5), (1, 0)), None),  # N of one inside C; M, K swapped
    (((16, 3, 8), (1, 0, 2)), ((16, 8, 5), (0, 1, 2)), OUTERMOST % "a"),
    (((1, 3, 8), (1, 0, 2)), ((8, 5), None), None),  # a batch of one may lie anywhere
])
def test_a_matmul_needs_each_operands_batch_axes_outermost_in_memory(
        a: tuple[tuple[int, ...], tuple[int, ...] | None],
        b: tuple[tuple[int, ...], tuple[int, ...] | None], reason: str | None) -> None:
    """`OpDef.needs` of matmul: the reason lowering copies an operand row-major, or None."""
    from dslc.ops import OPS

    needs = OPS["matmul"].needs
    assert needs is not None
    assert needs({"a": _laid(*a), "b": _laid(*b)}) == reason  # type: ignore[dict-item]


def test_a_type_rule_outside_the_checker_records_its_errors_and_the_attrs_it_sets() -> None:
    """`SilentCtx` (the IR verifier's, the program generator's): the normalised `perm` a
    transpose sets, and an error as its code and message."""
    from dslc.core.dims import DimEnv
    from dslc.core.types import PrecisionSpec, TensorType
    from dslc.diag.span import Span
    from dslc.ops import OPS
    from dslc.ops.opdef import Args, SilentCtx

    def run(perm: list[int]) -> tuple[object, dict[str, object], list[str]]:
        ctx = SilentCtx(DimEnv(), PrecisionSpec(), {}, Span("m.cgraph", 1, 1, 1, 2))
        result = OPS["transpose"].infer(ctx, Args({"x": TensorType("f32", (2, 3, 4)),
                                                   "perm": perm}))
        return result, ctx.attrs, ctx.errors

    assert run([-1, 0, 1]) == (TensorType("f32", (4, 2, 3)), {"perm": (2, 0, 1)}, [])
    assert run([0, 1]) == (None, {}, ["E0304 `perm` must list all 3 axes once"])


def test_an_ops_bound_arguments_give_defaults_and_only_tensors_as_optional_tensors() -> None:
    from dslc.core.types import TensorType
    from dslc.ops.opdef import Args

    x = TensorType("f16", (2, 3))
    args = Args({"x": x, "eps": 1e-5, "bias": None, "axes": [1], "scale": 2.0})
    assert (args.get("eps", 0.5), args.get("window", 7), args.get("window")) == (1e-5, 7, None)
    assert args.get("bias", 3) is None  # given as none: not the default
    assert args.opt("x") is x
    assert [args.opt(n) for n in ("bias", "axes", "scale", "kv_len")] == [None] * 4


# --- pointwise: binary ops, bias_add / scale_mul, the width-axis bias warning -------------------

FP8_HELP = ("fp8 tensors are taken only by `conv`, `matmul` and `cast`",)


@pytest.mark.parametrize(("p", "q", "under"), [("f8e4m3", "f16", "p"), ("f16", "f8e4m3", "q")])
def test_an_fp8_operand_of_a_binary_op_is_refused_once_at_that_operand(
        p: str, q: str, under: str, tmp_path: Path) -> None:
    body = f"  input p: {p}[2, 3]\n  input q: {q}[2, 3]\n  output y = cast(p + q, f16)"
    assert _errors(HEAD, body, tmp_path) == [
        ("E0401", "`+` does not take f8e4m3 inputs", under, "f8e4m3 here", (), FP8_HELP,
         (f"widen it first: `cast({under}, f16)`",))]


def test_a_pow_of_two_integer_tensors_is_refused_once_at_the_first(tmp_path: Path) -> None:
    """Both operands are i32 (a float beside one is E0402): the first is said, not both."""
    body = "  input p: i32[2, 3]\n  input q: i32[2, 3]\n  output y = cast(pow(p, q), f16)"
    assert _errors(HEAD, body, tmp_path) == [
        ("E0401", "`pow` does not support i32 inputs", "p", "i32 here", (),
         ("`pow` takes floating-point tensors (f32, f16, bf16)",),
         ("convert first: `cast(p, f32)`",))]


@pytest.mark.parametrize(("op", "p", "q", "under"), [
    ("bias_add", "i32", "f32", "p"), ("bias_add", "f32", "i32", "q"),
    ("scale_mul", "i32", "f32", "p"), ("scale_mul", "f32", "i32", "q"),
])
def test_an_integer_tensor_or_vector_of_bias_add_and_scale_mul_is_refused_at_itself(
        op: str, p: str, q: str, under: str, tmp_path: Path) -> None:
    body = f"  input p: {p}[2, 3]\n  input q: {q}[3]\n  output y = cast({op}(p, q), f16)"
    assert _errors(HEAD, body, tmp_path) == [
        ("E0401", f"`{op}` does not support i32 inputs", under, "i32 here", (),
         (f"`{op}` takes floating-point tensors (f32, f16, bf16)",),
         (f"convert first: `cast({under}, f32)`",))]


def test_a_scale_mul_by_a_tensor_that_does_not_broadcast_names_both(tmp_path: Path) -> None:
    body = "  input p: f32[2, 3, 4]\n  input q: f32[2, 4]\n  output y = cast(scale_mul(p, q), f16)"
    assert _errors(HEAD, body, tmp_path) == [
        ("E0301", "the operands of `scale_mul` have incompatible shapes", "p", "f32[2, 3, 4]",
         (("f32[2, 4]", "q"),),
         ("axis 1 differs: 3 vs 2; each axis must be equal or 1 to broadcast",), ())]


def test_a_bias_add_of_a_tensor_that_broadcasts_keeps_the_shape_of_x(tmp_path: Path) -> None:
    checked = check_source(HEAD + "  input p: f32[2, 3, 4]\n  input q: f32[3, 1]\n"
                           "  let z = bias_add(p, q)\n  output y = cast(z, f16)\n}\n", tmp_path)
    assert [d.message for d in checked.diagnostics] == []
    z = checked.model.graph.by_name()["z"]
    assert (z.op, z.type.dtype, z.type.shape) == ("bias_add", "f32", (2, 3, 4))


def _w0301(body: str, tmp_path: Path) -> list[tuple[str, str, tuple[tuple[str, str], ...],
                                                     tuple[str, ...], tuple[str, ...]]]:
    """The W0301s of a model: (text under it, label, secondary labels as (text, text under it),
    notes, help); the model has no other diagnostic."""
    source = HEAD + body + "\n}\n"
    diagnostics = check_source(source, tmp_path).diagnostics
    assert {d.code for d in diagnostics} <= {"W0301"}, [(d.code, d.message) for d in diagnostics]
    assert all(d.message == "rank-1 operand lines up with the width axis, not the channel axis"
               for d in diagnostics)
    return [whole(d, source)[2:] for d in diagnostics]


WIDTH_NOTE = ("this broadcast is only legal because W == C in this instance; another input size "
              "would fail",)
WIDTH_HELP = ("use `bias_add(x, b)`, or declare the bias as `[C, 1, 1]`",)


@pytest.mark.parametrize(("x", "c", "v", "expr", "big"), [
    ("2, 4, 3, 4", 4, 4, "bias_add(p, b) + v", "f32[2, 4, 3, 4]"),  # W = C, H not
    ("2, 4, 4", 4, 4, "v + bias_add(p, b)", "f32[2, 4, 4]"),  # rank 3, the vector first
    ("2, 2, 3, 2", 2, 2, "bias_add(p, b) + v", "f32[2, 2, 3, 2]"),  # W = C = 2
])
def test_a_vector_added_to_a_conv_familys_output_where_w_equals_c_is_warned_at_the_vector(
        x: str, c: int, v: int, expr: str, big: str, tmp_path: Path) -> None:
    body = (f"  input p: f32[{x}]\n  input b: f32[{c}]\n  input v: f32[{v}]\n"
            f"  output y = cast({expr}, f16)")
    assert _w0301(body, tmp_path) == [
        ("v", f"f32[{v}]: broadcast onto W", ((f"{big}  (N, C, H, W)", "bias_add(p, b)"),),
         WIDTH_NOTE, WIDTH_HELP)]


def test_a_channel_vector_added_to_a_conv_output_of_width_one_is_warned_it_makes_w(
        tmp_path: Path) -> None:
    """[N, C, H, 1] + [C] is legal for any C: the result is [N, C, H, C], not a per-channel
    bias (the size the vector makes W is said)."""
    body = ("  input p: f32[2, 4, 3, 1]\n  input b: f32[4]\n  input v: f32[4]\n"
            "  output y = cast(bias_add(p, b) + v, f16)")
    assert _w0301(body, tmp_path) == [
        ("v", "f32[4]: broadcast onto W", (("f32[2, 4, 3, 1]  (N, C, H, W)", "bias_add(p, b)"),),
         ("W is 1 here: the result is [N, C, H, 4], one copy of the image per value, not a "
          "per-channel bias",), WIDTH_HELP)]


@pytest.mark.parametrize(("x", "c", "v"), [
    ("2, 4, 3, 5", 4, 1),  # a vector of one
    ("2, 4, 3, 5", 4, 5),  # W != C: right for any input size
    ("2, 1, 3, 1", 1, 1),  # all of one
])
def test_a_vector_that_does_not_line_up_with_w_equal_to_c_is_not_warned_of(
        x: str, c: int, v: int, tmp_path: Path) -> None:
    body = (f"  input p: f32[{x}]\n  input b: f32[{c}]\n  input v: f32[{v}]\n"
            "  output y = cast(bias_add(p, b) + v, f16)")
    assert _w0301(body, tmp_path) == []


# --- the compute precision of an op (E0403), and what follows a refusal -------------------------

@pytest.mark.parametrize("compute", ["i32", "bool"])
def test_an_integer_or_bool_compute_on_float_inputs_is_refused_at_the_op(
        compute: str, tmp_path: Path) -> None:
    assert _errors(HEAD, f"  input x: [2, 3]\n  output y = relu(x, compute={compute})",
                   tmp_path) == [("E0403", f"`relu` cannot compute in {compute} on float inputs",
                                  "relu", "", (), (), ("use `compute=f32`",))]


def test_a_compute_narrower_than_the_inputs_is_said_with_the_setting_that_asked_for_it(
        tmp_path: Path) -> None:
    assert _errors(HEAD, "  input x: f32[2, 3]\n  output y = relu(x, compute=f16)", tmp_path) == [
        ("E0403", "compute f16 is narrower than the inputs of `relu`", "relu", "inputs of 32 bits",
         (("compute=f16 set here", "compute=f16"),), (), ("use `compute=f32`",))]


@pytest.mark.parametrize(("x", "expr", "dtype"), [
    ("f16", "relu(x, compute=f16)", "f16"),  # pointwise ops need no f32 math
    ("f16", "x * x", "f16"),
    ("i32", "x + x", "i32"),  # integer math in an integer compute
])
def test_a_pointwise_op_computes_in_what_it_is_given_where_that_is_wide_enough(
        x: str, expr: str, dtype: str, tmp_path: Path) -> None:
    head = ("cgraph 0.1\nmodel m {\n  precision io=f16, intermediate=f16, "
            f"compute={'i32' if x == 'i32' else 'f16'}\n")
    checked = check_source(head + f"  input x: {x}[2, 3]\n  output y = {expr}\n}}\n", tmp_path)
    assert [d.message for d in checked.diagnostics if d.is_error] == []
    y = checked.model.graph.by_name()["y"]
    assert (y.type.dtype, y.type.shape) == (dtype, (2, 3))


@pytest.mark.parametrize(("inputs", "refused", "code"), [
    ("  input x: [2, 3]\n", "relu(x, compute=i32)", "E0403"),
    ("  input x: [2, 3]\n  param w: [3, 4]\n", "matmul(x, w, compute=f16)", "E0403"),
    ("  input x: f32[2, 3]\n", "relu(x, compute=f16)", "E0403"),
    ("  input x: [2, 3]\n  param w: bf16[3, 4]\n", "matmul(x, w)", "E0401"),
    ("  input x: [2, 3]\n", "(x > 0.0) == 1.0", "E0402"),
    ("  input x: [2, 3]\n  input i: i32[2, 3]\n", "x + i", "E0402"),
])
def test_a_refused_op_has_no_result_for_its_readers_to_be_refused_again(
        inputs: str, refused: str, code: str, tmp_path: Path) -> None:
    """One fault, one error: were the refused op given a type, `matmul(a, a)` ([2, 3] or
    [2, 4] by itself, or a mask) would be refused too."""
    errors = _errors(HEAD, f"{inputs}  let a = {refused}\n  output y = matmul(a, a)", tmp_path)
    assert [e[0] for e in errors] == [code]


def test_a_number_beside_a_mask_is_said_as_a_bool_tensor_with_no_way_back(tmp_path: Path) -> None:
    """"a bool tensor" (an integer one is "an i32 tensor"), and no `cast(..., bool)` to go back."""
    assert _errors(HEAD, "  input x: [2, 3]\n  let m = x > 0.0\n  output y = m == 1.0",
                   tmp_path) == [
        ("E0402", "`==` mixes a bool tensor with the number `1.0`", "m", "bool",
         (("a number: an f32 scalar", "1.0"),),
         ("an integer number beside integer tensors is one of theirs in `+ - *`, `max`, `min` and "
          "comparisons; any other number is an f32 scalar, and integer and bool tensors are never "
          "converted implicitly",),
         ("compute in floats: `cast(m, f32)`",))]


# --- conv: dtypes and sizes ----------------------------------------------------------------------

@pytest.mark.parametrize(("io", "dtype"), [
    ("f16", "f16"), ("bf16", "bf16"), ("f32", "f32"),
    ("f8e4m3", "f32"),  # an fp8 io dtype is not a result dtype: f32 then
])
def test_an_fp8_conv_gives_the_io_dtype_where_it_is_a_wide_float(
        io: str, dtype: str, tmp_path: Path) -> None:
    head = f"cgraph 0.1\nmodel m {{\n  precision io={io}, intermediate=f32, compute=f32\n"
    checked = check_source(head + "  input x: f8e4m3[1, 16, 8, 8] @NHWC\n"
                           "  param w: f8e4m3[16, 16, 3, 3]\n  let z = conv(x, w, pad=1)\n"
                           "  output y = cast(z, f32)\n}\n", tmp_path)
    assert [d.message for d in checked.diagnostics if d.is_error] == []
    assert checked.model.graph.by_name()["z"].type.dtype == dtype


def test_an_integer_conv_needs_both_operands_integer(tmp_path: Path) -> None:
    assert _errors(HEAD, "  input x: i8[1, 4, 8, 8]\n  param w: [4, 4, 3, 3]\n"
                   "  output y = conv(x, w, pad=1)", tmp_path) == [
        ("E0401", "`conv` does not support i8 inputs", "x", "i8 here", (),
         ("`conv` takes floating-point tensors (f32, f16, bf16)",), ("convert first: `cast(x, f32)`",))]


def test_a_conv_of_four_spatial_axes_is_refused(tmp_path: Path) -> None:
    assert _errors(HEAD, "  input x: [1, 4, 8, 8, 8, 8]\n  param w: [4, 4, 3, 3, 3, 3]\n"
                   "  output y = conv(x, w)", tmp_path) == [
        ("E0301", "`conv` expects x [N, C, *S] with 1 to 3 spatial axes", "x",
         "f16[1, 4, 8, 8, 8, 8] has rank 6", (), ("the first two axes are batch and channels",), ())]


def test_a_conv_output_below_one_names_its_axis(tmp_path: Path) -> None:
    """W = 2 under a 3-wide kernel: axis 3 (the second spatial one), not axis 2."""
    assert [e[:4] for e in _errors(HEAD, "  input x: [1, 4, 8, 2]\n  param w: [4, 4, 3, 3]\n"
                                   "  output y = conv(x, w)", tmp_path)] == [
        ("E0603", "the output of `conv` has size below 1 on axis 3", "x", "output size is 0")]
