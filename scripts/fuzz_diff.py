#!/usr/bin/env python3
"""Differential testing with generated programs: N well-typed `.cgraph` programs, each run
through the whole compiler and compared with independent oracles (dslc/fuzz/oracle.py; on a GPU
with --backend cudnn, dslc/fuzz/gpu.py). Failures are listed with the command that reruns each;
--minimize shrinks each failure and saves it as a regression case under tests/fuzz_cases/.

    scripts/fuzz_diff.py --count 500 --seed 1
    scripts/fuzz_diff.py --count 500 --seed 1 --backend cudnn --jobs 8      # on a GPU
    scripts/fuzz_diff.py --seed 1 --only 137 --minimize --save tests/fuzz_cases

Program i of seed S is drawn from Choices(S * 1_000_000 + i): reproducible on any machine.
Exit status: 0 when every program passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dslc.fuzz.choices import Choices
from dslc.fuzz.generate import generate
from dslc.fuzz.oracle import Outcome
from dslc.fuzz.state import Stats


def program_seed(seed: int, index: int) -> int:
    return seed * 1_000_000 + index


# A CUDA error such as an illegal memory access is sticky: the process's context is lost, and
# every later program of the worker would crash too. They are reported `lost` and run again,
# each in a fresh process, once the pool is done.
_STICKY = ("illegal memory access", "ILLEGAL_ADDRESS", "cudaErrorIllegalAddress")
_lost_to: int | None = None


def check_one(args: tuple[int, int, str, bool]) -> tuple[int, Outcome, Stats]:
    global _lost_to
    seed, index, backend, compile_ = args
    stats = Stats()
    if _lost_to is not None:
        return index, Outcome("lost", "run", f"the CUDA context was lost to program {_lost_to}"), \
            stats
    prog = generate(Choices(program_seed(seed, index)), stats)
    outcome = run_backend(prog, program_seed(seed, index), backend, compile_)
    if outcome.status == "crash" and any(s in outcome.detail for s in _STICKY):
        _lost_to = index
    return index, outcome, stats


def run_backend(prog, seed: int, backend: str, compile_: bool) -> Outcome:  # type: ignore[no-untyped-def]
    if backend == "cudnn":
        from dslc.fuzz import gpu

        return gpu.run(prog, seed)
    from dslc.fuzz import oracle

    return oracle.run(prog, seed, compile=compile_)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--count", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--backend", choices=("reference", "cudnn"), default="reference")
    p.add_argument("--no-compile", action="store_true",
                   help="skip the deviceless compile and bundle round trip (reference backend)")
    p.add_argument("--only", type=int, action="append", help="run only program I (repeatable)")
    p.add_argument("--jobs", type=int, default=1, help="worker processes")
    p.add_argument("--minimize", action="store_true", help="shrink each failure")
    p.add_argument("--budget", type=float, default=120.0, help="seconds to shrink each failure")
    p.add_argument("--save", type=Path, help="keep shrunk failures here as regression cases")
    p.add_argument("--show", action="store_true", help="print each program's source")
    p.add_argument("--coverage", action="store_true", help="print the coverage table")
    args = p.parse_args()

    indices = args.only or list(range(args.count))
    work = [(args.seed, i, args.backend, not args.no_compile) for i in indices]
    stats, statuses, skipped = Stats(), Counter[str](), Counter[str]()
    failures: list[tuple[int, Outcome]] = []
    worst: dict[str, float] = {}
    start = time.monotonic()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # On a GPU each worker starts fresh (spawn): CUDA cannot be used after a fork.
    context = multiprocessing.get_context("spawn" if args.backend == "cudnn" else "fork")
    pool = ProcessPoolExecutor(args.jobs, mp_context=context) if args.jobs > 1 else None
    results = pool.map(check_one, work, chunksize=4) if pool else map(check_one, work)
    lost: list[int] = []
    for done, (index, outcome, st) in enumerate(_again_if_lost(results, work, args, lost), 1):
        _merge(stats, st)
        statuses[outcome.status] += 1
        for name, err in outcome.errors.items():
            worst[name] = max(worst.get(name, 0.0), err)
        if args.show:
            print(generate(Choices(program_seed(args.seed, index))).source())
        if outcome.skipped:
            skipped[outcome.skipped] += 1
        if outcome.failed:
            failures.append((index, outcome))
            lines = outcome.detail.splitlines() or [""]
            more = "".join(f"\n    {line}" for line in lines[1:14])
            print(f"FAIL program {index}: {outcome.status} at {outcome.stage}: {lines[0]}{more}\n"
                  f"  rerun: scripts/fuzz_diff.py --seed {args.seed} --only {index} "
                  f"--backend {args.backend} --show", flush=True)
        if done % 50 == 0 or done == len(work):
            print(f"[{done}/{len(work)}] {dict(statuses)} {time.monotonic() - start:.0f} s",
                  flush=True)
    if pool:
        pool.shutdown()
    if args.minimize:
        for index, outcome in failures:
            _minimize(args, index, outcome)
    if args.coverage:
        print(stats.table())
    for why, count in skipped.items():
        print(f"oracle not applied to {count} programs: {why}")
    print(f"{len(work)} programs (seed {args.seed}, backend {args.backend}): "
          f"{statuses['ok']} passed, {len(failures)} failed "
          f"({', '.join(f'{k} {v}' for k, v in statuses.items() if k != 'ok') or 'none'}) "
          f"in {time.monotonic() - start:.0f} s; largest relative error "
          f"{max(worst.values(), default=0.0):.2e}")
    return 1 if failures else 0


def _again_if_lost(results, work, args, lost):  # type: ignore[no-untyped-def]
    """The results, with the programs lost to another's sticky CUDA error run again, each in a
    process of its own (a crash there loses no other program, so one round ends it)."""
    while True:
        for index, outcome, st in results:
            if outcome.status == "lost":
                lost.append(index)
            else:
                yield index, outcome, st
        if not lost:
            return
        print(f"running {len(lost)} programs again in fresh processes (a CUDA context was lost)",
              flush=True)
        again = [w for w in work if w[1] in set(lost)]
        lost.clear()
        fresh = ProcessPoolExecutor(max(args.jobs, 1), max_tasks_per_child=1,
                                    mp_context=multiprocessing.get_context("spawn"))
        results = list(fresh.map(check_one, again))
        fresh.shutdown()


def _merge(total: Stats, part: Stats) -> None:
    total.ops.update(part.ops)
    total.pairs.update(part.pairs)
    total.rejected.update(part.rejected)
    total.features.update(part.features)
    total.programs += part.programs


def _minimize(args: argparse.Namespace, index: int, outcome: Outcome) -> None:
    from dslc.fuzz.shrink import replay, save_case, shrink

    seed = program_seed(args.seed, index)
    first = Choices(seed)
    generate(first)

    def test(prog):  # type: ignore[no-untyped-def]
        return run_backend(prog, seed, args.backend, not args.no_compile)

    print(f"shrinking program {index} ({len(first.record)} choices)...", flush=True)
    best = shrink(first.record, test, outcome.signature, args.budget,
                  log=lambda m: print("  " + m, flush=True))
    prog, _ = replay(best)
    print(prog.source())
    if args.save:
        name = f"seed{args.seed}_{index}_{outcome.status}"
        command = (f"pytest tests/test_fuzz_diff.py -k {name}  (found by scripts/fuzz_diff.py "
                   f"--seed {args.seed} --only {index})")
        path = save_case(prog, seed, outcome, args.save, name, command)
        print(f"saved {path} and {path.with_suffix('.npz')}")


if __name__ == "__main__":
    sys.exit(main())
