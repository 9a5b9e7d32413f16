"""Which steps run as one launch and in what order (dslc/runtime/batches.py): a small kernel step
joins the earliest slot of such steps after the last step that touches its memory, never moves
ahead of a reader of the bytes it overwrites (arena bytes the memory plan reuses included), and
a decoder step's rotary halves and value cache write become one launch. The arena run
(`dslc.fuzz.arena`, which runs the schedule in this order, every slot's steps in reverse and
checked byte for byte to touch nothing another writes) holds it to the reference in the fuzz
tests and here."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dslc.fuzz import arena
from dslc.ir import interp
from dslc.runtime import batches
from dslc.runtime.batches import Region, Touch
from dslc.runtime.records import Bundle
from dslc.runtime.schedule import Schedule
from tests.helpers import deviceless_program, rng


def _touch(reads: list[Region], writes: list[Region]) -> Touch:
    return Touch(tuple(reads), tuple(writes))


def _r(key: str, lo: int = 0, hi: int = 16, part: tuple[str, str] | None = None) -> Region:
    return Region(key, lo, hi, part)


def test_independent_small_steps_share_a_slot_and_a_reader_of_theirs_follows() -> None:
    touches = [_touch([_r("x")], [_r("a")]),        # 0: big, writes a
               _touch([_r("a")], [_r("b")]),        # 1: small
               _touch([_r("a")], [_r("c")]),        # 2: small, apart from 1
               _touch([_r("b")], [_r("d")]),        # 3: small, reads 1's
               _touch([_r("a")], [_r("e")])]        # 4: small, apart from all
    small = {1, 2, 3, 4}.__contains__
    assert batches.slots(touches, small) == [[0], [1, 2, 4], [3]]
    assert batches.slots(touches, lambda i: False) == [[0], [1], [2], [3], [4]]


def test_a_step_never_moves_ahead_of_a_reader_of_what_it_overwrites() -> None:
    """Step 2 writes arena bytes 8..24, which step 1 (a big step) still reads at 0..16 (the
    memory plan gave both values those bytes, one after the other): it stays after step 1, as
    does step 3, which writes what step 1 writes."""
    touches = [_touch([], [_r("arena", 0, 16)]),
               _touch([_r("arena", 0, 16)], [_r("y")]),
               _touch([_r("x")], [_r("arena", 8, 24)]),
               _touch([_r("x")], [_r("y", 4, 8)])]
    assert batches.slots(touches, {0, 2, 3}.__contains__) == [[0], [1], [2, 3]]
    apart = [*touches[:2], _touch([_r("x")], [_r("arena", 16, 24)])]
    assert batches.slots(apart, {0, 2}.__contains__) == [[0, 2], [1]]


def test_slices_of_one_concatenation_are_apart_however_their_bytes_interleave() -> None:
    q0, q1 = _r("q", 0, 64, ("q", "q.part0")), _r("q", 4, 68, ("q", "q.part1"))
    assert not q0.meets(q1) and q0.meets(q0) and q0.meets(_r("q", 60, 61))
    assert q0.meets(_r("q", 0, 64, ("k", "k.part1")))  # another concat's slice: bytes decide
    assert not _r("a", 0, 8).meets(_r("b", 0, 8)) and not _r("a", 0, 8).meets(_r("a", 8, 9))
    touches = [_touch([_r("x")], [q0]), _touch([_r("x")], [q1]), _touch([_r("q", 0, 68)], [])]
    assert batches.slots(touches, {0, 1}.__contains__) == [[0, 1], [2]]


def test_a_step_moves_ahead_over_a_window_of_slots_at_most() -> None:
    touches = [_touch([], [_r("s")])] + [_touch([], [_r(f"big{i}")]) for i in range(10)] + \
        [_touch([], [_r("t")])]
    small = {0, 11}.__contains__
    assert batches.slots(touches, small, window=12)[0] == [0, 11]
    assert batches.slots(touches, small, window=8)[-1] == [11]


DECODER = """cgraph 0.1
import "std/nn.cgraph"
import "llama_layer.cgraph" as llama
import "llama_decode.cgraph" as dec

