"""Shrinking a failing program, and keeping it as a regression case.

A program is a function of its choice sequence (`choices.py`), and every sequence gives a
well-typed program, so shrinking works on the sequence, as Hypothesis does: delete runs of
choices, then lower single choices (0, half, one less), keeping any change after which the
program still fails the same way. The result is the shortlex-smallest sequence found within the
time budget; the printed program keeps only what its outputs need.

A kept case is `NAME.cgraph` (the program, with a header saying what failed and how to rerun
it) and `NAME.npz` (its dims, inputs, weights, and PyTorch's outputs, the expected result).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from dslc.fuzz.choices import Choices, Exhausted
from dslc.fuzz.generate import generate
from dslc.fuzz.oracle import Case, Outcome, run_case
from dslc.fuzz.program import Program

Test = Callable[[Program], Outcome]


def replay(sequence: list[int]) -> tuple[Program, list[int]]:
    """The program a sequence gives, and the choices it actually used."""
    ch = Choices(replay=sequence)
    prog = generate(ch)
    return prog, ch.record


def _spans(sequence: list[int]) -> list[tuple[int, int]]:
    ch = Choices(replay=sequence)
    generate(ch)
    return ch.spans


def _key(seq: list[int]) -> tuple[int, list[int]]:
    return len(seq), seq


def shrink(sequence: list[int], test: Test, want: tuple[str, str, str],
           budget_s: float = 120.0, log: Callable[[str], None] | None = None) -> list[int]:
    """The smallest sequence found whose program fails with the signature `want`."""
    deadline = time.monotonic() + budget_s
    best = list(sequence)
    tried: set[tuple[int, ...]] = set()
    verdicts: dict[str, bool] = {}  # by source: many sequences print the same live program

    def fails(candidate: list[int]) -> bool:
        nonlocal best
        key = tuple(candidate)
        if key in tried or time.monotonic() > deadline:
            return False
        tried.add(key)
        try:
            prog, used = replay(candidate)
        except Exhausted:
            return False
        if _key(used) >= _key(best):
            return False
        source = prog.source()
        if source not in verdicts:
            verdicts[source] = test(prog).signature == want
        if not verdicts[source]:
            return False
        best = used
        if log:
            log(f"shrunk to {len(best)} choices, {len(prog.source().splitlines())} lines")
        return True

    improved = True
    while improved and time.monotonic() < deadline:
        improved = False
        # Whole op applications first, the last ones first (later ops read earlier ones).
        for start, stop in reversed(_spans(best)):
            if stop <= len(best) and fails(best[:start] + best[stop:]):
                improved = True
        for k in (8, 4, 2, 1):
            i = 0
            while i < len(best):
                if fails(best[:i] + best[i + k:]):
                    improved = True
                else:
                    i += 1
        for i in range(len(best)):
            for lower in (0, best[i] // 2, best[i] - 1) if i < len(best) else ():
                if 0 <= lower < best[i] and fails([*best[:i], lower, *best[i + 1:]]):
                    improved = True
                    break
    return best


def save_case(prog: Program, seed: int, outcome: Outcome, directory: Path, name: str,
              command: str) -> Path:
    """Write the shrunk program and its inputs, weights and expected outputs."""
    case = Case.of(prog, seed)
    run_case(case, torch_oracle=True, compile=False)  # draws inputs and PyTorch's outputs
    directory.mkdir(parents=True, exist_ok=True)
    header = [f"# Found by the program generator: {outcome.status} at {outcome.stage}",
              f"#   {outcome.detail.splitlines()[0] if outcome.detail else ''}",
              f"# Rerun: {command}",
              "# Expected: the reference executor equals PyTorch's outputs in the .npz beside"
              " this file."]
    path = directory / f"{name}.cgraph"
    path.write_text("\n".join(header) + "\n" + case.source)
    arrays: dict[str, np.ndarray] = {f"dim:{k}": np.asarray(v) for k, v in case.run_dims.items()}
    arrays.update({f"input:{k}": np.asarray(v, np.float32) for k, v in (case.inputs or {}).items()})
    arrays.update({f"weight:{k}": np.asarray(v, np.float32)
                   for k, v in (case.weights or {}).items()})
    arrays.update({f"expected:{k}": np.asarray(v) for k, v in (case.expected or {}).items()})
    with open(directory / f"{name}.npz", "wb") as f:
        np.savez(f, **arrays)  # type: ignore[arg-type]
    return path


def load_case(path: Path) -> Case:
    """A saved case, ready for `run_case` (inputs and weights cast back to declared dtypes by
    the interpreter and the translation, which read them as they are declared)."""
    data = np.load(path.with_suffix(".npz"))
    part = {kind: {k.split(":", 1)[1]: data[k] for k in data.files if k.startswith(kind + ":")}
            for kind in ("dim", "input", "weight", "expected")}
    return Case(path.read_text(), {k: int(v) for k, v in part["dim"].items()},
                inputs=part["input"], weights=part["weight"], expected=part["expected"])
