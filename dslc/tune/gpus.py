"""Tuning across the GPUs of a host (`--gpus all|0,1`): the bundle's distinct graphs are spread
over one process per GPU, each measures its share as `tune` does (with the tuning database
shared), and the parent merges what they chose into one set of plans.

Spreading: the graphs of one key (the same cuDNN graph at the same size) go to one GPU, so
each is measured once; the keys are dealt largest first to the GPU with the least work so far
(work estimated by the elements the graph's tensors hold), so the shares come out even.
Merging: every (bucket, graph) gets the plan of the one process that measured it; the GPUs must
be of one kind (one environment key), since a bundle records one environment: plans measured on
an H200 and an H100 cannot go into one bundle, and the merge says so.

Each worker is a fresh process (spawn: CUDA does not survive a fork) that sees only its GPU
(`CUDA_VISIBLE_DEVICES`), so the measuring code is the single-GPU one.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from dslc.backend.spec import GroupSpec
from dslc.runtime.records import Bundle, PlanRecord
from dslc.runtime.tuningdb import TuningStore, env_key, spec_key
from dslc.tune import Report, Tuned, tune

Job = tuple[str, str]  # (bucket key, group signature)


class SpreadError(Exception):
    """A `--gpus` value that names no GPUs here, or shares that cannot be merged: one sentence."""


@dataclass(frozen=True)
class Share:
    """What one worker is given: the GPU, the jobs, how to tune."""

    gpu: int
    jobs: frozenset[Job]
    db: TuningStore | None
    budget_s: float
    model_budget_s: float
    search: str


TuneShare = Callable[[Bundle, Share], Tuned]


def parse_gpus(text: str, count: int | None) -> list[int] | None:
    """`all` or `0,1,...`: the GPUs of this host to tune on (None: all, when `count`, how many
    this host has, is not known yet); SpreadError naming what is wrong."""
    if text.strip() == "all":
        gpus = None
    else:
        try:
            gpus = [int(part) for part in text.split(",")]
        except ValueError:
            raise SpreadError(f"`--gpus {text}`: write `all` or GPU numbers such as 0,1") from None
        if len(set(gpus)) != len(gpus):
            raise SpreadError(f"`--gpus {text}` names a GPU twice")
    if count is None:
        return gpus
    if count < 1:
        raise SpreadError(f"`--gpus {text}`: this machine has no GPU")
    if gpus is None:
        return list(range(count))
    wrong = [g for g in gpus if not 0 <= g < count]
    if wrong:
        raise SpreadError(f"`--gpus {text}`: there is no GPU {wrong[0]} here (this machine has "
                          f"{count}: 0..{count - 1})")
    return gpus


def cost(spec: GroupSpec) -> int:
    """A graph's measuring work, roughly: the elements its tensors hold."""
    return sum(math.prod(t.dims) for t in spec.tensors)


def spread(bundle: Bundle, gpus: list[int]) -> dict[int, frozenset[Job]]:
    """The jobs of each GPU: one key's jobs together, the largest keys first to the least
    loaded GPU (ties: the lower GPU number)."""
    by_key: dict[str, list[Job]] = {}
    costs: dict[str, int] = {}
    for bucket in bundle.buckets:
        for signature, entry in bucket.graphs.items():
            spec = GroupSpec.from_data(entry.spec.to_data())
            key = spec_key(spec)
            by_key.setdefault(key, []).append((bucket.key, signature))
            costs[key] = cost(spec)
    load = {gpu: 0 for gpu in gpus}
    shares: dict[int, set[Job]] = {gpu: set() for gpu in gpus}
    for key in sorted(by_key, key=lambda k: (-costs[k], k)):
        gpu = min(gpus, key=lambda g: (load[g], g))
        load[gpu] += costs[key]
        shares[gpu].update(by_key[key])
    return {gpu: frozenset(jobs) for gpu, jobs in shares.items()}


