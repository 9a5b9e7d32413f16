"""What `dslc bench`'s roofline counts (dslc/ir/cost.py, dslc/bench/roofline.py), against values
derived by hand from each op's definition: FLOPs of a grouped conv, a matmul, a pointwise op, an
sdpa with and without masks; the bytes a step moves; the bound, achieved rates and time lost."""

from __future__ import annotations

from pathlib import Path

import pytest

from dslc.bench.roofline import Peaks, by_time_lost, step_line, totals
from dslc.ir.cost import Cost, Sizes, kept_pairs, node_flops, step_cost
from dslc.ir.graph import Node
from tests.helpers import check_source, model_snippet


def sizes_of(tmp_path: Path, body: str, dims: dict[str, int] | None = None) -> Sizes:
    model = check_source(model_snippet(body), tmp_path).model
    return Sizes(model.graph.by_name(), dims or {}, model.env)


def only(sizes: Sizes, op: str) -> Node:
    [node] = [n for n in sizes.nodes.values() if n.op == op]
    return node


def cost_of(sizes: Sizes, node: Node) -> Cost:
    return step_cost(sizes, [node.name], node.inputs, [node.name])


def test_grouped_conv_counts_two_flops_per_weight_tap_of_each_output(tmp_path: Path) -> None:
    s = sizes_of(tmp_path, "  input x: [2, 8, 10, 10]\n  param w: [16, 4, 3, 3]\n"
                 "  output y = conv(x, w, pad=1, groups=2)")
    conv = only(s, "conv")
    # out 2x16x10x10 = 3200 elements, each 4 channels x 3x3 taps = 36 multiply-adds
    assert node_flops(conv, s) == 2 * 3200 * 36
    # f32: x 1600 + w 576 + y 3200 elements, 4 bytes each
    assert cost_of(s, conv) == Cost(230400, (1600 + 576 + 3200) * 4, "f32")


def test_strided_conv_counts_only_the_outputs_it_makes(tmp_path: Path) -> None:
    s = sizes_of(tmp_path, "  input x: [1, 3, 8, 8]\n  param w: [4, 3, 2, 2]\n"
                 "  output y = conv(x, w, stride=2)")
    # out 1x4x4x4 = 64, each 3x2x2 = 12 multiply-adds
    assert node_flops(only(s, "conv"), s) == 2 * 64 * 12


def test_matmul_at_a_dynamic_size(tmp_path: Path) -> None:
    s = sizes_of(tmp_path, "  dim N = 1..64\n  input a: [N, 64]\n  param b: [64, 32]\n"
                 "  output y = matmul(a, b)", {"N": 5})
    mm = only(s, "matmul")
    assert node_flops(mm, s) == 2 * 5 * 32 * 64
    assert cost_of(s, mm).bytes == (5 * 64 + 64 * 32 + 5 * 32) * 4


def test_a_pointwise_op_is_one_flop_per_element_and_a_cast_none(tmp_path: Path) -> None:
    s = sizes_of(tmp_path, "  input x: [3, 7]\n  let r = relu(x)\n  output y = cast(r, f16)")
    relu, cast = only(s, "relu"), only(s, "cast")
    assert node_flops(relu, s) == 21 and node_flops(cast, s) == 0
    assert cost_of(s, relu) == Cost(21, 2 * 21 * 4, None)


def test_a_fused_step_moves_only_what_it_reads_and_stores(tmp_path: Path) -> None:
    s = sizes_of(tmp_path, "  input x: [4, 16]\n  param w: [16, 8]\n  input r: [4, 8]\n"
                 "  output y = relu(matmul(x, w) + r)")
    members = [n.name for n in s.nodes.values() if n.op in ("matmul", "add", "relu")]
    inputs = [n.name for n in s.nodes.values() if n.op in ("input", "param")]
    cost = step_cost(s, members, inputs, members[-1:])
    # matmul 2x4x8x16 + add 32 + relu 32; reads x 64, w 128, r 32; writes y 32 (f32)
    assert cost == Cost(2 * 4 * 8 * 16 + 32 + 32, (64 + 128 + 32 + 32) * 4, "f32")


def test_a_cache_write_moves_only_the_rows_it_writes(tmp_path: Path) -> None:
    s = sizes_of(tmp_path, "  input c: [2, 4, 64, 8]\n  input n: [2, 4, 3, 8]\n"
                 "  input p: i32[1]\n  output y = cache_write(c, n, at=p)")
    node = only(s, "cache_write")
    # reads the 2x4x3x8 new rows and the offset; stores the same rows: none of the 64-row cache
    assert cost_of(s, node) == Cost(0, (192 + 192) * 4 + 4, None)


def test_sdpa_counts_both_matmuls_per_query_key_pair(tmp_path: Path) -> None:
    s = sizes_of(tmp_path, "  input q: [1, 2, 4, 8]\n  input k: [1, 2, 6, 8]\n"
                 "  input v: [1, 2, 6, 16]\n  output y = sdpa(q, k, v)")
    # 1 batch x 2 heads x 4x6 pairs, each q.k (8 multiply-adds) and p.v (16)
    assert node_flops(only(s, "sdpa"), s) == 2 * 2 * 24 * (8 + 16)


