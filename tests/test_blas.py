"""The cuBLASLt matmul (`backend.blas`) and the matmul step's split between it and a pointwise
kernel (`backend.gemv._many_rows`), on the CPU: the column-major reading of each layout checked
by doing on the arrays' memory what cuBLASLt is told to do (NumPy, hand-derived: y^T = op(A) B
with A, B, C and D read at their leading dimensions), the arrays it refuses, the descriptor as
the library holds it, and which epilogue members it takes. On the GPU against PyTorch:
tests/gpu/test_blas_gpu.py."""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import pytest

from dslc.backend import blas, fused, gemv
from tests.helpers import deviceless_program, matmuls_as_kernels

RNG = np.random.default_rng(7)


def _column_major(a: np.ndarray, rows: int, cols: int, ld: int) -> np.ndarray:
    """a's memory read as a column-major rows x cols matrix of leading dimension ld."""
    return np.lib.stride_tricks.as_strided(a, (rows, cols), (a.itemsize, ld * a.itemsize))


def _as_cublaslt_computes(p: blas.Problem, x: np.ndarray, w: np.ndarray, y: np.ndarray,
                          c: np.ndarray | None, bias: np.ndarray | None) -> None:
    """D = op(A) B (+ C) (+ bias along D's rows) on the arrays' memory, as the layouts say."""
    (_, *a), (_, *b), (_, *cl), (_, *d) = p.layouts()
    op_a = _column_major(w, *a).astype(np.float32)
    if p.trans_a() == blas.OP_T:
        op_a = op_a.T
    out = op_a @ _column_major(x, *b).astype(np.float32)
    if c is not None:
        out += _column_major(c, *cl).astype(np.float32)
    if bias is not None:
        out += bias.astype(np.float32)[:, None]
    _column_major(y, *d)[...] = out


def _pitched(rows: int, cols: int, pitch: int) -> np.ndarray:
    return RNG.standard_normal((rows, pitch)).astype(np.float16)[:, :cols]


@pytest.mark.parametrize("linear", [True, False], ids=["weight_N_K_transposed", "weight_K_N"])
@pytest.mark.parametrize("extras", ["none", "bias", "bias_and_addend"])
def test_each_layout_read_column_major_computes_x_at_w(linear: bool, extras: str) -> None:
    m, k, n = 6, 16, 10
    x = _pitched(m, k, 24)  # rows at a pitch past K
    w = RNG.standard_normal((n, k)).astype(np.float16).T if linear else \
        _pitched(k, n, 12)
    y = np.zeros((m, 16), np.float16)[:, :n]
    c = _pitched(m, n, 10) if extras == "bias_and_addend" else None
    bias = RNG.standard_normal(n).astype(np.float16) if extras != "none" else None
    p = blas.problem("f16", x, w, y, c, bias)
    assert p is not None and p.bias == (bias is not None)
    assert p.trans_a() == (blas.OP_T if linear else blas.OP_N)
    _as_cublaslt_computes(p, x, w, y, c, bias)
    want = x.astype(np.float32) @ w.astype(np.float32)
    want += (0 if c is None else c.astype(np.float32)) + (0 if bias is None else bias)
    np.testing.assert_allclose(y.astype(np.float32), want, rtol=2e-3, atol=2e-2)


def _strided(shape: tuple[int, ...], strides: tuple[int, ...]) -> np.ndarray:
    """A float16 view of these element strides over a buffer large enough for it."""
    base = np.arange(4096, dtype=np.float16)
    return np.lib.stride_tricks.as_strided(base, shape, tuple(2 * s for s in strides))


