"""The ops' rules as a user meets them. The fp8 forms cuDNN takes (LANGUAGE.md 3.4 rule 6,
E0404), rule by rule: each refusal said once, at the operand it is about, naming the op, the
size or dtype that stops it, where fp8 was asked for, and what to do; and the forms taken said
nothing of (the golden cases in tests/diagnostics/ show a few renderings whole; these hold every
branch). The signatures `dslc ops` prints. (Written for the survivors of the ops mutation group:
docs/mutation.md.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import check_source

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


def _spanned(source: str, d: object) -> str:
    """The source text under a diagnostic's primary span (one line)."""
    span = d.span  # type: ignore[attr-defined]
    assert span.line == span.end_line
    return source.splitlines()[span.line - 1][span.col - 1:span.end_col - 1]


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
    assert _spanned(source, d) == under


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
    assert _spanned(source, errors[0]) == under
