"""`runtime.schedule.Schedule`, the runtime's reading of a bundle, on one small model whose
steps, values and memory are derived by hand below: which values stay inside their step, what
the memory plan holds, which weights the steps read, which steps have a kernel of their own or
may run op by op, and the bounds every size is held to, each with the sentence it is refused
with. (The mutation group `schedule` of scripts/mutation.py runs these; session 32 found the
functions here reached by no test that could fail.)"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from dslc.runtime import schedule as schedule_module
from dslc.runtime.bundle import read
from dslc.runtime.records import BundleError
from dslc.runtime.schedule import Schedule
from tests.gpu.common import compile_source

# x [N, 64] f16 @ w^T (a view of the param) * 0.5 -> h; s = the row sums of h; y = relu(h) + s.
# Compiled for the H200 profile: three steps, `w+mul` (h.matmul, h), `s`, `y.relu+add`.
SOURCE = """cgraph 0.1
model m {
  precision io=f16, intermediate=f32, compute=f32
  dim N = 1..8
  input x: [N, 64]
  param w: [32, 64]
  let h = matmul(x, transpose(w, [1, 0])) * 0.5
  let s = reduce_sum(h, axes=[1], keepdims=true)
  output y = relu(h) + s
}
"""


@pytest.fixture(scope="module")
def bundle_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return compile_source(SOURCE, tmp_path_factory.mktemp("schedule"), profile="h200")


@pytest.fixture
def program(bundle_path: Path) -> Schedule:
    return Schedule(read(bundle_path))


def _step(program: Schedule, name: str) -> object:
    return next(s for s in program.steps if s.name == name)


def _with(program: Schedule, name: str, **attrs: object) -> None:
    """The node `name` with these attributes in place of its own."""
    node = program.nodes[name]
    program.nodes[name] = dataclasses.replace(node, attrs={**node.attrs, **attrs})


def _view(program: Schedule, **attrs: object) -> None:
    _with(program, "h.transpose", **attrs)


def test_the_steps_are_the_ones_derived_by_hand(program: Schedule) -> None:
    assert [(s.name, s.nodes) for s in program.steps] == [
        ("w+mul", ("h.matmul", "h")), ("s", ("s",)), ("y.relu+add", ("y.relu", "y"))]


def test_the_values_inside_a_step_of_two_ops_are_virtual(program: Schedule) -> None:
    """The matmul's product before its scale and the ReLU before the add: never stored."""
    assert program.virtual() == {"h.matmul", "y.relu"}


def test_the_memory_plan_holds_every_stored_value_and_no_constant(program: Schedule) -> None:
    plan = program.memory_plan({"N": 4})
    assert sorted(plan.storage) == ["h", "h.matmul", "h.transpose", "s", "w", "x", "y",
                                    "y.relu"]
    assert "h.scalar" not in plan.storage  # the 0.5 reaches cuDNN by value
    assert plan.storage["h.transpose"].strides == (1, 64)  # w [32, 64] read as [64, 32]
    assert plan.storage["h"].shape == (4, 32)
    # in the arena: h (4 x 32 f16, 256 B) and s (4 B a row, 16 B); x, w and y are not
    assert set(plan.offsets) == {"h", "s"}
    assert program.peak_bytes({"N": 4}) == plan.arena >= 256 + 16


def test_the_weights_used_are_the_params_read_through_their_views_once(program: Schedule,
                                                                      ) -> None:
    """`h.transpose` is read by the first step: its base `w` is the weight; the scalar is a
    load-time value too, but no weight."""
    assert "h.scalar" in program.load_time
    assert program.weights_used() == ["w"]
    first = _step(program, "w+mul")
    program.steps.append(dataclasses.replace(first, name="again"))  # w read by a second step
    assert program.weights_used() == ["w"]


def test_a_matmul_with_its_epilogue_has_the_matmul_kernel(program: Schedule) -> None:
    step = _step(program, "w+mul")
    g = program.matmul_kernel(step)
    assert g is not None and (g.x, g.w) == ("x", "h.transpose")
    assert program.pointwise_kernel(step) is None and program.has_kernel(step)
    assert program.matmul_kernel(_step(program, "y.relu+add")) is None


def test_a_node_computing_in_fp8_keeps_its_step_from_running_op_by_op(program: Schedule,
                                                                      ) -> None:
    """Told by its `precision` attribute alone (no fp8-typed value in the step)."""
    step = _step(program, "y.relu+add")
    assert program.by_ops(step)
    _with(program, "y", precision="f8e4m3")
    assert not program.by_ops(step)


