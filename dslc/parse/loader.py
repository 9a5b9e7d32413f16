"""Read a `.cgraph` file and everything it imports (paths -> `Program`).

An import is resolved relative to the importing file, then against each `-I` directory, then
against the bundled library (`std/...` inside the dslc package). Missing files are E0703, cycles
E0702; every file is parsed once, whatever the number of files importing it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from dslc.diag.diagnostic import Diagnostic, Sink
from dslc.diag.records import collector_paused
from dslc.diag.span import SourceMap, display_name, printable
from dslc.parse import ast
from dslc.parse.parser import parse_text
from dslc.parse.structure import check_structure

PACKAGE_ROOT = Path(__file__).resolve().parents[1]  # the `dslc` package: holds `std/`
STD_ROOT = PACKAGE_ROOT / "std"


@dataclass
class Program:
    """The parsed files by resolved path, and what each import statement resolved to."""

    sources: SourceMap = field(default_factory=SourceMap)
    modules: dict[str, ast.Module] = field(default_factory=dict)
    imports: dict[tuple[str, int], str] = field(default_factory=dict)  # (file path, index) -> path
    failed: set[str] = field(default_factory=set)  # files that did not parse or could not be read

    def imported(self, module: ast.Module) -> list[tuple[ast.Import, ast.Module]]:
        """`module`'s imports with the modules they resolved to (unresolved ones left out)."""
        out = []
        for i, imp in enumerate(module.imports):
            target = self.imports.get((module.path, i))
            if target is not None and target in self.modules:
                out.append((imp, self.modules[target]))
        return out


class ReadError(Exception):
    """An entry file could not be read: a usage error (exit code 2), not a diagnostic."""


def load(entry: Path, include_dirs: list[Path], sink: Sink, program: Program | None = None,
         ) -> tuple[Program, ast.Module | None]:
    """Parse `entry` and its imports into `program` (a new one if None)."""
    with collector_paused():
        return _load(entry, include_dirs, sink, program or Program())


def _load(entry: Path, include_dirs: list[Path], sink: Sink, program: Program,
          ) -> tuple[Program, ast.Module | None]:
    path = entry.resolve()
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        what = "a compiled bundle" if path.suffix == ".bundle" else "not UTF-8 text"
        raise ReadError(f"cannot read `{printable(entry)}`: it is {what}; this command takes a "
                        ".cgraph source file") from err
    except OSError as err:
        raise ReadError(f"cannot read `{printable(entry)}`: {err.strerror or err}") from err
    module = _parse(program, path, text, sink)
    if module is not None:
        _load_imports(program, module, include_dirs, sink, stack=[str(path)])
    return program, module


def _parse(program: Program, path: Path, text: str, sink: Sink) -> ast.Module | None:
    key = str(path)
    if key in program.modules:
        return program.modules[key]
    name = display_name(path, STD_ROOT)
    program.sources.add(name, text)
    module = parse_text(text, name, sink, path=key)
    if module is None:
        program.failed.add(key)
        return None
    check_structure(module, sink)
    program.modules[key] = module
    return module


def _resolve(imp: ast.Import, importer: Path, include_dirs: list[Path]) -> Path | None:
    rel = Path(imp.path.value)
    if rel.is_absolute():
        candidates = [rel]
    else:
        candidates = [importer.parent / rel, *(d / rel for d in include_dirs), PACKAGE_ROOT / rel]
    for cand in candidates:
        if cand.is_file():
            return cand.resolve()
    return None


def _nearby(written: str, importer: Path, include_dirs: list[Path]) -> str | None:
    """A `.cgraph` file that exists under a similar name, as the import would be written."""
    import difflib

    rel = Path(written)
    found: list[str] = []
    for root in [importer.parent, *include_dirs, PACKAGE_ROOT]:
        folder = root / rel.parent
        if folder.is_dir():
            found += [(rel.parent / p.name).as_posix() for p in folder.glob("*.cgraph")]
    match = difflib.get_close_matches(written, found, n=1, cutoff=0.6)
    return match[0] if match else None


def _search_note(module: ast.Module, include_dirs: list[Path]) -> str:
    places = [f"next to `{module.file}`"]
    places += [f"in `{d.as_posix()}`" for d in include_dirs]
    return "looked " + ", ".join(places) + " and in the bundled library (`std/...`)"


def _load_imports(program: Program, module: ast.Module, include_dirs: list[Path], sink: Sink,
                  stack: list[str]) -> None:
    importer = Path(module.path)
    for i, imp in enumerate(module.imports):
        target = _resolve(imp, importer, include_dirs)
        if target is None:
            near = _nearby(imp.path.value, importer, include_dirs)
            sink.report(Diagnostic(
                "E0703", f"cannot find import `{imp.path.value}`", imp.path.span,
                "no such file",
                notes=(_search_note(module, include_dirs),),
                help=(f'did you mean `"{near}"`?',) if near else (),
            ))
            continue
        key = str(target)
        program.imports[(module.path, i)] = key
        if key in stack:
            cycle = [Path(p).name for p in stack[stack.index(key):]] + [target.name]
            sink.report(Diagnostic(
                "E0702", f"import cycle: {' -> '.join(cycle)}", imp.span,
                f"`{target.name}` is already being imported",
                notes=("a file cannot import itself, directly or through other files",),
                help=("move the defs both files need into a third file that both import",),
            ))
            continue
        if key in program.modules or key in program.failed:
            continue
        try:
            text = target.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            sink.report(Diagnostic("E0703", f"cannot read import `{imp.path.value}`",
                                   imp.path.span, str(getattr(err, "strerror", None) or err)))
            continue
        child = _parse(program, target, text, sink)
        if child is not None:
            _load_imports(program, child, include_dirs, sink, [*stack, key])