model tiny_decode {
  precision io=f32, intermediate=f32, compute=f32
  dim B = 1
  dim S = 1
  input hidden_states: [B, S, 32]
  input position: i32[1]
  let positions  = arange(S, dtype=i32) + position
  let kv_len     = expand(positions[S - 1:S] + full([1], 1), [B])
  let (cos, sin) = llama.rotary_embedding(positions, head_dim=8, theta=10000.0)
  let layers = repeat 2 dec.decoder_step(hidden_states, cos, sin, position, kv_len,
                                         max_len=16, heads=4, kv_heads=2, head_dim=8, ffn=48,
                                         eps=1e-5) as "model.layers.{i}"
  output out = layers
}
"""


@pytest.fixture(scope="module")
def decoder(tmp_path_factory: pytest.TempPathFactory) -> Schedule:
    folder = tmp_path_factory.mktemp("decoder")
    for name in ("llama_layer.cgraph", "llama_decode.cgraph", "encoder.cgraph"):
        (folder / name).write_text((Path(__file__).parents[1] / "models" / name).read_text())
    return deviceless_program(DECODER, folder)[1]


def test_a_decoder_steps_rotary_halves_and_cache_writes_are_one_launch(
        decoder: Schedule) -> None:
    """The key cache write runs as the rotary halves that write the keys (`cachewrites`), so it
    reads what they read and joins their launch with the value cache write."""
    memory = decoder.memory_plan({})
    order, again = batches.plan(decoder, memory)
    assert sorted(s.name for slot in order for s in slot) == sorted(s.name for s in decoder.steps)
    merged = [[s.name for s in slot] for slot in order if len(slot) > 1]
    assert len(merged) == 2  # one a layer
    for i, names in enumerate(merged):
        layer = f"model.layers.{i}."
        assert len(names) == 6 and all(n.startswith(layer) for n in names)
        assert sum(n.startswith(layer + "q.") for n in names) == 2
        assert sum(n.startswith(layer + "k_new.") for n in names) == 2
        assert {layer + "k", layer + "v"} <= set(names)
        k = again[layer + "k"]
        assert [w.name for w in k.writers] == [n for n in names if n.startswith(layer + "k_new.")]
        assert k.rows == 16 and layer + "v" not in again  # v is no computed value: a copy


def _weights(decoder: Schedule, g: np.random.Generator) -> dict[str, np.ndarray]:
    return {n.attrs["path"]: (g.standard_normal([int(d) for d in n.type.shape]) * 0.3)
            .astype(np.float32) for n in decoder.graph.nodes if n.op == "param"}


def _decoder_inputs(g: np.random.Generator) -> dict[str, np.ndarray]:
    x = {"hidden_states": g.standard_normal((1, 1, 32)).astype(np.float32),
         "position": np.array([5], np.int32)}
    for i in range(2):
        for kv in ("k", "v"):
            x[f"model.layers.{i}.{kv}_cache"] = g.standard_normal((1, 2, 16, 8)).astype(np.float32)
    return x


def test_the_decoder_run_in_slots_equals_the_reference(decoder: Schedule) -> None:
    g = rng("decoder in slots")
    x = _decoder_inputs(g)
    weights = _weights(decoder, g)
    want = interp.run(decoder.graph, x, weights, decoder.env, virtual=decoder.virtual())
    _, caches = interp.run_in_place(decoder.graph, x, weights, decoder.env)
    written: dict[str, np.ndarray] = {}
    got = arena.run(decoder, {}, x, weights, written)
    assert sorted(written) == sorted(caches) and len(caches) == 4
    for name, cache in caches.items():  # row 5 of each cache written, the others kept
        np.testing.assert_allclose(written[name], cache, rtol=1e-5, atol=1e-6)
        assert not np.array_equal(cache[:, :, 5], x[name][:, :, 5])
    # a reduction's additions may come in another order (numpy over strided or dense arrays)
    np.testing.assert_allclose(got["out"], want["out"], rtol=1e-5, atol=1e-6)
    assert np.unique(got["out"]).size > 20


def test_the_arena_run_refuses_a_slot_whose_steps_touch_each_others_bytes(
        decoder: Schedule, monkeypatch: pytest.MonkeyPatch) -> None:
    """A wrong order (the attention merged with the cache writes it reads) fails the arena
    run, so the fuzz oracle would see a defect of `slots`."""
    real = batches.plan

    def tangled(program: Schedule, memory: object,
                graphs: object = ()) -> tuple[list[list[object]], object]:
        out, again = real(program, memory, graphs)  # type: ignore[arg-type]
        ctx = next(i for i, slot in enumerate(out) if slot[0].name == "model.layers.0.ctx")
        first = next(i for i, slot in enumerate(out) if len(slot) > 1)
        return [*out[:first], out[first] + out[ctx], *out[first + 1:ctx], *out[ctx + 1:]], again

    monkeypatch.setattr(batches, "plan", tangled)
    g = rng("tangled slots")
    with pytest.raises(arena.Overlap, match="run as one launch"):
        arena.run(decoder, {}, _decoder_inputs(g), _weights(decoder, g))


def test_regions_meet_wherever_the_steps_bytes_do(decoder: Schedule) -> None:
    """Every value a step reads or writes, as a region, spans the bytes the arena run places it
    in (`fuzz.arena.Memory.extent`: the arena's offset of its base, its own offset in it) and
    meets every other whose bytes it shares (the arena run's exact byte sets), arena bytes the
    plan reused for another value included."""
    memory = decoder.memory_plan({})
    mem = arena.Memory(decoder, memory)
    pairs = []
    for step, touch in zip(decoder.steps, batches.touches(decoder, memory), strict=True):
        values = [v for v in step.inputs if decoder.nodes[v].op != "scalar"] + list(step.outputs)
        pairs += zip(values, (*touch.reads, *touch.writes), strict=True)
    shared = 0
    for va, ra in pairs:
        extent = mem.extent(*_where(memory.storage[va]))
        assert (ra.lo, ra.hi) == (extent.first, extent.end), va
    for a, (va, ra) in enumerate(pairs):
        sa = memory.storage[va]
        for vb, rb in pairs[a + 1:]:
            sb = memory.storage[vb]
            if mem.extent(*_where(sa)).meets(mem.extent(*_where(sb))):
                assert ra.meets(rb), (va, vb)
                shared += sa.base != sb.base and sa.base in memory.offsets
    assert shared > 0  # values of different bases in the same arena bytes were compared


def _where(s: object) -> tuple[object, ...]:
    return (s.shape, s.strides, s.dtype, s.base, s.offset)  # type: ignore[attr-defined]


ROTARY = """cgraph 0.1
model m {
  precision io=f32
  dim S = 1..128 tune [63, 64]
  input x: [1, 32, S, 64]
  param angles: [64]
  let turned = concat([-x[:, :, :, 32:64], x[:, :, :, 0:32]], axis=3)
  output y = x * cos(angles) + turned * sin(angles)
}
"""


def test_halves_written_into_an_output_run_as_one_launch_below_the_vector_kernels_size(
        tmp_path: Path) -> None:
    """The two halves of a rotation (pointwise steps writing their slices of the model's output
    in place, outside the arena) are apart and run as one launch, until a half holds 65,536
    elements: from there the vector kernel computes it, alone."""
    from dslc.backend import fused

    program = deviceless_program(ROTARY, tmp_path)[1]
    halves = [s.name for s in program.steps if s.outputs[0] in program.placement]
    assert len(halves) == 2 and fused.VECTOR_AT_LEAST == 32 * 64 * 32
    below = batches.plan(program, program.memory_plan({"S": 63}))[0]
    at = batches.plan(program, program.memory_plan({"S": 64}))[0]
    assert [s.name for s in below[0]] == halves and len(below) == 2
    assert [[s.name for s in slot] for slot in at[:2]] == [[h] for h in halves]


def test_a_cache_write_whose_writers_operands_are_overwritten_before_it_stays_a_copy(
        tmp_path: Path) -> None:
    """Generated program 149 of the suite's batch: a rotation's halves read a cast's result,
    whose arena bytes the memory plan gives a later step before the cache write; run again by
    the cache write, the halves' kernels would read that step's bytes (the arena oracle saw it:
    "memory"). The write stays a copy of the rotated value, and the program passes every
    oracle."""
    from dslc.fuzz import oracle
    from dslc.fuzz.choices import Choices
    from dslc.fuzz.generate import generate
    from dslc.runtime.cachewrites import recomputed

    program = generate(Choices(2026_000_149))
    schedule = deviceless_program(program.source(), tmp_path)[1]
    memory = schedule.memory_plan(dict(schedule.bundle.buckets[0].dims))
    could = recomputed(schedule, memory, lambda s: batches.small(schedule, memory, s))
    assert list(could) == ["v31"] and batches.plan(schedule, memory)[1] == {}
    outcome = oracle.run(program, 2026_000_149, compile=True)
    assert not outcome.failed, outcome.detail


WRITES = """model m {
  input x: [1, 2, 4, 8]
  input y: [1, 2, 4, 8]
  input big: [1, 8, 128, 64]
  input c1: [1, 2, 6, 8]
  input c2: [1, 2, 6, 8]
  input c3: [1, 2, 6, 16]
  input c4: [1, 8, 130, 64]
  input at: i32[1]
  let b = y + 1.0
  output k2 = cache_write(c2, b, at)
  output ob = b
  output k3 = cache_write(c3, concat([x * 3.0, y], axis=3), at)
  output k4 = cache_write(c4, big * 2.0, at)
  output k1 = cache_write(c1, x * 2.0, at)
}
"""


def test_a_cache_write_runs_as_its_writers_where_they_are_small_pointwise_kernels(
        tmp_path: Path) -> None:
    """With every pointwise step a kernel (`tune.joins.every_kernel`): k3's concatenation
    copies an input and k4's value is too large for the strided kernel (the vector kernel runs
    it, alone): each stays a copy. k2's value, an output too, and k1's run as their kernels
    into the cache's rows (all of a row: the region starts at the cache's first element); the
    kernels still write the values, so `ob` reads b as before. The arena run equals the
    reference, caches included."""
    from dslc.runtime.cachewrites import recomputed
    from dslc.tune.joins import every_kernel

    program = Schedule(every_kernel(deviceless_program(WRITES, tmp_path)[1].bundle))
    memory = program.memory_plan({})
    again = recomputed(program, memory, lambda s: batches.small(program, memory, s))
    assert sorted(again) == ["k1", "k2"]  # k3 and k4, between them, stay copies
    r = again["k1"]
    assert r.rows == 6 and r.at == program.inputs["at"]
    assert batches.plan(program, memory)[1] == again
    [region] = r.regions
    assert (region.base, region.offset, region.shape) == (program.inputs["c1"], 0, (1, 2, 4, 8))
    assert region.strides == memory.storage[program.inputs["c1"]].strides
    g = rng("cache writes as writers")
    x = {n: g.standard_normal(t).astype(np.float32) for n, t in
         (("x", (1, 2, 4, 8)), ("y", (1, 2, 4, 8)), ("big", (1, 8, 128, 64)),
          ("c1", (1, 2, 6, 8)), ("c2", (1, 2, 6, 8)), ("c3", (1, 2, 6, 16)),
          ("c4", (1, 8, 130, 64)))}
    x["at"] = np.array([3], np.int32)  # rows 3..6 of 6: the last dropped
    want, caches = interp.run_in_place(program.graph, x, {}, program.env)
    written: dict[str, np.ndarray] = {}
    got = arena.run(program, {}, x, {}, written)
    for name in ("k1", "k2", "k3", "k4", "ob"):
        np.testing.assert_allclose(got[name], want[name], rtol=1e-6)
    for name, cache in caches.items():
        np.testing.assert_allclose(written[name], cache, rtol=1e-6)
    assert np.array_equal(written["c1"][:, :, 3:6], x["x"][:, :, :3] * 2.0)


def test_a_parts_region_in_the_cache_is_where_its_slice_of_the_value_is() -> None:
    """`cachewrites._region`: a part's coordinates in the value, found from its offset, laid
    out by the cache's strides, at row 0. Checked by hand: the value [1, 2, 4, 8] dense (its
    size-1 axis given stride 1, as PyTorch may), a cache [1, 2, 6, 16]."""
    from dslc.ir.storage import Storage
    from dslc.runtime.cachewrites import _region

    whole = Storage((1, 2, 4, 8), (1, 32, 8, 1), "f32", "v", 0)
    cache = Storage((1, 2, 6, 16), (192, 96, 16, 1), "f32", "c", 0)
    half = Storage((1, 2, 4, 4), (1, 32, 8, 1), "f32", "v", 4)  # d 4..8
    assert _region(whole, half, cache) == Storage((1, 2, 4, 4), cache.strides, "f32", "c", 4)
    head = Storage((1, 1, 4, 8), (1, 32, 8, 1), "f32", "v", 32)  # head 1
    assert _region(whole, head, cache) == Storage((1, 1, 4, 8), cache.strides, "f32", "c", 96)
    inner = Storage((1, 2, 4, 8), (1, 32, 8, 1), "f32", "v", 10)  # the value 10 elements on
    shifted = Storage((1, 1, 4, 2), (1, 32, 8, 1), "f32", "v", 10 + 32 + 2)
    assert _region(inner, shifted, cache).offset == 96 + 2  # type: ignore[union-attr]
    # a part of some rows only (a concatenation along the rows): the kernel's bounds check
    # would count its own rows, not the cache's
    assert _region(whole, Storage((1, 2, 2, 8), whole.strides, "f32", "v", 16), cache) is None
    assert _region(whole, Storage((1, 2, 2, 8), whole.strides, "f32", "v", 0), cache) is None
    assert _region(whole, Storage((1, 2, 4, 4), (64, 32, 8, 1), "f32", "w", 0), cache) is None
    assert _region(whole, half, Storage((2, 6, 16), (96, 16, 1), "f32", "c", 0)) is None
    gaps = Storage((1, 2, 4, 8), (1, 64, 16, 1), "f32", "v", 0)  # not dense
    assert _region(gaps, half, cache) is None


WRITERS = """model m {
  input x: [1, 2, 4, 8]
  input z: [1, 2, 4, 3]
  input c2: [1, 2, 6, 11]
  input c3: [1, 2, 6, 8]
  input at: i32[1]
  output k2 = cache_write(c2, concat([x * 3.0, z * 2.0], axis=3), at)
  output k3 = cache_write(c3, x * 4.0, at)
}
"""


def test_a_cache_write_whose_writers_store_elsewhere_stays_a_copy(tmp_path: Path) -> None:
    """k2's concatenation copies its operands (3 f32 channels of 11: no slice on 16 bytes),
    whose kernels write buffers of their own: it stays a copy, and k3 after it runs as its
    writer."""
    from dslc.runtime.cachewrites import recomputed
    from dslc.tune.joins import every_kernel

    program = Schedule(every_kernel(deviceless_program(WRITERS, tmp_path)[1].bundle))
    memory = program.memory_plan({})
    concat = program.nodes[program.nodes["k2"].inputs[1]]
    assert concat.op == "concat" and not set(concat.inputs) & set(program.placement)
    again = recomputed(program, memory, lambda s: batches.small(program, memory, s))
    assert list(again) == ["k3"]


TWO = """model m {
  dim N = 1..8 tune [2, 4]
  input x: [N, 64]
  output y1 = sigmoid(x * 2.0 + 1.0)
  output y2 = tanh(x * 3.0)
}
"""


def test_a_step_running_its_graph_at_a_bucket_joins_no_launch_there(tmp_path: Path) -> None:
    """Two kernel steps of no dependency run as one launch, but at a bucket where the first
    keeps its graph (`Schedule.runs_graph`) it runs alone, as the graph."""
    from dataclasses import replace

    bundle = deviceless_program(TWO, tmp_path)[1].bundle
    first = bundle.steps[0]
    kept = replace(bundle, steps=tuple(replace(s, kind="kernel", graph_at=("N=4",) if s is first
                                               else ()) for s in bundle.steps),
                   buckets=tuple(replace(b, graphs={k: g for k, g in b.graphs.items()
                                                    if b.key == "N=4" and k == first.signature})
                                 for b in bundle.buckets))
    program = Schedule(Bundle.from_data(kept.to_data()))  # valid
    for bucket in kept.buckets:
        slots = batches.plan(program, program.memory_plan(dict(bucket.dims)), bucket.key)[0]
        assert [len(s) for s in slots] == ([1, 1] if bucket.key == "N=4" else [2])
    # between the buckets the step runs its graph too: its kernel was never measured there
    assert [len(s) for s in batches.plan(program, program.memory_plan({"N": 3}))[0]] == [1, 1]


def test_a_parts_coordinates_follow_the_values_memory_order() -> None:
    """A value stored with its heads innermost ([B, H, S, D], strides 64, 1, 16, 2): the half
    from d = 4 on is 8 elements in, which is h = 8 only if the axes were taken in their own
    order."""
    from dslc.ir.storage import Storage
    from dslc.runtime.cachewrites import _region

    whole = Storage((1, 2, 4, 8), (64, 1, 16, 2), "f32", "v", 0)
    cache = Storage((1, 2, 6, 8), (96, 48, 8, 1), "f32", "c", 0)
    half = Storage((1, 2, 4, 4), (64, 1, 16, 2), "f32", "v", 8)
    assert _region(whole, half, cache).offset == 4  # type: ignore[union-attr]


REUSED = """model m {
  input x: [1, 2, 4, 8]
  input y: [1, 2, 4, 8]
  input c: [1, 2, 6, 8]
  input d: [1, 2, 6, 8]
  input at: i32[1]
  let a = x + 1.0
  output v = a * 5.0
  let w = a * 2.0
  let b = y * 3.0
  output k = cache_write(c, w, at)
  output ob = b + 0.5
  output ob2 = b * 0.5
  let e = y - 1.0
  output k2 = cache_write(d, e * 2.0, at)
  output ov = e * 7.0
}
"""


def test_a_cache_write_is_run_as_its_writers_only_while_their_operands_last(
        tmp_path: Path) -> None:
    """k's writer reads `a`, whose arena bytes the memory plan gives `b` right after the
    writer (its last reader): run again at k, the writer would read b. k2's writer reads `e`,
    written just before it (the step ahead of a writer is no step between) and kept until
    `ov`: it runs as its writer. Where the writer runs
    its graph (a bucket that keeps it), k2 stays a copy."""
    from dataclasses import replace

    from dslc.runtime.cachewrites import recomputed
    from dslc.tune.joins import every_kernel

    program = Schedule(every_kernel(deviceless_program(REUSED, tmp_path)[1].bundle))
    memory = program.memory_plan({})
    assert memory.offsets["a"] == memory.offsets["b"]  # b takes a's bytes
    could = recomputed(program, memory, lambda s: batches.small(program, memory, s))
    assert sorted(could) == ["k", "k2"]
    assert list(batches.plan(program, memory)[1]) == ["k2"]
    writer = could["k2"].writers[0]
    key = program.bundle.buckets[0].key
    keeps = Schedule(replace(program.bundle, steps=tuple(
        replace(s, graph_at=(key,)) if s.name == writer.name else s
        for s in program.bundle.steps)))
    assert batches.plan(keeps, memory, key)[1] == {}
    elsewhere = Schedule(replace(program.bundle, steps=tuple(  # its graph kept at another bucket
        replace(s, graph_at=("N=64",)) if s.name == writer.name else s
        for s in program.bundle.steps)))
    assert list(batches.plan(elsewhere, memory, key)[1]) == ["k2"]
    g = rng("reused operands")
    x = {n: g.standard_normal((1, 2, 6 if n in "cd" else 4, 8)).astype(np.float32)
         for n in ("x", "y", "c", "d")}
    x["at"] = np.array([1], np.int32)
    want, caches = interp.run_in_place(program.graph, x, {}, program.env)
    written: dict[str, np.ndarray] = {}
    got = arena.run(program, {}, x, {}, written)
    np.testing.assert_allclose(got["ob"], want["ob"], rtol=1e-6)
    for name, cache in caches.items():
        np.testing.assert_allclose(written[name], cache, rtol=1e-6)


def test_inspect_says_which_steps_run_as_one_launch(decoder: Schedule) -> None:
    """`dslc inspect`: each step the runtime runs with others says so at each bucket, and the
    key cache write that it runs as the rotary halves writing the keys."""
    from dslc.cli.inspect import _bundle_text, bundle_report

    report = bundle_report(decoder.bundle)
    launch = {s["name"]: s["launch"] for s in report["steps"]}
    assert launch["model.layers.0.v"] == {"static": "one launch with 5 other steps"}
    k = launch["model.layers.1.k"]["static"]
    assert k.startswith("runs as its value's writers (model.layers.1.k_new.") and \
        k.endswith("into the cache; one launch with 5 other steps")
    assert sum(bool(v) for v in launch.values()) == 12  # six a layer
    assert "        static: one launch with 5 other steps" in _bundle_text(report)


ROWS = """model m {
  input x: [1, 2, 2, 8]
  input y: [1, 2, 2, 8]
  input c: [1, 2, 6, 8]
  input at: i32[1]
  output k = cache_write(c, concat([x * 3.0, y * 2.0], axis=2), at)
}
"""


@pytest.mark.parametrize("at", [3, -1, 5])
def test_a_cache_write_of_rows_concatenated_stays_a_copy(at: int, tmp_path: Path) -> None:
    """The new rows a concatenation along the rows: the second part's rows start at 2, which
    the kernel's bounds check (of the part's own rows) would not count; the write stays a copy
    and the cache equals the reference's, rows past the end dropped, rows before 0 too."""
    from dslc.runtime.cachewrites import recomputed
    from dslc.tune.joins import every_kernel

    program = Schedule(every_kernel(deviceless_program(ROWS, tmp_path)[1].bundle))
    memory = program.memory_plan({})
    assert recomputed(program, memory, lambda s: batches.small(program, memory, s)) == {}
    g = rng("rows concatenated", at)
    x = {n: g.standard_normal((1, 2, 6 if n == "c" else 2, 8)).astype(np.float32)
         for n in ("x", "y", "c")}
    x["at"] = np.array([at], np.int32)
    _, caches = interp.run_in_place(program.graph, x, {}, program.env)
    written: dict[str, np.ndarray] = {}
    arena.run(program, {}, x, {}, written)
    np.testing.assert_allclose(written["c"], caches["c"], rtol=1e-6)