def test_an_inner_view_keeps_its_step_from_running_op_by_op(program: Schedule) -> None:
    """A view has no memory of its own for the scratch the ops run through."""
    step = _step(program, "y.relu+add")
    program.nodes["y.relu"] = dataclasses.replace(program.nodes["y.relu"], op="view")
    assert not program.by_ops(step)


@pytest.mark.parametrize(("values", "message"), [
    ({"N": 4}, None),
    ({}, "graph: a dim of `x` has no value at {}"),
])
def test_a_value_s_storage_needs_every_dim(program: Schedule, values: dict[str, int],
                                          message: str | None) -> None:
    if message is None:
        assert program.storage("x", values).shape == (4, 64)
        return
    with pytest.raises(BundleError) as err:
        program.storage("x", values)
    assert str(err.value).startswith(message), err.value


def test_every_size_is_held_to_the_bounds_naming_the_value_and_the_dims(
        program: Schedule, monkeypatch: pytest.MonkeyPatch) -> None:
    """The bounds are those of `runtime.fields`; lowered here to reach them with small sizes.
    A value at a bound is taken, one past it refused."""
    limits = {k: getattr(schedule_module, k) for k in ("MAX_DIM", "MAX_ELEMENTS")}
    monkeypatch.setattr(schedule_module, "MAX_DIM", 64)
    assert program.storage("x", {"N": 4}).shape == (4, 64)  # 64: at the bound
    monkeypatch.setattr(schedule_module, "MAX_DIM", 63)
    with pytest.raises(BundleError, match=r"^graph: `x` has shape \[4, 64\] at N=4$"):
        program.storage("x", {"N": 4})
    monkeypatch.setattr(schedule_module, "MAX_DIM", limits["MAX_DIM"])

    monkeypatch.setattr(schedule_module, "MAX_ELEMENTS", 64)
    assert program.storage("x", {"N": 4}).shape == (4, 64)
    monkeypatch.setattr(schedule_module, "MAX_ELEMENTS", 63)
    with pytest.raises(BundleError, match=r"^graph: a dim of `x` is 64 at \{'N': 4\}$"):
        program.storage("x", {"N": 4})
    monkeypatch.setattr(schedule_module, "MAX_ELEMENTS", limits["MAX_ELEMENTS"])

    monkeypatch.setattr(schedule_module, "MAX_BYTES", 512)  # x: 4 x 64 f16
    assert program.storage("x", {"N": 4}).nbytes == 512
    monkeypatch.setattr(schedule_module, "MAX_BYTES", 511)
    with pytest.raises(BundleError, match=r"^graph: `x` takes 512 bytes at \{'N': 4\}$"):
        program.storage("x", {"N": 4})


def test_a_memory_plan_past_the_largest_arena_is_refused_by_its_size(
        program: Schedule, monkeypatch: pytest.MonkeyPatch) -> None:
    """The arena as the planner returns it, made to land at the bound and one past it (this
    model's values are each far under it)."""
    planned, most = schedule_module.plan_memory, schedule_module.MAX_BYTES
    for arena, refused in ((most, False), (most + 1, True)):
        monkeypatch.setattr(schedule_module, "plan_memory",
                            lambda buffers, arena=arena: (planned(buffers)[0], arena))
        if not refused:
            assert program.memory_plan({"N": 8}).arena == arena
            continue
        with pytest.raises(BundleError, match=rf"^graph: its memory plan at \{{'N': 8\}} "
                                              rf"takes {most + 1:,} bytes$"):
            program.memory_plan({"N": 8})


@pytest.mark.parametrize("attrs", [
    {"strides": (1,)},  # a rank of its own
    {"strides": (-1, 64)},  # backwards
    {"offset": -1},  # before its base
    {"offset": 1},  # its last element past w's
])
def test_a_view_reaching_outside_its_base_is_refused_naming_both(program: Schedule,
                                                                 attrs: dict[str, object],
                                                                 ) -> None:
    _view(program, **attrs)
    with pytest.raises(BundleError,
                       match=r"^graph: view `h.transpose` reaches outside `w` at N=2$"):
        program.storage("h.transpose", {"N": 2})


