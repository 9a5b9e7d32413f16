"""Compiled model -> bundle records (`dslc.runtime.records`; schema in `dslc.runtime.bundle`),
written atomically, alone or together with the files that go with it (its runner, its weights).
What is written is validated as a reader would, so a bundle that `write` accepts is one that
`dslc.runtime.bundle.load` reads."""

from __future__ import annotations

import dataclasses
import datetime
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from dslc import __version__, fsutil
from dslc.backend import environment
from dslc.compile.stage import Compiled
from dslc.core.dims import bucket_key
from dslc.emit.manifest import manifest_record
from dslc.runtime import bundle
from dslc.runtime.irdata import GraphRecord
from dslc.runtime.records import (
    BucketRecord,
    Bundle,
    Environment,
    GraphEntry,
    PlanRecord,
    SpecRecord,
    StepRecord,
)
from dslc.runtime.schedule import Schedule, check_buckets


def _plan(compiled: Compiled, key: tuple[str, str]) -> PlanRecord:
    b = compiled.builds[key]
    return PlanRecord(b.engine_id, dict(b.knobs), b.workspace, b.serialized, note=b.note,
                      candidates=b.candidates, tuned=False,
                      built_on_device=compiled.target.live and b.has_plan,
                      build_s=None if _fixed_clock() else round(b.build_s, 4))


def _fixed_clock() -> str | None:
    """SOURCE_DATE_EPOCH (seconds since 1970, as in reproducible builds): where set, the bundle
    records that time and no measured build times, so two builds of one source compare byte for
    byte."""
    fixed = os.environ.get("SOURCE_DATE_EPOCH", "").strip()
    return fixed if fixed.isdigit() else None


def _created() -> str:
    fixed = _fixed_clock()
    when = (datetime.datetime.fromtimestamp(int(fixed), datetime.UTC) if fixed
            else datetime.datetime.now(datetime.UTC))
    return when.isoformat(timespec="seconds")


def records(compiled: Compiled) -> Bundle:
    """The bundle of a compiled model (plans as built; `dslc.tune` measures them)."""
    model = compiled.model
    graph = GraphRecord.of(compiled.graph, model.env)
    steps = tuple(StepRecord(s.kind, s.group.name, s.group.pattern, s.group.nodes,
                             s.group.inputs, s.group.outputs, s.group.signature, s.reason)
                  for s in compiled.steps)
    env = (environment.live(properties=True) if compiled.target.live
           else environment.from_profile(compiled.target.properties_json))
    out = Bundle(model.name, model.file, __version__,
                 _created(),
                 manifest_record(model, record=graph), graph,
                 tuple(compiled.plan.load_time), steps, compiled.target.name,
                 Environment.from_data(env), ())
    program = Schedule(out)
    nodes = program.nodes
    buckets = []
    for b in compiled.buckets:
        key = bucket_key(b)
        graphs = {sig: GraphEntry(SpecRecord.from_data(compiled.specs[(k, sig)].data(),
                                                       f"buckets.{key}.{sig}", nodes),
                                  _plan(compiled, (k, sig)))
                  for (k, sig) in compiled.specs if k == key}
        memory = program.memory_plan(b)
        buckets.append(BucketRecord(key, dict(b), graphs, memory.offsets, memory.arena))
    return dataclasses.replace(out, buckets=tuple(buckets))


def payload(compiled: Compiled) -> dict[str, Any]:
    """The bundle's plain data (as a reader of the file sees it)."""
    return records(compiled).to_data()


def write(path: Path, data: Bundle | Mapping[str, Any]) -> None:
    """Validate (BundleError: a bug in whoever made `data`), then write atomically."""
    record = data if isinstance(data, Bundle) else Bundle.from_data(data)
    check_buckets(Schedule(record))
    fsutil.write_bytes(path, bundle.pack(record))


def write_with(path: Path, data: Bundle | Mapping[str, Any],
               beside: list[tuple[Path, Callable[[str], object]]]) -> None:
    """The bundle and the files made with it, replaced together (`fsutil.replace_together`): a
    failed write leaves the previous set, and the bundle is replaced last."""
    record = data if isinstance(data, Bundle) else Bundle.from_data(data)
    check_buckets(Schedule(record))
    packed = bundle.pack(record)
    fsutil.replace_together([(path, lambda tmp: Path(tmp).write_bytes(packed)), *beside])
