"""Mutation fuzzing of the front end: token-level mutants of the example models must never crash it.

Each source in `models/` and the bundled `std/nn.cgraph` is split into tokens with the grammar's own
Lark lexer; every mutant deletes, duplicates, swaps, replaces or inserts tokens (replacements and
insertions draw from the tokens seen in the whole corpus, plus a few edge-case literals). The only
allowed outcomes of `front_end` on a mutant are a clean check or coded diagnostics whose spans lie
inside a file the program read; any exception escaping the checker is a bug, reported with the
mutant's text and the traceback. Every diagnostic must also render (human, JSON, GitHub) without
raising and without a traceback in its text.

The run is deterministic: the random generator of each corpus file is seeded from its name, so a
failure names a mutant that is reproduced by running the test again. `CASES` sets the budget per
file (the costlier a file is to check, the fewer mutants).
"""

from __future__ import annotations

import itertools
import json
import os
import random
import re
import shutil
import traceback
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from dslc.check import context as check_context
from dslc.diag.codes import CODES
from dslc.diag.diagnostic import Diagnostic, Sink
from dslc.diag.render import render, render_human
from dslc.diag.span import SourceMap, Span
from dslc.parse.grammar import lark_parser
from dslc.pipeline import Options, front_end
from tests.conftest import ROOT
from tests.helpers import note_seed

MODELS = ROOT / "models"
STD_NN = ROOT / "dslc" / "std" / "nn.cgraph"

# Mutants per corpus file, chosen so the whole run takes about 25 s on a 2-core machine. A mutant
# that still checks costs a full check with every bucket re-checked (~200 ms for the encoder, ~5 ms
# for the MLP); about 70% stop at a syntax error, which is cheaper. Measured CPU time per mutant:
# mlp 3 ms, nn 8 ms, resnet and unet 10 ms, resnet18 and resnet50 13 ms, encoder 20 ms.
CASES = {
    "mlp.cgraph": 1000,
    "nn.cgraph": 600,
    "resnet.cgraph": 400,
    "unet.cgraph": 350,
    "resnet18.cgraph": 300,
    "resnet50.cgraph": 300,
    "encoder.cgraph": 200,
    # the model families, fewer each (nine files, about 30 ms of CPU a mutant)
    "mobilenet_v3.cgraph": 40,
    "convnext.cgraph": 40,
    "vit_front.cgraph": 40,
    "bert.cgraph": 40,
    "sd_down_block.cgraph": 40,
    "yolo_sppf.cgraph": 40,
    "llama_layer.cgraph": 40,
    "llama_decode.cgraph": 40,
    "whisper_encoder.cgraph": 40,
}
DEFAULT_CASES = 200  # a model added to models/ later
# A longer campaign, still reproducible: DSLC_FUZZ_SCALE=20 DSLC_FUZZ_SEED=7 pytest tests/test_fuzz.py
SCALE = float(os.environ.get("DSLC_FUZZ_SCALE", "1"))
SEED = int(os.environ.get("DSLC_FUZZ_SEED", "0"))
DOUBLE_MUTATION = 0.2  # share of mutants that get two mutations instead of one
# How often each mutation is picked. Most mutants break the syntax, so replacements, which keep it
# when the new token is of the same kind, are picked more often to reach the checker too.
OPERATORS = {"delete": 2, "duplicate": 1, "swap": 2, "insert": 2, "replace": 5}
# Where a replacement comes from: a token of the same kind from the same file (it likely names
# something in scope), of the same kind from the corpus, or any token (corpus or extra literal).
SAME_KIND_LOCAL, SAME_KIND_CORPUS = 0.45, 0.2
# A mutated `repeat` count (12 -> 1024) stops at this many nodes with E0305 instead of taking
# seconds; the largest model of the corpus has under 600.
MAX_NODES = 5_000

# Literals that the corpus does not hold but a user may well write.
EXTRA_TOKENS = ("0", "-", "1", "2", "3", "99999999999999999999", "1e400", "0.0", '""', '"{i}"',
                '"{j}"', '"x.{i+1}"', '"/"', "*", "..", ":", "@", "@NCHW", "f8e4m3", "bool", "->")


