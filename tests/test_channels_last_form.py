"""A pointwise group named in cuDNN's channels-last form addresses the same memory: every
element of every tensor, indexed at the result's shape, is at the same offset before and after
(offsets derived here from the dims and strides, element by element), and only the forms the
H200 measured as taken come out (dslc/backend/channels_last.py)."""

from __future__ import annotations

import itertools
import random
from dataclasses import replace
from pathlib import Path

import pytest

from dslc.backend.channels_last import channels_last_form, form_holds_at_every_size
from dslc.backend.spec import GroupSpec, OpSpec, TensorSpec


def _packed(dims: tuple[int, ...], order: tuple[int, ...]) -> tuple[int, ...]:
    """Packed strides, axes outermost first in `order` (written here, not the module's own: the
    expected side of the test)."""
    strides = [0] * len(dims)
    step = 1
    for axis in reversed(order):
        strides[axis] = step
        step *= dims[axis]
    return tuple(strides)


def _spec(result: tuple[int, ...], operands: dict[str, tuple[int, ...]],
          order: tuple[int, ...] = (0, 1, 2, 3), op: str = "mul") -> GroupSpec:
    tensors = [TensorSpec(name, i + 1, dims, _packed(dims, order), "f16", "input")
               for i, (name, dims) in enumerate(operands.items())]
    tensors.append(TensorSpec("y", len(tensors) + 1, result, _packed(result, order), "f16",
                              "output"))
    return GroupSpec("s", tuple(tensors), (OpSpec("y", op, tuple(operands), {}, "f32"),),
                     "f16", "f32", "f32")


def _offsets(t: TensorSpec, result: tuple[int, ...]) -> list[int]:
    """The offset of each element of the result's index space in `t` (broadcast axes: 0)."""
    return [sum(i * s for i, s, d in zip(index, t.strides, t.dims, strict=True) if d > 1)
            for index in itertools.product(*(range(n) for n in result))]


def _new_index_offsets(old: GroupSpec, new: GroupSpec) -> dict[str, list[int]]:
    """Each tensor's offsets in the new form, enumerated in the old result's index order: the
    new form's element reached by the same memory walk of the result. The result is packed, so
    its offset names the element; a tensor's new offset at that element must be its old one."""
    result_old = old.tensor("y")
    result_new = new.tensor("y")
    by_offset_new = {}
    for index in itertools.product(*(range(n) for n in result_new.dims)):
        at = sum(i * s for i, s in zip(index, result_new.strides, strict=True))
        by_offset_new[at] = index
    out = {}
    for t in new.tensors:
        offsets = []
        for at in _offsets(result_old, result_old.dims):
            index = by_offset_new[at]
            offsets.append(sum(i * s for i, s, d in zip(index, t.strides, t.dims, strict=True)
                               if d > 1))
        out[t.name] = offsets
    return out


def test_position_embeddings_over_a_batch_become_one_per_channel_operand() -> None:
    spec = _spec((1, 8, 197, 768), {"x": (1, 8, 197, 768), "pos": (1, 1, 197, 768)}, op="add")
    new = channels_last_form(spec)
    assert new.tensor("x").dims == (8, 197 * 768, 1, 1)
    assert new.tensor("pos").dims == (1, 197 * 768, 1, 1)
    assert new.tensor("pos").strides[1] == 1


def test_a_rotary_table_over_the_heads_becomes_per_channel() -> None:
    new = channels_last_form(_spec((1, 32, 1, 64), {"x": (1, 32, 1, 64), "cos": (1, 1, 1, 64)}))
    assert new.tensor("x").dims == (32, 64, 1, 1)
    assert new.tensor("cos").dims == (1, 64, 1, 1)


def test_a_full_size_group_keeps_its_axes_with_the_innermost_named_axis_1() -> None:
    # merged into one axis of 2,097,152 a Llama layer's full-size group failed to launch
    new = channels_last_form(_spec((1, 32, 1024, 64), {"x": (1, 32, 1024, 64),
                                                        "h": (1, 32, 1024, 64)}, op="add"))
    assert new.tensor("y").dims == (32, 64, 1024, 1)


def test_an_axis_1_longer_than_any_measured_keeps_the_form() -> None:
    spec = _spec((8, 1, 400, 768), {"x": (8, 1, 400, 768), "pos": (1, 1, 400, 768)}, op="add")
    assert channels_last_form(spec) is spec  # 307,200 > MAX_CHANNELS
    spec = _spec((8, 1, 197, 768), {"x": (8, 1, 197, 768), "pos": (1, 1, 197, 768)}, op="add")
    assert channels_last_form(spec).tensor("pos").dims == (1, 197 * 768, 1, 1)


