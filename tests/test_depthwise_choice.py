"""Which depthwise convs compile alone in their cuDNN graph (compile/stage.py: with their bias
in one graph, cuDNN's engines ran a 7x7 12x slower on the H200), and the depthwise fallback
kernel's promises (dslc/backend/depthwise.py: which convs it takes, how a block splits the
channels). Its numbers are checked on the GPU against PyTorch
(tests/gpu/test_depthwise_gpu.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dslc.backend.depthwise import CHUNK_BYTES, chunk, takes
from dslc.backend.target import load_target
from dslc.compile.stage import DEPTHWISE, DEPTHWISE_ALONE_TAPS, compile_model
from dslc.pipeline import lower_and_fuse
from tests.helpers import check_source


def _steps(source: str, tmp_path: Path) -> list[tuple[str, list[str], str]]:
    model = check_source(source, tmp_path).model
    lowered, plan = lower_and_fuse(model)
    c = compile_model(model, lowered, plan, load_target("h200"))
    nodes = c.graph.by_name()
    return [(s.kind, [nodes[n].op for n in s.group.nodes], s.reason) for s in c.steps]


def _model(groups: int, k: int, c: int = 64) -> str:
    return f"""model m {{
  precision io=f16
  layout NHWC
  input x: [2, {c}, 14, 14]
  param w: [{c}, {c // groups}, {k}, {k}]
  param b: [{c}]
  output y = relu(bias_add(conv(x, w, pad={k // 2}, groups={groups}), b))
}}
"""


@pytest.mark.parametrize("k", [5, 7])
def test_a_depthwise_conv_of_25_taps_or_more_is_a_graph_of_its_own(k: int,
                                                                   tmp_path: Path) -> None:
    steps = _steps(_model(groups=64, k=k), tmp_path)
    assert [(kind, ops) for kind, ops, _ in steps] == [("graph", ["conv"]),
                                                        ("graph", ["bias_add", "relu"])]
    assert k * k >= DEPTHWISE_ALONE_TAPS and steps[0][2] == steps[1][2] == DEPTHWISE


@pytest.mark.parametrize(("groups", "k", "why"), [
    (64, 3, "a depthwise 3x3 runs as fast with its epilogue"),
    (32, 7, "two input channels a filter: grouped, not depthwise"),
    (1, 7, "an ordinary conv"),
])
def test_other_convs_keep_their_epilogue(groups: int, k: int, why: str, tmp_path: Path) -> None:
    steps = _steps(_model(groups, k), tmp_path)
    assert [(kind, ops) for kind, ops, _ in steps] == [("graph", ["conv", "bias_add", "relu"])], why


def _kernel_takes(channels: int, w: tuple[int, ...], groups: int, dtype: str) -> bool:
    """Whether a conv of an [8, channels, 14, 14] image runs the depthwise kernel."""
    from dslc.backend.kernels import on_the_reference

    return not on_the_reference("conv", [(8, channels, 14, 14), w], dtype, {"groups": groups})


def test_the_kernel_takes_floats_of_one_filter_a_channel() -> None:
    assert _kernel_takes(96, (96, 1, 7, 7), 96, "bf16") and _kernel_takes(3, (3, 1, 3, 3), 3, "f32")
    assert not _kernel_takes(96, (96, 1, 7, 7), 96, "i8")
    assert not _kernel_takes(96, (192, 1, 7, 7), 96, "f16")  # two filters a channel
    assert not _kernel_takes(96, (96, 1, 7, 7), 48, "f16")
    assert not _kernel_takes(96, (96, 1, 7), 96, "f16")  # 1-d
    assert _kernel_takes(8, (8, 1, 16, 16), 8, "f16") and not _kernel_takes(8, (8, 1, 16, 17), 8, "f16")
    assert takes(256, "f16") and not takes(257, "f16")  # 16 channels of 256 taps fill a row


@pytest.mark.parametrize("vec", [1, 2, 4, 8])
def test_block_rows_cover_the_channels_evenly_in_whole_vectors(vec: int) -> None:
    for channels in range(vec, 1025, vec):
        for taps in (1, 9, 25, 49, 121, 256):
            cb = chunk(channels, taps, vec)
            rows = -(-channels // cb)
            assert cb % vec == 0 and (rows - 1) * cb < channels <= rows * cb
            assert cb * taps * 4 <= CHUNK_BYTES or cb == vec
            # evenly: no row more than a vector short of a full one, but the last
            most = max(vec, CHUNK_BYTES // (4 * taps) // vec * vec)
            assert rows == -(-channels // most)
    assert chunk(96, 49, 8) == 48 and chunk(768, 49, 8) == 80


def test_which_kernels_run_the_reference_on_cupy() -> None:
    """What R0803 names when CuPy refuses a CUDA graph capture: the kernels that run their op's
    numpy reference (a depthwise conv has a kernel of its own, other convs do not)."""
    from dslc.backend.kernels import on_the_reference
    from dslc.core.dims import sym

    depthwise = {"groups": 96}
    assert not on_the_reference("conv", [(8, 96, 14, 14), (96, 1, 7, 7)], "f16", depthwise)
    assert on_the_reference("conv", [(8, 96, 14, 14), (96, 96, 3, 3)], "f16", {"groups": 1})
    assert on_the_reference("conv", [(8, 96, 14, 14), (96, 1, 7, 7)], "i8", depthwise)
    # a dynamic batch keeps the kernel (only channels and filters are read); dynamic channels not
    assert not on_the_reference("conv", [(sym("N"), 96, 14, 14), (96, 1, 7, 7)], "f16", depthwise)
    assert on_the_reference("conv", [(8, sym("C"), 14, 14), (96, 1, 7, 7)], "f16", depthwise)
    assert not on_the_reference("maxpool", [(8, 96, 14, 14)], "f16", {})
    assert on_the_reference("softmax", [(8, 96)], "f16", {})
