#!/usr/bin/env python3
"""Mutation testing (mutmut 3) of the modules that hold dslc's numeric and safety logic.

    scripts/mutation.py [GROUP ...] [--fresh] [--jobs N] [--survivors] [--report] [--save]
    scripts/mutation.py GROUP --typecheck-elsewhere   # then scripts/mutation_device.sh GROUP
    scripts/mutation.py GROUP --modules GLOB ...      # only those modules' untested mutants

GROUP is one of ir, ops, lower, fuse, runtime, bundle, weights, channels_last, placement, fusion, joins,
tune (all of them, in that order, when none is named). The modules are `[tool.mutmut] only_mutate` in
pyproject.toml; GROUPS below maps each group to its modules and to the test files that exercise
them, and mutmut runs, for each mutant, only those of the group's tests that call the mutated
function (fastest first, stopping at the first failure). Each group works in its own folder,
build/mutation/GROUP, so that its test selection and its cached results stay its own.

Results are cached: a second run tests only the mutants of functions that changed, then tests the
earlier survivors again (new tests may kill them). `--fresh` forgets the cache. A checkout has no
cache (build/ is not committed), so each run also keeps its results in mutation/GROUP.json (each
function's mutants' exit codes with the hash of the function's code, as mutmut keys them): a
group run in a checkout without its folder starts from them, testing only the mutants of
functions changed since and those never tested; a group too slow for one sitting thus goes on
where the last one stopped. The script prints,
per module, the mutants killed by a test, rejected by mypy (the CI gate), timed out or crashed,
and the survivors; the survivors listed in docs/mutation.md as equivalent are marked so.
`cd build/mutation/GROUP && mutmut show NAME` shows one mutant. (Not `mutmut apply` there: the
group's `dslc` is a link to the checkout, so it would write the mutant into the source.)

Time (docs/mutation.md has the measurements): fresh, on 2 busy CPU cores, `ir` took 32 min;
`ops` (4,529 mutants) would take hours. A cached run with nothing changed takes a minute or two
per group; `--survivors` tests only the last survivors again (after adding tests).

Installs nothing: it needs the `dev` extra (mutmut, mypy) in the Python that runs it.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / "build" / "mutation"
DOC = ROOT / "docs" / "mutation.md"
SAVED = ROOT / "mutation"  # GROUP.json: the last results of each group, committed

# group -> (module globs, test files). Tests run with the group's `-m "not gpu and not slow"`.
GROUPS: dict[str, tuple[list[str], list[str]]] = {
    "ir": (["dslc/ir/views.py", "dslc/ir/interp.py"],
           ["tests/test_interp.py", "tests/test_dim_binding.py", "tests/test_views_strided.py",
            "tests/test_intermediate_precision.py", "tests/test_op_references.py",
            "tests/test_batchnorm_folding.py", "tests/test_lower.py",
            # fp8 calibration and the in-place runs of decoding (session 22: their functions
            # had no test of this group)
            "tests/test_fp8.py", "tests/test_kv_cache.py", "tests/test_decoder.py",
            "tests/test_batches.py"]),
    "ops": (["dslc/ops/*.py"],
            ["tests/test_op_references.py", "tests/test_shape_rules.py",
             "tests/test_diagnostics.py", "tests/test_views_strided.py", "tests/test_fp8.py",
             "tests/test_groupnorm.py", "tests/test_expand.py", "tests/test_to_torch.py",
             "tests/test_depthwise_choice.py", "tests/test_fuzz_diff.py",
             "tests/test_op_rules.py", "tests/test_ops_mutants.py",
             "tests/test_device_references.py"]),
    "lower": (["dslc/lower/*.py"],
              ["tests/test_lower.py", "tests/test_batchnorm_folding.py",
               "tests/test_views_strided.py", "tests/test_intermediate_precision.py",
               "tests/test_fuse.py", "tests/test_memory_order_needs.py",
               "tests/test_groupnorm.py", "tests/test_expand.py", "tests/test_packing.py",
               "tests/test_step_names.py", "tests/test_fp8.py", "tests/test_fp8_deviceless.py",
               "tests/test_fp8_auto.py", "tests/test_sdpa_kv_len.py", "tests/test_masks.py",
               "tests/test_pointwise_order.py", "tests/test_gather.py", "tests/test_upconv.py"]),
    "fuse": (["dslc/fuse/*.py"],
             ["tests/test_fuse.py", "tests/test_fusion_checks.py",
              "tests/test_intermediate_precision.py", "tests/test_memory_order_needs.py"]),
    "runtime": (["dslc/runtime/inputs.py", "dslc/runtime/fields.py", "dslc/runtime/plancache.py"],
                ["tests/test_runtime_inputs.py", "tests/test_dim_binding.py",
                 "tests/test_bundle_fields.py", "tests/test_plan_cache.py", "tests/test_startup.py",
                 "tests/test_bundle_hostile.py", "tests/test_bundle.py"]),
    "bundle": (["dslc/runtime/records.py", "dslc/runtime/bundle.py", "dslc/runtime/manifest.py"],
               ["tests/test_bundle.py", "tests/test_bundle_fields.py", "tests/test_bundle_hostile.py",
                "tests/test_bundle_records.py", "tests/test_bundle_mutants.py", "tests/test_kv_cache.py",
                "tests/test_plan_cache.py", "tests/test_startup.py",
                "tests/test_manifest_layouts.py"]),
    "weights": (["dslc/weights.py"],
                ["tests/test_weights.py", "tests/test_weight_checks.py",
                 "tests/test_weights_details.py"]),
    "channels_last": (["dslc/backend/channels_last.py"], ["tests/test_channels_last_form.py"]),
    "placement": (["dslc/ir/placement.py"],
                  ["tests/test_concat_in_place.py", "tests/test_upconv.py", "tests/test_gather.py",
                   "tests/test_kv_cache.py"]),
    "fusion": (["dslc/tune/fusion.py"],
               ["tests/test_fusion_choice.py", "tests/test_gemv_kernel.py",
                "tests/test_attention_kernel.py", "tests/test_fused_kernel.py"]),
    "joins": (["dslc/tune/joins.py"],
              ["tests/test_gemv_kernel.py", "tests/test_fusion_choice.py"]),
    "batches": (["dslc/runtime/batches.py", "dslc/runtime/cachewrites.py"],
                ["tests/test_batches.py", "tests/test_kv_cache.py", "tests/test_packing.py"]),
    "blas": (["dslc/backend/blas.py"], ["tests/test_blas.py"]),
    "schedule": (["dslc/runtime/schedule.py", "dslc/runtime/split.py"],
                 ["tests/test_by_ops.py", "tests/test_split.py", "tests/test_arena.py",
                  "tests/test_concat_in_place.py", "tests/test_kv_cache.py",
                  "tests/test_bundle_hostile.py", "tests/test_decoder.py",
                  "tests/test_batches.py", "tests/test_startup.py",
                  "tests/test_schedule_checks.py", "tests/test_conv1d.py",
                  "tests/test_prepared_weights.py"]),
    "tune": (["dslc/runtime/tuningdb/*.py"],
             ["tests/test_tuning_db.py", "tests/test_tuning_db_hostile.py",
              "tests/test_tuning_store.py"]),
}
LINKED = ("dslc", "tests", "models", "grammar")  # what the tests read, linked into a group's folder

# mutmut's exit codes of a mutant's test run -> how this report counts it
KILLED, TYPED, TIMEOUT, CRASHED, SURVIVED, NO_TESTS, SKIPPED = (
    "killed", "mypy", "timeout", "crashed", "survived", "no tests", "skipped")
STATUS = {1: KILLED, 3: KILLED, 37: TYPED, 36: TIMEOUT, 24: TIMEOUT, -24: TIMEOUT, 152: TIMEOUT,
          255: TIMEOUT, -11: CRASHED, -9: CRASHED, 0: SURVIVED, 5: NO_TESTS, 33: NO_TESTS,
          34: SKIPPED}
DETECTED = (KILLED, TYPED, TIMEOUT, CRASHED)


def status(code: int | None) -> str:
    return "not tested" if code is None else STATUS.get(code, "other")


def scope() -> tuple[dict[str, object], list[str]]:
    """pyproject's [tool.mutmut] and the modules it mutates (each in exactly one group)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mutmut"]
    files = sorted({str(p.relative_to(ROOT)) for pattern in config["only_mutate"]
                    for p in ROOT.glob(pattern)})
    for f in files:
        owners = [g for g, (globs, _) in GROUPS.items()
                  if any(fnmatch.fnmatch(f, pat) for pat in globs)]
        assert len(owners) == 1, f"{f} is in groups {owners}: give it exactly one"
    return config, files