def test_a_view_of_another_dtype_than_its_base_is_refused(program: Schedule) -> None:
    node = program.nodes["h.transpose"]
    program.nodes["h.transpose"] = dataclasses.replace(
        node, type=dataclasses.replace(node.type, dtype="f32"))
    with pytest.raises(BundleError, match=r"view `h\.transpose` reaches outside `w`"):
        program.storage("h.transpose", {"N": 2})


def test_a_broadcast_view_of_stride_zero_is_taken(program: Schedule) -> None:
    """A stride of 0 (an expand) is a view, not one reaching backwards."""
    _view(program, strides=(0, 64))
    s = program.storage("h.transpose", {"N": 2})
    assert (s.strides, s.offset, s.base) == ((0, 64), 0, "w")


def test_a_model_without_dims_names_no_dims_in_its_refusals(tmp_path: Path) -> None:
    program = Schedule(read(compile_source(SOURCE.replace("dim N = 1..8\n", "").replace(
        "[N, 64]", "[2, 64]"), tmp_path, profile="h200")))
    _view(program, offset=1)
    with pytest.raises(BundleError, match=r"^graph: view `h.transpose` reaches outside `w`$"):
        program.storage("h.transpose", {})


def _specs(program: Schedule, dims: dict[str, int]) -> dict[str, object]:
    """Each step's cuDNN graph at `dims`, as the runtime makes it between buckets."""
    from dslc.backend.spec import group_spec
    from dslc.ir.groups import make_group

    return {s.name: group_spec(program.graph, make_group(program.graph, list(s.nodes),
                                                         s.pattern), dims, program.env)
            for s in program.steps}


def test_a_graph_is_checked_against_its_step_s_ops_and_each_bound_tensor(program: Schedule,
                                                                       ) -> None:
    dims = {"N": 3}
    storage = program.memory_plan(dims).storage
    specs = _specs(program, dims)
    first, last = _step(program, "w+mul"), _step(program, "y.relu+add")
    for step in program.steps:
        program.check_bindings(step, specs[step.name], storage, dims, "here")
    with pytest.raises(BundleError, match=r"^here: its ops are not those of step `y.relu\+add`$"):
        program.check_bindings(last, specs["w+mul"], storage, dims, "here")
    spec = specs["w+mul"]
    # its tensors: x, h.transpose (inputs), h.scalar, h.matmul (virtual), h (the output): the
    # output, after the virtual one, is checked too
    assert [t.role for t in spec.tensors][-2:] == ["virtual", "output"]
    h = spec.tensors[-1]
    wide = dataclasses.replace(spec, tensors=(*spec.tensors[:-1],
                                              dataclasses.replace(h, dims=(1, 4, 32))))
    with pytest.raises(BundleError, match=r"^here: tensor `h` reaches past the memory of `h` "
                                          r"\(128 f16 elements, it holds 192 bytes of f16\)"):
        program.check_bindings(first, wide, storage, dims, "here")


# A value named past the 60 characters a refusal keeps of a name, and a dim derived from
# another by floor division (M = N // 2: only the dims' environment gives its value).
LONG = "a_sum_whose_name_runs_on_well_past_the_sixty_characters_a_message_keeps"
LONG_SOURCE = f"""cgraph 0.1
model m {{
  precision io=f16, intermediate=f32, compute=f32
  dim N = 2..16
  dim M = N // 2
  input x: [M, 64]
  let {LONG} = reduce_sum(x * 0.5, axes=[1], keepdims=true)
  output y = relu({LONG})
}}
"""


def test_a_derived_dim_takes_its_value_from_the_dims_it_is_made_of(tmp_path: Path) -> None:
    program = Schedule(read(compile_source(LONG_SOURCE, tmp_path, profile="h200")))
    assert program.storage("x", {"N": 7}).shape == (3, 64)
    assert program.memory_plan({"N": 12}).storage["y"].shape == (6, 1)


