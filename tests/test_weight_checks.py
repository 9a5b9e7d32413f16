"""What weights are checked for: converted to a `--precision` override (not refused), the error
limit reached by a mismatching file (exit 1, never an internal error), prepared weights whose
bytes do not fit the bundle (R0202 naming the value), NaN and infinities (W0202 when converted
or checked, logged once when a runner loads them), and a model without params run without
weights."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

from dslc.runtime import Model, RunnerError, params
from tests.conftest import ROOT
from tests.helpers import run_cli

SEED = 20240611  # every random array below comes from it


@pytest.fixture(scope="module")
def mlp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """mlp.cgraph (f16 params), its random weights, an f16 input and a compiled bundle."""
    d = tmp_path_factory.mktemp("mlp")
    shutil.copy(ROOT / "models" / "mlp.cgraph", d / "m.cgraph")
    assert run_cli("weights", "random", str(d / "m.cgraph"), "-o", str(d / "w.safetensors"),
                   "--seed", "5").code == 0
    np.save(d / "x.npy", np.random.default_rng(SEED).standard_normal((3, 784)).astype(np.float16))
    assert run_cli("compile", str(d / "m.cgraph"), "-q", "-o", str(d / "build")).code == 0
    return d


def _torch_mlp(w: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    """The model in f32, written with torch (the independent oracle)."""
    t = {k: torch.from_numpy(v.astype(np.float32)) for k, v in w.items()}
    h1 = torch.relu(torch.from_numpy(x.astype(np.float32)) @ t["w1"] + t["b1"])
    h2 = torch.nn.functional.gelu(h1 @ t["w2"] + t["b2"])
    return (h2 @ t["w3"] + t["b3"]).numpy()


# -- defect 3: --precision converts the model's own weights ------------------------------------
def test_run_at_f32_converts_the_model_weights_and_says_so_once(mlp: Path, tmp_path: Path) -> None:
    x = np.load(mlp / "x.npy").astype(np.float32)
    np.save(tmp_path / "x32.npy", x)
    run = run_cli("run", str(mlp / "m.cgraph"), "--precision", "f32", "--weights",
                  str(mlp / "w.safetensors"), "--input", f"x={tmp_path / 'x32.npy'}",
                  "-o", str(tmp_path / "o.npz"))
    assert run.code == 0, run.stderr
    notes = [line for line in run.stderr.splitlines() if line.startswith("note:")]
    assert notes == ["note: weights converted to the dtypes `--precision f32` declares: "
                     "6 from f16 to f32"]
    want = _torch_mlp(load_file(str(mlp / "w.safetensors")), x)
    np.testing.assert_allclose(np.load(tmp_path / "o.npz")["logits"], want, rtol=1e-4, atol=1e-4)


def test_compile_at_f32_puts_converted_weights_beside_the_bundle(mlp: Path, tmp_path: Path) -> None:
    run = run_cli("compile", str(mlp / "m.cgraph"), "-q", "--precision", "f32", "--weights",
                  str(mlp / "w.safetensors"), "-o", str(tmp_path))
    assert run.code == 0, run.stderr
    given, saved = load_file(str(mlp / "w.safetensors")), load_file(str(tmp_path / "mnist_mlp.safetensors"))
    assert {a.dtype for a in saved.values()} == {np.dtype(np.float32)}
    for name, a in given.items():
        assert np.array_equal(saved[name], a.astype(np.float32)), name  # f16 -> f32 is exact


def _f64_copy(src: Path, dst: Path) -> None:
    save_file({k: v.astype(np.float64) for k, v in load_file(str(src)).items()}, str(dst))


@pytest.mark.parametrize("limit", [None, "3"])
def test_many_mismatching_weights_stop_at_the_error_limit_with_exit_1(
        tmp_path: Path, limit: str | None) -> None:
    """ResNet-18's 102 params given as f64 (a dtype the model never declares): more errors than
    the limit, which ends the report, not the process."""
    model = ROOT / "models" / "resnet18.cgraph"
    w = tmp_path / "w.safetensors"
    assert run_cli("weights", "random", str(model), "-o", str(w)).code == 0
    _f64_copy(w, tmp_path / "w64.safetensors")
    image = tmp_path / "image.npy"
    np.save(image, np.zeros((1, 3, 224, 224), np.float16))
    extra = ["--max-errors", limit] if limit else []
    run = run_cli("run", str(model), "--weights", str(tmp_path / "w64.safetensors"),
                  "--input", f"image={image}", "-o", str(tmp_path / "o.npz"), *extra)
    assert run.code == 1, run.stderr
    assert "internal error" not in run.stderr and "Traceback" not in run.stderr
    assert run.stderr.count("error[R0202]") == int(limit or 50)
    assert run.stderr.rstrip().endswith(f": {limit or 50} errors")
    assert not (tmp_path / "o.npz").exists()


def test_denied_warnings_past_the_limit_end_in_exit_1(mlp: Path, tmp_path: Path) -> None:
    tensors = load_file(str(mlp / "w.safetensors"))
    for a in tensors.values():
        a.reshape(-1)[0] = np.nan
    save_file(tensors, str(tmp_path / "nan.safetensors"))
    run = run_cli("compile", str(mlp / "m.cgraph"), "-q", "--deny-warnings", "--max-errors", "2",
                  "--weights", str(tmp_path / "nan.safetensors"), "-o", str(tmp_path / "out"))
    assert run.code == 1 and run.stderr.count("error[W0202]") == 2, run.stderr
    assert "internal error" not in run.stderr and not (tmp_path / "out").exists()


# -- defect 9: prepared weights hold exactly the bytes the bundle reads ------------------------
@pytest.fixture(scope="module")
def prepared(mlp: Path) -> tuple[Path, dict[str, np.ndarray], dict[str, str]]:
    path = mlp / "p.safetensors"
    run = run_cli("weights", "prepare", str(mlp / "build" / "mnist_mlp.bundle"),
                  str(mlp / "w.safetensors"), "-o", str(path))
    assert run.code == 0, run.stderr
    with safe_open(str(path), framework="np") as f:
        meta = dict(f.metadata())
    return path, load_file(str(path)), meta


FORGERIES = {
    "2-byte tensors": lambda a: a[:2],
    "one byte short": lambda a: a[:-1],
    "one byte more": lambda a: np.concatenate([a, a[:1]]),
    "the bytes as f16": lambda a: a.view(np.float16),
    "the bytes as a matrix": lambda a: a.reshape(2, -1),
}


@pytest.mark.parametrize("forge", FORGERIES.values(), ids=FORGERIES.keys())
def test_prepared_weights_with_the_right_digest_but_wrong_bytes_are_refused(
        mlp: Path, prepared: tuple[Path, dict[str, np.ndarray], dict[str, str]], tmp_path: Path,
        forge: object) -> None:
    _, data, meta = prepared
    forged = dict(data)
    forged["w2"] = forge(data["w2"])  # type: ignore[operator]
    path = tmp_path / "forged.safetensors"
    save_file(forged, str(path), metadata=meta)
    with pytest.raises(RunnerError) as err:
        Model(mlp / "build" / "mnist_mlp.bundle", path)
    assert err.value.code == "R0202"
    assert "the prepared value `w2`" in str(err.value) and "524,288 bytes (f16[512, 512])" in str(
        err.value)


# -- defect 11: NaN and infinities --------------------------------------------------------------
TORCH_FLOATS = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16,
                "f8e4m3": torch.float8_e4m3fn, "f8e5m2": torch.float8_e5m2}
NUMPY_FLOATS = {"f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16,
                "f8e4m3": ml_dtypes.float8_e4m3fn, "f8e5m2": ml_dtypes.float8_e5m2}
BITS = {1: np.uint8, 2: np.uint16, 4: np.uint32}


@pytest.mark.parametrize("dtype", TORCH_FLOATS)
def test_nonfinite_counts_match_torch(dtype: str) -> None:
    """Counted from exponent bits; torch counts the same tensor's NaN and infinities."""
    gen = torch.Generator().manual_seed(SEED)
    t = torch.randn(3_000_001, generator=gen) * 4
    where = torch.randperm(t.numel(), generator=gen)
    t[where[:37]] = float("nan")
    t[where[37:41]] = float("inf")
    t[where[41:50]] = float("-inf")
    t = t.to(TORCH_FLOATS[dtype])
    nbytes = t.element_size()
    a = t.view(getattr(torch, f"uint{8 * nbytes}") if nbytes > 1 else torch.uint8).numpy()
    a = a.view(BITS[nbytes]).view(NUMPY_FLOATS[dtype])
    wide = t.float()
    assert params.nonfinite(a) == (int(wide.isnan().sum()), int(wide.isinf().sum()))
    assert params.nonfinite(np.zeros(0, NUMPY_FLOATS[dtype])) == (0, 0)
    assert params.nonfinite(np.arange(5, dtype=np.int32)) == (0, 0)