EMBEDDINGS = """import "std/nn.cgraph"
model m {
  dim B = 1..4 tune [2]
  dim S = 1..8 tune [8]
  input ids: i64[B, S]
  input types: i32[B, S]
  let word = embedding(ids, num=30, dim=16) as "word"
  let kind = embedding(types, num=2, dim=16) as "kind"
  let position = embedding(arange(S), num=8, dim=16) as "position"
  output y = word + kind + position
}
"""


def test_a_models_embedding_lookups_are_one_launch(tmp_path: Path) -> None:
    """BERT's word and token-type lookups read their tables side by side: one launch (their
    positions, `arange(S)` within the table, are its slice, no step). Run in that order by the
    arena, the sum equals the tables' rows picked by hand."""
    program = deviceless_program(EMBEDDINGS, tmp_path)[1]
    order, _ = batches.plan(program, program.memory_plan({"B": 2, "S": 8}), "B=2,S=8")
    assert [sorted(s.name for s in slot) for slot in order if len(slot) > 1] == [["kind", "word"]]
    g = rng("embeddings in one launch")
    ids, types = g.integers(0, 30, (2, 8)), g.integers(0, 2, (2, 8)).astype(np.int32)
    tables = {f"{n}.weight": g.standard_normal((k, 16)).astype(np.float32)
              for n, k in (("word", 30), ("kind", 2), ("position", 8))}
    got = arena.run(program, {"B": 2, "S": 8}, {"ids": ids, "types": types}, tables)
    want = tables["word.weight"][ids] + tables["kind.weight"][types] + tables["position.weight"]
    np.testing.assert_allclose(got["y"], want, rtol=1e-6)
