"""Hostile command lines: every bad output path, every output that names an input, a missing
cuDNN frontend, and a write that fails half-way. Each case asserts the documented exit code, one
sentence on stderr (no traceback, no internal error) and that nothing is lost: the workspace
(inputs and previous artifacts) is byte for byte what it was."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from dslc import fsutil
from dslc import weights as weights_module
from dslc.diag.diagnostic import TooManyErrors
from tests.conftest import ROOT
from tests.helpers import Run, run_cli

MODEL = "mnist_mlp"


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A workspace: a model, its weights, an input, a checkpoint, a compiled bundle, runner and
    weights, links to two of them, and a plain file (`afile`) where folders are expected."""
    d = tmp_path_factory.mktemp("workspace")
    shutil.copy(ROOT / "models" / "mlp.cgraph", d / "m.cgraph")
    assert run_cli("weights", "random", str(d / "m.cgraph"), "-o", str(d / "w.safetensors")).code == 0
    np.save(d / "x.npy", np.random.default_rng(0).standard_normal((2, 784)).astype(np.float16))
    state = {k: torch.from_numpy(v.astype(np.float32))
             for k, v in weights_module.load(d / "w.safetensors").items()}
    torch.save(state, d / "ckpt.pt")
    run = run_cli("compile", str(d / "m.cgraph"), "-o", str(d / "build"), "-q")
    assert run.code == 0, run.stderr
    shutil.copy(d / "w.safetensors", d / "build" / f"{MODEL}.safetensors")  # the weights beside
    (d / "afile").write_text("a file, not a folder\n")
    os.symlink(d / "build" / f"{MODEL}.bundle", d / "link.bundle")
    os.link(d / "w.safetensors", d / "hardlink.safetensors")
    return d


@pytest.fixture
def ws(template: Path, tmp_path: Path) -> Path:
    d = tmp_path / "ws"
    shutil.copytree(template, d, symlinks=False)
    os.unlink(d / "link.bundle")  # re-made to point inside this copy
    os.symlink(d / "build" / f"{MODEL}.bundle", d / "link.bundle")
    os.unlink(d / "hardlink.safetensors")
    os.link(d / "w.safetensors", d / "hardlink.safetensors")
    # /dev/null reached through a link: should the check ever regress, a write replaces the link,
    # not the device (run as root, a rename over /dev/null itself replaces it for everyone)
    os.symlink("/dev/null", d / "null")
    os.mkfifo(d / "fifo")
    return d


@pytest.fixture
def read_only(tmp_path: Path) -> Iterator[Path]:
    """A folder this user cannot write into. Root writes into any folder whatever its mode, but
    not into sysfs, which is read-only to root too."""
    if os.geteuid() == 0:
        if not Path("/sys/kernel").is_dir():
            pytest.skip("running as root without a sysfs to stand in for a read-only folder")
        yield Path("/sys")
        return
    d = tmp_path / "read-only"
    d.mkdir()
    d.chmod(0o555)
    yield d
    d.chmod(0o755)


def snapshot(root: Path) -> dict[str, bytes | None]:
    """Every entry under `root`: a file's bytes, None for a folder (symlinks as their target)."""
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None)
            for p in sorted(root.rglob("*"))}


def assert_one_sentence(run: Run, code: int, *words: str) -> None:
    """The exit code, and one line of error on stderr (after any `note:` lines)."""
    assert run.code == code, run.stderr
    lines = [line for line in run.stderr.splitlines()
             if line.strip() and not line.startswith("note: ")]
    assert len(lines) == 1, run.stderr
    assert lines[0].startswith("error"), lines[0]
    assert "Traceback" not in run.stderr and "internal error" not in run.stderr
    for word in words:
        assert word in lines[0], lines[0]


RUN = ["run", "{d}/m.cgraph", "--weights", "{d}/w.safetensors", "--input", "x={d}/x.npy"]
RUN_BUNDLE = ["run", "{d}/build/mnist_mlp.bundle", "--weights", "{d}/w.safetensors",
              "--input", "x={d}/x.npy"]
COMPILE = ["compile", "{d}/m.cgraph", "-q"]
PREPARE = ["weights", "prepare", "{d}/build/mnist_mlp.bundle", "{d}/w.safetensors"]