@pytest.fixture
def nan_checkpoint(mlp: Path, tmp_path: Path) -> Path:
    state = {k: torch.from_numpy(v.astype(np.float32))
             for k, v in load_file(str(mlp / "w.safetensors")).items()}
    state["w2"][7, :12] = float("nan")
    state["b1"][3] = float("-inf")
    path = tmp_path / "diverged.pt"
    torch.save(state, path)
    return path


def test_from_torch_warns_about_nan_naming_the_weight_and_the_count(
        mlp: Path, nan_checkpoint: Path, tmp_path: Path) -> None:
    out = tmp_path / "w.safetensors"
    run = run_cli("weights", "from-torch", str(nan_checkpoint), "--model", str(mlp / "m.cgraph"),
                  "-o", str(out))
    assert run.code == 0, run.stderr
    assert f"warning[W0202]: weight `w2` holds 12 NaN values of 262,144 in `{nan_checkpoint}`" \
        in run.stderr
    assert "warning[W0202]: weight `b1` holds 1 infinite value of 512" in run.stderr
    assert np.isnan(load_file(str(out))["w2"]).sum() == 12


def test_from_torch_with_denied_warnings_writes_nothing(
        mlp: Path, nan_checkpoint: Path, tmp_path: Path) -> None:
    out = tmp_path / "w.safetensors"
    shutil.copy(mlp / "w.safetensors", out)
    before = out.read_bytes()
    run = run_cli("weights", "from-torch", str(nan_checkpoint), "--model", str(mlp / "m.cgraph"),
                  "-o", str(out), "--deny-warnings")
    assert run.code == 1 and "error[W0202]" in run.stderr
    assert out.read_bytes() == before