def test_an_outer_product_keeps_its_form() -> None:
    # positions times rotary frequencies: no operand full-size (a Llama layer at S = 1024
    # failed to launch it renamed)
    spec = _spec((1, 1, 1024, 64), {"pos": (1, 1, 1024, 1), "freq": (1, 1, 1, 64)})
    assert channels_last_form(spec) is spec


@pytest.mark.parametrize("operand", [(3, 2, 3, 3), (1, 2, 1, 1), (3, 1, 3, 3), (1, 1, 1, 1)])
def test_a_channels_last_group_cudnn_takes_is_left_as_it_is(operand: tuple[int, ...]) -> None:
    # full, per-channel, per-pixel and one-element operands over NHWC [3, 2, 3, 3]: measured
    # right on the H200 as they are
    spec = _spec((3, 2, 3, 3), {"x": (3, 2, 3, 3), "b": operand}, order=(0, 2, 3, 1))
    assert channels_last_form(spec) is spec


def test_a_channels_last_group_with_a_size_one_height_is_left_as_it_is() -> None:
    spec = _spec((2, 4, 1, 3), {"x": (2, 4, 1, 3), "b": (1, 4, 1, 1)}, order=(0, 2, 3, 1))
    assert channels_last_form(spec) is spec


def test_one_channel_channels_last_is_renamed_to_channels() -> None:
    # a row-major mask [8, 1, 1, 128] is packed channels-last with one channel: declined
    new = channels_last_form(_spec((8, 1, 1, 128), {"m": (8, 1, 1, 128)}, op="relu"))
    assert new.tensor("m").dims == (8, 128, 1, 1)


def test_a_single_long_axis_becomes_axis_1() -> None:
    new = channels_last_form(_spec((1, 1, 1, 64), {"x": (1, 1, 1, 64)}, op="relu"))
    assert new.tensor("x").dims == (1, 64, 1, 1)


def test_size_one_axes_of_any_stride_do_not_stop_the_renaming() -> None:
    spec = _spec((8, 1, 197, 768), {"x": (8, 1, 197, 768), "pos": (1, 1, 197, 768)}, op="add")
    odd = tuple(replace(t, strides=(0, 0, 768, 1)) if t.name == "pos" else t
                for t in spec.tensors)
    new = channels_last_form(replace(spec, tensors=odd))
    assert new.tensor("pos").dims == (1, 197 * 768, 1, 1)


def test_scalars_pass_through_and_every_tensor_is_kept() -> None:
    # (1.0 - m) * -10000.0: scalars first, as group_spec makes them
    tensors = (TensorSpec("one", 1, (1, 1, 1, 1), (1, 1, 1, 1), "f32", "scalar", 1.0),
               TensorSpec("m", 2, (8, 1, 1, 128), (128, 128, 128, 1), "f32", "input"),
               TensorSpec("big", 3, (1, 1, 1, 1), (1, 1, 1, 1), "f32", "scalar", -1e4),
               TensorSpec("d", 4, (8, 1, 1, 128), (128, 128, 128, 1), "f32", "virtual"),
               TensorSpec("y", 5, (8, 1, 1, 128), (128, 128, 128, 1), "f32", "output"))
    ops = (OpSpec("d", "sub", ("one", "m"), {}, "f32"), OpSpec("y", "mul", ("d", "big"), {}, "f32"))
    new = channels_last_form(GroupSpec("s", tensors, ops, "f32", "f32", "f32"))
    assert [t.name for t in new.tensors] == ["one", "m", "big", "d", "y"]
    assert new.tensor("one") == tensors[0] and new.tensor("big") == tensors[2]
    assert {new.tensor(n).dims for n in ("m", "d", "y")} == {(8, 128, 1, 1)}


def test_groups_of_another_rank_keep_the_form() -> None:
    x = TensorSpec("x", 1, (8, 128, 768), (98304, 768, 1), "f16", "input")
    y = TensorSpec("y", 2, (8, 128, 768), (98304, 768, 1), "f16", "output")
    spec = GroupSpec("s", (x, y), (OpSpec("y", "relu", ("x",), {}, "f32"),), "f16", "f32", "f32")
    assert channels_last_form(spec) is spec
    assert form_holds_at_every_size(spec, lambda: None)


def test_a_scale_over_the_pixels_of_each_image_keeps_its_form() -> None:
    # [N, C, 1, 1] over NHWC: kept on the outermost and the innermost axis, broadcast between;
    # no naming makes it full, per-channel or per-pixel
    spec = _spec((32, 672, 14, 14), {"x": (32, 672, 14, 14), "s": (32, 672, 1, 1)},
                 order=(0, 2, 3, 1))
    assert channels_last_form(spec) is spec


def test_operands_in_another_memory_order_keep_the_form() -> None:
    spec = _spec((2, 3, 4, 5), {"x": (2, 3, 4, 5)})
    moved = GroupSpec(spec.signature, (spec.tensors[0], TensorSpec(
        "y", 2, (2, 3, 4, 5), _packed((2, 3, 4, 5), (0, 2, 3, 1)), "f16", "output")),
        spec.ops, "f16", "f32", "f32")
    assert channels_last_form(moved) is moved


