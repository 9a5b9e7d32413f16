"""A transposed convolution whose kernel equals its stride (a UNet's learned 2x upsample) as one
matmul per row of its kernel, each writing its rows of the channels-last output in place.

Such a convolution scatters each input pixel into its own kh x kw block of the output; no two
pixels meet:

    y[n, kh*h + i, kw*w + j, o] = sum_c x[n, h, w, c] * w[c, o, i, j]          (stride = kernel)

Read the channels-last output as [N*H, kh, W, kw*O]: its rows i are the matmul of the input's
rows [N*H, W, C] by w's taps of block row i, [C, kw*O] (taps j and channels o side by side).
So each block row is one matmul whose result is a slice of a concat along that axis, written in
place (`ir.placement`: strides of kh times its own rows); the weights are rearranged once, at
load time, the input and the output are views of channels-last memory, and a bias of the
convolution (on axis 1) is each matmul's epilogue, tiled kw times.

Measured on an H100 (session 30, the UNet's two upsamples at 1x256x256): cuDNN's conv_dgrad
0.055-0.058 ms each; the two row matmuls with their bias 0.0052 and 0.0058 ms together. One
batched matmul with its input broadcast along the block rows (session 28) got no engine."""

from __future__ import annotations

from dslc.core import dims
from dslc.core.dims import Dim
from dslc.core.types import FLOATS, TensorType
from dslc.ir.graph import Node
from dslc.lower.packing import concat_attrs
from dslc.lower.rewrite import Rewriter

TO_ROWS = (0, 2, 3, 1)  # [N, C, H, W] -> [N, H, W, C]
TAPS = (2, 0, 3, 1)  # w [C, O, kh, kw] -> [kh, C, kw, O]
TO_CHANNELS = (0, 3, 1, 2)  # [N, H', W', O] -> [N, O, H', W']


def transposed_conv_as_matmul(rw: Rewriter, node: Node) -> str | None:
    """conv_transpose (stride = kernel, no padding) -> views of a matmul per block row; with the
    bias_add that alone reads it, the bias as their epilogue (the rule fires at the bias_add
    then, and the convolution left behind is dead)."""
    # an eligible conv_transpose a bias_add reads is one left for it (`_bias_follows`)
    if node.op == "bias_add" and _eligible(rw, rw.node(node.inputs[0])):
        return _as_matmuls(rw, rw.node(node.inputs[0]), node, node.inputs[1])
    if _eligible(rw, node) and not _bias_follows(rw, node.name):
        return _as_matmuls(rw, node, node, None)
    return None


def _bias_follows(rw: Rewriter, conv: str) -> bool:
    """Whether a bias_add on the channels alone reads `conv` (its rule takes the conv along)."""
    users = rw.users_of(conv)
    return rw.only_read_by_one(conv) and users[0].op == "bias_add" and \
        int(users[0].attrs["axis"]) == 1 and users[0].inputs[0] == conv


def _eligible(rw: Rewriter, node: Node) -> bool:
    """A 2-d conv_transpose of floats whose kernel is its stride (static), unpadded, undilated."""
    if node.op != "conv_transpose" or node.type.rank != 4 or node.type.dtype not in FLOATS:
        return False
    a = node.attrs
    if any(x != v for k, v in (("pad", 0), ("dilation", 1), ("output_pad", 0)) for x in a[k]):
        return False
    return tuple(a["stride"]) == tuple(rw.node(node.inputs[1]).type.shape[2:])


def _as_matmuls(rw: Rewriter, conv: Node, like: Node, bias: str | None) -> str:
    x, w = conv.inputs
    n, c, h, wd = rw.node(x).type.shape
    kh, kw = (int(k) for k in conv.attrs["stride"])
    o = rw.node(w).type.shape[1]
    dtype, rows, cols = like.type.dtype, dims.mul(n, h), dims.mul(kw, o)
    xt = _view(rw, like, x, TO_ROWS, (rows, 1, wd, c), "rows")
    taps = _view(rw, like, w, TAPS, (kh, c, cols), "taps")
    tiled = None
    if bias is not None:
        b = rw.node(bias).type
        tiled = rw.new("concat", (bias,) * kw, concat_attrs(0, kw), TensorType(b.dtype, (cols,)),
                       like, f"{like.name}.tiled_bias")
    row_shape = (rows, 1, wd, cols)
    parts = []
    for i in range(kh):
        wi = rw.new("slice", (taps,), {"starts": (i, 0, 0), "ends": (i + 1, c, cols)},
                    TensorType(rw.node(w).type.dtype, (1, c, cols)), like, f"{like.name}.taps{i}")
        y = rw.new("matmul", (xt, wi), {}, TensorType(conv.type.dtype, row_shape), conv,
                   f"{like.name}.row{i}")
        if tiled is not None:
            y = rw.new("bias_add", (y, tiled), {"axis": 3}, TensorType(dtype, row_shape), like,
                       f"{like.name}.row{i}.bias_add")
        parts.append(y)
    shape = (rows, kh, wd, cols)
    y = parts[0] if kh == 1 else rw.new("concat", tuple(parts), concat_attrs(1, kh),
                                        TensorType(dtype, shape), like, f"{like.name}.rows_out")
    out = (n, dims.mul(h, kh), dims.mul(wd, kw), o)
    y = rw.new("reshape", (y,), {"shape": out}, TensorType(dtype, out), like,
               f"{like.name}.blocks")
    return rw.new("transpose", (y,), {"perm": TO_CHANNELS}, like.type, like, like.name)


def _view(rw: Rewriter, like: Node, x: str, perm: tuple[int, ...], shape: tuple[Dim, ...],
          what: str) -> str:
    """`x` transposed by `perm`, then reshaped to `shape` (views: nothing runs)."""
    t = rw.node(x).type
    moved = tuple(t.shape[p] for p in perm)
    y = rw.new("transpose", (x,), {"perm": perm}, TensorType(t.dtype, moved), like,
               f"{like.name}.{what}.moved")
    return rw.new("reshape", (y,), {"shape": shape}, TensorType(t.dtype, shape), like,
                  f"{like.name}.{what}")