@pytest.mark.parametrize(("shape", "strides", "want"), [
    ((3, 8), (10, 1), blas.Matrix(3, 8, 10)),  # rows at a pitch
    ((3, 8), (8, 1), blas.Matrix(3, 8, 8)),
    ((1, 8), (1, 1), blas.Matrix(1, 8, 8)),  # one row: its pitch is its width
    ((1, 8), (20, 1), blas.Matrix(1, 8, 20)),
    ((8, 3), (1, 10), blas.Matrix(8, 3, 10, transposed=True)),  # columns at a pitch
    ((8, 3), (1, 8), blas.Matrix(8, 3, 8, transposed=True)),
    ((8, 1), (1, 1), blas.Matrix(8, 1, 1)),  # one dense column: rows of one at a pitch of 1
    ((8, 1), (1, 3), blas.Matrix(8, 1, 8, transposed=True)),  # one column: its height
    ((8, 1), (1, 20), blas.Matrix(8, 1, 20, transposed=True)),
    ((1, 1), (1, 1), blas.Matrix(1, 1, 1)),
    ((3, 8), (4, 1), None),  # rows overlapping one another
    ((8, 3), (1, 4), None),  # columns overlapping one another
    ((4, 4), (8, 2), None),  # neither axis contiguous
])
def test_a_2d_array_is_a_matrix_of_rows_or_columns_at_a_pitch(
        shape: tuple[int, int], strides: tuple[int, int], want: blas.Matrix | None) -> None:
    assert blas.matrix(_strided(shape, strides)) == want


def test_arrays_of_another_rank_or_strides_of_part_elements_are_no_matrix() -> None:
    assert blas.matrix(np.zeros((2, 2, 2), np.float16)) is None
    odd = np.lib.stride_tricks.as_strided(np.zeros(64, np.float16), (3, 4), (9, 2))
    assert blas.matrix(odd) is None
    assert blas.matrix(np.zeros((0, 4), np.float16)) is None  # empty: nothing to multiply


def test_rows_of_keeps_each_row_s_elements() -> None:
    a = _strided((2, 3, 8), (40, 10, 1))  # blocks of 3 rows at a pitch of 10, 40 apart
    assert blas.rows_of(a) is None  # 3 rows at 10 span 30 elements, not 40
    b = _strided((2, 3, 8), (30, 10, 1))
    merged = blas.rows_of(b)
    assert merged is not None and merged.shape == (6, 8)
    np.testing.assert_array_equal(merged, b.reshape(6, 8))
    one = _strided((1, 1, 8), (99, 77, 1))  # leading axes of one element: one row
    got = blas.rows_of(one)
    assert got is not None and got.shape == (1, 8) and blas.matrix(got) == blas.Matrix(1, 8, 8)
    np.testing.assert_array_equal(got[0], one[0, 0])
    lone = _strided((4, 1, 8), (12, 99, 1))  # a size-1 axis between: its stride never read
    assert blas.rows_of(lone) is not None and blas.rows_of(lone).strides == (24, 2)
    vector = np.arange(5, dtype=np.float16)
    assert blas.rows_of(vector).shape == (1, 5)
    np.testing.assert_array_equal(blas.rows_of(vector)[0], vector)
    assert blas.rows_of(np.float16(1.0).reshape(())) is None
    flat = np.zeros((3, 4), np.float16)
    assert blas.rows_of(flat) is flat


def test_rows_of_merges_the_leading_axes_where_each_is_whole_rows_of_the_next() -> None:
    a = np.zeros((2, 3, 8), np.float16)
    merged = blas.rows_of(a)
    assert merged is not None and merged.shape == (6, 8) and merged.strides == (16, 2)
    pitched = np.zeros((2, 3, 16), np.float16)[:, :, :8]  # a row pitch of 16: merges
    assert blas.rows_of(pitched) is not None and blas.rows_of(pitched).strides == (32, 2)
    gapped = np.zeros((2, 4, 8), np.float16)[:, :3]  # a gap after each 3 rows: no one pitch
    assert blas.rows_of(gapped) is None


