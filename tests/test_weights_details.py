"""What dslc.weights promises in detail (written for the survivors of its mutation run): the
scales of random weights per role, how a PyTorch checkpoint is read (nesting, weights only,
bf16, what is skipped), each diagnostic's wording, label and help, safetensors metadata kept
byte-safe, and the error a file that cannot be read gives."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open

from dslc import weights
from dslc.check.context import ParamSpec
from dslc.core.types import Layout
from dslc.diag.diagnostic import Sink
from dslc.diag.span import Span


def _param(path: str, shape: tuple[int, ...], line: int = 1, dtype: str = "f32") -> ParamSpec:
    return ParamSpec(path, dtype, shape, Layout.row_major(len(shape)),
                     Span("m.cgraph", line, 3, line, 9))


def test_random_weights_have_the_scale_of_their_role() -> None:
    """Written from the docstring's promise (realistic scales): batchnorm variances in
    [0.5, 1.5] and means about N(0, 0.1); matrices N(0, 1/sqrt(fan_in)) with fan_in every axis
    but the first (a rank-2 weight too); norm scales in [0.8, 1.2]; biases N(0, 0.05)."""
    params = (_param("bn.running_var", (20000,)), _param("bn.running_mean", (20000,)),
              _param("conv.weight", (64, 8, 5, 5)), _param("fc.weight", (300, 200)),
              _param("norm.weight", (20000,)), _param("fc.bias", (20000,)))
    w = weights.random_weights(params, seed=11)
    var, mean = w["bn.running_var"], w["bn.running_mean"]
    assert var.min() >= 0.5 and var.max() <= 1.5 and abs(var.mean() - 1.0) < 0.01
    assert abs(mean.mean()) < 0.005 and abs(mean.std() - 0.1) < 0.005
    conv, fc = w["conv.weight"], w["fc.weight"]
    assert abs(conv.mean()) < 0.005 and abs(conv.std() - 1 / math.sqrt(8 * 5 * 5)) < 0.003
    assert abs(fc.mean()) < 0.005 and abs(fc.std() - 1 / math.sqrt(200)) < 0.002
    scale = w["norm.weight"]
    assert scale.min() >= 0.8 and scale.max() <= 1.2 and abs(scale.mean() - 1.0) < 0.005
    bias = w["fc.bias"]
    assert abs(bias.mean()) < 0.002 and abs(bias.std() - 0.05) < 0.002


def test_a_checkpoint_nested_under_model_or_state_dict_is_read(tmp_path: Path) -> None:
    for key in ("model", "state_dict"):
        path = tmp_path / f"{key}.pt"
        torch.save({key: {"w": torch.arange(4.0)}, "epoch": 3}, path)
        np.testing.assert_array_equal(weights.from_torch(path)["w"], [0, 1, 2, 3])


def test_entries_that_are_no_tensors_are_skipped_not_the_rest(tmp_path: Path) -> None:
    path = tmp_path / "c.pt"
    torch.save({"step": 5, "a": torch.ones(2), "note": "x", "b": torch.zeros(3)}, path)
    assert sorted(weights.from_torch(path)) == ["a", "b"]


def test_bf16_tensors_stay_bf16(tmp_path: Path) -> None:
    path = tmp_path / "c.pt"
    t = torch.tensor([1.5, -2.25, 3.0], dtype=torch.bfloat16)
    torch.save({"w": t, "f": torch.ones(2, dtype=torch.float16)}, path)
    got = weights.from_torch(path)
    assert weights.dtype_name(got["w"]) == "bf16" and got["f"].dtype == np.float16
    np.testing.assert_array_equal(got["w"].astype(np.float32), [1.5, -2.25, 3.0])


class _Pickled:  # not a tensor, a dict or a number: `weights_only` loading refuses it
    pass


def test_only_weights_are_unpickled(tmp_path: Path) -> None:
    path = tmp_path / "c.pt"
    torch.save({"w": torch.ones(1), "x": _Pickled()}, path)
    with pytest.raises(weights.WeightError, match=r"^cannot read the PyTorch checkpoint `"):
        weights.from_torch(path)


def test_what_holds_no_state_dict_says_so(tmp_path: Path) -> None:
    path = tmp_path / "c.pt"
    torch.save([torch.ones(1)], path)
    with pytest.raises(weights.WeightError) as err:
        weights.from_torch(path)
    assert str(err.value) == f"`{path}` holds no state_dict"


def test_without_torch_the_message_says_what_to_install(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(weights.WeightError) as err:
        weights.from_torch(tmp_path / "c.pt")
    assert str(err.value) == "reading a PyTorch checkpoint needs torch (`pip install torch`)"


def test_a_file_that_is_no_safetensors_names_itself(tmp_path: Path) -> None:
    path = tmp_path / "w.safetensors"
    path.write_bytes(b"not a safetensors file")
    with pytest.raises(weights.WeightError) as err:
        weights.load(path)
    assert str(err.value).startswith(f"cannot read weights `{path}`: ")


def test_metadata_is_written_and_a_name_that_is_no_utf8_keeps_its_bytes_as_escapes(
        tmp_path: Path) -> None:
    path = tmp_path / "w.safetensors"
    weights.save(path, {"w": np.ones(2, np.float32)}, {"source": "m\udcff.cgraph", "v": "1"})
    with safe_open(str(path), "np") as f:
        assert f.metadata() == {"source": "m\\udcff.cgraph", "v": "1"}


def test_each_mismatch_has_its_label_note_and_help() -> None:
    params = (_param("layer1.0.weight", (2, 3), line=4), _param("layer1.0.bias", (2,), line=5),
              _param("head.scale", (2,), line=6, dtype="f16"))
    sink = Sink()
    weights.validate({"layer1.0.weight": np.zeros((3, 3), np.float32),
                      "head.scale": np.zeros(2, np.int32),
                      "layer.weight": np.zeros(1, np.float32)}, params, sink, "`w`")
    by = {d.message: d for d in sink.diagnostics}
    shape = by["weight `layer1.0.weight` has shape [3, 3] in `w`, but the model declares [2, 3]"]
    assert (shape.span.line, shape.label) == (4, "declared here")
    missing = by["weight `layer1.0.bias` is missing from `w`"]
    assert (missing.span.line, missing.label, missing.notes) == \
        (5, "declared here", ("expected f32[2]",))
    dtype = by["weight `head.scale` is i32 in `w`, but the model declares f16"]
    assert dtype.label == "declared here" and "dslc weights from-torch" in dtype.help[0]
    extra = by["`w` holds 1 weight the model does not declare: `layer.weight`"]
    assert (extra.code, extra.span.line, extra.label) == \
        ("W0203", 4, "the model's parameters start here")
    assert extra.help == ("parameter names are instance paths, e.g. `layer1.0.weight`",)


def test_bf16_is_a_float_that_converts_to_the_declared_dtype() -> None:
    sink = Sink()
    bf16 = np.array([1.5, 2.0], dtype=weights.NUMPY_DTYPES["bf16"])
    out = weights.validate({"s": bf16}, (_param("s", (2,)),), sink, "`w`", convert=True)
    assert not sink.diagnostics and out["s"].dtype == np.float32
    np.testing.assert_array_equal(out["s"], [1.5, 2.0])


def test_a_dtype_dslc_has_no_name_for_is_named_as_numpy_names_it() -> None:
    assert weights.dtype_name(np.zeros(1, np.complex64)) == "complex64"


def test_every_weight_with_nan_or_inf_is_reported_not_just_the_first() -> None:
    params = (_param("a", (3,), line=2), _param("b", (3,), line=3), _param("c", (2,), line=4))
    sink = Sink()
    weights.report_nonfinite({"a": np.ones(3, np.float32),
                              "b": np.array([1, np.nan, np.inf], np.float32),
                              "c": np.array([np.nan, 0], np.float32)}, params, sink, "`w`")
    assert [(d.code, d.span.line) for d in sink.diagnostics] == [("W0202", 3), ("W0202", 4)]
    d = sink.diagnostics[0]
    assert d.label == "declared here"
    assert d.help == ("the outputs that depend on it may be NaN or infinite too; if the values "
                      "are meant (a -inf mask), silence this with `--allow W0202`",)


def test_a_file_that_is_not_there_names_itself(tmp_path: Path) -> None:
    path = tmp_path / "missing.safetensors"
    with pytest.raises(weights.WeightError) as err:
        weights.load(path)
    assert str(err.value).startswith(f"cannot read weights `{path}`: ")


def test_validate_reports_nonfinite_weights_unless_told_not_to() -> None:
    params = (_param("w", (2,)),)
    nan = {"w": np.array([np.nan, 1.0], np.float32)}
    sink = Sink()
    weights.validate(nan, params, sink, "`w`")
    assert [d.code for d in sink.diagnostics] == ["W0202"]
    quiet = Sink()
    weights.validate(nan, params, quiet, "`w`", finite=False)
    assert not quiet.diagnostics


@pytest.mark.parametrize("stored", ["f32", "f16", "f8e4m3", "f8e5m2"])
def test_every_float_dtype_converts_to_the_declared_one(stored: str) -> None:
    """f32 (PyTorch's) and f16 are numpy floats; bf16 and the fp8 types (ml_dtypes) are not,
    and are known by name."""
    sink = Sink()
    a = np.array([1.5, -2.0], dtype=weights.NUMPY_DTYPES[stored])
    out = weights.validate({"s": a}, (_param("s", (2,), dtype="bf16"),), sink, "`w`",
                           convert=True)
    assert not sink.diagnostics and out["s"].dtype == weights.NUMPY_DTYPES["bf16"]
    np.testing.assert_array_equal(out["s"].astype(np.float32), [1.5, -2.0])


def test_a_dtype_mismatch_says_how_to_convert() -> None:
    sink = Sink()
    weights.validate({"s": np.zeros(2, np.int32)}, (_param("s", (2,)),), sink, "`w`")
    [d] = sink.diagnostics
    assert d.help == ("convert the file with `dslc weights from-torch` (it casts floats to the "
                      "declared dtypes)",)


@pytest.mark.parametrize(("count", "shown"), [
    (2, "`w` holds 2 weights the model does not declare: `e0`, `e1`"),
    (3, "`w` holds 3 weights the model does not declare: `e0`, `e1`, `e2`"),
    (4, "`w` holds 4 weights the model does not declare: `e0`, `e1`, `e2` and 1 more"),
])
def test_extra_weights_are_counted_and_the_first_three_named(count: int, shown: str) -> None:
    sink = Sink()
    extra = {f"e{i}": np.zeros(1, np.float32) for i in range(count)}
    weights.validate({"w": np.zeros(1, np.float32), **extra}, (_param("w", (1,)),), sink, "`w`")
    assert [d.message for d in sink.diagnostics] == [shown]


def test_extra_weights_of_a_model_without_params_are_reported_without_a_span() -> None:
    sink = Sink()
    weights.validate({"e": np.zeros(1, np.float32)}, (), sink, "`w`")
    [d] = sink.diagnostics
    assert d.code == "W0203" and d.span.line == 0


def test_the_help_for_extra_names_compares_their_last_component() -> None:
    wanted = {"fc2.weight": _param("fc2.weight", (1,))}
    assert weights._extra_help(["blk.fc.weight"], wanted) == \
        "parameter names are instance paths, e.g. `fc2.weight`"
    assert weights._extra_help(["blk.fc.gamma"], wanted) == \
        "`dslc weights from-torch --prefix P` reads the weights under a prefix"


def test_a_missing_weight_does_not_stop_the_nonfinite_report() -> None:
    sink = Sink()
    weights.report_nonfinite({"b": np.array([np.inf], np.float32)},
                             (_param("a", (1,)), _param("b", (1,), line=3)), sink, "`w`")
    assert [(d.code, d.span.line) for d in sink.diagnostics] == [("W0202", 3)]


def test_random_weights_are_the_seeds_and_seed_0_by_default() -> None:
    params = (_param("fc.weight", (4, 3)),)
    a, b = weights.random_weights(params, seed=5), weights.random_weights(params, seed=5)
    np.testing.assert_array_equal(a["fc.weight"], b["fc.weight"])
    np.testing.assert_array_equal(weights.random_weights(params)["fc.weight"],
                                  weights.random_weights(params, seed=0)["fc.weight"])


def test_a_norm_scale_deep_in_a_path_is_drawn_as_a_norm_scale() -> None:
    w = weights.random_weights((_param("layers.0.norm.weight", (5000,)),), seed=3)
    scale = w["layers.0.norm.weight"]
    assert scale.min() >= 0.8 and scale.max() <= 1.2


def test_a_checkpoint_is_loaded_onto_the_cpu_and_as_weights_only(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkpoint saved from GPU tensors must load on a machine without one
    (`map_location="cpu"`), and no pickled code runs (`weights_only=True`): the arguments
    torch.load gets (this machine has no GPU to save such a checkpoint with)."""
    path = tmp_path / "c.pt"
    torch.save({"w": torch.ones(2)}, path)
    seen = {}
    load = torch.load

    def spy(*args: object, **kwargs: object) -> object:
        seen.update(kwargs)
        return load(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(torch, "load", spy)
    weights.from_torch(path)
    assert seen == {"map_location": "cpu", "weights_only": True}


def test_convert_casts_floats_only_an_integer_weight_stays_a_mismatch() -> None:
    sink = Sink()
    out = weights.validate({"s": np.arange(2, dtype=np.int32)}, (_param("s", (2,)),), sink,
                           "`w`", convert=True)
    assert "s" not in out and [d.code for d in sink.diagnostics] == ["R0202"]
