"""Prepared weights (`dslc weights prepare`): a bundle's load-time values computed once and saved
in their device bytes, so start-up uploads them as they are. The runner takes either file; a
prepared file made for another build is refused, and the reference backend asks for the raw one."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file

from dslc.runtime import Model, RunnerError
from dslc.runtime import bundle as bundle_file
from dslc.runtime.schedule import Schedule
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


def _params_of(program: Schedule, name: str) -> set[str]:
    """The param paths a value is computed from."""
    node = program.nodes[name]
    if node.op == "param":
        return {node.attrs["path"]}
    return set().union(*(_params_of(program, i) for i in node.inputs)) if node.inputs else set()


def _expected(program: Schedule, name: str, raw: dict[str, np.ndarray]) -> torch.Tensor:
    """A prepared value worked out with PyTorch from the raw weights: a conv weight folded with
    its batchnorm (w * gamma / sqrt(var + eps)), the batchnorm's shift (beta - mean * gamma /
    sqrt(var + eps)), or a param as it is; in the value's dtype and memory order."""
    node = program.nodes[name]
    paths = _params_of(program, name)
    t = {p: torch.from_numpy(raw[p]).float() for p in paths}
    if len(paths) == 1:
        value = t[paths.pop()]
    else:
        bn = next(p for p in paths if p.endswith(".running_var")).rsplit(".", 1)[0]
        stats = {f"{bn}.{k}" for k in ("weight", "bias", "running_mean", "running_var")}
        scale = t[f"{bn}.weight"] / torch.sqrt(t[f"{bn}.running_var"] + 1e-5)  # PyTorch's eps
        if len(node.type.shape) == 4:  # the conv's weight, folded
            [conv] = paths - stats
            value = t[conv] * scale.reshape(-1, 1, 1, 1)
        else:  # the batchnorm's shift, the conv's bias
            assert paths == stats, paths
            value = t[f"{bn}.bias"] - t[f"{bn}.running_mean"] * scale
    value = value.to({"f16": torch.float16, "f32": torch.float32}[node.type.dtype])
    layout = str(node.type.layout)
    if layout == "@NHWC":  # channels-last: the bytes of torch's channels_last memory format
        return value.permute(0, 2, 3, 1).contiguous()
    assert node.type.layout is None or node.type.layout.order == tuple(range(value.dim())), layout
    return value.contiguous()


def test_prepared_weights_hold_the_load_time_values_in_device_bytes(
        built: tuple[Path, Path, Path]) -> None:
    """Each value in the prepared file, read as the bytes it is, equals the value worked out with
    PyTorch from the raw weights (folded batchnorms in f16, channels-last), within one f16 unit
    in the last place (PyTorch's sqrt and numpy's rsqrt may differ by one f32 ulp before the
    rounding to f16)."""
    bundle, raw_path, prepared = built
    Model(bundle, prepared)  # accepted as this bundle's
    program = Schedule(bundle_file.read(bundle))
    raw = load_file(str(raw_path))
    data = load_file(str(prepared))
    assert set(data) == set(program.weights_used())
    folded = 0
    for name, stored in data.items():
        want = _expected(program, name, raw)
        dtype = {torch.float16: np.float16, torch.float32: np.float32}[want.dtype]
        got = stored.view(dtype).reshape(tuple(want.shape)).astype(np.float64)
        w = want.double().numpy()
        ulp = np.spacing(np.abs(w).astype(dtype)).astype(np.float64)
        assert np.all(np.abs(got - w) <= ulp), (name, np.abs(got - w).max())
        folded += len(_params_of(program, name)) > 1
    # every batchnorm of resnet18 follows a conv: a folded weight and a shift for each
    assert folded == 2 * sum(path.endswith(".running_var") for path in raw) > 0


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