def test_arrays_cublaslt_cannot_take_as_they_lie_are_refused() -> None:
    x, w, y = (np.zeros(s, np.float16) for s in ((4, 8), (8, 6), (4, 6)))
    assert blas.problem("f16", x, w, y) is not None
    assert blas.problem("f32", x, w, y) is None  # f16 or bf16 only
    assert blas.problem("f16", np.zeros((8, 4), np.float16).T, w, y) is None  # K strided
    assert blas.problem("f16", x, w, np.zeros((6, 4), np.float16).T) is None  # y transposed
    assert blas.problem("f16", x, w, y, bias=np.zeros(12, np.float16)[::2]) is None
    assert blas.problem("f16", x, w, y, bias=np.zeros(5, np.float16)) is None  # not N long
    assert blas.problem("f16", x.astype(np.float32), w, y) is None  # dtypes differ
    assert blas.problem("f16", np.zeros((4, 7), np.float16), w, y) is None  # K differs


def test_alignment_is_the_largest_power_of_two_up_to_256_bytes() -> None:
    assert blas.alignment(0, 4096, 48, 6, 1, 384, 64, 32, 8, 4) == \
        (256, 256, 16, 2, 1, 128, 64, 32, 8, 4)


def test_a_problem_of_3d_arrays_reads_their_rows_and_each_operand_s_alignment() -> None:
    x = np.zeros((2, 3, 8), np.float16)
    w, y = np.zeros((8, 6), np.float16), np.zeros((2, 3, 6), np.float16)
    c = np.zeros(2 * 3 * 6 + 1, np.float16)[1:].reshape(2, 3, 6)  # 2 bytes off its buffer
    p = blas.problem("f16", x, w, y, c, np.zeros(6, np.float16))
    assert p is not None and (p.x.rows, p.y.rows, p.c is not None) == (6, 6, True)
    assert p.alignment[2] == blas.alignment(c.ctypes.data)[0] != p.alignment[3]
    assert blas.problem("f16", x, w, y, bias=np.zeros(3, np.float16)) is None  # not N long
    gapped = np.zeros((2, 4, 6), np.float16)[:, :3]  # rows that do not merge
    assert blas.problem("f16", x, w, gapped) is None
    assert blas.problem("f16", x, w, y, gapped) is None
    assert blas.problem("f16", np.zeros((2, 4, 8), np.float16)[:, :3], w, y) is None


def test_the_descriptor_holds_the_transpose_and_the_bias_epilogue() -> None:
    if blas._library() is None:
        pytest.skip("libcublasLt is not on this machine")
    x, y = np.zeros((4, 8), np.float16), np.zeros((4, 6), np.float16)
    w = np.zeros((6, 8), np.float16).T
    p = blas.problem("bf16", x, w, y, bias=np.zeros(6, np.float16))
    assert p is not None
    desc, layouts = blas.descriptor(p)
    lib = blas._loaded()

    def read(attr: int) -> int:
        value, size = ctypes.c_int32(), ctypes.c_size_t()
        assert lib.cublasLtMatmulDescGetAttribute(desc, attr, ctypes.byref(value), 4,
                                                  ctypes.byref(size)) == 0
        return value.value

    assert read(blas.TRANSA) == blas.OP_T and read(blas.TRANSB) == blas.OP_N
    assert read(blas.EPILOGUE) == blas.EPILOGUE_BIAS
    assert read(blas.BIAS_DATA_TYPE) == blas.DATA_TYPES["bf16"] and len(layouts) == 4


def test_the_descriptor_of_a_row_major_weight_and_no_bias_reads_it_as_it_lies() -> None:
    if blas._library() is None:
        pytest.skip("libcublasLt is not on this machine")
    x, w, y = (np.zeros(s, np.float16) for s in ((4, 8), (8, 6), (4, 6)))
    p = blas.problem("f16", x, w, y)
    assert p is not None
    desc, _ = blas.descriptor(p)
    value, size = ctypes.c_int32(), ctypes.c_size_t()
    lib = blas._loaded()
    for attr, want in ((blas.TRANSA, blas.OP_N), (blas.EPILOGUE, blas.EPILOGUE_DEFAULT)):
        assert lib.cublasLtMatmulDescGetAttribute(desc, attr, ctypes.byref(value), 4,
                                                  ctypes.byref(size)) == 0
        assert value.value == want