def merge(bundle: Bundle, results: Mapping[int, Tuned], seconds: float) -> Tuned:
    """One result from the workers': plans from the worker that measured each (bucket, graph),
    report rows in the bundle's order, the environment they all share."""
    kinds: dict[str, int] = {}  # environment key -> the first GPU of that kind
    for gpu in sorted(results):
        kinds.setdefault(env_key(results[gpu].environment), gpu)
    if len(kinds) > 1:
        a, b = list(kinds.values())[:2]
        raise SpreadError(f"GPUs {a} and {b} differ ({_kind(results[a])}; {_kind(results[b])}): "
                          "a bundle records one environment, so tune on GPUs of one kind")
    plans: dict[Job, PlanRecord] = {}
    rows = []
    for gpu in sorted(results):
        for job, plan in results[gpu].plans.items():
            if job in plans:
                raise SpreadError(f"{job[1]} at {job[0]} was measured twice (a bug in dslc)")
            plans[job] = plan
        rows.extend(results[gpu].report.rows)
    order = {job: i for i, job in enumerate((b.key, sig) for b in bundle.buckets
                                            for sig in b.graphs)}
    rows.sort(key=lambda r: order.get((r.bucket, r.signature), len(order)))
    first = results[min(results)]
    return Tuned(plans, first.environment, Report(rows, seconds))


def _kind(tuned: Tuned) -> str:
    env = tuned.environment
    return f"{env.device_name} with cuDNN {env.cudnn_backend}"


def visible(gpu: int, parent: str | None) -> str:
    """What a worker on GPU `gpu` sets CUDA_VISIBLE_DEVICES to: GPUs are numbered as this
    process sees them, so within the parent's own CUDA_VISIBLE_DEVICES where it has one (a
    scheduler gave it GPUs 2 and 3: `--gpus 1` is GPU 3)."""
    ids = [part.strip() for part in (parent or "").split(",") if part.strip()]
    return ids[gpu] if gpu < len(ids) else str(gpu)


def tune_share(bundle: Bundle, share: Share) -> Tuned:
    """A worker: this GPU only, then `tune` over the share's jobs (GPU)."""
    # Before CUDA is first touched in this process (importing cupy or cudnn does not).
    os.environ["CUDA_VISIBLE_DEVICES"] = visible(share.gpu, os.environ.get("CUDA_VISIBLE_DEVICES"))
    tuned = tune(bundle, share.db, share.budget_s, share.model_budget_s, share.search,
                 only=share.jobs)
    rows = [replace(r, gpu=share.gpu) for r in tuned.report.rows]
    return replace(tuned, report=replace(tuned.report, rows=rows))


def _worker(work: TuneShare, bundle: Bundle, share: Share, conn: Any) -> None:
    try:
        conn.send(("ok", work(bundle, share)))
    except BaseException as err:  # said by the parent, with the GPU's number
        conn.send(("failed", f"{type(err).__name__}: {err}"))
    finally:
        conn.close()


def across(bundle: Bundle, gpus: list[int], db: TuningStore | None, budget_s: float,
           model_budget_s: float, search: str, work: TuneShare = tune_share,
           context: str = "spawn") -> Tuned:
    """Tune `bundle` with one process per GPU of `gpus` and merge (SpreadError if a worker
    fails or the GPUs differ)."""
    started = time.perf_counter()
    ctx: Any = multiprocessing.get_context(context)  # typed by the method's name, not a str
    running = []
    for gpu, jobs in spread(bundle, gpus).items():
        if not jobs:
            continue
        share = Share(gpu, jobs, db, budget_s, model_budget_s, search)
        ours, theirs = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_worker, args=(work, bundle, share, theirs))
        proc.start()
        theirs.close()
        running.append((gpu, proc, ours))
    results: dict[int, Tuned] = {}
    failures = []
    for gpu, proc, conn in running:
        try:
            status, value = conn.recv()
        except EOFError:
            status, value = "failed", "the process ended without a result"
        proc.join()
        if status == "ok":
            results[gpu] = value
        else:
            failures.append(f"GPU {gpu}: {value}")
    if failures:
        raise SpreadError(f"tuning failed on {'; '.join(failures)}")
    return merge(bundle, results, time.perf_counter() - started)
