"""The bundle payload as typed records: frozen dataclasses with `to_data()` (plain data, what
msgpack stores) and `from_data()`, which reads untrusted data and validates it: types, required
and unknown fields, ranges, and cross-references (a step names nodes of the graph, a bucket's
graphs are those of graph steps, its dims are the model's dims within their ranges, the
manifest describes the graph). A failure is a `BundleError` naming the field path. The plain
form is the schema documented in `dslc.runtime.bundle`; the IR is checked by
`dslc.runtime.irdata`, the manifest by `dslc.runtime.manifest`. What needs concrete sizes (each
cuDNN tensor within the memory of the value it is bound to) is checked by
`dslc.runtime.schedule.check_buckets`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from dslc.backend import fused, gemv
from dslc.core.dims import bucket_key
from dslc.core.types import DTYPES
from dslc.ir.graph import SOURCES, outside_reads
from dslc.runtime import fields as f
from dslc.runtime.calibration import Calibration, quantised
from dslc.runtime.fields import (
    MAX_BYTES,
    MAX_DIM,
    MAX_ELEMENTS,
    MAX_SPEC_RANK,
    BundleError,
)
from dslc.runtime.irdata import GraphRecord
from dslc.runtime.manifest import Manifest

__all__ = ["Bundle", "BundleError", "PlanRecord", "StepRecord"]

ENGINE = (0, 2**31 - 1)  # a cuDNN engine id
ROLES = ("input", "output", "virtual", "scalar")


@dataclass(frozen=True)
class Candidate:
    """A measured (engine_id, knobs): the heuristics' choice, or one of the fastest."""

    engine_id: int
    knobs: Mapping[str, int]
    ms: float | None
    error: float | None = None

    def to_data(self) -> dict[str, Any]:
        out = {"engine_id": self.engine_id, "knobs": dict(self.knobs), "ms": self.ms}
        return out if self.error is None else {**out, "error": self.error}

    @staticmethod
    def from_data(d: Any, path: str) -> Candidate:
        d = f.mapping(d, path, ("engine_id", "knobs"), ("ms", "error"))
        return Candidate(f.integer(d["engine_id"], f"{path}.engine_id", *ENGINE),
                         f.int_map(d["knobs"], f"{path}.knobs"),
                         f.opt_number(d.get("ms"), f"{path}.ms"),
                         f.opt_number(d.get("error"), f"{path}.error"))


@dataclass(frozen=True)
class PlanRecord:
    """A group graph's plan at one size: what start-up restores (`serialized`, `workspace`) or
    replays (`engine_id`, `knobs`), and what tuning measured. Optional fields are None when
    absent; `to_data` leaves those out."""

    engine_id: int | None
    knobs: Mapping[str, int]
    workspace: int
    serialized: bytes | None
    note: str | None = None
    candidates: int | None = None
    tuned: bool | None = None
    built_on_device: bool | None = None
    build_s: float | None = None
    ms: float | None = None
    error: float | None = None
    heuristic: Candidate | None = None
    top: tuple[Candidate, ...] | None = None
    tune_s: float | None = None
    reused: bool | None = None
    made_at_startup: str | None = None

    def to_data(self) -> dict[str, Any]:
        out: dict[str, Any] = {"engine_id": self.engine_id, "knobs": dict(self.knobs),
                               "workspace": self.workspace, "serialized": self.serialized}
        for field in fields(self)[4:]:
            value = getattr(self, field.name)
            if value is not None:
                out[field.name] = (value.to_data() if isinstance(value, Candidate) else
                                   [c.to_data() for c in value] if field.name == "top" else value)
        return out

    def updated(self, data: Mapping[str, Any], path: str) -> PlanRecord:
        """This plan with the fields in `data` replaced (validated as a bundle's plan)."""
        return PlanRecord.from_data({**self.to_data(), **data}, path)

    @staticmethod
    def from_data(d: Any, path: str, tuning: bool = False) -> PlanRecord:
        """`tuning`: a tuning-database entry, which holds no serialized plan or workspace."""
        required = PLAN_FIELDS[:2] if tuning else PLAN_FIELDS[:4]
        d = f.mapping(d, path, required, PLAN_FIELDS)
        get = d.get
        heuristic = get("heuristic")
        top = get("top")
        return PlanRecord(
            f.opt_integer(get("engine_id"), f"{path}.engine_id", *ENGINE),
            f.int_map(get("knobs"), f"{path}.knobs"),
            f.integer(get("workspace", 0), f"{path}.workspace", 0, MAX_BYTES),
            f.blob(get("serialized"), f"{path}.serialized"),
            f.opt_text(get("note"), f"{path}.note"),
            f.opt_integer(get("candidates"), f"{path}.candidates"),
            f.opt_flag(get("tuned"), f"{path}.tuned"),
            f.opt_flag(get("built_on_device"), f"{path}.built_on_device"),
            f.opt_number(get("build_s"), f"{path}.build_s"),
            f.opt_number(get("ms"), f"{path}.ms"), f.opt_number(get("error"), f"{path}.error"),
            None if heuristic is None else Candidate.from_data(heuristic, f"{path}.heuristic"),
            None if top is None else tuple(Candidate.from_data(c, f"{path}.top[{i}]")
                                           for i, c in enumerate(f.items(top, f"{path}.top", 0, 64))),
            f.opt_number(get("tune_s"), f"{path}.tune_s"),
            f.opt_flag(get("reused"), f"{path}.reused"),
            f.opt_text(get("made_at_startup"), f"{path}.made_at_startup"))