def corpus() -> list[Path]:
    return [*sorted(MODELS.glob("*.cgraph")), STD_NN]


@dataclass(frozen=True)
class Tok:
    kind: str
    text: str
    start: int
    end: int


def tokenize(text: str) -> list[Tok]:
    """The significant tokens of `text` (comments and whitespace dropped), with their offsets."""
    return [Tok(t.type, str(t), t.start_pos, t.end_pos) for t in lark_parser().lex(text)
            if t.start_pos is not None and t.end_pos is not None]


def _splice(text: str, start: int, end: int, new: str) -> str:
    # Spaces around the new text keep it from gluing onto a neighbour (`relu` + `x` -> `relux`).
    return f"{text[:start]} {new} {text[end:]}"


class Mutator:
    def __init__(self, text: str, pool: list[Tok], seed: int) -> None:
        self.rng = random.Random(seed)
        self.pool = pool
        self.by_kind = _by_kind(pool)
        self.local_by_kind = _by_kind(tokenize(text))
        self.original = text

    def _token(self, like: Tok | None = None) -> str:
        rng = self.rng
        if like is not None:
            r = rng.random()
            kinds = None
            if r < SAME_KIND_LOCAL:
                kinds = self.local_by_kind
            elif r < SAME_KIND_LOCAL + SAME_KIND_CORPUS:
                kinds = self.by_kind
            others = sorted(set(kinds.get(like.kind, ())) - {like.text}) if kinds else []
            if others:
                return rng.choice(others)
        if rng.random() < 0.1:
            return self.rng.choice(EXTRA_TOKENS)
        return self.rng.choice(self.pool).text

    def mutate_once(self, text: str) -> tuple[str, str]:
        toks = tokenize_or_none(text)
        if not toks:
            return text + " " + self._token(), "insert at end"
        rng = self.rng
        op = rng.choices(list(OPERATORS), list(OPERATORS.values()))[0]
        i = rng.randrange(len(toks))
        t = toks[i]
        if op == "delete":
            return _splice(text, t.start, t.end, ""), f"delete {t.text!r} at {t.start}"
        if op == "duplicate":
            return _splice(text, t.start, t.end, f"{t.text} {t.text}"), f"duplicate {t.text!r}"
        if op == "swap" and i + 1 < len(toks):
            u = toks[i + 1]
            new = f"{text[:t.start]} {u.text} {text[t.end:u.start]} {t.text} {text[u.end:]}"
            return new, f"swap {t.text!r} {u.text!r} at {t.start}"
        if op == "replace":
            if rng.random() < SAME_KIND_LOCAL + SAME_KIND_CORPUS:
                # A token with look-alikes (a name, a number, a dtype): the mutant likely parses.
                t = rng.choice([u for u in toks if len(self.local_by_kind.get(u.kind, ())) > 1]
                               or toks)
            new_tok = self._token(t)
            return _splice(text, t.start, t.end, new_tok), f"replace {t.text!r} by {new_tok!r}"
        new_tok = self._token()
        at = t.start if rng.random() < 0.5 else t.end
        return _splice(text, at, at, new_tok), f"insert {new_tok!r} at {at}"

    def mutant(self) -> tuple[str, list[str]]:
        text, how = self.original, []
        for _ in range(2 if self.rng.random() < DOUBLE_MUTATION else 1):
            text, what = self.mutate_once(text)
            how.append(what)
        return text, how


def _by_kind(toks: list[Tok]) -> dict[str, list[str]]:
    """The distinct spellings of each token kind, in a stable order."""
    out: dict[str, set[str]] = {}
    for t in toks:
        out.setdefault(t.kind, set()).add(t.text)
    return {kind: sorted(texts) for kind, texts in out.items()}


def tokenize_or_none(text: str) -> list[Tok] | None:
    """Tokens of a mutant (a first mutation may have made text the lexer rejects: then None)."""
    try:
        return tokenize(text)
    except Exception:
        return None


