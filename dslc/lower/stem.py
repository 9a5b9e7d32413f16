"""A stride-2 convolution over few channels (an image network's stem: ResNet's 7x7 over RGB) as a
stride-1 convolution over the 2x2 space-to-depth of its input.

cuDNN has no fast kernel for a convolution over 3 channels: its tensor-core kernels read
channels in vectors of 8 (ResNet-50's stem took 0.59 ms of 7.4 at batch 256 on an H100, where
its memory bound is about 0.15). After the rewrite the conv reads 12 channels at half the
resolution through a kernel half as wide:

    y[i, j] = sum_{d, e < k} w[d, e] * x[2i + d - p, 2j + e - p]              (stride 2, pad p)
            = sum_{a, b < k'} w'[a, b] * s[i + a - p', j + b - p']              (stride 1)

where s[i, j, (u, v, c)] = x[2i + u, 2j + v, c] (u, v in {0, 1}: four times the channels, in
ONNX SpaceToDepth's order), and w' is w padded with zero taps to an even size, one in front
where p is odd (so the padding, p + 1, is even: p' = (p + 1) / 2), then split the same way:
w'[a, b, (u, v, c)] = w_padded[2a + u, 2b + v, c]. The weights are rearranged at load time;
the input is one copy (`views._copy_order` writes it channels-last). The zero taps only ever
multiply zeros of the padding or image values the original also reads (for a neighbouring
output): the results differ only where the image holds an infinity or NaN, which then reaches
one more output (0 * inf is NaN)."""

from __future__ import annotations

from dslc.core import dims
from dslc.core.dims import Dim
from dslc.core.types import FLOATS, TensorType
from dslc.ir.graph import Graph, Node
from dslc.lower.canonical import load_time
from dslc.lower.packing import concat_attrs
from dslc.lower.rewrite import Rewriter, Rule

MAX_CHANNELS = 4  # at most 16 channels after the rewrite: what cuDNN's kernels read in one go
SPLIT = (0, 3, 5, 1, 2, 4)  # [.., C, H/2, 2, W/2, 2] -> [.., 2, 2, C, H/2, W/2]


def make_space_to_depth_rule(graph: Graph) -> Rule:
    """The rule, knowing which weights are load-time values (their rearranging is free)."""
    weights = load_time(graph)

    def space_to_depth_stem(rw: Rewriter, node: Node) -> str | None:
        sizes = _static_sizes(rw, node, weights)
        if sizes is None:
            return None
        c, h, wd, kh, kw = sizes
        x, w = rw.node(node.inputs[0]), rw.node(node.inputs[1])
        n, k = x.type.shape[0], w.type.shape[0]
        ph, pw = node.attrs["pre_pad"]  # the post pads follow from the output's size
        oh, ow = node.type.shape[2:]
        along_h, along_w = _sides(kh, ph, h, oh), _sides(kw, pw, wd, ow)
        if along_h is None or along_w is None:
            return None
        (fh, bh, th, pre_h, post_h), (fw, bw, tw, pre_w, post_w) = along_h, along_w
        padded = _zero_taps(rw, node, w.name, 2, fh, bh)
        padded = _zero_taps(rw, node, padded, 3, fw, bw)
        ws = _split(rw, node, padded, (k, c, th, 2, tw, 2), (k, 4 * c, th, tw), "weights")
        xs = _split(rw, node, x.name, (n, c, h // 2, 2, wd // 2, 2), (n, 4 * c, h // 2, wd // 2),
                    "space_to_depth")
        attrs = {**dict(node.attrs), "stride": (1, 1), "pre_pad": (pre_h, pre_w),
                 "post_pad": (post_h, post_w)}
        return rw.new("conv", (xs, ws), attrs, node.type, node, node.name)

    return space_to_depth_stem


def _static_sizes(rw: Rewriter, node: Node, weights: set[str],
                  ) -> tuple[int, int, int, int, int] | None:
    """Channels, height, width and the kernel's two sizes of a 2-d conv of stride 2 over at
    most 4 float channels (never one asked to compute in fp8: that needs 16), an even static
    image, a kernel of 3 or more whose weights are known at load time; else None. f32 too: the
    reference backend then runs the rewritten conv, which the generated programs check against
    PyTorch's conv of the source."""
    if node.op != "conv" or node.type.rank != 4 or node.attrs["groups"] != 1:
        return None
    if tuple(node.attrs["stride"]) != (2, 2) or tuple(node.attrs["dilation"]) != (1, 1):
        return None
    x, w = rw.node(node.inputs[0]), rw.node(node.inputs[1])
    if x.type.dtype not in FLOATS or w.name not in weights:
        return None
    sizes = [d for d in (*x.type.shape[1:], *w.type.shape[2:]) if isinstance(d, int)]
    if len(sizes) != 5:  # a dynamic size
        return None
    c, h, wd, kh, kw = sizes
    if c > MAX_CHANNELS or h % 2 or wd % 2 or min(kh, kw) < 3:
        return None
    return c, h, wd, kh, kw


def _sides(k: int, pre: int, size: int, out: Dim) -> tuple[int, int, int, int, int] | None:
    """Along one axis: zero taps in front and behind, the split kernel's size, and the new
    conv's pads; None where the new conv would need a negative pad (an original whose last
    rows of padding no output reads) or the output size is not static."""
    if not isinstance(out, int):
        return None
    front = pre % 2
    back = (k + front) % 2
    taps = (k + front + back) // 2
    new_pre = (pre + front) // 2
    new_post = out - 1 + taps - new_pre - size // 2
    if new_post < 0:
        return None
    return front, back, taps, new_pre, new_post


def _zero_taps(rw: Rewriter, node: Node, w: str, axis: int, front: int, back: int) -> str:
    """`w` with `front` zero taps before and `back` after along `axis` (at load time)."""
    if not front and not back:
        return w
    t = rw.node(w).type
    parts = []
    for count, where in ((front, "front"), (back, "back")):
        if not count:
            parts.append("")
            continue
        shape = tuple(count if a == axis else d for a, d in enumerate(t.shape))
        zeros = rw.new("full", (), {"shape": shape, "value": 0, "dtype": "i32"},
                       TensorType("i32", shape), node, f"{node.name}.taps{axis}_{where}.zeros")
        parts.append(rw.new("cast", (zeros,), {"dtype": t.dtype}, TensorType(t.dtype, shape),
                            node, f"{node.name}.taps{axis}_{where}"))
    joined = tuple(p for p in (parts[0], w, parts[1]) if p)
    shape = tuple(dims.add(d, front + back) if a == axis else d for a, d in enumerate(t.shape))
    return rw.new("concat", joined, concat_attrs(axis, len(joined)), TensorType(t.dtype, shape),
                  node, f"{node.name}.taps{axis}")


def _split(rw: Rewriter, node: Node, x: str, six: tuple[Dim, ...], four: tuple[Dim, ...],
           what: str) -> str:
    """The 2x2 space-to-depth of `x`: reshape to `six`, move the two phases before the channels,
    merge them into `four` (views: the layout pass makes one copy, at load time for weights)."""
    dtype = rw.node(x).type.dtype
    split = rw.new("reshape", (x,), {"shape": six}, TensorType(dtype, six), node,
                   f"{node.name}.{what}.split")
    moved_shape = tuple(six[p] for p in SPLIT)
    moved = rw.new("transpose", (split,), {"perm": SPLIT}, TensorType(dtype, moved_shape), node,
                   f"{node.name}.{what}.phases")
    return rw.new("reshape", (moved,), {"shape": four}, TensorType(dtype, four), node,
                  f"{node.name}.{what}")