PLAN_FIELDS = tuple(x.name for x in fields(PlanRecord))


@dataclass(frozen=True)
class TensorRecord:
    name: str  # the IR value (of the first step with this graph); bound by uid at run time
    uid: int
    dims: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: str
    role: str  # input | output | virtual | scalar
    value: float = 0.0  # a scalar's, passed by value

    def to_data(self) -> dict[str, Any]:
        return {"name": self.name, "uid": self.uid, "dims": list(self.dims),
                "strides": list(self.strides), "dtype": self.dtype, "role": self.role,
                "value": self.value}

    @staticmethod
    def from_data(d: Any, path: str) -> TensorRecord:
        d = f.mapping(d, path, ("name", "uid", "dims", "strides", "dtype", "role"), ("value",))
        dims = f.ints(d["dims"], f"{path}.dims", 1, MAX_DIM, 1, MAX_SPEC_RANK)
        strides = f.ints(d["strides"], f"{path}.strides", 0, MAX_ELEMENTS, len(dims), len(dims))
        return TensorRecord(f.text(d["name"], f"{path}.name"),
                            f.integer(d["uid"], f"{path}.uid", 1, 2**31 - 1), dims, strides,
                            f.text(d["dtype"], f"{path}.dtype", DTYPES),
                            f.text(d["role"], f"{path}.role", ROLES),
                            f.number(d.get("value", 0.0), f"{path}.value"))


@dataclass(frozen=True)
class OpRecord:
    node: str
    op: str
    inputs: tuple[str, ...]
    attrs: Mapping[str, Any]  # plain data, every dim evaluated
    compute: str

    def to_data(self) -> dict[str, Any]:
        return {"node": self.node, "op": self.op, "inputs": list(self.inputs),
                "attrs": dict(self.attrs), "compute": self.compute}


@dataclass(frozen=True)
class SpecRecord:
    """A group graph at concrete sizes in cuDNN's form (`dslc.backend.spec.GroupSpec` as data):
    what a plan is built from and restored for."""

    signature: str
    tensors: tuple[TensorRecord, ...]
    ops: tuple[OpRecord, ...]
    io: str
    intermediate: str
    compute: str

    def to_data(self) -> dict[str, Any]:
        return {"signature": self.signature, "tensors": [t.to_data() for t in self.tensors],
                "ops": [o.to_data() for o in self.ops], "io": self.io,
                "intermediate": self.intermediate, "compute": self.compute}

    @staticmethod
    def from_data(d: Any, path: str, graph_nodes: Mapping[str, Any]) -> SpecRecord:
        d = f.mapping(d, path, ("signature", "tensors", "ops", "io", "intermediate", "compute"), ())
        tensors = tuple(TensorRecord.from_data(t, f"{path}.tensors[{i}]")
                        for i, t in enumerate(f.items(d["tensors"], f"{path}.tensors", 1, 4096)))
        names = {t.name for t in tensors}
        if len(names) != len(tensors) or len({t.uid for t in tensors}) != len(tensors):
            f.wrong(f"{path}.tensors", "two tensors share a name or a uid")
        ops = []
        for i, o in enumerate(f.items(d["ops"], f"{path}.ops", 1, 4096)):
            at = f"{path}.ops[{i}]"
            o = f.mapping(o, at, ("node", "op", "inputs", "attrs", "compute"), ())
            node = graph_nodes.get(f.name_of(o["node"], f"{at}.node", names, "a tensor of the spec"))
            if node is None or f.text(o["op"], f"{at}.op") != node.op:
                f.wrong(at, "not an op of the graph")
            attrs = f.mapping(o["attrs"], f"{at}.attrs")
            ops.append(OpRecord(o["node"], o["op"], f.names(o["inputs"], f"{at}.inputs", names,
                                                            "a tensor of the spec"),
                                {k: f.plain(v, f"{at}.attrs.{k}") for k, v in attrs.items()},
                                f.text(o["compute"], f"{at}.compute", DTYPES)))
        return SpecRecord(f.text(d["signature"], f"{path}.signature"), tensors, tuple(ops),
                          *(f.text(d[k], f"{path}.{k}", DTYPES)
                            for k in ("io", "intermediate", "compute")))