def unlisted(globs: list[str], files: list[str]) -> list[str]:
    """A group's module patterns that match none of the modules pyproject lets mutmut mutate."""
    return [p for p in globs if not any(fnmatch.fnmatch(f, p) for f in files)]


def toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    return json.dumps(v)  # strings and numbers: JSON spells them as TOML does


def prepare(group: str, config: dict[str, object], files: list[str], fresh: bool) -> Path:
    """build/mutation/GROUP: links to the checkout and a pyproject.toml whose [tool.mutmut]
    mutates the group's modules with the group's tests."""
    folder = WORK / group
    if fresh and folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for name in LINKED:
        link = folder / name
        if not link.is_symlink():
            link.symlink_to(os.path.relpath(ROOT / name, folder))
    globs, tests = GROUPS[group]
    settings = {k: v for k, v in config.items() if k not in ("only_mutate",
                                                             "pytest_add_cli_args_test_selection")}
    missing = unlisted(globs, files)
    if missing:  # skipped silently, or with none listed mutmut would mutate every module
        raise SystemExit(f"group {group}: {', '.join(missing)} not in pyproject's "
                         "[tool.mutmut] only_mutate")
    settings["only_mutate"] = [f for f in files if any(fnmatch.fnmatch(f, p) for p in globs)]
    settings["pytest_add_cli_args_test_selection"] = tests
    # mypy rejects some mutants before any test runs (CI runs it): the same mypy as this Python.
    # Its cache stays out of the mutants folder, which a run elsewhere carries (54 MB for `ops`).
    settings["type_check_command"] = [sys.executable, "-m", "mypy", "--output", "json",
                                      "--no-warn-unused-ignores", "--cache-dir", "../mypy_cache"]
    text = (ROOT / "pyproject.toml").read_text()
    text = re.sub(r"\n\[tool\.mutmut\]\n.*?(?=\n\[|\Z)", "", text, flags=re.S)
    text += "\n[tool.mutmut]\n" + "".join(f"{k} = {toml_value(v)}\n" for k, v in settings.items())
    target = folder / "pyproject.toml"
    if not target.exists() or target.read_text() != text:
        target.write_text(text)
    return folder