def test_a_failed_library_call_says_what_failed_and_its_status() -> None:
    blas._check(0, "layout")
    with pytest.raises(RuntimeError, match=r"cuBLASLt: layout failed \(cublasStatus_t 7\)"):
        blas._check(7, "layout")


def _plan(*members: fused.Member, operands: int = 3) -> fused.Plan:
    ops = (fused.Operand("acc", "f32"), fused.Operand("bias", "bf16", (2, 3)),
           fused.Operand("h", "bf16"))[:operands]
    return fused.Plan(ops, members, (len(members) - 1,), ("bf16",))


GELU = fused.expression("gelu", "f32", {})
assert GELU is not None


def test_the_leading_additions_are_taken_and_the_rest_reads_the_result() -> None:
    p = _plan(fused.Member("a + b", ("x0", "x1"), "f32"), fused.Member(GELU, ("v0",), "f32"))
    assert gemv.leading_adds(p, 0) == [1]
    rest = gemv.rest_after(p, 0, 1)
    assert isinstance(rest, fused.Plan)
    assert [o.name for o in rest.operands] == ["result"] and rest.stores == (0,)
    assert rest.members == (fused.Member(GELU, ("x0",), "f32"),)
    whole = gemv.rest_after(p, 0, 0)  # none taken: the whole epilogue over the product
    assert isinstance(whole, fused.Plan) and [o.name for o in whole.operands] == ["result", "bias"]
    assert whole.members[0].operands == ("x0", "x1") and whole.members[1].operands == ("v0",)


def test_a_bias_then_a_residual_are_both_taken_and_nothing_is_left() -> None:
    p = _plan(fused.Member("a + b", ("x1", "x0"), "f32"), fused.Member("a + b", ("v0", "x2"), "f32"))
    assert gemv.leading_adds(p, 0) == [1, 2]
    assert gemv.rest_after(p, 0, 2) is None


def test_a_later_op_reading_the_product_or_an_inner_value_keeps_the_epilogue_whole() -> None:
    reads_product = _plan(fused.Member("a + b", ("x0", "x1"), "f32"),
                          fused.Member("a * b", ("v0", "x0"), "f32"))
    assert "matmul's value" in str(gemv.rest_after(reads_product, 0, 1))
    reads_inner = _plan(fused.Member("a + b", ("x0", "x1"), "f32"),
                        fused.Member("a + b", ("v0", "x2"), "f32"),
                        fused.Member("a * b", ("v1", "v0"), "f32"))
    assert "before the stored one" in str(gemv.rest_after(reads_inner, 0, 2))
    doubled = _plan(fused.Member("a + b", ("x0", "x0"), "f32"))  # the product twice: no addend
    assert gemv.leading_adds(doubled, 0) == []


ENCODER_MLP = """
model m {
  precision io=bf16, intermediate=f32, compute=f32
  input x: [8, 64, 128]
  param fc1.weight: [512, 128]
  param fc1.bias: [512]
  param fc2.weight: [128, 512]
  param fc2.bias: [128]
  let h = gelu(matmul(x, transpose(fc1.weight, [1, 0])) + fc1.bias)
  output y: [8, 64, 128] = x + (matmul(h, transpose(fc2.weight, [1, 0])) + fc2.bias)
}
"""