@dataclass(frozen=True)
class GraphEntry:
    spec: SpecRecord
    plan: PlanRecord

    def to_data(self) -> dict[str, Any]:
        return {"spec": self.spec.to_data(), "plan": self.plan.to_data()}


@dataclass(frozen=True)
class BucketRecord:
    """One bucket: its dim values, per group signature its spec and plan, its memory plan."""

    key: str
    dims: Mapping[str, int]
    graphs: Mapping[str, GraphEntry]
    offsets: Mapping[str, int]  # the memory plan: arena offsets of stored values (bytes)
    arena_bytes: int

    def to_data(self) -> dict[str, Any]:
        return {"key": self.key, "dims": dict(self.dims),
                "graphs": {s: g.to_data() for s, g in self.graphs.items()},
                "memory": {"offsets": dict(self.offsets), "arena_bytes": self.arena_bytes}}

    @staticmethod
    def from_data(d: Any, path: str, graph: GraphRecord, nodes: Mapping[str, Any],
                  signatures: set[str]) -> BucketRecord:
        d = f.mapping(d, path, ("key", "dims", "graphs", "memory"), ())
        syms = {s.name: s for s in graph.syms}
        dims = f.int_map(d["dims"], f"{path}.dims", 0, MAX_DIM)
        for name, value in dims.items():
            s = syms.get(name)
            if s is None or not s.lo <= value <= s.hi or value % s.align:
                f.wrong(f"{path}.dims.{name}", f"{value} is not a value of a dim of the model")
        if set(dims) != set(syms):
            f.wrong(f"{path}.dims", "not a value for every dim of the model")
        if f.text(d["key"], f"{path}.key") != bucket_key(dims):
            f.wrong(f"{path}.key", f"`{d['key'][:40]}` does not name its dims")
        graphs = {}
        for sig, entry in f.mapping(d["graphs"], f"{path}.graphs").items():
            at = f"{path}.graphs.{sig[:40]}"
            if sig not in signatures:
                f.wrong(at, "not the signature of a step")
            entry = f.mapping(entry, at, ("spec", "plan"), ())
            spec = SpecRecord.from_data(entry["spec"], f"{at}.spec", nodes)
            if spec.signature != sig:
                f.wrong(f"{at}.spec.signature", "differs from the graph's key")
            graphs[sig] = GraphEntry(spec, PlanRecord.from_data(entry["plan"], f"{at}.plan"))
        memory = f.mapping(d["memory"], f"{path}.memory", ("offsets", "arena_bytes"), ())
        arena = f.integer(memory["arena_bytes"], f"{path}.memory.arena_bytes", 0, MAX_BYTES)
        offsets = f.int_map(memory["offsets"], f"{path}.memory.offsets", 0, arena)
        for name in offsets:
            f.name_of(name, f"{path}.memory.offsets", nodes)
        return BucketRecord(d["key"], dims, graphs, offsets, arena)