def test_causal_sdpa_counts_only_the_pairs_the_mask_keeps(tmp_path: Path) -> None:
    s = sizes_of(tmp_path, "  input q: [1, 1, 4, 8]\n  input k: [1, 1, 4, 8]\n"
                 "  input v: [1, 1, 4, 8]\n  output y = sdpa(q, k, v, causal=true)")
    # query i keeps keys 0..i: 1 + 2 + 3 + 4 pairs
    assert node_flops(only(s, "sdpa"), s) == 2 * 10 * (8 + 8)


@pytest.mark.parametrize(("sq", "skv", "causal", "window", "bottom_right", "pairs"), [
    (4, 6, False, None, False, 24),
    (4, 6, True, None, False, 1 + 2 + 3 + 4),  # query i at key i
    (4, 6, True, None, True, 3 + 4 + 5 + 6),  # the last query at the last key
    (5, 5, True, 2, False, 1 + 2 + 2 + 2 + 2),  # itself and the key before
    (3, 3, False, 1, False, 3 + 2 + 1),  # a window alone drops only keys before it: i keeps i..2
])
def test_kept_pairs_of_attention_masks(sq: int, skv: int, causal: bool, window: int | None,
                                       bottom_right: bool, pairs: int) -> None:
    assert kept_pairs(sq, skv, causal, window, bottom_right) == pairs


def test_a_gather_reads_the_rows_it_picks_not_the_table(tmp_path: Path) -> None:
    s = sizes_of(tmp_path, "  input ids: i32[6]\n  param table: [1000, 4]\n"
                 "  output y = gather(table, ids)")
    g = only(s, "gather")
    # ids 6 x 4 bytes; 6 rows of 4 f32 read; 6x4 f32 written
    assert cost_of(s, g) == Cost(0, 6 * 4 + 24 * 4 + 24 * 4, None)


PEAKS = Peaks("test GPU", {"f16": 100.0}, 10.0, 1000.0)  # TFLOP/s, TFLOP/s, GB/s


def test_a_compute_bound_step_at_half_the_peak() -> None:
    # 2e9 FLOPs at 100 TFLOP/s: 0.02 ms; 1e6 bytes at 1000 GB/s: 0.001 ms; measured 0.04 ms
    line = step_line("conv", "graph", 0.04, Cost(2_000_000_000, 1_000_000, "f16"), PEAKS)
    assert line.bound_by == "compute"
    assert line.bound_ms == pytest.approx(0.02) and line.lost_ms == pytest.approx(0.02)
    assert line.fraction == pytest.approx(0.5)
    assert line.tflops == pytest.approx(50.0) and line.gbps == pytest.approx(25.0)


def test_a_step_without_a_tensor_op_is_held_to_the_vector_rate_and_the_memory() -> None:
    # 1e6 FLOPs at 10 TFLOP/s: 1e-4 ms; 4e6 bytes at 1000 GB/s: 0.004 ms
    line = step_line("relu", "graph", 0.008, Cost(1_000_000, 4_000_000, None), PEAKS)
    assert line.bound_by == "memory" and line.bound_ms == pytest.approx(0.004)
    # a dtype without a tensor-core peak of its own falls back to the vector rate
    assert PEAKS.tflops("f8e4m3") == 10.0 and PEAKS.tflops("f16") == 100.0


def test_steps_sorted_by_time_lost_and_totals_summed() -> None:
    a = step_line("a", "graph", 0.010, Cost(0, 4_000_000, None), PEAKS)  # bound 0.004, lost 0.006
    b = step_line("b", "graph", 0.030, Cost(0, 10_000_000, None), PEAKS)  # bound 0.010, lost 0.020
    c = step_line("c", "kernel", 0.002, Cost(0, 2_000_000, None), PEAKS)  # bound 0.002, lost 0
    assert [x.step for x in by_time_lost([a, b, c])] == ["b", "a", "c"]
    t = totals([a, b, c])
    assert t.ms == pytest.approx(0.042) and t.bound_ms == pytest.approx(0.016)
    assert t.fraction == pytest.approx(0.016 / 0.042) and t.bytes == 16_000_000


@pytest.mark.parametrize("device", ["NVIDIA H200", "NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe"])
def test_the_gpus_sessions_run_on_have_peaks_for_every_tensor_core_dtype(device: str) -> None:
    """`dslc bench` draws a roofline only where the GPU's name (as cuDNN reports it) is listed:
    the H100s the device machines are lent as too, or their benchmark has no roofline."""
    from dslc.backend import target

    data = target.peaks(device)
    assert data is not None
    peaks = Peaks.from_data(device, data)
    assert set(peaks.tensor_tflops) == {"f16", "bf16", "f8e4m3", "f8e5m2", "i8", "f32"}
    # fp8 and i8 run twice as fast as f16 and bf16, f32 (TF32) half, on every Hopper part
    f16 = peaks.tensor_tflops["f16"]
    assert peaks.tensor_tflops["f8e4m3"] == peaks.tensor_tflops["i8"] == pytest.approx(2 * f16, rel=1e-3)
    assert peaks.tensor_tflops["f32"] == pytest.approx(f16 / 2, rel=1e-3)
    assert peaks.vector_tflops < peaks.tensor_tflops["f32"] and peaks.memory_gbps > 1000