def _hashes(module: str) -> dict[str, str]:
    """mutmut's hash of each function of a module's code in the checkout (its mangled name ->
    12 hex digits), as this Python parses it."""
    from mutmut.mutation.file_mutation import compute_function_hashes

    return compute_function_hashes((ROOT / module).read_text())


def _version() -> str:
    """What mutmut's function hashes depend on besides the code: Python's `ast.dump` differs
    between versions (3.12 added fields), so a hash is compared only with one of its version."""
    return f"python {sys.version_info.major}.{sys.version_info.minor}"


def _loaded(group: str) -> dict[str, Any]:
    path = SAVED / f"{group}.json"
    return json.loads(path.read_text()) if path.exists() else {}


def _metas(folder: Path) -> dict[str, dict[str, Any]]:
    """module -> its mutmut result file (`.meta`), for the modules the group mutates now (a
    module taken out of a group, or deleted from the checkout, keeps a stale one)."""
    globs = GROUPS[folder.name][0]
    out = {}
    for meta in sorted((folder / "mutants").glob("dslc/**/*.py.meta")):
        module = str(meta.relative_to(folder / "mutants"))[:-len(".meta")]
        if any(fnmatch.fnmatch(module, pattern) for pattern in globs) and (ROOT / module).exists():
            out[module] = json.loads(meta.read_text())
    return out


def save(folder: Path) -> Path:
    """The group's results as mutation/GROUP.json: per module, per function, the hash of its
    code and its mutants' exit codes in mutant order (null: not tested); with the Python the
    hashes are of and the group's tests. Only functions whose result file's hash is this
    checkout's code's are written (results of other code are stale); a module with no result
    file here keeps what the file had; a code the file had stays where the run left it
    untested (a run stopped before reaching it)."""
    metas = _metas(folder)
    if not metas:
        sys.exit(f"no results in {folder}: nothing to save")
    before = _loaded(folder.name)
    old = before.get("modules", {}) if before.get("version") == _version() else {}
    out: dict[str, dict[str, list[object]]] = {
        m: f for m, f in old.items() if m not in metas and (ROOT / m).exists()}
    for module, meta in metas.items():
        hashes = _hashes(module)
        functions: dict[str, dict[int, int | None]] = {}
        for name, code in meta["exit_code_by_key"].items():
            function, _, number = name.rpartition(".")[2].rpartition("__mutmut_")
            functions.setdefault(function, {})[int(number)] = code
        out[module] = {}
        for function, codes in sorted(functions.items()):
            digest = hashes.get(function)
            if digest is None or meta["hash_by_function_name"].get(function) != digest:
                continue
            had_digest, had = old.get(module, {}).get(function, ["", []])
            found = []
            for i in sorted(codes):
                code = codes[i]
                if code is None and had_digest == digest and i <= len(had):
                    code = had[i - 1]  # known before, not reached by this run
                found.append(code)
            out[module][function] = [digest, found]
    SAVED.mkdir(exist_ok=True)
    path = SAVED / f"{folder.name}.json"
    data = {"version": _version(), "tests": GROUPS[folder.name][1], "modules": out}
    text = json.dumps(data, separators=(",", ":"), sort_keys=True)
    path.write_text(text.replace("],\"", "],\n\"") + "\n")  # a line a function: small diffs
    return path