# (case, command line, words the sentence holds); all exit with code 2
CORPUS = [
    ("run -o an existing folder", [*RUN, "-o", "{d}/build"], ["is a folder"]),
    ("run -o /dev/null", [*RUN, "-o", "{d}/null"], ["not a regular file"]),
    ("run -o a FIFO", [*RUN, "-o", "{d}/fifo"], ["not a regular file"]),
    ("run -o a file's subfolder", [*RUN, "-o", "{d}/afile/sub/out.npz"], ["is a file, not a"]),
    ("run -o the model", [*RUN, "-o", "{d}/m.cgraph"], ["is the input"]),
    ("run -o the weights", [*RUN, "-o", "{d}/w.safetensors"], ["is the input"]),
    ("run -o a hard link of the weights", [*RUN, "-o", "{d}/hardlink.safetensors"],
     ["is the input"]),
    ("run -o an input array", [*RUN, "-o", "{d}/x.npy"], ["is the input"]),
    ("run B.bundle -o B.bundle", [*RUN_BUNDLE, "-o", "{d}/build/mnist_mlp.bundle"],
     ["is the input"]),
    ("run B.bundle -o B.bundle spelled otherwise",
     [*RUN_BUNDLE, "-o", "{d}/build/../build/./mnist_mlp.bundle"], ["is the input"]),
    ("run a symlink of B -o B",
     ["run", "{d}/link.bundle", "--weights", "{d}/w.safetensors", "--input", "x={d}/x.npy",
      "-o", "{d}/build/mnist_mlp.bundle"], ["is the input"]),
    ("run B.bundle --precision", [*RUN_BUNDLE, "--precision", "f32", "-o", "{d}/o.npz"],
     ["`--precision` applies to a .cgraph file"]),
    ("run without the weights a model loads",
     ["run", "{d}/m.cgraph", "--input", "x={d}/x.npy", "-o", "{d}/o.npz"],
     ["loads 6 weights (`w1`, `b1`, `w2`, ...)", "--weights"]),
    ("run B.bundle without the weights it loads",
     ["run", "{d}/build/mnist_mlp.bundle", "--input", "x={d}/x.npy", "-o", "{d}/o.npz"],
     ["loads 6 weights"]),
    ("weights random -o the model", ["weights", "random", "{d}/m.cgraph", "-o", "{d}/m.cgraph"],
     ["is the input"]),
    ("weights from-torch -o the checkpoint",
     ["weights", "from-torch", "{d}/ckpt.pt", "--model", "{d}/m.cgraph", "-o", "{d}/ckpt.pt"],
     ["is the input"]),
    ("weights from-torch -o a folder",
     ["weights", "from-torch", "{d}/ckpt.pt", "--model", "{d}/m.cgraph", "-o", "{d}"],
     ["is a folder"]),
    ("weights prepare B W -o W", [*PREPARE, "-o", "{d}/w.safetensors"], ["is the input"]),
    ("weights prepare B W -o B", [*PREPARE, "-o", "{d}/build/mnist_mlp.bundle"], ["is the input"]),
    ("weights prepare -o /dev/null", [*PREPARE, "-o", "{d}/null"], ["not a regular file"]),
    ("compile -o an existing file", [*COMPILE, "-o", "{d}/afile"], ["is a file"]),
    ("compile -o /dev/null", [*COMPILE, "-o", "/dev/null"], ["not a folder"]),
    ("compile -o a file's subfolder", [*COMPILE, "-o", "{d}/afile/sub"], ["is a file, not a"]),
    ("compile --weights that it would replace",
     [*COMPILE, "--weights", "{d}/build/mnist_mlp.safetensors", "-o", "{d}/build"],
     ["would replace", "is the input"]),
    ("tune -o /dev/null", ["tune", "{d}/build/mnist_mlp.bundle", "-o", "{d}/null"],
     ["not a regular file"]),
    ("tune -o the tuning database",
     ["tune", "{d}/build/mnist_mlp.bundle", "--tuning-db", "{d}/db.json", "-o", "{d}/db.json"],
     ["is the input"]),
    ("target capture -o a file's subfolder", ["target", "capture", "-o", "{d}/afile/t.json"],
     ["is a file, not a"]),
]


@pytest.mark.parametrize(("argv", "words"), [c[1:] for c in CORPUS], ids=[c[0] for c in CORPUS])
def test_hostile_command_line_is_one_sentence_and_loses_nothing(
        ws: Path, argv: list[str], words: list[str]) -> None:
    before = snapshot(ws)
    run = run_cli(*(a.replace("{d}", str(ws)) for a in argv))
    assert_one_sentence(run, 2, *words)
    assert snapshot(ws) == before


