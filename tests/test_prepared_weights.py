"""Prepared weights (`dslc weights prepare`): a bundle's load-time values computed once and saved
in their device bytes, so start-up uploads them as they are. The runner takes either file; a
prepared file made for another build is refused, and the reference backend asks for the raw one."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dslc.runtime import Model, RunnerError, params
from tests.helpers import run_cli


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    out = tmp_path_factory.mktemp("resnet18")
    assert run_cli("compile", "models/resnet18.cgraph", "-o", str(out), "-q").code == 0
    raw = out / "w.safetensors"
    assert run_cli("weights", "random", "models/resnet18.cgraph", "-o", str(raw)).code == 0
    prepared = out / "w.prepared.safetensors"
    run = run_cli("weights", "prepare", str(out / "resnet18.bundle"), str(raw), "-o", str(prepared))
    assert run.code == 0, run.stderr
    return out / "resnet18.bundle", raw, prepared


def test_prepared_weights_hold_the_load_time_values_in_device_bytes(
        built: tuple[Path, Path, Path]) -> None:
    bundle, raw, prepared = built
    model = Model(bundle, prepared)
    want = params.prepare(model.program, params.read(raw, model.manifest))
    got = model._host_weights
    assert got is not None and set(got) == set(want) == set(model.program.weights_used())
    folded = [n for n in want if model.program.nodes[n].op != "param"]
    assert folded  # batchnorm folding happened at prepare time
    for name, data in want.items():
        assert np.array_equal(got[name], data), name


def test_a_plain_weights_file_still_loads(built: tuple[Path, Path, Path]) -> None:
    bundle, raw, _ = built
    model = Model(bundle, raw)
    assert not model._prepared and model._host_weights is not None


def test_prepared_weights_of_another_build_are_refused(built: tuple[Path, Path, Path],
                                                      tmp_path: Path) -> None:
    _, _, prepared = built
    other = tmp_path / "other"
    assert run_cli("compile", "models/resnet18.cgraph", "-o", str(other), "-q",
                   "--precision", "f32").code == 0
    with pytest.raises(RunnerError) as err:
        Model(other / "resnet18.bundle", prepared)
    assert err.value.code == "R0202" and "prepare it again" in str(err.value)


def test_reference_backend_asks_for_the_raw_weights(built: tuple[Path, Path, Path],
                                                    tmp_path: Path) -> None:
    bundle, _, prepared = built
    image = tmp_path / "image.npy"
    np.save(image, np.zeros((1, 3, 224, 224), np.float16))
    run = run_cli("run", str(bundle), "--weights", str(prepared), "--input", f"image={image}",
                  "-o", str(tmp_path / "out.npz"))
    assert run.code == 1
    assert "R0202" in run.stderr and "prepared for one bundle" in run.stderr