def seed(folder: Path) -> int:
    """mutmut's result files of a group folder made from mutation/GROUP.json, for the modules
    that have none yet (a new checkout): the results of functions whose code is unchanged stand
    (mutmut keeps them; it tests the rest). Not where the file's hashes are of another Python,
    or its results of tests the group no longer has (a test taken out may have been what
    killed a mutant). Returns the mutants seeded."""
    data = _loaded(folder.name)
    if not data:
        return 0
    if data.get("version") != _version() or not set(data["tests"]) <= set(GROUPS[folder.name][1]):
        print(f"{folder.name}: {SAVED.name}/{folder.name}.json is of {data.get('version')} or "
              "other tests: not used")
        return 0
    seeded = 0
    for module, functions in data["modules"].items():
        meta = folder / "mutants" / f"{module}.meta"
        if meta.exists() or not (ROOT / module).exists():
            continue
        # mutmut takes a mutants file newer than its source as up to date, with this result
        # file as it is: made again, it compares each function's hash
        (folder / "mutants" / module).unlink(missing_ok=True)
        hashes = _hashes(module)
        prefix = _prefix(module)
        codes: dict[str, int | None] = {}
        kept: dict[str, str] = {}
        for function, (digest, found) in functions.items():
            if hashes.get(function) != digest:
                continue  # changed since: mutmut tests its mutants afresh
            kept[function] = digest
            for i, code in enumerate(found, 1):
                codes[f"{prefix}.{function}__mutmut_{i}"] = code
                seeded += code is not None
        meta.parent.mkdir(parents=True, exist_ok=True)
        meta.write_text(json.dumps({"exit_code_by_key": codes, "hash_by_function_name": kept,
                                    "type_check_error_by_key": {}, "durations_by_key": {},
                                    "estimated_durations_by_key": {}}))
    return seeded


def unpack(folder: Path, results_dir: Path) -> Path:
    """The result files a run on another machine returned (`scripts/mutation_device.sh`:
    meta.tar, mutmut-stats.json) into the group's folder, their hashes made this Python's (that
    run carried this checkout's code and mutants, so the code is the same), then saved."""
    import tarfile

    mutants = folder / "mutants"
    here = results(folder)
    with tarfile.open(results_dir / "meta.tar") as tar:
        tar.extractall(mutants, filter="data")
    shutil.copy(results_dir / "mutmut-stats.json", mutants / "mutmut-stats.json")
    for module, meta in _metas(folder).items():
        hashes = _hashes(module)
        meta["hash_by_function_name"] = {f: hashes.get(f, "") for f in meta["hash_by_function_name"]}
        codes = meta["exit_code_by_key"]  # a result found here stands where that run had none
        for name, code in here.get(module, {}).items():  # (the group split between machines)
            if codes.get(name) is None and code is not None:
                codes[name] = code
        (mutants / f"{module}.meta").write_text(json.dumps(meta))
    return save(folder)


def untested(folder: Path, globs: list[str]) -> list[str]:
    """The names of the mutants never run in the group's modules that match one of `globs`:
    a group split between machines (`--modules` here, MODULES= for mutation_device.sh), each
    running its own modules, then the results joined with `--unpack`."""
    return [name for module, codes in results(folder).items()
            if any(fnmatch.fnmatch(module, g) for g in globs)
            for name, code in codes.items() if code is None]


def results(folder: Path) -> dict[str, dict[str, int | None]]:
    """module -> mutant name -> exit code (None: not tested yet), from mutmut's .meta files."""
    return {module: meta["exit_code_by_key"] for module, meta in _metas(folder).items()}