def corpus_pool() -> list[Tok]:
    seen: dict[tuple[str, str], Tok] = {}
    for path in corpus():
        for t in tokenize(path.read_text()):
            seen.setdefault((t.kind, t.text), t)
    return [seen[k] for k in sorted(seen)]


# -- outcome checks ------------------------------------------------------------------------------
def span_problem(span: Span, sources: SourceMap) -> str | None:
    text = sources.text(span.file)
    if text is None:
        return f"span names a file the program did not read: {span}"
    lines = text.split("\n")
    if not (1 <= span.line <= span.end_line <= len(lines)):
        return f"span lines {span.line}..{span.end_line} outside 1..{len(lines)}: {span}"
    if span.col < 1 or span.col > len(lines[span.line - 1]) + 1:
        return f"span column {span.col} outside line {span.line} (length {len(lines[span.line - 1])})"
    # One column past the end of a line is allowed: the caret of "unexpected end of file".
    if span.end_col < 1 or span.end_col > len(lines[span.end_line - 1]) + 2:
        return (f"span end column {span.end_col} outside line {span.end_line} "
                f"(length {len(lines[span.end_line - 1])})")
    if (span.line, span.col) > (span.end_line, span.end_col):
        return f"span ends before it starts: {span!r}"
    return None


def outcome_problems(diags: list[Diagnostic], sources: SourceMap) -> list[str]:
    problems = []
    for d in diags:
        if d.code not in CODES:
            problems.append(f"uncoded diagnostic {d.code}: {d.message}")
        for span in (d.span, *(lb.span for lb in d.labels)):
            why = span_problem(span, sources)
            if why:
                problems.append(f"{d.code} ({d.message}): {why}")
        text = render_human(d, sources)
        if "Traceback" in text:
            problems.append(f"{d.code}: the human rendering shows a traceback:\n{text}")
    for fmt in ("human", "json", "github"):
        text = render(diags, fmt, sources, False)
        if "Traceback" in text:
            problems.append(f"the {fmt} rendering shows a traceback")
        if fmt == "json":
            for line in text.splitlines():
                try:
                    json.loads(line)
                except ValueError:
                    problems.append(f"a JSON diagnostic line does not parse: {line!r}")
    return problems


@dataclass
class Failure:
    what: str  # "crash" or "bad outcome"
    key: str  # deduplication key: exception type and innermost dslc frame, or the problem
    mutant: str
    how: list[str]
    detail: str


def _dslc_frame(tb: BaseException) -> str:
    """`file:line` of the innermost frame inside the dslc package (else the innermost frame)."""
    frames = traceback.extract_tb(tb.__traceback__)
    package = str(ROOT / "dslc")
    inside = [f for f in frames if f.filename.startswith(package)]
    f = (inside or frames)[-1]
    return f"{Path(f.filename).relative_to(ROOT) if inside else f.filename}:{f.lineno}"


def run_mutant(path: Path, text: str, how: list[str]) -> Failure | None:
    # Unlink first: rewriting a file in place makes ext4 flush it (~3 ms, more than most checks).
    path.unlink(missing_ok=True)
    path.write_text(text)
    sink = Sink()
    try:
        result = front_end(path, Options(), sink)
        problems = outcome_problems(list(sink.diagnostics), result.program.sources)
        if not sink.error_count and result.module is None:
            problems.append("no error reported, yet the file gave no module")
        if not sink.error_count and result.module and result.module.models and not result.model:
            problems.append("no error reported, yet the model gave no checked model")
        if sink.error_count and result.model is not None:
            problems.append("errors reported, yet a checked model came back")
    except Exception as err:
        return Failure("crash", f"{type(err).__name__} at {_dslc_frame(err)}", text, how,
                       traceback.format_exc())
    if problems:
        return Failure("bad outcome", problems[0].split(":")[0], text, how, "\n".join(problems))
    return None