def test_allowed_infinities_are_not_reported(mlp: Path, nan_checkpoint: Path,
                                             tmp_path: Path) -> None:
    run = run_cli("weights", "from-torch", str(nan_checkpoint), "--model", str(mlp / "m.cgraph"),
                  "-o", str(tmp_path / "w.safetensors"), "--allow", "W0202")
    assert run.code == 0 and "W0202" not in run.stderr


@pytest.fixture
def nan_weights(mlp: Path, tmp_path: Path) -> Path:
    tensors = load_file(str(mlp / "w.safetensors"))
    tensors["w3"][:, 2] = np.nan  # 512 values
    tensors["b2"][:2] = np.inf
    path = tmp_path / "nan.safetensors"
    save_file(tensors, str(path))
    return path


def test_run_of_a_bundle_warns_once_and_denied_writes_nothing(mlp: Path, nan_weights: Path,
                                                             tmp_path: Path) -> None:
    argv = ["run", str(mlp / "build" / "mnist_mlp.bundle"), "--weights", str(nan_weights),
            "--input", f"x={mlp / 'x.npy'}", "-o", str(tmp_path / "o.npz")]
    run = run_cli(*argv, "--deny-warnings")
    assert run.code == 1 and not (tmp_path / "o.npz").exists()
    assert run.stderr.strip() == (
        f"error[W0202]: weight `b2` holds 2 infinite values of 512 in `{nan_weights}` (1 more "
        "weight holds some too); the outputs that depend on it may be NaN or infinite too")
    run = run_cli(*argv)
    assert run.code == 0 and run.stderr.count("warning[W0202]") == 1


def test_runner_logs_nan_once_for_raw_and_prepared_weights(
        mlp: Path, nan_weights: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    bundle = mlp / "build" / "mnist_mlp.bundle"
    prepared_nan = tmp_path / "p.safetensors"
    assert run_cli("weights", "prepare", str(bundle), str(nan_weights), "-o",
                   str(prepared_nan)).code == 0
    for weights in (nan_weights, prepared_nan):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="dslc.runtime"):
            Model(bundle, weights)
        records = [r.getMessage() for r in caplog.records if "W0202" in r.getMessage()]
        assert len(records) == 1, records
        assert "weight `b2` holds 2 infinite values of 512" in records[0]
        assert "(1 more weight holds some too)" in records[0]


# -- a model without params runs without weights -----------------------------------------------
def test_a_model_without_params_runs_without_weights(tmp_path: Path) -> None:
    source = tmp_path / "noparams.cgraph"
    source.write_text("model noparams {\n  precision io=f32\n  input x: [2, 3]\n"
                      "  output y: [2, 3] = relu(x) * x\n}\n")
    x = np.random.default_rng(SEED).standard_normal((2, 3)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    want = (torch.relu(torch.from_numpy(x)) * torch.from_numpy(x)).numpy()
    assert run_cli("compile", str(source), "-q", "-o", str(tmp_path / "b")).code == 0
    for given in (source, tmp_path / "b" / "noparams.bundle"):
        out = tmp_path / f"{given.suffix[1:]}.npz"
        run = run_cli("run", str(given), "--input", f"x={tmp_path / 'x.npy'}", "-o", str(out))
        assert run.code == 0, run.stderr
        np.testing.assert_allclose(np.load(out)["y"], want, rtol=1e-6)