def saved(group: str) -> dict[str, dict[str, int | None]]:
    """mutation/GROUP.json's results as `results` gives them (a checkout that never ran the
    group: its last results, whatever the code is now)."""
    path = SAVED / f"{group}.json"
    if not path.exists():
        return {}
    out: dict[str, dict[str, int | None]] = {}
    for module, functions in json.loads(path.read_text())["modules"].items():
        prefix = _prefix(module)
        out[module] = {f"{prefix}.{function}__mutmut_{i}": code
                       for function, (_, found) in functions.items()
                       for i, code in enumerate(found, 1)}
    return out


def _prefix(module: str) -> str:
    """The start of mutmut's names of a module's mutants: dslc/ops/__init__.py -> dslc.ops."""
    return module[:-len(".py")].replace("/", ".").removesuffix(".__init__")


def mutmut(folder: Path, jobs: int, names: list[str]) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the mutants, not the checkout
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    cmd = ["nice", "-n", "10", sys.executable, "-m", "mutmut", "run", "--max-children", str(jobs),
           *names]
    done = subprocess.run(cmd, cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, errors="replace")
    if done.returncode != 0:
        print(done.stdout[-4000:])
        sys.exit(f"mutmut failed in {folder} (exit {done.returncode})")


def run_group(group: str, config: dict[str, object], files: list[str], fresh: bool,
              jobs: int, survivors_only: bool = False, modules: list[str] | None = None) -> Path:
    folder = prepare(group, config, files, fresh)
    if not fresh:
        count = seed(folder)
        if count:
            print(f"{group}: {count} mutants' results from {SAVED.name}/{group}.json", flush=True)
    if modules:  # mutmut runs named mutants even where they have a result: name the untested
        names = untested(folder, modules)
        if names:
            mutmut(folder, jobs, names)
        save(folder)
        return folder
    before = {name for codes in results(folder).values() for name, code in codes.items()
              if status(code) in (SURVIVED, NO_TESTS)}
    if not survivors_only:
        mutmut(folder, jobs, [])
    after = {name: code for codes in results(folder).values() for name, code in codes.items()}
    again = sorted(n for n in before if status(after.get(n)) in (SURVIVED, NO_TESTS))
    if again:  # cached survivors: tests added since may kill them
        mutmut(folder, jobs, again)
    save(folder)
    return folder


