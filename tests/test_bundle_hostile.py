"""Hostile bundles: a payload edited and re-hashed (its checksum is only a checksum), damaged
msgpack, and files that are no bundle at all (a FIFO, `/dev/zero`, a folder, a huge file).
Each ends in a `BundleError` naming the field, exit 2 with one sentence from the CLI, or is
accepted and then runs: never an internal error, a raw exception, a hang or an unbounded read.
Every number that would reach cuDNN or CuPy is bound-checked on the way."""

from __future__ import annotations

import copy
import os
import random
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from functools import cache
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest

from dslc.backend.spec import group_spec
from dslc.backend.target import load_target
from dslc.compile.stage import compile_model
from dslc.emit import bundle as emit_bundle
from dslc.ir.groups import make_group
from dslc.pipeline import lower_and_fuse
from dslc.runtime import bundle, plancache
from dslc.runtime.records import Bundle, BundleError
from dslc.runtime.schedule import Schedule
from tests.helpers import check_source, model_snippet, run_cli
from tests.test_compile_deviceless import compiled


@cache
def _payload(name: str) -> dict[str, Any]:
    return emit_bundle.payload(compiled(name))


def payload(name: str) -> dict[str, Any]:
    return copy.deepcopy(_payload(name))


def write(tmp_path: Path, data: Any, name: str = "m.bundle") -> Path:
    path = tmp_path / name
    path.write_bytes(bundle.pack(data))  # re-hashed: the checksum matches
    return path


def refused(path: Path, message: str) -> None:
    """Refused in one sentence naming the problem, by the reader and by `dslc inspect`."""
    with pytest.raises(BundleError) as err:
        bundle.load(path)
    assert message in str(err.value) and "\n" not in str(err.value), str(err.value)
    r = run_cli("inspect", str(path))
    assert r.code == 2 and r.stderr.count("\n") == 1 and message in r.stderr, r.stderr


# -- edited payloads: field types and values ---------------------------------------------------
OTHERS: list[Any] = [None, True, False, -1, 0, 1, 2**63, -(2**31), 1.5, float("nan"),
                     float("inf"), "x", "", b"\x00\x01", [], [1], [["x"]], {}, {"a": 1},
                     {"terms": [[[["N", 1]], 1, 0]]}]


