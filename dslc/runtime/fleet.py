"""Start-up's use of the tuning database: before a replica re-tunes (its GPU or cuDNN differs
from the bundle's), it looks for plans measured in an equal environment; only a key nobody has
measured is measured, by one replica under the key's lease, and published for the rest. The
others go on to the keys nobody holds, then wait for the ones held, up to `wait_s`, and take
the heuristics' plan for what is still missing then: a start is never failed or held without
bound by the database.

Replicas walk the keys in the same order, so while one measures a key the next takes the one
after: a fleet starting at once measures each key once, spread over its replicas, and the total
measuring work is one replica's.

`consult` is all of it; the measuring itself is a function given to it (the GPU's in
`dslc.runtime.model`, a fake one in the tests, which have no GPU).
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from dslc.backend.spec import GroupSpec
from dslc.runtime.records import BucketRecord, Environment, PlanRecord
from dslc.runtime.startup import Decision
from dslc.runtime.tuningdb import TuningStore, Unavailable, env_key, measured, spec_key, validated


@dataclass(frozen=True)
class FleetOptions:
    wait_s: float = 120.0  # for another replica's measurement, then the heuristics' plan
    poll_s: float = 0.5  # how often a waiting replica looks again
    lease_s: float = 600.0  # longer than a measurement; a dead holder's lease expires by it


@dataclass(frozen=True)
class Wanted:
    """A group graph a start-up needs a plan for."""

    signature: str
    spec: GroupSpec
    where: str  # for messages: "group layer1.0.conv1 (27b2...) at N=32"


@dataclass(frozen=True)
class Outcome:
    how: str  # database (measured elsewhere) | tuned (measured here) | heuristics
    plan: PlanRecord | None  # with its serialized plan if measured here or under this driver


Measure = Callable[[Wanted], PlanRecord | None]  # a validated plan measured here, or None
NO_PLAN = PlanRecord(None, {}, 0, None, note="measured: no candidate was valid", tuned=True)


def holder_id() -> str:
    """Who holds a lease: this process on this host, unique across restarts."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def wanted_in(bucket: BucketRecord, names: Mapping[str, str]) -> list[Wanted]:
    """The graphs of one bucket, in the bundle's order (the same on every replica)."""
    return [Wanted(sig, GroupSpec.from_data(entry.spec.to_data()),
                   f"group {names.get(sig, sig)} ({sig}) at {bucket.key}")
            for sig, entry in bucket.graphs.items()]


def consult(db: TuningStore | None, live: Environment, decision: Decision,
            wanted: list[Wanted], measure: Measure, log: logging.Logger,
            options: FleetOptions = FleetOptions()) -> dict[str, Outcome]:
    """By signature, what the database gives where start-up would not trust the saved plans:
    on `retune`, a plan for every graph (the database's, measured here, or the heuristics');
    on `replay` (cuDNN changed) and `heuristic` (the policy says measure nothing), the
    database's plans where it has them (the rest replay, or take the heuristics', as before).
    Nothing on `restore` and `retime` (the bundle's own candidates, timed here)."""
    if db is None or decision.action not in ("replay", "heuristic", "retune"):
        return {}
    return plans_for(db, env_key(live), wanted, measure if decision.action == "retune" else None,
                     log, options, driver=live.driver)


def plans_for(db: TuningStore, env: str, wanted: list[Wanted], measure: Measure | None,
              log: logging.Logger, options: FleetOptions = FleetOptions(),
              holder: str | None = None, clock: Callable[[], float] = time.monotonic,
              sleep: Callable[[float], None] = time.sleep,
              driver: int | None = None) -> dict[str, Outcome]:
    """`driver`: this host's; plans serialized under the same one are restored from their
    bytes (as fast as a bundle's), the others replayed from their engine and knobs."""
    holder = holder or holder_id()
    keys = {w.signature: spec_key(w.spec) for w in wanted}
    out: dict[str, Outcome] = {}
    pending = list(wanted)
    deadline = clock() + options.wait_s
    try:
        while pending:
            waiting = []
            for w in pending:
                outcome = _one(db, env, keys[w.signature], w, measure, holder, options, log,
                               driver)
                if outcome is not None:
                    out[w.signature] = outcome
                elif measure is not None:
                    waiting.append(w)
            pending = waiting
            if pending and clock() >= deadline:
                for w in pending:
                    log.info("%s: another replica is still measuring it after %.0f s; took the "
                             "heuristics' plan", w.where, options.wait_s)
                    out[w.signature] = Outcome("heuristics", None)
                break
            if pending:
                sleep(options.poll_s)
    except Unavailable as err:  # a store without a local fallback, gone
        log.warning("%s; the heuristics' plans for the graphs still missing", err)
        for w in wanted:
            out.setdefault(w.signature, Outcome("heuristics", None))
    return out


def _one(db: TuningStore, env: str, key: str, w: Wanted, measure: Measure | None, holder: str,
         options: FleetOptions, log: logging.Logger, driver: int | None) -> Outcome | None:
    """The outcome of one graph now, or None: another replica holds its lease (or, `measure`
    None, the database has nothing for it)."""
    found = _found(db, env, key, w, log, measure is not None, driver)
    if found is not None or measure is None:
        return found
    if not db.lease(env, key, holder, options.lease_s):
        return None
    try:
        found = _found(db, env, key, w, log, True, driver)  # published between the look and the lease
        if found is not None:
            return found
        try:
            plan = measure(w)
        except Exception as err:  # a start never fails for want of a measurement
            log.warning("%s: measuring failed (%s); the heuristics' plan", w.where, err)
            return Outcome("heuristics", None)
        if plan is None or not validated(plan):
            db.put(env, key, measured(NO_PLAN))  # the waiting replicas stop waiting
            log.info("%s: no measured candidate was valid; the heuristics' plan", w.where)
            return Outcome("heuristics", None)
        db.put(env, key, measured(plan, driver=driver))
        log.info("%s: measured here (engine %s, %.4f ms) and published", w.where, plan.engine_id,
                 plan.ms)
        return Outcome("tuned", plan)
    finally:
        db.release(env, key, holder)


def _found(db: TuningStore, env: str, key: str, w: Wanted, log: logging.Logger,
           tuning: bool, driver: int | None) -> Outcome | None:
    entry = db.get(env, key)
    if entry is None:
        return None
    if not entry.validated:  # measured, and nothing was valid: no use measuring again now
        return Outcome("heuristics", None) if tuning else None
    log.info("%s: plan measured on %s at %s (engine %s, %.4f ms)", w.where, entry.host, entry.at,
             entry.plan.engine_id, entry.plan.ms)
    return Outcome("database", entry.plan_for(driver))