def test_a_transformer_mlp_splits_into_cublaslt_s_additions_and_the_gelu(tmp_path: Path) -> None:
    """fc1 + bias + GELU: cuBLASLt adds the bias, one kernel the GELU over its result; fc2 +
    bias + residual: cuBLASLt adds both, nothing is left."""
    program = deviceless_program(ENCODER_MLP, tmp_path)[1]
    kernels = [program.matmul_kernel(s) for s in program.steps]
    fc1, fc2 = (g for g in kernels if g is not None)
    names = [o.name for o in fc1.epilogue.operands]
    assert [names[i] for i in gemv.leading_adds(fc1.epilogue, fc1.anchor)] == ["fc1.bias"]
    rest = gemv.rest_after(fc1.epilogue, fc1.anchor, 1)
    assert isinstance(rest, fused.Plan) and len(rest.members) == 1
    assert rest.members[0].expr == GELU and len(rest.operands) == 1
    taken = gemv.leading_adds(fc2.epilogue, fc2.anchor)
    assert sorted(fc2.epilogue.operands[i].name for i in taken) == ["fc2.bias", "x"]
    assert gemv.rest_after(fc2.epilogue, fc2.anchor, 2) is None


def test_inspect_says_a_many_row_matmul_kernel_step_runs_on_cublaslt(tmp_path: Path) -> None:
    from dslc.cli.inspect import _bundle_text, bundle_report
    from dslc.runtime.bundle import load

    deviceless_program(ENCODER_MLP, tmp_path)
    kernels, count = matmuls_as_kernels(load(tmp_path / "m.bundle"))
    assert count == 2
    text = _bundle_text(bundle_report(kernels))
    assert text.count("on cuBLASLt (with the epilogue's leading additions)") == 2, text


def test_a_bias_off_16_bytes_is_refused() -> None:
    x, w, y = (np.zeros(s, np.float16) for s in ((4, 8), (8, 6), (4, 6)))
    base = np.zeros(64, np.float16)
    start = (-base.ctypes.data % 16) // 2  # the first element on 16 bytes
    aligned, off = base[start:start + 6], base[start + 1:start + 7]
    assert blas.problem("f16", x, w, y, bias=aligned) is not None
    assert blas.problem("f16", x, w, y, bias=off) is None


def _gemv(p: fused.Plan, held: str) -> gemv.Gemv:
    return gemv.Gemv("x", "w", "f16", held, p, 0)


@pytest.mark.parametrize(("inner", "out", "taken", "held", "exact"), [
    ("f32", "f16", 1, "f32", False),  # the rest would read f16's rounding (or inf) of f32's value
    ("f32", "bf16", 1, "f32", True),  # bf16 keeps f32's range: a rounding only
    ("f16", "f16", 1, "f32", True),  # the reference holds that value in f16 too
    ("f32", "f16", 0, "f16", True),  # the product itself held in f16
    ("f32", "f16", 0, "f32", False),
    ("f32", "f16", 2, "f32", True),  # nothing left to read it
])
def test_the_rest_reads_the_stored_result_only_where_that_is_the_value_it_reads(
        inner: str, out: str, taken: int, held: str, exact: bool) -> None:
    p = fused.Plan((fused.Operand("acc", "f32"), fused.Operand("b", out, (1, 2))),
                   (fused.Member("a + b", ("x0", "x1"), inner), fused.Member(GELU, ("v0",), inner)),
                   (1,), (out,))
    assert gemv.rest_reads_exactly(p, _gemv(p, held), taken) is exact


def test_a_rest_of_copies_is_run_only_where_a_member_rounds_the_result_s_values() -> None:
    def rest(dtype: str, expr: str = "a") -> fused.Plan:
        return fused.Plan((fused.Operand("result", "f16"),),
                          (fused.Member(expr, ("x0",), dtype),), (0,), ("f16",))

    assert not gemv.needs_rest(rest("f32")) and not gemv.needs_rest(rest("f16"))
    assert gemv.needs_rest(rest("bf16"))  # a cast to bf16 and back rounds f16's values
    assert gemv.needs_rest(rest("f32", GELU))