def test_groups_with_a_non_pointwise_op_keep_the_form() -> None:
    spec = _spec((2, 3, 4, 5), {"x": (2, 3, 4, 5), "w": (2, 3, 5, 5)}, op="matmul")
    assert channels_last_form(spec) is spec


def test_every_tensor_keeps_its_addresses_and_the_form_is_one_cudnn_takes() -> None:
    rng = random.Random(7)
    renamed = 0
    for case in range(300):
        result = tuple(rng.choice((1, 2, 3, 4)) for _ in range(4))
        order = tuple(rng.sample(range(4), 4))
        operands = {f"x{i}": tuple(d if i == 0 or rng.random() < 0.6 else 1 for d in result)
                    for i in range(rng.randint(1, 3))}  # x0 full: outer products keep their form
        old = _spec(result, operands, order, op=("relu", "add", "select")[len(operands) - 1])
        new = channels_last_form(old)
        if new is old:
            continue
        renamed += 1
        for t, offsets in _new_index_offsets(old, new).items():
            assert offsets == _offsets(old.tensor(t), result), (case, t, old, new)
        full = {i for i, d in enumerate(new.tensor("y").dims) if d > 1}
        for t in new.tensors:
            assert t.strides == _packed(t.dims, (0, 2, 3, 1)), (case, t)
            held = {i for i, d in enumerate(t.dims) if d > 1}
            assert held in (full, {1}, full - {1}, set()), (case, t, held, full)
    assert renamed > 100, renamed  # most random cases are renamed to a form cuDNN takes


def test_a_form_that_hangs_on_an_axis_of_one_does_not_hold_at_other_sizes() -> None:
    # [B, S, H, D] times [B, 1, H, D]: at S = 1 the operand is full; at S = 5 it is kept on the
    # outermost and innermost axes and broadcast between, which no naming makes cuDNN's
    at_one = _spec((2, 1, 4, 8), {"x": (2, 1, 4, 8), "b": (2, 1, 4, 8)})
    at_five = _spec((2, 5, 4, 8), {"x": (2, 5, 4, 8), "b": (2, 1, 4, 8)})
    assert not form_holds_at_every_size(at_one, lambda: at_five)
    assert not form_holds_at_every_size(at_one, lambda: None)


def test_a_per_channel_operand_holds_at_every_size() -> None:
    at_one = _spec((2, 1, 4, 8), {"x": (2, 1, 4, 8), "b": (1, 1, 1, 8)})
    at_five = _spec((2, 5, 4, 8), {"x": (2, 5, 4, 8), "b": (1, 1, 1, 8)})
    assert form_holds_at_every_size(at_one, lambda: at_five)


def test_a_group_kept_in_its_form_holds_without_a_second_spec() -> None:
    nc = _spec((4, 6, 3, 3), {"x": (4, 6, 3, 3), "s": (4, 6, 1, 1)}, order=(0, 2, 3, 1))
    assert form_holds_at_every_size(nc, lambda: None)


def test_a_decoder_step_whose_form_hangs_on_s_equal_1_compiles_to_a_fallback_kernel(
        tmp_path: Path) -> None:
    from dslc.backend.target import load_target
    from dslc.compile.stage import compile_model
    from dslc.pipeline import lower_and_fuse
    from tests.helpers import check_source

    def kinds(operand: str) -> str:
        model = check_source(f"""model m {{
  dim B = 1..8 tune [2]
  dim S = 1..64 tune [1]
  input x: [B, S, 4, 8]
  input b: {operand}
  output y = x * b
}}""", tmp_path).model
        lowered, plan = lower_and_fuse(model)
        [step] = compile_model(model, lowered, plan, load_target("h200")).steps
        return step.kind

    assert kinds("[B, 1, 4, 8]") == "kernel"
    assert kinds("[1, 1, 1, 8]") == "graph"


def test_the_graph_gets_the_renamed_dims_and_a_probe_can_keep_the_spec_as_given() -> None:
    import json

    from dslc.backend.graphs import make_graph
    from dslc.backend.target import load_target

    spec = _spec((1, 8, 197, 768), {"x": (1, 8, 197, 768), "pos": (1, 1, 197, 768)}, op="add")
    properties = load_target("h200").properties()

    def dims_of(as_given: bool) -> dict[str, list[int]]:
        graph = json.loads(str(make_graph(spec, None, properties, as_given=as_given)))
        return {t["name"]: t["dim"] for t in graph["tensors"]}

    assert dims_of(False)["pos"] == [1, 197 * 768, 1, 1]
    assert dims_of(True)["pos"] == [1, 1, 197, 768]