def shrink(text: str, key: str, path: Path, budget: int = 800) -> str:
    """A smaller mutant with the same failure `key`, checked as `path`: drop runs of lines, then
    of tokens, halving the run length (a small delta-debugging loop; `budget` checks at most)."""
    tries = 0

    def same(candidate: str) -> bool:
        nonlocal tries
        tries += 1
        f = run_mutant(path, candidate, [])
        return f is not None and f.key == key

    for unit in ("line", "token"):
        pieces = _lines(text) if unit == "line" else _token_pieces(text)
        n = max(len(pieces) // 2, 1)
        while n >= 1 and tries < budget:
            i, changed = 0, False
            while i < len(pieces) and tries < budget:
                candidate = pieces[:i] + pieces[i + n:]
                if candidate and same("".join(candidate)):
                    pieces, changed = candidate, True
                else:
                    i += n
            if not changed:
                n //= 2
        text = "".join(pieces)
    return text


def _lines(text: str) -> list[str]:
    return text.splitlines(keepends=True)


def _token_pieces(text: str) -> list[str]:
    """`text` cut before each token (comments and spaces stay with the token before them)."""
    toks = tokenize_or_none(text)
    if not toks:
        return _lines(text)
    cuts = [0, *(t.start for t in toks[1:]), len(text)]
    return [text[a:b] for a, b in itertools.pairwise(cuts) if b > a]


def mutants(source: Path) -> Iterator[tuple[str, list[str]]]:
    pool = corpus_pool()
    seed = note_seed(f"random.Random mutating {source.name} (DSLC_FUZZ_SEED={SEED})",
                     zlib.crc32(source.name.encode()) + SEED)
    mut = Mutator(source.read_text(), pool, seed)
    for _ in range(round(SCALE * CASES.get(source.name, DEFAULT_CASES))):
        yield mut.mutant()


def _report(source: Path, failures: list[Failure], total: int, path: Path) -> str:
    distinct: dict[str, list[Failure]] = {}
    for f in failures:
        distinct.setdefault(f.key, []).append(f)
    parts = [f"{len(failures)} of {total} mutants of {source.name} failed, "
             f"{len(distinct)} distinct problems:"]
    for key, group in distinct.items():
        first = min(group, key=lambda f: len(f.mutant))
        small = shrink(first.mutant, key, path)
        parts.append(f"\n=== {first.what}: {key} ({len(group)} mutants); mutations: "
                     f"{'; '.join(first.how)}\n--- mutant ---\n{first.mutant}\n"
                     f"--- shrunk, same failure ---\n{small}\n--- detail ---\n{first.detail}")
    return "\n".join(parts)


@pytest.fixture
def mutant_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder beside which the models' imports of each other (`import "resnet.cgraph"`,
    `import "encoder.cgraph" as enc`) still resolve; `std/...` resolves anyway."""
    for imported in ("resnet.cgraph", "encoder.cgraph"):
        shutil.copy(MODELS / imported, tmp_path / imported)
    monkeypatch.setattr(check_context, "MAX_NODES", MAX_NODES)
    return tmp_path


def test_corpus_checks_cleanly(mutant_dir: Path) -> None:
    """The unmutated files are the baseline: they tokenize, and check without errors."""
    for source in corpus():
        assert tokenize(source.read_text())
        assert run_mutant(mutant_dir / "mutant.cgraph", source.read_text(), []) is None, source
        sink = Sink()
        front_end(source, Options(), sink)
        assert not sink.error_count, [d.message for d in sink.diagnostics]


@pytest.mark.parametrize("source", corpus(), ids=lambda p: p.name)
def test_mutants_never_crash(source: Path, mutant_dir: Path) -> None:
    failures = []
    total = 0
    for text, how in mutants(source):
        total += 1
        failure = run_mutant(mutant_dir / "mutant.cgraph", text, how)
        if failure is not None:
            failures.append(failure)
    assert not failures, _report(source, failures, total, mutant_dir / "mutant.cgraph")


def test_tokenizer_respects_strings_and_comments() -> None:
    toks = tokenize('import "a # b.cgraph"  # a comment with "quotes"\nmodel m {}\n')
    assert [t.text for t in toks] == ["import", '"a # b.cgraph"', "model", "m", "{", "}"]
    assert re.fullmatch(r"\w+", toks[0].kind)
