"""Property tests: the checker's shape rules agree with NumPy (broadcasting) and PyTorch (conv,
pooling, transposed conv, matmul) on random literal shapes, and report the documented code when
the reference refuses the shapes. Inputs are f32 (`precision io=f32`), clear of layout warnings.
"""

from __future__ import annotations

import functools
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from dslc.backend.target import load_target
from dslc.compile.stage import compile_model
from dslc.core import dims
from dslc.emit import bundle as emit_bundle
from dslc.pipeline import lower_and_fuse
from dslc.runtime import bundle
from dslc.runtime.records import BundleError
from tests.helpers import Said, check_source, model_snippet, whole

SETTINGS = settings(deadline=None, max_examples=50,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])


@pytest.fixture(scope="module")
def workdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as d:
        yield Path(d)


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread() -> Iterator[None]:
    """The reference calls are on tiny tensors: threads only cost time (restored afterwards)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _shape(dims_: Any) -> str:
    return "[" + ", ".join(str(d) for d in dims_) + "]"


def _ints(values: tuple[int, ...]) -> str:
    return "[" + ", ".join(str(v) for v in values) + "]"


def _errors(c: Any) -> list[str]:
    return [code for code in c.codes if code.startswith("E")]


def _messages(c: Any) -> list[str]:
    return [f"{d.code}: {d.message}" for d in c.diagnostics]


def _node_shapes(c: Any, op: str) -> list[tuple[Any, ...]]:
    return [tuple(n.type.shape) for n in c.model.graph.nodes if n.op == op]


def _torch_shape(fn: Any) -> tuple[int, ...] | None:
    """The result shape of `fn()`, or None when PyTorch refuses the sizes. An empty result
    (PyTorch's conv_transpose1d gives size 0 where 2d/3d refuse) also counts as refused: every
    size in the language is at least 1."""
    try:
        shape = tuple(fn().shape)
    except RuntimeError:
        return None
    return shape if all(d >= 1 for d in shape) else None


# ---- (a) broadcasting ------------------------------------------------------------------------

lit_shapes = st.lists(st.sampled_from([1, 2, 3, 5]), min_size=0, max_size=4)


@SETTINGS
@given(lit_shapes, lit_shapes)
def test_broadcasting_agrees_with_numpy(workdir: Path, a: list[int], b: list[int]) -> None:
    src = model_snippet(f"  input a: {_shape(a)}\n  input b: {_shape(b)}\n  output y = a + b")
    c = check_source(src, workdir)
    try:
        expected: tuple[int, ...] | None = np.broadcast_shapes(tuple(a), tuple(b))
    except ValueError:
        expected = None
    if expected is None:
        assert _errors(c) == ["E0301"], _messages(c)
    else:
        assert _errors(c) == [], _messages(c)
        assert _node_shapes(c, "add") == [expected]


@SETTINGS
@given(lit_shapes, lit_shapes, lit_shapes)
def test_select_broadcasts_three_ways_like_numpy(workdir: Path, m: list[int], a: list[int],
                                                b: list[int]) -> None:
    src = model_snippet(f"  input m: bool{_shape(m)}\n  input a: {_shape(a)}\n"
                        f"  input b: {_shape(b)}\n  output y = select(m, a, b)")
    c = check_source(src, workdir)
    try:
        expected: tuple[int, ...] | None = np.broadcast_shapes(tuple(m), tuple(a), tuple(b))
    except ValueError:
        expected = None
    if expected is None:
        assert _errors(c) == ["E0301"], _messages(c)
    else:
        assert _errors(c) == [], _messages(c)
        assert _node_shapes(c, "select") == [expected]


# spellings of symbolic dims, each with its normal form (H is even in 2..16, W is 1..16)
SYM_DECLS = "  dim H = 2..16 align 2\n  dim W = 1..16\n  dim D = 1"
_ENV = dims.DimEnv()
_ENV.add(dims.SymInfo("H", 2, 16, 2))
_ENV.add(dims.SymInfo("W", 1, 16))
_H, _W = dims.sym("H"), dims.sym("W")
SYM_SPELLINGS: list[tuple[str, Any]] = [
    ("1", 1), ("D", 1), ("W - W + 1", 1), ("3", 3), ("H", _H), ("H + 0", _H),
    ("2 * H / 2", _H), ("W", _W), ("2 * H", dims.mul(2, _H)), ("H + H", dims.mul(2, _H)),
    ("H / 2", dims.div_exact(_H, 2, _ENV)), ("H * W", dims.mul(_H, _W)),
    ("W * H", dims.mul(_H, _W)),
]
sym_shapes = st.lists(st.sampled_from(SYM_SPELLINGS), min_size=0, max_size=3)


def _bcast_rule(a: list[Any], b: list[Any]) -> tuple[Any, ...] | None:
    """Section 3.3: right-aligned; each pair equal in normal form, or one side the literal 1
    (a dynamic dim never broadcasts)."""
    out = []
    for i in range(1, max(len(a), len(b)) + 1):
        x = a[-i] if i <= len(a) else 1
        y = b[-i] if i <= len(b) else 1
        if x == y or y == 1:
            out.append(x)
        elif x == 1:
            out.append(y)
        else:
            return None
    return tuple(reversed(out))


@SETTINGS
@given(sym_shapes, sym_shapes)
def test_broadcasting_symbolic_dims_by_normal_form(workdir: Path, a: list[tuple[str, Any]],
                                                   b: list[tuple[str, Any]]) -> None:
    src = model_snippet(f"{SYM_DECLS}\n  input a: {_shape(t for t, _ in a)}\n"
                        f"  input b: {_shape(t for t, _ in b)}\n  output y = a * b")
    c = check_source(src, workdir)
    expected = _bcast_rule([d for _, d in a], [d for _, d in b])
    if expected is None:
        assert _errors(c) == ["E0301"], _messages(c)
    else:
        assert _errors(c) == [], _messages(c)
        assert _node_shapes(c, "mul") == [expected]


@SETTINGS
@given(st.sampled_from(SYM_SPELLINGS), st.sampled_from(SYM_SPELLINGS))
def test_matmul_inner_dims_match_by_normal_form(workdir: Path, ka: tuple[str, Any],
                                                kb: tuple[str, Any]) -> None:
    src = model_snippet(f"{SYM_DECLS}\n  input a: [W, {ka[0]}]\n  input b: [{kb[0]}, 3]\n"
                        "  output y = matmul(a, b)")
    c = check_source(src, workdir)
    if ka[1] == kb[1]:
        assert _errors(c) == [], _messages(c)
        assert _node_shapes(c, "matmul") == [(_W, 3)]
    else:
        assert _errors(c) == ["E0302"], _messages(c)


# ---- (b) convolution -------------------------------------------------------------------------

TORCH_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
TORCH_CONV_T = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}
TORCH_MAXPOOL = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}
TORCH_AVGPOOL = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}


def per_axis(n: int, lo: int, hi: int) -> st.SearchStrategy[tuple[int, ...]]:
    return st.tuples(*[st.integers(lo, hi)] * n)


@st.composite
def conv_cases(draw: st.DrawFn) -> dict[str, Any]:
    n = draw(st.integers(1, 3))
    groups = draw(st.integers(1, 3))
    return {
        "n": n, "N": draw(st.integers(1, 2)), "groups": groups,
        "C": groups * draw(st.integers(1, 2)), "K": groups * draw(st.integers(1, 2)),
        "S": draw(per_axis(n, 1, 9)), "R": draw(per_axis(n, 1, 4)),
        "stride": draw(per_axis(n, 1, 3)), "pad": draw(per_axis(n, 0, 2)),
        "dilation": draw(per_axis(n, 1, 2)),
    }


@SETTINGS
@given(conv_cases())
def test_conv_output_size_agrees_with_torch(workdir: Path, p: dict[str, Any]) -> None:
    n, g = p["n"], p["groups"]
    x_shape = (p["N"], p["C"], *p["S"])
    w_shape = (p["K"], p["C"] // g, *p["R"])
    src = model_snippet(
        f"  input x: {_shape(x_shape)}\n  input w: {_shape(w_shape)}\n"
        f"  output y = conv(x, w, stride={_ints(p['stride'])}, pad={_ints(p['pad'])}, "
        f"dilation={_ints(p['dilation'])}, groups={g})")
    c = check_source(src, workdir)
    expected = _torch_shape(lambda: TORCH_CONV[n](
        torch.zeros(x_shape), torch.zeros(w_shape), stride=p["stride"], padding=p["pad"],
        dilation=p["dilation"], groups=g))
    if expected is None:
        assert _errors(c) == ["E0603"], _messages(c)
    else:
        assert _errors(c) == [], _messages(c)
        assert _node_shapes(c, "conv") == [expected]


@SETTINGS
@given(st.integers(1, 3).flatmap(lambda n: st.tuples(
    st.just(n), per_axis(n, 1, 9), per_axis(n, 1, 4), per_axis(n, 1, 3), per_axis(n, 0, 3),
    per_axis(n, 0, 3), per_axis(n, 1, 2))))
def test_conv_asymmetric_padding_agrees_with_torch(workdir: Path, case: tuple[Any, ...]) -> None:
    """pre_pad/post_pad: PyTorch pads explicitly (F.pad), then convolves without padding."""
    n, size, kernel, stride, pre, post, dilation = case
    x_shape, w_shape = (1, 2, *size), (3, 2, *kernel)
    src = model_snippet(
        f"  input x: {_shape(x_shape)}\n  input w: {_shape(w_shape)}\n"
        f"  output y = conv(x, w, stride={_ints(stride)}, pre_pad={_ints(pre)}, "
        f"post_pad={_ints(post)}, dilation={_ints(dilation)})")
    c = check_source(src, workdir)
    torch_pad = [v for i in reversed(range(n)) for v in (pre[i], post[i])]  # last axis first
    expected = _torch_shape(lambda: TORCH_CONV[n](
        F.pad(torch.zeros(x_shape), torch_pad), torch.zeros(w_shape), stride=stride,
        dilation=dilation))
    if expected is None:
        assert _errors(c) == ["E0603"], _messages(c)
    else:
        assert _errors(c) == [], _messages(c)
        assert _node_shapes(c, "conv") == [expected]


@functools.cache
def _conv_pool_1d(h: int, kernel: int, stride: int, pad: int, dilation: int,
                  pool: tuple[int, int, int] | None) -> tuple[int | None, int | None]:
    """PyTorch's sizes after conv1d, and after a following max_pool1d (window, stride, pad)."""
    conv = _torch_shape(lambda: F.conv1d(torch.zeros(1, 2, h), torch.zeros(3, 2, kernel),
                                         stride=stride, padding=pad, dilation=dilation))
    if conv is None:
        return None, None
    if pool is None:
        return conv[2], None
    window, pstride, ppad = pool
    pooled = _torch_shape(lambda: F.max_pool1d(torch.zeros(conv), window, pstride, ppad))
    return conv[2], None if pooled is None else pooled[2]


@SETTINGS
@given(st.integers(1, 12), st.integers(1, 4), st.integers(1, 24), st.integers(1, 5),
       st.integers(1, 3), st.integers(0, 2), st.integers(1, 2),
       st.one_of(st.none(), st.integers(1, 3).flatmap(
           lambda w: st.tuples(st.just(w), st.integers(1, 3), st.integers(0, w // 2)))))
def test_conv_on_a_dynamic_dim_agrees_with_torch_at_every_value(
        workdir: Path, lo: int, align: int, span: int, kernel: int, stride: int, pad: int,
        dilation: int, pool: tuple[int, int, int] | None) -> None:
    """`dim H = lo..hi align a`: the symbolic output size of a conv (and of a max-pool after
    it: a floor of a floor), evaluated at each admissible H, is PyTorch's; E0603 exactly when
    some admissible H gives an empty output."""
    hi = lo + span
    admissible = [h for h in range(lo, hi + 1) if h % align == 0]
    assume(admissible)
    # the sizes grow with H, so the smallest admissible H decides E0603; compare a spread
    admissible = sorted({*admissible[:2], *admissible[-2:], *admissible[::4]})
    body = (f"  dim H = {lo}..{hi} align {align}\n  input x: [1, 2, H]\n"
            f"  input w: [3, 2, {kernel}]\n"
            f"  let y = conv(x, w, stride={stride}, pad={pad}, dilation={dilation})\n")
    if pool is None:
        body += "  output z = y"
    else:
        body += f"  output z = maxpool(y, window={pool[0]}, stride={pool[1]}, pad={pool[2]})"
    c = check_source(model_snippet(body), workdir)
    sizes = {h: _conv_pool_1d(h, kernel, stride, pad, dilation, pool) for h in admissible}
    if any(conv is None or (pool is not None and pooled is None)
           for conv, pooled in sizes.values()):
        assert _errors(c) == ["E0603"], _messages(c)
        return
    assert _errors(c) == [], _messages(c)
    ((_, k, conv_out),) = _node_shapes(c, "conv")
    assert k == 3
    pooled_out = _node_shapes(c, "maxpool")[0][2] if pool is not None else 1
    for h, (conv_size, pooled_size) in sizes.items():
        assert dims.evaluate(conv_out, {"H": h}, c.model.env) == conv_size, (h, conv_out)
        if pool is not None:
            assert dims.evaluate(pooled_out, {"H": h}, c.model.env) == pooled_size, (h, pooled_out)


# ---- (c) pooling -----------------------------------------------------------------------------


@st.composite
def pool_cases(draw: st.DrawFn) -> dict[str, Any]:
    n = draw(st.integers(1, 3))
    window = draw(per_axis(n, 1, 4))
    pad = tuple(draw(st.integers(0, w // 2)) for w in window)
    stride = draw(st.one_of(st.none(), per_axis(n, 1, 3)))
    return {"n": n, "S": draw(per_axis(n, 1, 9)), "window": window, "pad": pad,
            "stride": stride, "op": draw(st.sampled_from(["maxpool", "avgpool"]))}


@SETTINGS
@given(pool_cases())
def test_pool_output_size_agrees_with_torch(workdir: Path, p: dict[str, Any]) -> None:
    n, op = p["n"], p["op"]
    x_shape = (2, 3, *p["S"])
    stride_kw = "" if p["stride"] is None else f", stride={_ints(p['stride'])}"
    src = model_snippet(f"  input x: {_shape(x_shape)}\n"
                        f"  output y = {op}(x, window={_ints(p['window'])}{stride_kw}, "
                        f"pad={_ints(p['pad'])})")
    c = check_source(src, workdir)
    # PyTorch's avg_pool3d alone also demands an unpadded input at least as large as the
    # window (avg_pool1d/2d and max_pool3d do not); its output size is max_pool3d's.
    fn = (TORCH_AVGPOOL if op == "avgpool" and n < 3 else TORCH_MAXPOOL)[n]
    expected = _torch_shape(lambda: fn(torch.zeros(x_shape), p["window"], stride=p["stride"],
                                       padding=p["pad"], ceil_mode=False))
    if expected is None:
        assert _errors(c) == ["E0603"], _messages(c)
    else:
        assert _errors(c) == [], _messages(c)
        assert _node_shapes(c, op) == [expected]


@SETTINGS
@given(st.integers(1, 5), st.integers(0, 4), st.integers(3, 9))
@example(window=3, pad=2, size=5).via("padding above half the window")
@example(window=5, pad=0, size=3).via("a window larger than the input")
@example(window=3, pad=1, size=5).via("an output")
def test_pool_padding_above_half_the_window_is_refused_like_torch(
        workdir: Path, window: int, pad: int, size: int) -> None:
    src = model_snippet(f"  input x: [1, 2, {size}, {size}]\n"
                        f"  output y = maxpool(x, window={window}, stride=1, pad={pad})")
    c = check_source(src, workdir)
    expected = _torch_shape(lambda: F.max_pool2d(torch.zeros(1, 2, size, size), window, 1, pad))
    if 2 * pad > window:
        assert expected is None
        assert _errors(c) == ["E0305"], _messages(c)
    elif expected is None:  # a window larger than the padded input: no output
        assert _errors(c) == ["E0603"], _messages(c)
    else:
        assert _errors(c) == [] and _node_shapes(c, "maxpool") == [expected], _messages(c)


# ---- (d) transposed convolution --------------------------------------------------------------


@st.composite
def conv_t_cases(draw: st.DrawFn) -> dict[str, Any]:
    n = draw(st.integers(1, 3))
    stride = draw(per_axis(n, 1, 3))
    dilation = draw(per_axis(n, 1, 2))
    opad = tuple(draw(st.integers(0, s - 1)) for s in stride)  # output_pad < stride
    return {"n": n, "S": draw(per_axis(n, 1, 6)), "R": draw(per_axis(n, 1, 4)),
            "stride": stride, "pad": draw(per_axis(n, 0, 3)), "dilation": dilation,
            "opad": opad}


@SETTINGS
@given(conv_t_cases())
def test_conv_transpose_output_size_agrees_with_torch(workdir: Path, p: dict[str, Any]) -> None:
    n = p["n"]
    x_shape, w_shape = (2, 3, *p["S"]), (3, 4, *p["R"])
    src = model_snippet(
        f"  input x: {_shape(x_shape)}\n  input w: {_shape(w_shape)}\n"
        f"  output y = conv_transpose(x, w, stride={_ints(p['stride'])}, pad={_ints(p['pad'])}, "
        f"dilation={_ints(p['dilation'])}, output_pad={_ints(p['opad'])})")
    c = check_source(src, workdir)
    expected = _torch_shape(lambda: TORCH_CONV_T[n](
        torch.zeros(x_shape), torch.zeros(w_shape), stride=p["stride"], padding=p["pad"],
        output_padding=p["opad"], dilation=p["dilation"]))
    if expected is None:
        assert _errors(c) == ["E0603"], _messages(c)
    else:
        assert _errors(c) == [], _messages(c)
        assert _node_shapes(c, "conv_transpose") == [expected]


# ---- (e) matmul ------------------------------------------------------------------------------

batch = st.lists(st.sampled_from([1, 2, 3]), min_size=0, max_size=2)
mat = st.integers(1, 4)


@SETTINGS
@given(batch, batch, mat, mat, mat)
def test_matmul_batch_broadcasting_agrees_with_torch(workdir: Path, ba: list[int], bb: list[int],
                                                     m: int, k: int, n: int) -> None:
    a_shape, b_shape = (*ba, m, k), (*bb, k, n)
    src = model_snippet(f"  input a: {_shape(a_shape)}\n  input b: {_shape(b_shape)}\n"
                        "  output y = matmul(a, b)")
    c = check_source(src, workdir)
    expected = _torch_shape(lambda: torch.matmul(torch.zeros(a_shape), torch.zeros(b_shape)))
    if expected is None:
        assert _errors(c) == ["E0301"], _messages(c)
    else:
        assert _errors(c) == [], _messages(c)
        assert _node_shapes(c, "matmul") == [expected]


@SETTINGS
@given(batch, mat, mat, mat, mat)
def test_matmul_inner_dimension_mismatch_is_e0302(workdir: Path, b: list[int], m: int, ka: int,
                                                  kb: int, n: int) -> None:
    assume(ka != kb)
    a_shape, b_shape = (*b, m, ka), (*b, kb, n)
    src = model_snippet(f"  input a: {_shape(a_shape)}\n  input b: {_shape(b_shape)}\n"
                        "  output y = matmul(a, b)")
    c = check_source(src, workdir)
    assert _torch_shape(lambda: torch.matmul(torch.zeros(a_shape), torch.zeros(b_shape))) is None
    assert _errors(c) == ["E0302"], _messages(c)


def _whole(src: str, workdir: Path) -> list[Said]:
    """Each diagnostic of `src` whole (`tests.helpers.whole`)."""
    return [whole(d, src) for d in check_source(src, workdir).diagnostics]


# ---- (f) the memory order of views: reshape and transpose ------------------------------------
# Each input is stored in a declared memory order; the view's type must give the order NumPy's
# view of the same memory has (the strides of every axis of size > 1 agree), and where NumPy can
# only copy, no order (None: lowering copies). Axes of size 1 take no place in memory: dslc puts
# those not merged or split with a larger axis outermost, in their order; the expected orders
# below are written out by hand.

def _stored(shape: tuple[int, ...], order: tuple[int, ...]) -> np.ndarray:
    """A NumPy array of `shape` whose memory holds its axes in `order`."""
    base = np.arange(int(np.prod(shape))).reshape([shape[a] for a in order])
    return base.transpose([order.index(a) for a in range(len(shape))])


def _same_memory_as_numpy(view: np.ndarray, order: tuple[int, ...]) -> bool:
    dense = _stored(view.shape, order)  # the same shape stored packed in `order`
    got = tuple(s // view.itemsize for s in view.strides)
    want = tuple(s // dense.itemsize for s in dense.strides)
    return all(n == 1 or g == w for n, g, w in zip(view.shape, got, want, strict=True))


def _numpy_reshape_view(a: np.ndarray, new: tuple[int, ...]) -> np.ndarray | None:
    try:
        return np.reshape(a, new, copy=False)
    except ValueError:  # NumPy needs a copy
        return None


def _layout_of(c: Any, name: str) -> tuple[int, ...] | None:
    node = next(n for n in c.model.graph.nodes if n.name == name)
    return None if node.type.layout is None else tuple(node.type.layout.order)


NHWC = (0, 2, 3, 1)


@pytest.mark.parametrize(("shape", "tag", "order", "new", "expected"), [
    ((2, 3, 4, 5), " @NHWC", NHWC, (2, 3, 4, 5), NHWC),  # the same shape keeps the layout
    ((2, 3, 4, 5), " @NHWC", NHWC, (2, 3, 20), (0, 2, 1)),  # H and W merge, C stays innermost
    ((3, 2, 4, 5), " @NHWC", NHWC, (3, 2, 20), (0, 2, 1)),  # as above, with a C of size 2
    ((2, 3, 4, 5), " @NHWC", NHWC, (2, 3, 2, 2, 5), (0, 2, 3, 4, 1)),  # H split, C innermost
    ((2, 3, 4, 5), " @NHWC", NHWC, (6, 20), None),  # N and C are not adjacent in memory
    ((6,), "", (0,), (2, 3, 1), (2, 0, 1)),  # a new size-1 axis goes outermost
    ((1, 1, 6), "", (0, 1, 2), (1, 1, 2, 3), (0, 1, 2, 3)),  # size-1 axes kept in their order
    ((2, 1, 6), "", (0, 1, 2), (1, 2, 6, 1), (3, 0, 1, 2)),  # the new 1 before 2 goes with it
])
def test_a_reshape_of_stored_data_has_the_memory_order_numpy_gives(
        workdir: Path, shape: tuple[int, ...], tag: str, order: tuple[int, ...],
        new: tuple[int, ...], expected: tuple[int, ...] | None) -> None:
    view = _numpy_reshape_view(_stored(shape, order), new)
    assert (view is None) == (expected is None)
    assert view is None or expected is None or _same_memory_as_numpy(view, expected)
    c = check_source(model_snippet(f"  input x: {_shape(shape)}{tag}\n"
                                   f"  let r = reshape(x, {_ints(new)})\n"
                                   "  output y = r + 1.0"), workdir)
    assert _errors(c) == [], _messages(c)
    assert _layout_of(c, "r") == expected


@pytest.mark.parametrize(("shape", "tag", "order", "perm", "expected"), [
    ((2, 3, 4, 5), " @NHWC", NHWC, (0, 3, 1, 2), (0, 3, 1, 2)),  # [N, W, C, H], stored N H W C
    ((2, 3, 4, 5), " @NHWC", NHWC, (0, 2, 3, 1), (0, 1, 2, 3)),  # NHWC read as [N, H, W, C]
    ((2, 3, 4), "", (0, 1, 2), (2, 0, 1), (1, 2, 0)),
])
def test_a_transpose_of_stored_data_has_the_memory_order_numpy_gives(
        workdir: Path, shape: tuple[int, ...], tag: str, order: tuple[int, ...],
        perm: tuple[int, ...], expected: tuple[int, ...]) -> None:
    assert _same_memory_as_numpy(_stored(shape, order).transpose(perm), expected)
    c = check_source(model_snippet(f"  input x: {_shape(shape)}{tag}\n"
                                   f"  let t = transpose(x, {_ints(perm)})\n"
                                   "  output y = t + 1.0"), workdir)
    assert _errors(c) == [], _messages(c)
    assert _layout_of(c, "t") == expected


# ---- (g) reductions compute in f32 -------------------------------------------------------------

@pytest.mark.parametrize("op", ["reduce_sum", "reduce_mean", "reduce_l2"])
@pytest.mark.parametrize("compute", ["f16", "bf16"])
def test_a_reduction_refuses_a_compute_narrower_than_f32_even_on_narrow_inputs(
        workdir: Path, op: str, compute: str) -> None:
    """The inputs are f16 (io=f16): only the reduction's own need of f32 math refuses them."""
    precision = f"io=f16, intermediate=f32, compute={compute}"
    src = model_snippet(f"  input x: [2, 8]\n  output y = {op}(x, axes=[1])", precision=precision)
    assert _whole(src, workdir) == [
        ("E0403", f"`{op}` needs compute=f32, but compute is {compute} here",
         op, f"computed in {compute}",
         ((f"compute={compute} set here", f"compute={compute}"),),
         (f"cuDNN runs `{op}` with f32 math",),
         ("set `precision compute=f32` in the model, or in the def that holds this op",))]


# ---- (h) a bundle's view whose reshape step does not keep the element count ---------------------

def test_a_bundle_view_reshaping_to_more_elements_than_its_base_is_refused(tmp_path: Path) -> None:
    """An edited (re-hashed) bundle: the view `r` of x [2, 3, 4] (24 elements) now reshapes it
    to [6, 5] (30): the reader refuses the view as reaching outside x, in one sentence."""
    model = check_source(model_snippet("  input x: [2, 3, 4]\n  let r = reshape(x, [6, 4])\n"
                                       "  output y = reduce_sum(r, axes=[0, 1], keepdims=true)"),
                         tmp_path).model
    lowered, plan = lower_and_fuse(model)
    data = emit_bundle.payload(compile_model(model, lowered, plan, load_target("h200")))
    view = next(n for n in data["graph"]["nodes"] if n["name"] == "r")
    assert view["op"] == "view" and view["attrs"]["steps"] == [["reshape", [6, 4]]]
    view["attrs"]["steps"] = [["reshape", [6, 5]]]
    view["type"]["shape"] = [6, 5]
    path = tmp_path / "m.bundle"
    path.write_bytes(bundle.pack(data))
    with pytest.raises(BundleError) as err:
        bundle.load(path)
    assert str(err.value) == f"`{path}` is not a valid bundle: graph: view `r` reaches outside `x`"


# ---- (i) conv's own diagnostics: rank, dtypes, padding, compute, the NCHW warning -------------

@pytest.mark.parametrize(("body", "expected"), [
    ("  input x: [2, 6]\n  input w: [3, 2]\n  output y = conv(x, w)",
     ("E0301", "`conv` expects x [N, C, *S] with 1 to 3 spatial axes", "x", "f32[2, 6] has rank 2",
      (), ("the first two axes are batch and channels",), ())),
    ("  input x: i32[1, 2, 6]\n  input w: i32[3, 2, 3]\n  output y = conv(x, w)",
     ("E0401", "`conv` does not support i32 inputs", "x", "i32 here", (),
      ("`conv` takes floating-point tensors (f32, f16, bf16)",), ("convert first: `cast(x, f32)`",))),
    ("  input x: f32[1, 2, 6]\n  input w: f16[3, 2, 3]\n  output y = conv(x, w)",
     ("E0401", "the operands of `conv` have different dtypes", "w", "f16", (("f32", "x"),), (),
      ("cast one of them: `cast(w, f32)`",))),
    ("  input x: [1, 2, 6, 6]\n  input w: [3, 2, 3, 3]\n  output y = conv(x, w, pad=[1, 1, 1])",
     ("E0305", "`pad` of `conv` needs 2 values, one per spatial axis", "pad=[1, 1, 1]",
      "3 given", (),
      (), ())),
    ("  input x: [1, 2, 6, 6]\n  input w: [3, 2, 3, 3]\n  output y = conv(x, w, pad=-1)",
     ("E0305", "`pad` of `conv` must be at least 0", "pad=-1", "-1 here", (), (), ())),
], ids=["rank", "integer-inputs", "mixed-dtypes", "pad-count", "negative-pad"])
def test_conv_refusals_name_conv_and_point_at_the_argument(workdir: Path, body: str,
                                                            expected: Said) -> None:
    assert _whole(model_snippet(body), workdir) == [expected]


def test_a_float_conv_refuses_a_compute_narrower_than_f32(workdir: Path) -> None:
    """f16 inputs under compute=f16: the compute is as wide as the inputs, yet cuDNN's conv
    needs f32 math."""
    precision = "io=f16, intermediate=f32, compute=f16"
    src = model_snippet("  input x: [1, 2, 6]\n  input w: [3, 2, 3]\n  output y = conv(x, w)",
                        precision=precision)
    assert _whole(src, workdir) == [
        ("E0403", "`conv` needs compute=f32, but compute is f16 here", "conv", "computed in f16",
         (("compute=f16 set here", "compute=f16"),), ("cuDNN runs `conv` with f32 math",),
         ("set `precision compute=f32` in the model, or in the def that holds this op",))]


@pytest.mark.parametrize("compute", ["f16", "bf16"])
def test_an_integer_conv_takes_a_float_compute_narrower_than_f32(workdir: Path,
                                                                 compute: str) -> None:
    """i8 x i8 accumulates in i32: the compute precision (only floats' math) does not bind it."""
    src = model_snippet("  input x: i8[1, 2, 6]\n  input w: i8[3, 2, 3]\n  output y = conv(x, w)",
                        precision=f"io=f32, intermediate=f32, compute={compute}")
    c = check_source(src, workdir)
    assert c.diagnostics == []
    assert [(n.type.dtype, tuple(n.type.shape)) for n in c.model.graph.nodes
            if n.op == "conv"] == [("i32", (1, 3, 4))]


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_a_half_precision_conv_on_nchw_data_is_warned(workdir: Path, dtype: str) -> None:
    src = model_snippet("  input x: [1, 8, 6, 6]\n  param w: [16, 8, 3, 3]\n  output y = conv(x, w)",
                        precision=f"io={dtype}, intermediate=f32, compute=f32")
    assert _whole(src, workdir) == [
        ("W0501", f"{dtype} `conv` on NCHW data", "x", f"{dtype}[1, 8, 6, 6] is NCHW", (),
         ("tensor-core convolutions run on channels-last data; NCHW costs a transpose or a "
          "slower engine",),
         ("declare the input `@NHWC`, or set `layout NHWC` in the model",))]


def test_a_bundle_conv_with_no_padding_recorded_is_read_as_unpadded(tmp_path: Path) -> None:
    """An edited (re-hashed) bundle: a conv checked with pad=1 (x [1, 2, 5, 5], 3x3 window, so
    y [1, 3, 5, 5]) loses its pre_pad and post_pad (`pad` is recorded as none after checking).
    The reader re-types it without padding, 5 - 3 + 1 = 3 per axis, and refuses the node."""
    model = check_source(model_snippet("  input x: [1, 2, 5, 5]\n  input w: [3, 2, 3, 3]\n"
                                       "  output y = conv(x, w, pad=1)"), tmp_path).model
    lowered, plan = lower_and_fuse(model)
    data = emit_bundle.payload(compile_model(model, lowered, plan, load_target("h200")))
    node = next(n for n in data["graph"]["nodes"] if n["op"] == "conv")
    assert node["attrs"]["pad"] is None
    assert (node["attrs"].pop("pre_pad"), node["attrs"].pop("post_pad")) == ([1, 1], [1, 1])
    path = tmp_path / "m.bundle"
    path.write_bytes(bundle.pack(data))
    with pytest.raises(BundleError) as err:
        bundle.load(path)
    assert str(err.value) == (
        f"`{path}` is not a valid bundle: graph: the IR does not check out "
        f"(%{node['name']} (conv): type f32[1, 3, 5, 5] @NHWC, but its op gives f32[1, 3, 3, 3])")
