"""`dslc import` op by op: one-node (or few-node) ONNX graphs built with `onnx.helper`, imported,
and run by the reference executor against onnxruntime on the same inputs; and what the text
says for the patterns that become the standard library's layers."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from tests.helpers import rel_error, rng, run_cli  # noqa: E402
from tests.onnx_helpers import import_file, run_onnxruntime, run_reference  # noqa: E402

F = np.float32


def _r(*shape: int, seed: int = 0, positive: bool = False) -> np.ndarray:
    a = rng("onnx op", shape, seed).standard_normal(shape).astype(F)
    return np.abs(a) + 0.5 if positive else a


@dataclass
class Graph:
    """Nodes over named inputs (fed at run time) and initializers; `y` is the output."""

    nodes: list[Any]
    inputs: dict[str, np.ndarray]
    inits: dict[str, np.ndarray] = field(default_factory=dict)
    opset: int = 17

    def save(self, path: Path) -> Path:
        graph = helper.make_graph(
            self.nodes, "g",
            [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
             for k, v in self.inputs.items()],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],  # every case is f32
            [numpy_helper.from_array(v, k) for k, v in self.inits.items()])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)])
        onnx.save(model, str(path))
        return path


def node(op: str, inputs: list[str], **attrs: Any) -> Any:
    return helper.make_node(op, inputs, ["y"], **attrs)


def one(op: str, shape: tuple[int, ...] = (2, 3, 4, 5), **attrs: Any) -> Graph:
    return Graph([node(op, ["x"], **attrs)], {"x": _r(*shape)})


def _i64(*values: int) -> np.ndarray:
    return np.array(values, np.int64)


CASES: dict[str, Graph] = {
    **{op.lower(): one(op) for op in ("Relu", "Sigmoid", "Tanh", "Erf", "Abs", "Neg", "Exp",
                                      "Softplus", "HardSwish", "Floor", "Sin")},
    "sqrt": Graph([node("Sqrt", ["x"])], {"x": _r(2, 3, positive=True)}),
    "log": Graph([node("Log", ["x"])], {"x": _r(2, 3, positive=True)}),
    "reciprocal": Graph([node("Reciprocal", ["x"])], {"x": _r(2, 3, positive=True)}),
    "leaky_relu": one("LeakyRelu", alpha=0.2),
    "elu": one("Elu", alpha=0.7),
    "selu": one("Selu"),
    "hard_sigmoid": one("HardSigmoid", alpha=0.3, beta=0.4),
    "gelu": Graph([node("Gelu", ["x"])], {"x": _r(2, 8)}, opset=20),
    "gelu_tanh": Graph([node("Gelu", ["x"], approximate="tanh")], {"x": _r(2, 8)}, opset=20),
    "add_broadcast": Graph([node("Add", ["x", "b"])], {"x": _r(2, 3, 4)}, {"b": _r(4, seed=1)}),
    "sub_scalar": Graph([node("Sub", ["c", "x"])], {"x": _r(2, 3)}, {"c": np.array(2.0, F)}),
    "mul_two_inputs": Graph([node("Mul", ["x", "z"])], {"x": _r(2, 3), "z": _r(2, 3, seed=1)}),
    "div": Graph([node("Div", ["x", "c"])], {"x": _r(2, 3)}, {"c": _r(3, positive=True)}),
    "pow_square": Graph([node("Pow", ["x", "p"])], {"x": _r(2, 3)}, {"p": np.array(2.0, F)}),
    "max_min": Graph([helper.make_node("Max", ["x", "z"], ["m"]), node("Min", ["m", "c"])],
                     {"x": _r(2, 3), "z": _r(2, 3, seed=1)}, {"c": np.array(0.5, F)}),
    "sum_of_three": Graph([node("Sum", ["x", "x", "z"])], {"x": _r(3), "z": _r(3, seed=2)}),
    "clip_relu6": Graph([node("Clip", ["x", "lo", "hi"])], {"x": _r(2, 5) * 5},
                        {"lo": np.array(0.0, F), "hi": np.array(6.0, F)}),
    "where": Graph([helper.make_node("Greater", ["x", "zero"], ["c"]),
                    node("Where", ["c", "x", "z"])],
                   {"x": _r(2, 3), "z": _r(2, 3, seed=1)}, {"zero": np.array(0.0, F)}),
    "matmul_batched": Graph([node("MatMul", ["x", "w"])], {"x": _r(2, 3, 4)},
                            {"w": _r(4, 5, seed=1)}),
    "gemm_trans_b": Graph([node("Gemm", ["x", "fc.weight", "fc.bias"], transB=1)],
                          {"x": _r(2, 4)}, {"fc.weight": _r(3, 4, seed=1),
                                            "fc.bias": _r(3, seed=2)}),
    "gemm_alpha_beta": Graph([node("Gemm", ["x", "w", "c"], alpha=0.5, beta=2.0)],
                             {"x": _r(2, 4)}, {"w": _r(4, 3, seed=1), "c": _r(3, seed=2)}),
    "softmax_axis_1": one("Softmax", axis=1),
    "log_softmax": one("LogSoftmax", (3, 7)),
    "reduce_mean_keep": Graph([node("ReduceMean", ["x"], axes=[2, 3], keepdims=1)],
                              {"x": _r(2, 3, 4, 5)}),
    "reduce_sum_axes_input": Graph([node("ReduceSum", ["x", "a"], keepdims=0)], {"x": _r(2, 3, 4)},
                                   {"a": _i64(1)}),
    "reduce_max": Graph([node("ReduceMax", ["x"], axes=[-1], keepdims=0)], {"x": _r(2, 3, 4)}),
    "reshape_minus_one": Graph([node("Reshape", ["x", "s"])], {"x": _r(2, 3, 4)},
                               {"s": _i64(0, -1)}),
    "flatten": one("Flatten", axis=1),
    "transpose": one("Transpose", perm=[0, 2, 3, 1]),
    "squeeze_unsqueeze": Graph([helper.make_node("Unsqueeze", ["x", "a"], ["u"]),
                                node("Squeeze", ["u", "a"])], {"x": _r(2, 3)}, {"a": _i64(1)}),
    "concat": Graph([node("Concat", ["x", "z"], axis=1)], {"x": _r(2, 3), "z": _r(2, 4, seed=1)}),
    "split_and_add": Graph([helper.make_node("Split", ["x"], ["a", "b"], axis=1),
                            node("Add", ["a", "b"])], {"x": _r(2, 6)}),
    "slice": Graph([node("Slice", ["x", "s", "e", "a"])], {"x": _r(2, 8, 3)},
                   {"s": _i64(1), "e": _i64(-2), "a": _i64(1)}),
    "gather_index": Graph([node("Gather", ["x", "i"], axis=1)], {"x": _r(2, 5, 3)},
                          {"i": np.array(3, np.int64)}),
    "embedding": Graph([node("Gather", ["emb.weight", "ids"])],
                       {"ids": np.array([[1, 4, 0], [2, 2, 3]], np.int64)},
                       {"emb.weight": _r(5, 8)}),
    "expand": Graph([node("Expand", ["x", "s"])], {"x": _r(3, 1)}, {"s": _i64(2, 3, 4)}),
    "tile": Graph([node("Tile", ["x", "r"])], {"x": _r(2, 3)}, {"r": _i64(2, 1)}),
    "cast_round_trip": Graph([helper.make_node("Cast", ["x"], ["h"], to=TensorProto.FLOAT16),
                              node("Cast", ["h"], to=TensorProto.FLOAT)], {"x": _r(2, 3)}),
    "depth_to_space": Graph([node("DepthToSpace", ["x"], blocksize=2)], {"x": _r(1, 8, 2, 3)}),
    "conv_bias_stride_pad": Graph(
        [node("Conv", ["x", "conv.weight", "conv.bias"], pads=[1, 1, 1, 1], strides=[2, 2])],
        {"x": _r(1, 3, 9, 9)}, {"conv.weight": _r(4, 3, 3, 3, seed=1),
                                "conv.bias": _r(4, seed=2)}),
    "conv_depthwise": Graph([node("Conv", ["x", "w"], group=4, pads=[1, 1, 1, 1])],
                            {"x": _r(1, 4, 6, 6)}, {"w": _r(4, 1, 3, 3, seed=1)}),
    "conv_rectangular": Graph([node("Conv", ["x", "w"], pads=[0, 1, 0, 1])],
                              {"x": _r(1, 2, 6, 6)}, {"w": _r(3, 2, 1, 3, seed=1)}),
    "pad_into_conv": Graph([helper.make_node("Pad", ["x", "p"], ["q"]), node("Conv", ["q", "w"])],
                           {"x": _r(1, 2, 5, 5)}, {"p": _i64(0, 0, 1, 1, 0, 0, 1, 1),
                                                   "w": _r(3, 2, 3, 3, seed=1)}),
    "conv_transpose": Graph([node("ConvTranspose", ["x", "w", "b"], strides=[2, 2],
                                  pads=[1, 1, 1, 1], output_padding=[1, 1])],
                            {"x": _r(1, 3, 4, 4)}, {"w": _r(3, 2, 3, 3, seed=1),
                                                    "b": _r(2, seed=2)}),
    "maxpool": one("MaxPool", (1, 2, 7, 7), kernel_shape=[3, 3], strides=[2, 2],
                   pads=[1, 1, 1, 1]),
    "avgpool": one("AveragePool", (1, 2, 6, 6), kernel_shape=[2, 2], strides=[2, 2]),
    "avgpool_count_pad": one("AveragePool", (1, 2, 6, 6), kernel_shape=[3, 3],
                             pads=[1, 1, 1, 1], count_include_pad=1),
    "global_average_pool": one("GlobalAveragePool"),
    "batchnorm": Graph([node("BatchNormalization", ["x", "bn.weight", "bn.bias",
                                                    "bn.running_mean", "bn.running_var"])],
                       {"x": _r(2, 3, 4, 4)},
                       {"bn.weight": _r(3, seed=1), "bn.bias": _r(3, seed=2),
                        "bn.running_mean": _r(3, seed=3),
                        "bn.running_var": _r(3, seed=4, positive=True)}),
    "layer_norm": Graph([node("LayerNormalization", ["x", "ln.weight", "ln.bias"],
                              epsilon=1e-6)],
                        {"x": _r(2, 3, 8)}, {"ln.weight": _r(8, seed=1), "ln.bias": _r(8, seed=2)}),
    "instance_norm": Graph([node("InstanceNormalization", ["x", "s", "b"])], {"x": _r(2, 3, 4, 4)},
                           {"s": _r(3, seed=1), "b": _r(3, seed=2)}),
    "resize_nearest": Graph([node("Resize", ["x", "", "s"], mode="nearest")],
                            {"x": _r(1, 2, 3, 4)}, {"s": np.array([1, 1, 2, 2], F)}),
    "gelu_erf_pattern": Graph(
        [helper.make_node("Div", ["x", "sqrt2"], ["d"]), helper.make_node("Erf", ["d"], ["e"]),
         helper.make_node("Add", ["e", "one"], ["a"]), helper.make_node("Mul", ["x", "a"], ["m"]),
         node("Mul", ["m", "half"])],
        {"x": _r(2, 8)}, {"sqrt2": np.array(np.sqrt(2), F), "one": np.array(1.0, F),
                          "half": np.array(0.5, F)}),
    "gelu_tanh_pattern": Graph(
        [helper.make_node("Pow", ["x", "three"], ["p"]), helper.make_node("Mul", ["c", "p"], ["cp"]),
         helper.make_node("Add", ["x", "cp"], ["s"]), helper.make_node("Mul", ["k", "s"], ["ks"]),
         helper.make_node("Tanh", ["ks"], ["t"]), helper.make_node("Add", ["one", "t"], ["a"]),
         helper.make_node("Mul", ["half", "x"], ["hx"]), node("Mul", ["hx", "a"])],
        {"x": _r(2, 8)}, {"three": np.array(3.0, F), "c": np.array(0.044715, F),
                          "k": np.array(np.sqrt(2 / np.pi), F), "one": np.array(1.0, F),
                          "half": np.array(0.5, F)}),
    "erf_not_gelu": Graph(  # 0.5 x (1 + erf(x)): no 1/sqrt(2) inside, so no gelu
        [helper.make_node("Erf", ["x"], ["e"]), helper.make_node("Add", ["e", "one"], ["a"]),
         helper.make_node("Mul", ["x", "a"], ["m"]), node("Mul", ["m", "half"])],
        {"x": _r(2, 8)}, {"one": np.array(1.0, F), "half": np.array(0.5, F)}),
    "shape_arithmetic_reshape": Graph(
        [helper.make_node("Shape", ["x"], ["sh"]),
         helper.make_node("Gather", ["sh", "zero"], ["n"], axis=0),
         helper.make_node("Unsqueeze", ["n", "ax"], ["n1"]),
         helper.make_node("Concat", ["n1", "minus"], ["target"], axis=0),
         node("Reshape", ["x", "target"])],
        {"x": _r(2, 3, 4)}, {"zero": np.array(0, np.int64), "ax": _i64(0),
                             "minus": _i64(-1)}),
}


@pytest.mark.parametrize("case", CASES)
def test_import_runs_as_onnxruntime_does(case: str, tmp_path: Path) -> None:
    graph = CASES[case]
    onnx_file = graph.save(tmp_path / f"{case}.onnx")
    imported = import_file(onnx_file, tmp_path)
    [ours], [theirs] = run_reference(imported, graph.inputs), run_onnxruntime(onnx_file,
                                                                            graph.inputs)
    assert ours.shape == theirs.shape
    assert rel_error(ours, theirs) <= 1e-5, imported.source.read_text()


def _text(case: str, tmp_path: Path) -> str:
    imported = import_file(CASES[case].save(tmp_path / f"{case}.onnx"), tmp_path)
    return imported.source.read_text()


def test_conv_with_a_named_bias_is_a_conv2d_instance(tmp_path: Path) -> None:
    text = _text("conv_bias_stride_pad", tmp_path)
    assert 'conv2d(x, out=4, k=3, stride=2, pad=1, has_bias=true) as "conv"' in text or \
        'let conv = conv2d(x, out=4, k=3, stride=2, pad=1, has_bias=true)\n' in text, text


def test_batchnorm_of_four_initializers_is_batchnorm2d(tmp_path: Path) -> None:
    assert "= batchnorm2d(x)" in _text("batchnorm", tmp_path)


def test_gemm_with_a_transposed_weight_is_linear(tmp_path: Path) -> None:
    assert "= linear(x, out=3)" in _text("gemm_trans_b", tmp_path)


def test_layer_norm_keeps_its_epsilon(tmp_path: Path) -> None:
    assert "= layer_norm(x, eps=1e-06)" in _text("layer_norm", tmp_path)


def test_gather_from_a_named_table_is_embedding(tmp_path: Path) -> None:
    assert "= embedding(ids, num=5, dim=8)" in _text("embedding", tmp_path)


@pytest.mark.parametrize(("case", "op"), [("gelu_erf_pattern", "gelu(x)"),
                                          ("gelu_tanh_pattern", "gelu_tanh(x)")])
def test_gelu_written_out_is_recognised(case: str, op: str, tmp_path: Path) -> None:
    body = _text(case, tmp_path).split("model ")[1]
    assert body.endswith(f"  output y = {op}\n}}\n"), body


def test_a_near_miss_of_gelu_stays_as_written(tmp_path: Path) -> None:
    body = _text("erf_not_gelu", tmp_path).split("model ")[1]
    assert "gelu(" not in body and "erf(x)" in body


def test_constant_pad_is_taken_into_the_convolution(tmp_path: Path) -> None:
    text = _text("pad_into_conv", tmp_path)
    assert "pad=1" in text and "pad(" not in text


def test_shape_arithmetic_is_worked_out_at_import_time(tmp_path: Path) -> None:
    text = _text("shape_arithmetic_reshape", tmp_path)
    assert "reshape(x, [2, 12])" in text and "param" not in text


def test_written_weights_are_the_initializers_by_name(tmp_path: Path) -> None:
    graph = CASES["conv_bias_stride_pad"]
    imported = import_file(graph.save(tmp_path / "c.onnx"), tmp_path)
    assert sorted(imported.weights) == ["conv.bias", "conv.weight"]
    np.testing.assert_array_equal(imported.weights["conv.weight"], graph.inits["conv.weight"])


def test_weights_out_and_name_options(tmp_path: Path) -> None:
    onnx_file = CASES["relu"].save(tmp_path / "r.onnx")
    run = run_cli("import", str(onnx_file), "-o", str(tmp_path / "m.cgraph"), "--weights-out",
                  str(tmp_path / "w.safetensors"), "--name", "tiny")
    assert run.code == 0, run.stderr
    assert "model tiny {" in (tmp_path / "m.cgraph").read_text()
    assert (tmp_path / "w.safetensors").is_file()


def test_a_file_that_is_no_onnx_model_is_a_usage_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\xff\x00not a protobuf")
    run = run_cli("import", str(bad), "-o", str(tmp_path / "bad.cgraph"))
    assert run.code == 2 and "is not an ONNX model" in run.stderr
    assert "Traceback" not in run.stderr and not (tmp_path / "bad.cgraph").exists()


def test_bad_dim_option_is_a_usage_error(tmp_path: Path) -> None:
    onnx_file = CASES["relu"].save(tmp_path / "r.onnx")
    with pytest.raises(SystemExit) as exit_info:
        run_cli("import", str(onnx_file), "--dim", "N=5..2")
    assert exit_info.value.code == 2