def code_digest() -> str:
    """One digest of what a run's verdicts depend on: the code (dslc, grammar) and the tests. A
    run elsewhere carries mutants and mypy's verdict made from them here: if either changed since
    (mutmut there makes the mutants of a changed module again, and copies the tests it finds), its
    start fails or its results are of other code. Session 20 lost a device call so."""
    import hashlib

    digest = hashlib.sha256()
    for folder in ("dslc", "grammar", "tests"):
        for path in sorted((ROOT / folder).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def typecheck_elsewhere(group: str, config: dict[str, object], files: list[str]) -> Path:
    """For a run on another machine (`scripts/mutation_device.sh`, the device machine's 16
    cores): the group's folder seeded, its mutants made, and mypy's verdict on them written to
    the folder's mypy.json, which the other machine reads in place of running mypy (its
    packages differ from the CI's, whose mypy is the gate). mutmut makes the same mutants from
    the same code anywhere."""
    folder = prepare(group, config, files, fresh=False)
    seed(folder)
    # A cache left inside the mutants folder by an older mypy setting (54 MB for `ops`) would
    # push the carried folder past the device call's 64 MiB.
    shutil.rmtree(folder / "mutants" / ".mypy_cache", ignore_errors=True)
    script = ("import os, subprocess, pathlib\n"
              "from mutmut.__main__ import (copy_src_dir, copy_also_copy_files, config,\n"
              "    setup_source_paths, store_lines_covered_by_tests, create_mutants)\n"
              "os.makedirs('mutants', exist_ok=True)\n"
              "copy_src_dir(); copy_also_copy_files(); setup_source_paths()\n"
              "store_lines_covered_by_tests(); create_mutants(2)\n"
              "done = subprocess.run(config().type_check_command, cwd='mutants',\n"
              "                      capture_output=True, text=True)\n"
              "pathlib.Path('mypy.json').write_text(done.stdout)\n")
    subprocess.run([sys.executable, "-c", script], cwd=folder, check=True,
                   stdout=subprocess.DEVNULL)
    (folder / "code.sha").write_text(code_digest() + "\n")  # mutation_device.sh compares
    return folder / "mypy.json"


def equivalents() -> set[str]:
    """The mutants docs/mutation.md lists as equivalent, with its reason."""
    if not DOC.exists():
        return set()
    return set(re.findall(r"^\| `(dslc\.[^`]+__mutmut_\d+)`", DOC.read_text(), flags=re.M))


COLUMNS = ("total", KILLED, TYPED, TIMEOUT, CRASHED, SURVIVED, "equivalent", "none")


def _row(label: str, c: dict[str, int]) -> str:
    """One line of the table: the counts, the score (detected / (all - equivalent)) and the
    score of the tests alone (what mypy rejects left out of both sides)."""
    detected = sum(c[s] for s in DETECTED)
    score = 100 * detected / max(c["total"] - c["equivalent"], 1)
    tests = 100 * (detected - c[TYPED]) / max(c["total"] - c["equivalent"] - c[TYPED], 1)
    return (f"{label:<28} " + " ".join(f"{c[k]:>6}" for k in COLUMNS)
            + f" {score:>6.1f}% {tests:>6.1f}%")


def report(folders: dict[str, Path]) -> None:
    listed = equivalents()
    heads = ("total", "killed", "mypy", "t/o", "crash", "surv", "equiv", "none")
    print(f"\n{'module':<28} " + " ".join(f"{h:>6}" for h in heads)
          + f" {'score':>7} {'tests':>7}")
    survivors: list[tuple[str, str, str]] = []
    for group, folder in folders.items():
        totals = dict.fromkeys(COLUMNS, 0)
        for module, codes in (results(folder) or saved(group)).items():
            counts = dict.fromkeys(COLUMNS, 0)
            for name, code in codes.items():
                what = status(code)
                if what in (SURVIVED, NO_TESTS) and name in listed:
                    what = "equivalent"
                counts[what if what in counts else "none"] += 1
                if what not in DETECTED and code is not None:  # the untested: counted only
                    survivors.append((group, name, what))
            counts["total"] = len(codes)
            for k in COLUMNS:
                totals[k] += counts[k]
            print(_row(module, counts))
        print(_row(f"group {group}", totals))
    for group, name, why in survivors:
        print(f"  {why:<10} {name}  (build/mutation/{group})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("groups", nargs="*", metavar="GROUP",
                        help=f"one of {', '.join(GROUPS)} (default: all)")
    parser.add_argument("--fresh", action="store_true", help="forget the cached results")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2, help="mutants at once")
    parser.add_argument("--report", action="store_true", help="only print the last results")
    parser.add_argument("--save", action="store_true",
                        help="only write the last results to mutation/GROUP.json (a run stopped "
                             "before its end; a run writes them itself)")
    parser.add_argument("--unpack", metavar="DIR", type=Path,
                        help="only take the results scripts/mutation_device.sh returned in DIR")
    parser.add_argument("--typecheck-elsewhere", action="store_true",
                        help="only make the mutants and mypy's verdict on them, for a run on "
                             "another machine (scripts/mutation_device.sh)")
    parser.add_argument("--modules", nargs="+", metavar="GLOB",
                        help="only the untested mutants of these modules (a group split between "
                             "machines: the others run elsewhere, joined by --unpack)")
    parser.add_argument("--survivors", action="store_true",
                        help="only test the last run's survivors again (after adding tests)")
    args = parser.parse_args()
    unknown = [g for g in args.groups if g not in GROUPS]
    if unknown:
        parser.error(f"unknown group {', '.join(unknown)}: the groups are {', '.join(GROUPS)}")
    config, files = scope()
    folders: dict[str, Path] = {}
    start = time.monotonic()
    for group in args.groups or list(GROUPS):
        t0 = time.monotonic()
        if args.typecheck_elsewhere:
            print(f"{group}: {typecheck_elsewhere(group, config, files).relative_to(ROOT)}")
            continue
        if args.unpack:
            folders[group] = WORK / group
            print(f"{group}: {unpack(WORK / group, args.unpack).relative_to(ROOT)}")
            continue
        if args.report or args.save:
            folders[group] = WORK / group
            if args.save:
                print(f"{group}: {save(WORK / group).relative_to(ROOT)}")
            continue
        folders[group] = run_group(group, config, files, args.fresh, args.jobs,
                                   args.survivors, args.modules)
        print(f"{group}: {time.monotonic() - t0:.0f} s", flush=True)
    if args.typecheck_elsewhere:
        return
    report(folders)
    if not args.report:
        print(f"wall time: {time.monotonic() - start:.0f} s")


if __name__ == "__main__":
    main()