@dataclass(frozen=True)
class StepRecord:
    """One step of the schedule: a cuDNN graph (a fused group) or a fallback kernel (one op, or
    pointwise ops that one kernel computes: `backend.fused`)."""

    kind: str  # graph | kernel
    name: str
    pattern: str
    nodes: tuple[str, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    signature: str
    reason: str
    # a kernel step's buckets (keys) where the tuner kept its graph, measured faster there
    # (`tune.fusion.KernelMeasured.graph_at`); it runs the graph there and between buckets
    graph_at: tuple[str, ...] = ()

    def to_data(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name, "pattern": self.pattern,
                "nodes": list(self.nodes), "inputs": list(self.inputs),
                "outputs": list(self.outputs), "signature": self.signature, "reason": self.reason,
                **({"graph_at": list(self.graph_at)} if self.graph_at else {})}

    @staticmethod
    def from_data(d: Any, path: str, nodes: Mapping[str, Any]) -> StepRecord:
        d = f.mapping(d, path, ("kind", "name", "pattern", "nodes", "inputs", "outputs",
                                "signature"), ("reason", "graph_at"))
        members = f.names(d["nodes"], f"{path}.nodes", nodes, lo=1)
        kind = f.text(d["kind"], f"{path}.kind", ("graph", "kernel"))
        if any(nodes[m].op in SOURCES for m in members):
            f.wrong(f"{path}.nodes", "not the computed nodes of one step")
        step = StepRecord(kind, f.text(d["name"], f"{path}.name"),
                          f.text(d["pattern"], f"{path}.pattern"), members,
                          f.names(d["inputs"], f"{path}.inputs", nodes),
                          f.names(d["outputs"], f"{path}.outputs", members, "a node of the step"),
                          f.text(d["signature"], f"{path}.signature"),
                          f.text(d.get("reason", ""), f"{path}.reason"),
                          tuple(f.text(k, f"{path}.graph_at[{i}]") for i, k in
                                enumerate(f.items(d.get("graph_at", []), f"{path}.graph_at"))))
        if step.graph_at and kind != "kernel":
            f.wrong(f"{path}.graph_at", "a graph step runs its graph at every bucket")
        if step.inputs != outside_reads(nodes, members):
            f.wrong(f"{path}.inputs", "not what the step's nodes read, in order")
        if kind == "kernel" and len(members) > 1:
            why: object = fused.plan_of(nodes, members, step.inputs, step.outputs)
            if isinstance(why, str) and nodes[members[0]].op in gemv.LEADS:
                why = gemv.plan_of(nodes, members, step.inputs, step.outputs)
            if isinstance(why, str):
                f.wrong(f"{path}.nodes", f"not ops one fallback kernel computes: {why}")
        return step


@dataclass(frozen=True)
class Environment:
    """Where a bundle was compiled or tuned (see `dslc.backend.environment`)."""

    cudnn_backend: int | None = None
    cudnn_frontend: str | None = None
    cuda_runtime: int | None = None
    driver: int | None = None
    driver_release: str | None = None
    device_name: str | None = None
    compute_capability: str | None = None
    sm_count: int | None = None
    memory_bytes: int | None = None
    device_properties: str | None = None
    live: bool = False

    def to_data(self) -> dict[str, Any]:
        return {x.name: getattr(self, x.name) for x in fields(self)}

    @staticmethod
    def from_data(d: Any, path: str = "environment") -> Environment:
        d = f.mapping(d, path, (), ENV_FIELDS)
        values: dict[str, Any] = {}
        for x in fields(Environment):
            v, at = d.get(x.name), f"{path}.{x.name}"
            values[x.name] = (f.flag(v if v is not None else False, at) if x.name == "live" else
                              f.opt_integer(v, at, 0, 2**62) if "int" in str(x.type) else
                              None if v is None else f.text(v, at, hi=f.MAX_BLOB))
        return Environment(**values)


ENV_FIELDS = tuple(x.name for x in fields(Environment))
PAYLOAD = ("model", "source", "dslc_version", "created", "manifest", "graph", "load_time",
           "steps", "target", "environment", "buckets")
OPTIONAL = ("calibration",)  # a bundle with fp8 ops: their calibrated amaxes


@dataclass(frozen=True)
class Bundle:
    """A bundle's payload (the envelope is `dslc.runtime.bundle`'s)."""

    model: str
    source: str
    dslc_version: str
    created: str
    manifest: Manifest
    graph: GraphRecord
    load_time: tuple[str, ...]  # values computed from the params alone, once, at load time
    steps: tuple[StepRecord, ...]
    target: str
    environment: Environment
    buckets: tuple[BucketRecord, ...]
    calibration: Calibration | None = None  # `dslc calibrate`: each quantised tensor's amax

    @property
    def uncalibrated(self) -> bool:
        """The graph quantises tensors to fp8 and no calibration gives their amaxes."""
        return self.calibration is None and bool(quantised(self.graph.graph))

    def with_plans(self, plans: Mapping[tuple[str, str], PlanRecord],
                   environment: Environment) -> Bundle:
        """This bundle with other plans (by bucket key and group signature; the rest stay) and
        the environment they were made in (what tuning and `Model.save_plans` write)."""
        buckets = tuple(replace(b, graphs={sig: replace(g, plan=plans.get((b.key, sig), g.plan))
                                           for sig, g in b.graphs.items()})
                        for b in self.buckets)
        return replace(self, buckets=buckets, environment=environment)

    def to_data(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name in PAYLOAD:
            value = getattr(self, name)
            out[name] = (value.to_data() if hasattr(value, "to_data") else list(value)
                         if name == "load_time" else [x.to_data() for x in value]
                         if isinstance(value, tuple) else value)
        for name in OPTIONAL:
            value = getattr(self, name)
            if value is not None:
                out[name] = value.to_data()
        return out

    @staticmethod
    def from_data(d: Any) -> Bundle:
        d = f.mapping(d, "payload", PAYLOAD, OPTIONAL)
        graph = GraphRecord.from_data(d["graph"], "graph")
        nodes = graph.graph.by_name()
        load_time = f.names(d["load_time"], "load_time", nodes)
        steps = tuple(StepRecord.from_data(s, f"steps[{i}]", nodes)
                      for i, s in enumerate(f.items(d["steps"], "steps")))
        _check_schedule(graph, load_time, steps)
        # a kernel step's graph too, where the tuner kept it at a bucket (measured faster there)
        signatures = {s.signature for s in steps}
        buckets = tuple(BucketRecord.from_data(b, f"buckets[{i}]", graph, nodes, signatures)
                        for i, b in enumerate(f.items(d["buckets"], "buckets")))
        if len({b.key for b in buckets}) != len(buckets):
            f.wrong("buckets", "two buckets have one key")
        keys = {b.key: b for b in buckets}
        for i, step in enumerate(steps):
            for key in step.graph_at:
                if key not in keys or step.signature not in keys[key].graphs:
                    f.wrong(f"steps[{i}].graph_at", f"no graph of the step at bucket `{key[:40]}`")
        return Bundle(f.text(d["model"], "model"), f.text(d["source"], "source"),
                      f.text(d["dslc_version"], "dslc_version"), f.text(d["created"], "created"),
                      Manifest.from_data(d["manifest"], graph), graph, load_time, steps,
                      f.text(d["target"], "target"), Environment.from_data(d["environment"]),
                      buckets,
                      None if d.get("calibration") is None else
                      Calibration.from_data(d["calibration"], graph.graph))


def _check_schedule(graph: GraphRecord, load_time: tuple[str, ...],
                    steps: tuple[StepRecord, ...]) -> None:
    """Load-time values come from params alone; each step has a name of its own, reads only
    what is there when it runs (an input, a load-time value, or what an earlier step wrote),
    and writes stored values, not views; the model's outputs are written."""
    nodes = graph.graph.by_name()
    loaded = set(load_time)
    for i, name in enumerate(load_time):
        node = nodes[name]
        if node.op == "input" or any(x not in loaded for x in node.inputs):
            f.wrong(f"load_time[{i}]", f"`{name[:60]}` is not computed from params alone")

    def base(name: str) -> str:
        while nodes[name].op == "view":
            name = nodes[name].inputs[0]
        return name

    there = {n.name for n in graph.graph.nodes if n.op in ("input", "scalar")} | loaded
    named: set[str] = set()
    for i, step in enumerate(steps):
        if step.name in named:  # the runtime keys a step's tensor bindings by its name
            f.wrong(f"steps[{i}].name", f"`{step.name[:60]}` names an earlier step too")
        named.add(step.name)
        for value in step.inputs:
            if base(value) not in there:
                f.wrong(f"steps[{i}].inputs", f"`{value[:60]}` is read before a step writes it")
        for value in step.outputs:
            if nodes[value].op == "view":
                f.wrong(f"steps[{i}].outputs", f"`{value[:60]}` is a view, not a stored value")
            there.add(value)
    for name, value in graph.graph.outputs:
        if base(value) not in there:
            f.wrong("graph.outputs", f"output `{name[:60]}` is never written")
