"""The split-key attention kernel (`backend.attention`) on the CPU: every variant of its source
compiles with NVRTC (the CUDA compiler runs without a GPU) for the H200 without a warning or a
register spilled, which attention it takes, and that the tuner offers a decoder's attention step to it
(`tune.fusion.kernel_steps`) and not one it cannot take. Its numbers are checked on the H200
against PyTorch (tests/gpu/test_attention_gpu.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dslc.backend import attention
from dslc.tune.fusion import kernel_steps
from tests.helpers import deviceless_program, nvrtc_compile


@pytest.mark.parametrize("storage", ["float16", "bfloat16"])
@pytest.mark.parametrize("group", [1, 5, attention.MAX_GROUP])
def test_every_variant_of_the_attention_kernel_compiles_without_a_warning_or_a_spill(
        storage: str, group: int) -> None:
    for head_dim in (d for d in attention.HEAD_DIMS if attention.fits(group, d)):
        for vec in (1, 8) if head_dim == 64 else (8,):  # the scalar loads differ in one place
            ok, log = nvrtc_compile(attention.source(storage, group, head_dim, vec))
            assert ok and "warning" not in log, (head_dim, vec, log[:2000])
            # registers spilled to local memory: loads issued together beyond what registers
            # hold spilled 0.2 to 7.5 KB a thread; a few words, where ptxas keeps to 128
            # registers, is its choice
            spilled = [int(n) for n in re.findall(r"(\d+) bytes spill stores", log)]
            assert spilled and max(spilled) <= 64, (head_dim, vec, log[:2000])


def test_a_syntax_error_in_a_kernel_source_is_seen() -> None:
    """The compile check above can fail."""
    ok, log = nvrtc_compile("extern \"C\" __global__ void k() { undefined_name; }")
    assert not ok and "undefined" in log


GQA = {"q": (1, 32, 1, 64), "k": (1, 8, 1024, 64), "v": (1, 8, 1024, 64), "kv_len": (1,)}


@pytest.mark.parametrize(("change", "taken"), [
    ({}, True),
    ({"q_len": (1,)}, True),
    ({"q": (1, 64, 1, 64)}, True),  # 8 query heads a KV head
    ({"q": (1, 72, 1, 64)}, False),  # 9
    ({"q": (1, 30, 1, 64)}, False),  # not a multiple of the KV heads
    ({"q": (1, 32, 1, 80), "k": (1, 8, 1024, 80), "v": (1, 8, 1024, 80)}, False),  # not 2^n
    ({"q": (1, 32, 1, 512), "k": (1, 8, 1024, 512), "v": (1, 8, 1024, 512)}, False),
    ({"v": (1, 8, 1024, 128)}, False),  # another head dim for the values
    ({"q": (1, 40, 1, 32), "k": (1, 8, 1024, 32), "v": (1, 8, 1024, 32)}, True),  # 5 at 32
    ({"q": (1, 48, 1, 32), "k": (1, 8, 1024, 32), "v": (1, 8, 1024, 32)}, False),  # 6 spill
    ({"v": (1, 8, 1000, 64)}, False),  # keys and values of two lengths
    ({"bias": (1, 32, 1, 1024)}, False),
    ({"descale_q": (1,)}, False),
    ({"q": (16, 32, 511, 64), "k": (16, 8, 1024, 64), "v": (16, 8, 1024, 64)}, True),
    ({"q": (16, 32, 512, 64), "k": (16, 8, 1024, 64), "v": (16, 8, 1024, 64)}, False),  # grid
    ({"q": (0, 32, 1, 64)}, False),  # nothing to launch
])
def test_the_kernel_takes_gqa_attention_of_power_of_two_head_dims_without_a_bias(
        change: dict[str, tuple[int, ...]], taken: bool) -> None:
    assert attention.takes({**GQA, **change}, "bf16") is taken


@pytest.mark.parametrize("dtype", ["f32", "f8e4m3", "i32"])
def test_the_kernel_takes_f16_and_bf16_only(dtype: str) -> None:
    assert attention.takes(GQA, "f16") and not attention.takes(GQA, dtype)


DECODE = """
model m {{
  precision io=f16
  dim B = 1..4 tune [1]
  input q: [B, 16, 1, {d}]
  input k: [B, 4, 256, {d}]
  input v: [B, 4, 256, {d}]
  input lens: i32[B]
  output y = sdpa(q, k, v, causal=true, align="bottom_right", kv_len=lens)
}}
"""


@pytest.mark.parametrize(("head_dim", "offered"), [(64, True), (48, False)])
def test_the_tuner_offers_a_decoders_attention_to_the_kernel_where_it_takes_it(
        head_dim: int, offered: bool, tmp_path: Path) -> None:
    _, program = deviceless_program(DECODE.format(d=head_dim), tmp_path)
    sdpa = [s for s in program.steps if program.nodes[s.nodes[0]].op == "sdpa"]
    assert len(sdpa) == 1 and sdpa[0].kind == "graph"
    assert (sdpa[0] in kernel_steps(program)) is offered