def test_the_cut_takes_fewer_additions_where_the_rest_reads_a_value_an_addition_replaces() -> None:
    """(mm + bias) then (v0 + h), then v0 * v1: the product's sum with the bias is read after
    the residual's, so cuBLASLt takes the bias alone and the kernel the rest."""
    p = _plan(fused.Member("a + b", ("x0", "x1"), "f32"), fused.Member("a + b", ("v0", "x2"), "f32"),
              fused.Member("a * b", ("v1", "v0"), "f32"))
    p = fused.Plan(p.operands, p.members, p.stores, ("bf16",))
    g = _gemv(p, "f32")
    assert gemv.leading_adds(p, 0) == [1, 2]
    cut = gemv.epilogue_cut(p, g, 2, lambda i: False)
    assert cut is not None and (cut.adds, cut.activation) == (1, "")
    assert isinstance(cut.rest, fused.Plan) and [o.name for o in cut.rest.operands] == ["result", "h"]


def test_the_cut_reads_no_operand_sharing_the_result_s_memory() -> None:
    """The residual h is the result's own memory: cuBLASLt may add it (C = D), but the GELU
    after reads nothing of it; where the rest reads h, no addition is taken that would leave
    it read after cuBLASLt wrote over it, and with none left the step is refused."""
    add_gelu = _plan(fused.Member("a + b", ("x0", "x2"), "f32"), fused.Member(GELU, ("v0",), "f32"))
    add_gelu = fused.Plan(add_gelu.operands, add_gelu.members, add_gelu.stores, ("bf16",))
    assert gemv.epilogue_cut(add_gelu, _gemv(add_gelu, "f32"), 1, lambda i: i == 2) == \
        gemv.Cut(1, "", gemv.rest_after(add_gelu, 0, 1))
    reads_h = _plan(fused.Member("a * b", ("x0", "x2"), "f32"))
    reads_h = fused.Plan(reads_h.operands, reads_h.members, reads_h.stores, ("bf16",))
    assert gemv.epilogue_cut(reads_h, _gemv(reads_h, "f32"), 0, lambda i: i == 2) is None
    assert gemv.epilogue_cut(reads_h, _gemv(reads_h, "f32"), 0, lambda i: False) == \
        gemv.Cut(0, "", gemv.rest_after(reads_h, 0, 0))


def test_an_f16_result_read_back_by_the_rest_of_an_f32_epilogue_is_refused() -> None:
    p = _plan(fused.Member("a + b", ("x0", "x1"), "f32"), fused.Member(GELU, ("v0",), "f32"))
    f16 = fused.Plan(p.operands, p.members, p.stores, ("f16",))
    assert gemv.epilogue_cut(f16, _gemv(f16, "f32"), 1, lambda i: False) is None
    alone = _plan(fused.Member("a + b", ("x0", "x1"), "f32"))  # nothing read back: taken
    alone = fused.Plan(alone.operands, alone.members, alone.stores, ("f16",))
    assert gemv.epilogue_cut(alone, _gemv(alone, "f32"), 1, lambda i: False) == \
        gemv.Cut(1, "", None)


GELU_TANH = fused.expression("gelu_tanh", "f32", {})
RELU = fused.expression("relu", "f32", {})


def test_a_relu_or_tanh_gelu_right_after_the_additions_is_cublaslt_s_activation() -> None:
    """cuBLASLt's epilogue applies it to the f32 sum: nothing is read back, so an f16 result
    of an f32 epilogue is fine (the erf GELU is no activation of its: a kernel reads it back)."""
    for expr, op in ((GELU_TANH, "gelu_tanh"), (RELU, "relu")):
        p = _plan(fused.Member("a + b", ("x0", "x1"), "f32"), fused.Member(expr, ("v0",), "f32"))
        p = fused.Plan(p.operands, p.members, p.stores, ("f16",))
        cut = gemv.epilogue_cut(p, _gemv(p, "f32"), 1, lambda i: False)
        assert cut == gemv.Cut(1, op, None) and cut.taken == 2
    erf = _plan(fused.Member("a + b", ("x0", "x1"), "f32"), fused.Member(GELU, ("v0",), "f32"))
    assert gemv.activation_after(erf, 0, 1) == ""