def _paths(v: Any, at: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    if at:
        yield at
    if isinstance(v, dict):
        for k, x in v.items():
            yield from _paths(x, (*at, k))
    elif isinstance(v, list):
        for i, x in enumerate(v):
            yield from _paths(x, (*at, i))


def mutate(data: dict[str, Any], rng: random.Random, names: list[str]) -> str:
    """Change one field of `data` in place: another type, or a nearby or extreme value, or
    another node's name, or a list or map with an entry dropped, repeated or added."""
    path = rng.choice(list(_paths(data)))
    parent: Any = data
    for k in path[:-1]:
        parent = parent[k]
    old = parent[path[-1]]
    if rng.random() < 0.45 or old in ([], {}):
        new = rng.choice(OTHERS)
    elif isinstance(old, bool):
        new = not old
    elif isinstance(old, int):
        new = rng.choice([old + 1, old - 1, -old - 1, old * 1000003 + 7, 2**31, 2**40 + old])
    elif isinstance(old, str):
        new = rng.choice([rng.choice(names), old + "x", old[:-1]])
    elif isinstance(old, list):
        new = list(old)
        r = rng.random()
        if r < 0.33:
            del new[rng.randrange(len(new))]
        elif r < 0.66:
            new.append(copy.deepcopy(rng.choice(new)))
        else:
            new.reverse()
    elif isinstance(old, dict):
        new = dict(old)
        k = rng.choice(list(new))
        if rng.random() < 0.5:
            del new[k]
        else:
            new[f"{k}_extra"] = copy.deepcopy(new[k])
    else:
        new = rng.choice(OTHERS)
    parent[path[-1]] = new
    return f"{'.'.join(map(str, path))}: {str(old)[:40]!r} -> {str(new)[:40]!r}"


def _runs_on_cpu(path: Path, tmp_path: Path, run: bool) -> tuple[list[str], bool]:
    """What a user does with a bundle without a GPU: what went wrong, and whether the bundle
    was refused."""
    problems = []
    r = run_cli("inspect", str(path))
    if r.code not in (0, 2) or (r.code == 2 and r.stderr.count("\n") != 1):
        problems.append(f"inspect: exit {r.code}: {r.stderr.strip()[:300]}")
    try:
        program = Schedule(bundle.load(path))
    except BundleError:
        return problems, True
    try:
        for b in program.bundle.buckets:
            program.memory_plan(b.dims)
    except BundleError:
        pass
    if run:
        args = ("--weights", str(tmp_path / "w.safetensors"), "--input",
                f"x={tmp_path / 'x.npy'}")
        r = run_cli("run", str(path), *args, "-o", str(tmp_path / "out.npz"))
        if r.code not in (0, 1, 2):
            problems.append(f"run: exit {r.code}: {r.stderr.strip()[:300]}")
        r = run_cli("weights", "prepare", str(path), args[1], "-o", str(tmp_path / "p.st"))
        if r.code not in (0, 1, 2):
            problems.append(f"weights prepare: exit {r.code}: {r.stderr.strip()[:300]}")
    return problems, False


@pytest.mark.slow
@pytest.mark.parametrize("model, count, seed, run", [("mlp", 200, 16, True),
                                                     ("resnet18", 100, 8, False)])
def test_edited_payloads_are_refused_or_run_never_crash(tmp_path: Path, model: str, count: int,
                                                        seed: int, run: bool) -> None:
    """`count` single-field mutations (seed `seed`) of a real deviceless bundle, re-hashed:
    `dslc inspect`, the reader and the schedule (and for mlp `dslc run --backend reference` and
    `dslc weights prepare`) refuse each in one sentence or handle it; none ends in exit 4 or a
    raw exception. (Larger runs, 5,000 mlp mutations with runs and 3,500 resnet18 ones over
    four other seeds, found nothing either.)"""
    if run:
        assert run_cli("weights", "random", f"models/{model}.cgraph", "-o",
                       str(tmp_path / "w.safetensors")).code == 0
        x = np.random.default_rng(seed).standard_normal((16, 784)).astype(np.float16)
        np.save(tmp_path / "x.npy", x)
    base = _payload(model)
    names = [n["name"] for n in base["graph"]["nodes"]]
    rng = random.Random(seed)
    refusals = 0
    for i in range(count):
        data = copy.deepcopy(base)
        what = mutate(data, rng, names)
        path = write(tmp_path, data)
        try:
            problems, refused = _runs_on_cpu(path, tmp_path, run)
        except Exception as err:  # a raw exception: the point of this test
            problems, refused = [f"raised {type(err).__name__}: {err}"], False
        assert not problems, f"seed {seed}, mutation {i} ({what}): {problems}"
        refusals += refused
    assert count // 2 < refusals < count  # the mutations reach the validation, and past it


# -- named bound checks ------------------------------------------------------------------------
def _first_graph(data: dict[str, Any], bucket: int = 0) -> tuple[str, dict[str, Any]]:
    sig, entry = next(iter(data["buckets"][bucket]["graphs"].items()))
    return sig, entry


def test_a_workspace_that_is_no_size_is_refused_naming_the_field(tmp_path: Path) -> None:
    data = payload("mlp")
    sig, entry = _first_graph(data)
    entry["plan"]["workspace"] = "x"
    refused(write(tmp_path, data), f'buckets[0].graphs.{sig}.plan.workspace: expected a '
            'non-negative int, got "x"')
    entry["plan"]["workspace"] = 2**50  # past any GPU: would reach cupy.empty
    refused(write(tmp_path, data), f"buckets[0].graphs.{sig}.plan.workspace: expected an int in "
            f"0..{2**40}, got {2**50}")


def test_a_step_naming_a_node_that_does_not_exist_is_refused(tmp_path: Path) -> None:
    data = payload("mlp")
    data["steps"][1]["nodes"][0] = "nope"
    refused(write(tmp_path, data), "steps[1].nodes[0]: `nope` is not a value of the graph")


def test_two_steps_of_one_name_are_refused(tmp_path: Path) -> None:
    data = payload("mlp")
    data["steps"][2]["name"] = data["steps"][0]["name"]
    refused(write(tmp_path, data), "steps[2].name: `w1+b1+relu` names an earlier step too")


def test_a_step_reading_what_no_step_wrote_is_refused(tmp_path: Path) -> None:
    data = payload("mlp")
    data["steps"][0], data["steps"][1] = data["steps"][1], data["steps"][0]
    refused(write(tmp_path, data), "steps[0].inputs: `h1` is read before a step writes it")


def test_a_step_whose_inputs_are_out_of_order_is_refused(tmp_path: Path) -> None:
    """The uids of a step's cuDNN tensors follow its inputs: another order binds x to w1."""
    data = payload("mlp")
    step = data["steps"][0]
    step["inputs"] = [step["inputs"][1], step["inputs"][0], *step["inputs"][2:]]
    refused(write(tmp_path, data), "steps[0].inputs: not what the step's nodes read, in order")


def test_a_saved_scalar_that_is_not_the_graph_constant_is_refused(tmp_path: Path) -> None:
    """A constant passed to cuDNN by value is the graph's constant."""
    model = check_source(model_snippet("  input x: [4, 64]\n  output y = relu(x * 0.5 + x)"),
                         tmp_path).model
    lowered, plan = lower_and_fuse(model)
    data = emit_bundle.payload(compile_model(model, lowered, plan, load_target("h200")))
    tensor = next(t for b in data["buckets"] for g in b["graphs"].values()
                  for t in g["spec"]["tensors"] if t["role"] == "scalar")
    assert tensor["value"] == 0.5
    write(tmp_path, data)
    bundle.load(tmp_path / "m.bundle")  # as compiled
    tensor["value"] = 2.0
    refused(write(tmp_path, data), f"scalar `{tensor['name']}` is no constant the step reads")


@pytest.mark.parametrize("change, message", [
    (lambda t: t.update(dims=[1, 4096, 784]), "reaches past the memory of `x`"),
    (lambda t: t.update(strides=[784, 785, 1]), "reaches past the memory of `x`"),
    # a slice's strides where this dslc gives the value a buffer of its own: an earlier
    # compiler's placement (a 3x3 conv's result written into a concat's channel slice)
    (lambda t: t.update(strides=[1568, 1568, 2]), "an earlier dslc may place values otherwise"),
    (lambda t: t.update(uid=9), "is bound to no input of step `w1+b1+relu`"),
    (lambda t: t.update(dtype="f32"), "reaches past the memory of `x`"),
    (lambda t: t.update(dims=[1] * 9, strides=[1] * 9), "expected 1..8"),
])
def test_a_saved_cudnn_tensor_reaches_only_the_memory_it_is_bound_to(
        tmp_path: Path, change: Any, message: str) -> None:
    data = payload("mlp")
    graphs = data["buckets"][1]["graphs"]  # N=16
    step = data["steps"][0]
    x = next(t for t in graphs[step["signature"]]["spec"]["tensors"] if t["name"] == "x")
    change(x)
    refused(write(tmp_path, data), message)


def test_a_saved_graph_whose_attributes_differ_from_its_nodes_is_refused(tmp_path: Path) -> None:
    data = payload("resnet18")
    entry = next(e for e in data["buckets"][0]["graphs"].values()
                 if e["spec"]["ops"][0]["op"] == "conv")
    entry["spec"]["ops"][0]["attrs"]["stride"] = [1, 3]
    refused(write(tmp_path, data), "the attributes of")


def test_a_view_reaching_outside_its_base_is_refused(tmp_path: Path) -> None:
    data = payload("resnet18")
    view = next(n for n in data["graph"]["nodes"] if n["name"] == "fc.y.transpose")
    view["attrs"]["offset"] = 1000
    refused(write(tmp_path, data), "view `fc.y.transpose` reaches outside `fc.weight`")


def test_an_attribute_of_the_wrong_kind_is_refused_naming_it(tmp_path: Path) -> None:
    data = payload("resnet18")
    i, conv = next((i, n) for i, n in enumerate(data["graph"]["nodes"]) if n["op"] == "conv")
    conv["attrs"]["stride"] = ["x", 2]
    refused(write(tmp_path, data), f'graph.nodes[{i}].attrs.stride[0]: expected an int')
    conv["attrs"]["stride"] = [3, 3]  # the right kind, but not what made its type
    refused(write(tmp_path, data), "graph: the IR does not check out")


def test_a_manifest_that_does_not_describe_the_graph_is_refused(tmp_path: Path) -> None:
    data = payload("mlp")
    data["manifest"]["params"][0]["shape"] = [784, 513]  # weights of this shape would pass R0202
    refused(write(tmp_path, data), "manifest.params[0]: `w1` differs from its node")


def test_a_memory_plan_past_its_arena_and_a_bucket_out_of_range_are_refused(
        tmp_path: Path) -> None:
    data = payload("mlp")
    data["buckets"][0]["memory"]["offsets"]["h1"] = data["buckets"][0]["memory"]["arena_bytes"]
    refused(write(tmp_path, data), "buckets[0].memory.offsets.h1")
    data = payload("mlp")
    data["buckets"][0]["dims"]["N"] = 4096
    refused(write(tmp_path, data), "buckets[0].dims.N: 4096 is not a value of a dim")


def test_unknown_and_missing_fields_are_refused(tmp_path: Path) -> None:
    data = payload("mlp")
    data["environment"]["extra"] = 1
    refused(write(tmp_path, data), "environment: unknown field `extra`")
    data = payload("mlp")
    del data["steps"]
    refused(write(tmp_path, data), "payload: missing field `steps`")


def test_a_size_between_buckets_is_checked_as_a_saved_one() -> None:
    """What the runtime does before it builds a graph at a size no bucket has (`Executable`):
    the spec made from the graph passes; one that reaches further is refused."""
    program = Schedule(Bundle.from_data(_payload("resnet18")))
    dims = {"N": 5}
    layout = program.memory_plan(dims)
    specs = {}
    for step in program.steps:
        if step.kind == "graph":
            specs[step.name] = group_spec(program.graph, make_group(
                program.graph, list(step.nodes), step.pattern), dims, program.env)
            program.check_bindings(step, specs[step.name], layout.storage, dims, step.name)
    step = next(s for s in program.steps if s.name == "fc+bias_add+cast")  # [N, 512] @ [512, 1000]
    pooled = specs[step.name].tensors[0]
    assert pooled.dims == (1, 5, 512)
    bad = replace(specs[step.name], tensors=(replace(pooled, dims=(1, 6, 512)),
                                               *specs[step.name].tensors[1:]))
    with pytest.raises(BundleError, match="reaches past the memory of `pooled`"):
        program.check_bindings(step, bad, layout.storage, dims, step.name)


def test_records_round_trip_and_the_plain_reader_gives_what_was_written(tmp_path: Path) -> None:
    data = _payload("resnet18")
    record = Bundle.from_data(data)
    assert Bundle.from_data(record.to_data()) == record
    assert bundle.read(write(tmp_path, data)) == record.to_data()


# -- damaged msgpack, re-hashed ------------------------------------------------------------------
@pytest.mark.parametrize("body, message", [
    (lambda b: b[: len(b) // 2], "its payload is not msgpack"),
    (lambda b: b + b"\x00", "its payload is not msgpack"),
    (lambda b: b"\x91" * 100_000 + b"\xc0", "its payload is not msgpack"),  # nested too deep
    (lambda b: b"\xc1", "its payload is not msgpack"),
    (lambda b: b"\xc6\xff\xff\xff\xff", "its payload is not msgpack"),  # 4 GiB of bin, claimed
    (lambda b: b"\xdd" + (5_000_000).to_bytes(4, "big") + b"\x90" * 5_000_000,
     "holds more than 4,000,000 maps and lists"),  # 5 MB making 320 MB of lists
    (lambda b: msgpack.packb([1, 2]), "malformed payload (not a map)"),
    (lambda b: msgpack.packb({1: 2}), "payload: a key 1 is not a string"),
])
def test_damaged_msgpack_with_a_matching_checksum_is_refused(tmp_path: Path, body: Any,
                                                             message: str) -> None:
    import hashlib

    raw = body(msgpack.packb(_payload("mlp"), use_bin_type=True))
    envelope = {"magic": bundle.MAGIC, "schema_version": bundle.SCHEMA_VERSION,
                "checksum": hashlib.sha256(raw).hexdigest(), "payload": raw}
    path = tmp_path / "m.bundle"
    path.write_bytes(msgpack.packb(envelope, use_bin_type=True))
    refused(path, message)


# -- files that are no bundle ------------------------------------------------------------------
def test_files_that_are_no_bundle_are_refused_without_reading_them(tmp_path: Path) -> None:
    huge = tmp_path / "huge.bundle"
    with open(huge, "wb") as f:
        f.truncate(bundle.MAX_BYTES + 1)  # sparse: costs no disk
    (tmp_path / "folder.bundle").mkdir()
    (tmp_path / "zero.bundle").symlink_to("/dev/zero")
    (tmp_path / "empty.bundle").write_bytes(b"")
    cases = {"huge.bundle": "larger than", "folder.bundle": "it is a folder",
             "zero.bundle": "not a regular file", "/dev/zero": "not a regular file",
             "empty.bundle": "is not a dslc bundle", "missing.bundle": "cannot read"}
    for name, message in cases.items():
        refused(tmp_path / name, message)


def test_a_fifo_given_as_a_bundle_does_not_hang(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.bundle"
    os.mkfifo(fifo)
    r = subprocess.run([sys.executable, "-m", "dslc", "inspect", str(fifo)], capture_output=True,
                       text=True, timeout=120, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert r.returncode == 2 and "not a regular file" in r.stderr, r.stderr
    from dslc.runtime import Model

    with pytest.raises(BundleError, match="not a regular file"):
        Model(fifo)


# -- the plan cache: a damaged file is a miss ----------------------------------------------------
PLAN = {"engine_id": 3, "knobs": {"KERNEL_CFG": 7}, "workspace": 1024, "serialized": b"\x01"}


@pytest.mark.parametrize("damage", [
    {"workspace": "x"}, {"workspace": -1}, {"workspace": 2**50}, {"engine_id": -3},
    {"knobs": {"KERNEL_CFG": "7"}}, {"serialized": 5}, {"top": [{"engine_id": None}]},
])
def test_a_plan_cache_file_with_numbers_out_of_bounds_is_a_miss(tmp_path: Path,
                                                               damage: dict[str, Any]) -> None:
    path = tmp_path / "p.plan"
    path.write_bytes(msgpack.packb({**PLAN, **damage}, use_bin_type=True))
    assert plancache.load(path) is None
    path.write_bytes(msgpack.packb(PLAN, use_bin_type=True))
    assert plancache.load(path) is not None


def test_a_plan_cache_file_that_is_a_fifo_or_huge_is_a_miss(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo.plan")
    assert plancache.load(tmp_path / "fifo.plan") is None
    with open(tmp_path / "huge.plan", "wb") as f:
        f.truncate(plancache.MAX_BYTES + 1)
    assert plancache.load(tmp_path / "huge.plan") is None
