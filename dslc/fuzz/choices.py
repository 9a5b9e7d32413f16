"""Where the generator's decisions come from: a seeded random source, or a recorded sequence of
choices replayed (to reproduce a program exactly, or to try a shrunk variant of it).

Every decision is an integer in 0..n-1, and 0 is always the simplest answer (fewest ops, smallest
size, no optional feature), so a sequence shrinks by deleting entries and lowering them; a
replayed sequence that runs out answers 0. This is how Hypothesis shrinks; the generator stays a
plain function of its choices, so any sequence gives a well-typed program.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")


class Exhausted(Exception):
    """A replayed run made far more choices than it was given (a runaway generator)."""


class Choices:
    def __init__(self, seed: int | None = None, replay: Sequence[int] | None = None) -> None:
        self.rng = random.Random(seed)
        self.replay = list(replay) if replay is not None else None
        self.record: list[int] = []
        self.spans: list[tuple[int, int]] = []  # the choices of each unit (an op family's try)

    def begin(self) -> int:
        return len(self.record)

    def end(self, start: int) -> None:
        """Mark the choices made since `start` as one unit: the shrinker deletes it whole."""
        if len(self.record) > start:
            self.spans.append((start, len(self.record)))

    def below(self, n: int) -> int:
        """An integer in 0..n-1 (0 when n <= 1)."""
        if n <= 1:
            self.record.append(0)
            return 0
        if self.replay is None:
            value = self.rng.randrange(n)
        else:
            i = len(self.record)
            if i > 4 * len(self.replay) + 10_000:
                raise Exhausted(f"{i} choices from a sequence of {len(self.replay)}")
            value = min(self.replay[i], n - 1) if i < len(self.replay) else 0
        self.record.append(value)
        return value

    def between(self, lo: int, hi: int) -> int:
        """An integer in lo..hi, shrinking towards lo."""
        return lo + self.below(hi - lo + 1)

    def pick(self, items: Sequence[T]) -> T:
        """One of `items`, shrinking towards the first."""
        return items[self.below(len(items))]

    def coin(self, p: float) -> bool:
        """True with probability p; shrinks towards False (the feature left out)."""
        return self.below(1000) >= round(1000 * (1 - p))

    def subset(self, items: Sequence[T], at_least: int = 1) -> list[T]:
        """A non-empty (at least `at_least`) ordered subset of `items`."""
        count = self.between(at_least, len(items))
        pool = list(items)
        return sorted((pool.pop(self.below(len(pool))) for _ in range(count)), key=items.index)