def test_an_activation_is_taken_only_right_after_every_leading_addition() -> None:
    then_mul = _plan(fused.Member("a + b", ("x0", "x1"), "f32"), fused.Member(RELU, ("v0",), "f32"),
                     fused.Member("a * b", ("v1", "x2"), "f32"))
    then_mul = fused.Plan(then_mul.operands, then_mul.members, then_mul.stores, ("bf16",))
    cut = gemv.epilogue_cut(then_mul, _gemv(then_mul, "f32"), 1, lambda i: False)
    assert cut is not None and (cut.adds, cut.activation, cut.taken) == (1, "relu", 2)
    assert cut.rest is not None and cut.rest.members[0].operands == ("x0", "x1")
    assert gemv.activation_after(then_mul, 0, 0) == ""  # member 0 is the addition
    on_product = _plan(fused.Member(RELU, ("x0",), "f32"))  # no addition: the product's ReLU
    assert gemv.activation_after(on_product, 0, 0) == "relu"
    on_other = _plan(fused.Member(RELU, ("x1",), "f32"))  # of another operand: no activation
    assert gemv.activation_after(on_other, 0, 0) == ""


def test_an_f16_mlp_with_an_f32_intermediate_offers_only_fc2_to_cublaslt(tmp_path: Path) -> None:
    """fc1's GELU would read f16's rounding of the f32 sum (the reference's value may pass
    65504 where f16 cannot hold it): it stays on its graph, and `inspect` says so."""
    from dslc.tune.fusion import takes_many_rows

    source = ENCODER_MLP.replace("io=bf16", "io=f16")
    program = deviceless_program(source, tmp_path)[1]
    steps = {s.name: s for s in program.steps if program.matmul_kernel(s) is not None}
    fc1, fc2 = (program.matmul_kernel(s) for s in steps.values())
    assert not gemv.on_cublaslt(fc1) and gemv.on_cublaslt(fc2)
    assert [takes_many_rows(program, s) for s in steps.values()] == [False, True]
    assert gemv.backend_of(fc1, 512).startswith("the reference matmul")
    assert gemv.backend_of(fc2, 512).startswith("cuBLASLt") and \
        gemv.backend_of(fc2, 8) == "the few-row matmul kernel"


def test_the_descriptor_holds_the_activation_s_epilogue() -> None:
    if blas._library() is None:
        pytest.skip("libcublasLt is not on this machine")
    x, w, y = (np.zeros(s, np.float16) for s in ((4, 8), (8, 6), (4, 6)))
    bias = np.zeros(6, np.float16)
    lib = blas._loaded()
    for act, with_bias, want in (("gelu_tanh", True, 36), ("gelu_tanh", False, 32),
                                 ("relu", True, 6), ("relu", False, 2)):
        p = blas.problem("f16", x, w, y, bias=bias if with_bias else None, activation=act)
        assert p is not None
        desc, _ = blas.descriptor(p)
        value, size = ctypes.c_int32(), ctypes.c_size_t()
        assert lib.cublasLtMatmulDescGetAttribute(desc, blas.EPILOGUE, ctypes.byref(value), 4,
                                                  ctypes.byref(size)) == 0
        assert value.value == want
    assert blas.problem("f16", x, w, y, activation="gelu") is None  # erf: not cuBLASLt's


def test_an_f16_gpt_mlp_s_fc_with_its_tanh_gelu_is_all_cublaslt_s(tmp_path: Path) -> None:
    source = ENCODER_MLP.replace("io=bf16", "io=f16").replace("gelu(", "gelu_tanh(")
    program = deviceless_program(source, tmp_path)[1]
    fc1, fc2 = (g for g in map(program.matmul_kernel, program.steps) if g is not None)
    cut = gemv.epilogue_cut(fc1.epilogue, fc1, 1, lambda i: False)
    assert cut is not None and (cut.adds, cut.activation, cut.rest) == (1, "gelu_tanh", None)
    assert gemv.on_cublaslt(fc1) and gemv.on_cublaslt(fc2)
