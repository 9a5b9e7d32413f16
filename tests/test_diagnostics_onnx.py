"""Golden tests of `dslc import`'s diagnostics (E09): each case builds an ONNX model with
`onnx.helper`, imports it, and its human and JSON renderings must equal
`tests/diagnostics/onnx/<CODE>_<case>.stderr` and `.json` (`pytest --bless` rewrites them).
Every unsupported node is reported at once, by name, op type and model, and nothing is written."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from dslc.diag.codes import CODES  # noqa: E402
from tests.conftest import ROOT  # noqa: E402
from tests.helpers import run_cli  # noqa: E402

GOLDEN = ROOT / "tests" / "diagnostics" / "onnx"


def _model(nodes: list[Any], inits: dict[str, np.ndarray], opset: int = 17,
           extra_domains: tuple[str, ...] = ()) -> Any:
    graph = helper.make_graph(
        nodes, "detector", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("top", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    opsets = [helper.make_opsetid("", opset), *(helper.make_opsetid(d, 1) for d in extra_domains)]
    return helper.make_model(graph, opset_imports=opsets)


def unsupported_ops() -> Any:
    """Three nodes without a counterpart (one of another domain), one reading a failed node (not
    reported again), and a node that imports fine."""
    return _model([
        helper.make_node("Relu", ["x"], ["r"], name="stem_relu"),
        helper.make_node("Flatten", ["r"], ["flat"], name="flatten"),
        helper.make_node("TopK", ["flat", "k"], ["top", "top_i"], name="head/topk"),
        helper.make_node("Neg", ["top_i"], ["n"], name="after_topk"),
        helper.make_node("FusedGemm", ["flat", "w"], ["g"], name="fused", domain="com.microsoft"),
        helper.make_node("Det", ["g"], ["y"], name="det"),
    ], {"k": np.array([5], np.int64), "w": np.ones((192, 4), np.float32)},
        extra_domains=("com.microsoft",))


def old_opset() -> Any:
    return _model([helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Relu", ["x"], ["top"])],
                  {}, opset=11)


CASES: dict[str, Callable[[], Any]] = {"E0901_unsupported_ops": unsupported_ops,
                                       "E0902_old_opset": old_opset}


def _golden(path: Path, actual: str, bless: bool) -> None:
    if bless:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(actual)
        return
    assert path.exists(), f"missing {path.name}: run `pytest --bless` to create it"
    assert actual == path.read_text(), f"{path.name} differs (update with `pytest --bless`)"


@pytest.mark.parametrize("case", CASES)
def test_import_diagnostic_golden(case: str, bless: bool, tmp_path: Path,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # the model is named as given: `detector.onnx`
    onnx.save(CASES[case](), "detector.onnx")
    human = run_cli("import", "detector.onnx", "-o", "detector.cgraph", "--color", "never")
    js = run_cli("import", "detector.onnx", "-o", "detector.cgraph", "--error-format", "json")
    assert human.code == js.code == 1
    assert not Path("detector.cgraph").exists() and not Path("detector.safetensors").exists()
    assert "Traceback" not in human.stderr
    _golden(GOLDEN / f"{case}.stderr", human.stderr, bless)
    _golden(GOLDEN / f"{case}.json", js.stdout, bless)
    assert {d["code"] for d in js.json_lines()} == {case.split("_")[0]}


def test_every_unsupported_node_is_reported_at_once_by_name_and_type() -> None:
    text = (GOLDEN / "E0901_unsupported_ops.stderr").read_text()
    for name, op in (("head/topk", "TopK"), ("fused", "FusedGemm")):
        assert f"cannot import node `{name}` (`{op}`) of `detector.onnx`" in text
    assert "after_topk" not in text and "`det`" not in text  # they only read failed nodes
    assert text.count("error[E0901]") == 2


def test_every_import_code_has_a_golden_case() -> None:
    covered = {case.split("_")[0] for case in CASES}
    assert covered == {c for c in CODES if c.startswith("E09")}