def test_refusals_of_a_saved_graph_keep_sixty_characters_of_each_name(tmp_path: Path) -> None:
    """Names in a hostile bundle may be of any length: each refusal is one sentence."""
    program = Schedule(read(compile_source(LONG_SOURCE, tmp_path, profile="h200")))
    dims = {"N": 12}
    storage = program.memory_plan(dims).storage
    specs = _specs(program, dims)
    mul, rest = program.steps
    assert (mul.name, rest.name) == (f"{LONG}.mul", f"{LONG}+relu")
    cut = LONG[:60]

    def refused(step: object, spec: object, message: str) -> None:
        with pytest.raises(BundleError) as err:
            program.check_bindings(step, spec, storage, dims, "here")
        assert str(err.value) == message

    refused(rest, specs[mul.name], f"here: its ops are not those of step `{cut}`")
    spec = specs[rest.name]
    summed = dataclasses.replace(spec.ops[0], attrs=(("axes", (1,)), ("keepdims", False)))
    refused(rest, dataclasses.replace(spec, ops=(summed, *spec.ops[1:])),
            f"here: the attributes of `{cut}` are not those of node `{cut}` at {{'N': 12}}")
    spec = specs[mul.name]
    x, scalar, out = spec.tensors
    assert (x.role, scalar.role, out.role) == ("input", "scalar", "output")
    refused(mul, dataclasses.replace(spec, tensors=(x, dataclasses.replace(scalar, value=2.0), out)),
            f"here: scalar `{cut}` is no constant the step reads")
    refused(mul, dataclasses.replace(spec, tensors=(
        dataclasses.replace(x, name=LONG, uid=9), scalar, out)),
        f"here: tensor `{cut}` (uid 9) is bound to no input of step `{cut}`")
    assert tuple(out.dims) == (1, 1, 6, 64)  # x * 0.5, [M, 64] at rank 4 (pointwise graphs)
    refused(mul, dataclasses.replace(spec, tensors=(
        x, scalar, dataclasses.replace(out, dims=(1, 1, 12, 64)))),
        f"here: tensor `{cut}` reaches past the memory of `{cut}` (768 f16 elements, it holds "
        "768 bytes of f16); a bundle compiled by an earlier dslc may place values otherwise "
        "(which results its producers write into a concat's slice): compile the model again")


def test_a_value_of_no_rows_and_a_view_of_one_element_are_taken(program: Schedule) -> None:
    """0 is a size (an empty batch); a view of rank 0 has no stride to be negative."""
    assert program.storage("x", {"N": 0}).shape == (0, 64)
    node = program.nodes["h.transpose"]
    program.nodes["h.transpose"] = dataclasses.replace(
        node, type=dataclasses.replace(node.type, shape=()),
        attrs={**node.attrs, "strides": (), "offset": 5})
    s = program.storage("h.transpose", {"N": 2})
    assert (s.shape, s.strides, s.offset, s.base) == ((), (), 5, "w")


def test_a_saved_bucket_s_refusals_name_the_value_and_the_graph_by_their_starts(
        tmp_path: Path) -> None:
    """A value past the arena by sixty characters of its name; a graph that binds memory it
    may not by forty of its signature (signatures dslc writes are 12)."""
    from dslc.runtime import bundle

    data = read(compile_source(LONG_SOURCE, tmp_path, profile="h200"))
    memory = data["buckets"][0]["memory"]
    value = f"{LONG}.mul"
    assert memory["offsets"] == {value: 0}
    rows = data["buckets"][0]["dims"]["N"] // 2  # x * 0.5: [M, 64] f16
    memory["offsets"][value] = memory["arena_bytes"] - 8
    path = tmp_path / "edited.bundle"
    path.write_bytes(bundle.pack(data))
    with pytest.raises(BundleError) as err:
        bundle.load(path)
    assert str(err.value).endswith(f" is not a valid bundle: buckets[0].memory.offsets.{value[:60]}: "
                              f"{memory['arena_bytes'] - 8} + {rows * 128} bytes is past the arena")

    data = read(compile_source(LONG_SOURCE, tmp_path, profile="h200"))
    long = "f" * 50
    [step] = [s for s in data["steps"] if s["name"] == f"{LONG}.mul"]
    graphs = data["buckets"][0]["graphs"]
    entry = graphs.pop(step["signature"])
    step["signature"] = long
    graphs[long] = entry
    entry["spec"]["signature"] = long
    entry["spec"]["tensors"][0]["uid"] = 9
    path.write_bytes(bundle.pack(data))
    with pytest.raises(BundleError) as err:
        bundle.load(path)
    assert f" is not a valid bundle: buckets[0].graphs.{long[:40]}.spec: tensor `x` (uid 9)" in str(
        err.value)


def test_a_refusal_names_every_dim_value_it_is_about(program: Schedule) -> None:
    _view(program, offset=1)
    with pytest.raises(BundleError, match=r" reaches outside `w` at N=2, K=7$"):
        program.storage("h.transpose", {"N": 2, "K": 7})
