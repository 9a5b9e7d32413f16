"""fp8 as a measured choice (`dslc compile --fp8 auto`): of the ops a model asks to compute in
fp8, keep those that make it faster on this GPU, within an error budget on representative
inputs.

fp8 pays where a matmul is wide: on the H200 PyTorch's fp8 matmul ran 1.81x its fp16 one at
8192^3 but 0.76x to 1.19x at a GPT block's K = 768, and dslc's fp8 GPT blocks, with their
quantising casts, ran at 0.86x fp16 (docs/benchmarks.md). So each op is measured where it runs:
the whole model timed with that op alone in fp8, against the model in fp16 (a whole-model time
counts what the op's quantising casts and its epilogue cost, wherever they fuse). Ops that
compute the same thing at the same sizes (a repeated block's projections: `alike`) are one
candidate, measured and kept together: one of sixteen matmuls alone moves a model's time less
than the noise of timing it (the 4 GPT blocks, 2026-12-03), the four of one kind do not, and a
ResNet's repeated bottlenecks share their convolutions' kinds (fewer builds). The kinds that
make it faster are kept; while the model's error on the samples is past the budget, the one
that gains least is dropped; and a set that together is not faster than fp16 by more than the
noise a tuned plan must beat (`measure.NOISE`) is dropped whole: fp8 chosen this way is never
slower than the fp16 model as measured.

The measuring and the error are functions given to `decide` (`dslc.pipeline.choose_fp8`
times and checks compiled models on the GPU), so the rule is tested on its own. A model that
does not build or run with an op in fp8 measures as infinitely slow for it; an error that is
not a number counts as past any budget.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from dslc.backend.measure import NOISE

Measure = Callable[[frozenset[str]], float]  # the model's ms with these ops in fp8
ErrorOf = Callable[[frozenset[str]], float]  # its output error with these ops in fp8


@dataclass
class OpTime:
    op: str  # the node asking for fp8 (the first of its kind)
    ms: float  # the model's time with this op (and those alike) alone in fp8
    chosen: bool = False
    why: str = ""
    alike: frozenset[str] = frozenset()  # the ops decided with it, itself included

    @property
    def ops(self) -> frozenset[str]:
        return self.alike or frozenset({self.op})


@dataclass
class Decision:
    """What `--fp8 auto` measured and chose."""

    fp16_ms: float
    ops: list[OpTime] = field(default_factory=list)
    ms: float = 0.0  # the model with the chosen ops in fp8 (fp16_ms where none is)
    error: float = 0.0  # its output error on the samples (0 where none is chosen)
    max_error: float = 0.0

    @property
    def measured(self) -> frozenset[str]:
        """Every op asking for fp8, measured alone or with those alike."""
        return frozenset().union(*(o.ops for o in self.ops))

    @property
    def chosen(self) -> frozenset[str]:
        """The ops computed in fp8."""
        return frozenset().union(*(o.ops for o in self.ops if o.chosen))

    def table(self) -> list[str]:
        """One line per op, then the model's choice: what `dslc compile` prints."""
        lines = [f"{'op':<40} {'fp8 ms':>9} {'fp16 ms':>9}  choice"]
        for o in self.ops:
            name = o.op if len(o.ops) == 1 else f"{o.op} and {len(o.ops) - 1} alike"
            lines.append(f"{name[:40]:<40} {o.ms:>9.4f} {self.fp16_ms:>9.4f}  "
                         f"{'fp8' if o.chosen else 'fp16'}: {o.why}")
        total = sum(len(o.ops) for o in self.ops)
        lines.append(f"model: {self.ms:.4f} ms with {len(self.chosen)} of {total} ops "
                     f"in fp8, against {self.fp16_ms:.4f} ms in fp16; error on the samples "
                     f"{self.error:.2e} (budget {self.max_error:.2e})")
        return lines

    def reason(self, op: str) -> str:
        """What a step running `op` says of the choice (`dslc inspect` shows it)."""
        o = next(o for o in self.ops if op in o.ops)
        those = "this op" if len(o.ops) == 1 else f"this op and {len(o.ops) - 1} alike"
        return (f"fp8 measured: the model {o.ms:.4f} ms with {those} in fp8, {self.fp16_ms:.4f} "
                f"ms in fp16: {'fp8' if o.chosen else 'fp16'} ({o.why}); with the "
                f"{len(self.chosen)} chosen {self.ms:.4f} ms, error {self.error:.2e}")


def decide(candidates: Collection[str] | Collection[frozenset[str]], measure: Measure,
           error_of: ErrorOf, max_error: float) -> Decision:
    """The ops of `candidates` to compute in fp8 (op names, or sets of ops alike decided
    together): each that alone makes the model faster, within `max_error` together (the
    smallest gain dropped first), and none where together they are no faster than the model
    in fp16."""
    kinds = sorted((frozenset({c}) if isinstance(c, str) else frozenset(c) for c in candidates),
                   key=min)
    out = Decision(measure(frozenset()), max_error=max_error)
    out.ops = [OpTime(min(k), measure(k), alike=k if len(k) > 1 else frozenset())
               for k in kinds]
    for o in out.ops:
        o.chosen = o.ms < out.fp16_ms
        o.why = "faster" if o.chosen else "no faster"
    own = error_of(frozenset()) if out.chosen else 0.0
    if not own <= max_error:  # NaN too: the budget cannot hold whatever fp8 adds
        for o in out.ops:
            if o.chosen:
                o.chosen, o.why = False, f"faster, but the model's own error is {own:.2e}"
    gain = {o.op: out.fp16_ms - o.ms for o in out.ops}
    out.error = error_of(out.chosen) if out.chosen else 0.0
    while out.chosen and not out.error <= max_error:
        o = min((o for o in out.ops if o.chosen), key=lambda o: (gain[o.op], o.op))
        o.chosen, o.why = False, f"faster, but the error with it was {out.error:.2e}"
        out.error = error_of(out.chosen) if out.chosen else 0.0
    out.ms = measure(out.chosen) if out.chosen else out.fp16_ms
    if out.chosen and not out.ms < out.fp16_ms * (1 - NOISE):
        for o in out.ops:
            if o.chosen:
                o.chosen, o.why = False, (f"faster alone, but with the others {out.ms:.4f} ms, "
                                          f"not {NOISE:.0%} faster than fp16")
        out.ms, out.error = out.fp16_ms, 0.0
    return out