@pytest.mark.parametrize("command", ["run", "compile"])
def test_a_read_only_folder_is_an_io_error(ws: Path, read_only: Path, command: str) -> None:
    before = snapshot(ws)
    if command == "run":
        run = run_cli(*(a.replace("{d}", str(ws)) for a in RUN), "-o", str(read_only / "o.npz"))
    else:
        run = run_cli("compile", str(ws / "m.cgraph"), "-q", "-o", str(read_only / "build"))
    assert_one_sentence(run, 2, str(read_only))
    assert snapshot(ws) == before


def test_compile_without_the_cudnn_extra_says_which_extra_to_install(ws: Path) -> None:
    """The frontend's absence, simulated by blocking its import in a fresh interpreter."""
    code = ("import sys; sys.modules['cudnn'] = None; from dslc.cli import main; "
            "sys.exit(main(sys.argv[1:]))")
    before = snapshot(ws)
    proc = subprocess.run([sys.executable, "-c", code, "compile", str(ws / "m.cgraph"), "-o",
                           str(ws / "build")], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert_one_sentence(Run(proc.returncode, proc.stdout, proc.stderr), 3,
                        "pip install 'dslc[cudnn]'", "`dslc compile`")
    assert snapshot(ws) == before


def test_a_failed_write_of_the_set_keeps_the_previous_bundle_runner_and_weights(
        ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The disk fills up while the third file (the weights) is written: the bundle and runner,
    already written to temporaries, must not replace the previous ones."""
    out = ws / "build"  # holds a bundle, its runner and its weights
    before = snapshot(ws)
    real = weights_module.writer

    def disk_full(*args: object, **kwargs: object) -> object:
        write = real(*args, **kwargs)  # type: ignore[arg-type]

        def partial(tmp: str) -> None:
            write(tmp)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), tmp)
        return partial

    monkeypatch.setattr(weights_module, "writer", disk_full)
    run = run_cli("compile", str(ws / "m.cgraph"), "-q", "--precision", "f32", "--weights",
                  str(ws / "w.safetensors"), "-o", str(out))
    assert_one_sentence(run, 2, "no space left on device")
    assert snapshot(ws) == before  # the old set, and no temporary file left beside it


def test_replace_together_replaces_all_or_none(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    fsutil.replace_together([(a, lambda t: Path(t).write_text("a1")),
                             (b, lambda t: Path(t).write_text("b1"))])
    assert (a.read_text(), b.read_text()) == ("a1", "b1")

    def fail(tmp: str) -> None:
        Path(tmp).write_text("b2, half")
        raise OSError(errno.EIO, "simulated")

    with pytest.raises(OSError):
        fsutil.replace_together([(a, lambda t: Path(t).write_text("a2")), (b, fail)])
    assert (a.read_text(), b.read_text()) == ("a1", "b1")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b"]


def test_compile_replaces_the_previous_pair(ws: Path) -> None:
    """A second compile at another precision writes a new bundle and runner over the old ones."""
    out = ws / "build"
    old = snapshot(out)
    run = run_cli("compile", str(ws / "m.cgraph"), "-q", "--precision", "f32", "-o", str(out))
    assert run.code == 0, run.stderr
    new = snapshot(out)
    assert set(new) == set(old)
    assert new[f"{MODEL}.bundle"] != old[f"{MODEL}.bundle"]


@pytest.mark.parametrize(("raised", "code", "words"), [
    (TooManyErrors(), 1, ["error limit"]),
    (PermissionError(errno.EACCES, os.strerror(errno.EACCES), "/some/file"), 2,
     ["`/some/file`", "permission denied"]),
])
def test_the_error_limit_and_unforeseen_io_errors_are_not_internal_errors(
        monkeypatch: pytest.MonkeyPatch, raised: Exception, code: int, words: list[str]) -> None:
    """The last nets under every command: a stage stopping at `--max-errors`, or an OS error on
    a path no command checked, keep their exit codes."""
    import dslc.cli

    def stop(*args: object, **kwargs: object) -> None:
        raise raised

    monkeypatch.setattr(dslc.cli.front, "front_end", stop)
    assert_one_sentence(run_cli("check", "models/mlp.cgraph"), code, *words)
