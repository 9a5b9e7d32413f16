"""The PyTorch translation of checked graphs (dslc/ir/to_torch.py) against independent oracles:
the hand-written modules of tests/torch_models.py for the example models, and, per op, values
derived by hand or written out in numpy here from the op's definition (loops over windows,
softmax by rows). Nothing here calls dslc's numpy references."""

from __future__ import annotations

import itertools
import math
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from dslc.check.checker import CheckedModel
from dslc.diag.diagnostic import Sink
from dslc.ir import to_torch as tt
from dslc.ir import torch_ops
from dslc.lower import lower
from dslc.ops import OPS
from dslc.pipeline import Options, front_end
from tests import torch_models
from tests.helpers import model_snippet

SEED = 20240617


def checked(tmp_path: Path, body: str, precision: str = "io=f32") -> CheckedModel:
    """A snippet checked for the reference backend (cuDNN's limits off: f32 sdpa, any head dim)."""
    path = tmp_path / "snippet.cgraph"
    path.write_text(model_snippet(body, precision=precision))
    sink = Sink()
    model = front_end(path, Options(backend="reference"), sink).model
    assert model is not None, [d.message for d in sink.diagnostics]
    return model


def translate_run(model: CheckedModel, inputs: dict[str, np.ndarray],
                  weights: dict[str, np.ndarray] | None = None, dims: dict[str, int] | None = None,
                  mode: str = "f32") -> dict[str, np.ndarray]:
    program = tt.to_torch(model.graph, dims or {}, mode, env=model.env)
    program.load_weights(weights or {})
    return tt.run(program, inputs)


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    """One intra-op thread: on a machine shared with other jobs, a second one waits to be
    scheduled at every op (10x slower here); the results do not depend on it."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def rng() -> np.random.Generator:
    return np.random.default_rng(SEED)


def close(got: np.ndarray, want: np.ndarray, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    assert got.shape == want.shape, (got.shape, want.shape)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


# ---- coverage and errors ------------------------------------------------------------------------

def test_every_op_in_the_op_table_has_a_translation() -> None:
    assert sorted(OPS) == sorted(torch_ops.OPS), set(OPS) ^ set(torch_ops.OPS)


def test_an_op_without_a_translation_is_named(tmp_path: Path) -> None:
    model = checked(tmp_path, "  input x: [2, 3]\n  output y: [3, 2] = transpose(relu(x), [1, 0])")
    lowered = lower(model.graph)  # lowered graphs hold `view` nodes: not a checked graph
    assert any(n.op == "view" for n in lowered.nodes)
    with pytest.raises(tt.TranslationError, match=r"op `view`"):
        tt.to_torch(lowered, {})


def test_missing_dims_weights_and_bad_inputs_are_reported(tmp_path: Path) -> None:
    model = checked(tmp_path, "  dim N = 1..8\n  input x: [N, 3]\n  param w: [3]\n"
                    "  output y: [N, 3] = x * w")
    with pytest.raises(tt.TranslationError, match="dim `N`"):
        tt.to_torch(model.graph, {})
    program = tt.to_torch(model.graph, {"N": 2})
    with pytest.raises(tt.TranslationError, match="missing weight `w`"):
        program.load_weights({})
    with pytest.raises(tt.TranslationError, match="weight `w` has shape"):
        program.load_weights({"w": np.ones(4, np.float32)})
    program.load_weights({"w": np.ones(3, np.float32)})
    with pytest.raises(tt.TranslationError, match="input `x` has shape"):
        program(x=torch.ones(3, 3))


def test_dslc_runs_without_torch() -> None:
    """torch is a development dependency: importing the compiler, the CLI and the executors
    loads neither it nor the translation."""
    code = ("import sys, dslc.cli, dslc.pipeline, dslc.ir.interp, dslc.runtime.model; "
            "print(sorted(m for m in sys.modules if m == 'torch' or 'to_torch' in m))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[1])
    assert out.stdout.strip() == "[]"


# ---- the example models against the hand-written modules ----------------------------------------

MODELS: dict[str, tuple[Callable[[], torch.nn.Module], dict[str, tuple[int, ...]], dict[str, int]]] = {
    "mlp": (torch_models.MLP, {"x": (3, 784)}, {"N": 3}),
    "resnet18": (torch_models.resnet18, {"image": (1, 3, 224, 224)}, {"N": 1}),
    "resnet50": (torch_models.resnet50, {"image": (1, 3, 224, 224)}, {"N": 1}),
    "encoder": (torch_models.Encoder, {"tokens": (2, 16, 768)}, {"B": 2, "S": 16}),
    "unet": (torch_models.UNet, {"image": (1, 3, 64, 96)}, {"N": 1, "H": 64, "W": 96}),
}


def model_weights(model: CheckedModel, seed: int) -> dict[str, np.ndarray]:
    """f32 weights of realistic scale (uniform, variances positive), whatever dtype the model
    declares: the f32 translation must not round them to it."""
    r = np.random.default_rng(seed)
    out = {}
    for p in model.params:
        leaf = p.path.rsplit(".", 1)[-1]
        a = r.random(p.shape, dtype=np.float32)
        if leaf == "running_var":
            a += np.float32(0.5)
        elif len(p.shape) >= 2:  # variance 1 / fan_in
            a = (a - np.float32(0.5)) * np.float32(math.sqrt(12 / math.prod(p.shape[1:])))
        else:
            a = (a - np.float32(0.5)) * np.float32(0.3)
        out[p.path] = a
    return out


@pytest.mark.parametrize("name", MODELS)
def test_example_model_in_f32_equals_the_hand_written_module(name: str) -> None:
    make, shapes, dims = MODELS[name]
    sink = Sink()
    model = front_end(Path(f"models/{name}.cgraph"), Options(), sink).model  # declared dtypes
    assert model is not None, [d.message for d in sink.diagnostics]
    program = tt.to_torch(model.graph, dims, "f32", env=model.env)
    program.load_weights(model_weights(model, seed=SEED))
    r = rng()
    inputs = {k: r.standard_normal(s, dtype=np.float32) for k, s in shapes.items()}
    [ours] = tt.run(program, inputs).values()

    with torch.device("meta"):  # no initialisation: the translation's weights are assigned
        module = make().eval()
    missing, unexpected = module.load_state_dict(program.state_dict(), strict=False, assign=True)
    assert not unexpected and all(k.endswith("num_batches_tracked") for k in missing)
    with torch.no_grad():
        theirs = module(*(torch.from_numpy(v) for v in inputs.values())).numpy()
    assert ours.dtype == np.float32 and ours.shape == theirs.shape
    err = float(np.abs(ours.astype(np.float64) - theirs).max() / np.abs(theirs).max())
    print(f"{name}: relative error {err:.2e}")
    assert err <= 1e-5


def test_declared_mode_keeps_f16_storage_and_stays_close_to_f32(tmp_path: Path) -> None:
    sink = Sink()
    model = front_end(Path("models/mlp.cgraph"), Options(), sink).model
    assert model is not None
    weights = model_weights(model, seed=SEED)
    x = rng().standard_normal((4, 784), dtype=np.float32)
    exact = tt.to_torch(model.graph, {"N": 4}, "f32")
    half = tt.to_torch(model.graph, {"N": 4}, "declared")
    exact.load_weights(weights)
    half.load_weights(weights)
    assert {p.dtype for p in half.parameters()} == {torch.float16}
    with torch.no_grad():
        out = half(x=torch.from_numpy(x))["logits"]
    assert out.dtype == torch.float32  # the output is declared f32
    want = tt.run(exact, {"x": x})["logits"]
    err = float(np.abs(out.numpy() - want).max() / np.abs(want).max())
    assert 0 < err < 1e-2, err  # rounded to f16 on the way, and only that much


# ---- pointwise ----------------------------------------------------------------------------------

def _sig(v: float) -> float:
    return 1 / (1 + math.exp(-v))


# op call -> the value at one point, from the definition (python's math, not numpy or torch)
UNARY_EXPECTED: dict[str, Callable[[float], float]] = {
    "relu(x)": lambda v: max(v, 0.0),
    "leaky_relu(x, slope=0.2)": lambda v: v if v > 0 else 0.2 * v,
    "clamp(x, lo=-0.5, hi=0.7)": lambda v: min(max(v, -0.5), 0.7),
    "clamp(x, hi=0.1)": lambda v: min(v, 0.1),
    "clamp(x)": lambda v: v,
    "gelu(x)": lambda v: 0.5 * v * (1 + math.erf(v / math.sqrt(2))),
    "gelu_tanh(x)": lambda v: 0.5 * v * (1 + math.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v**3))),
    "silu(x)": lambda v: v * _sig(v),
    "swish(x, beta=1.7)": lambda v: v * _sig(1.7 * v),
    "sigmoid(x)": _sig,
    "tanh(x)": math.tanh,
    "elu(x, alpha=0.6)": lambda v: v if v > 0 else 0.6 * (math.exp(v) - 1),
    "softplus(x)": lambda v: math.log1p(math.exp(v)),
    "hardsigmoid(x)": lambda v: min(max(v + 3, 0), 6) / 6,
    "hardswish(x)": lambda v: v * min(max(v + 3, 0), 6) / 6,
    "exp(x)": math.exp,
    "log(p)": math.log,
    "sqrt(p)": math.sqrt,
    "rsqrt(p)": lambda v: 1 / math.sqrt(v),
    "reciprocal(x)": lambda v: 1 / v,
    "erf(x)": math.erf,
    "sin(x)": math.sin,
    "cos(x)": math.cos,
    "floor(x)": math.floor,
    "ceil(x)": math.ceil,
    "abs(x)": abs,
    "neg(x)": lambda v: -v,
}


def test_unary_ops_match_their_definitions(tmp_path: Path) -> None:
    calls = list(UNARY_EXPECTED)
    assert {c.split("(")[0] for c in calls} == {n for n in OPS if OPS[n].returns == "shape of x"
                                                and len(OPS[n].tensor_params) == 1
                                                and n not in ("cast", "contiguous", "batchnorm")}
    body = "  input x: [7]\n  input p: [7]\n" + "\n".join(
        f"  output o{i}: [7] = {call}" for i, call in enumerate(calls))
    x = np.array([-2.3, -0.7, -0.1, 0.05, 0.4, 1.5, 2.6], np.float32)
    p = np.array([0.01, 0.3, 1.0, 2.0, 7.5, 40.0, 900.0], np.float32)
    outs = translate_run(checked(tmp_path, body), {"x": x, "p": p})
    for i, call in enumerate(calls):
        src = p if "(p" in call else x
        want = np.array([UNARY_EXPECTED[call](float(v)) for v in src])
        close(outs[f"o{i}"], want.astype(np.float32), rtol=2e-6, atol=1e-7)


def test_softplus_of_large_values_is_the_value_itself(tmp_path: Path) -> None:
    """log(1 + e^x) = x to f32 precision above ~17; e^x alone overflows above 88 (a generated
    program's softplus of a sum of squares once came back infinite from the translation)."""
    x = np.array([20.0, 88.5, 100.0, 1000.0, 3.0e38], np.float32)
    outs = translate_run(checked(tmp_path, "  input x: [5]\n  output y: [5] = softplus(x)"),
                         {"x": x})
    np.testing.assert_array_equal(outs["y"], x)


def test_binary_comparison_and_select_broadcast(tmp_path: Path) -> None:
    ops = {"a + b": np.add, "a - b": np.subtract, "a * b": np.multiply, "a / b": np.divide,
           "max(a, b)": np.maximum, "min(a, b)": np.minimum, "pow(a, b)": np.power}
    cmps = {"a < b": np.less, "a <= b": np.less_equal, "a > b": np.greater,
            "a >= b": np.greater_equal, "a == b": np.equal, "a != b": np.not_equal}
    lines = ["  input a: [2, 3]", "  input b: [3]"]
    lines += [f"  output o{i}: [2, 3] = {e}" for i, e in enumerate(ops)]
    lines += [f"  output c{i}: bool[2, 3] = {e}" for i, e in enumerate(cmps)]
    lines += ["  output s: [2, 3] = select(a > b, a, 2 - b)", "  output k: [2, 3] = 1.5 / a"]
    a = np.array([[0.5, 2.0, 3.0], [1.25, 0.5, 4.0]], np.float32)
    b = np.array([0.5, 3.0, 1.5], np.float32)
    outs = translate_run(checked(tmp_path, "\n".join(lines)), {"a": a, "b": b})
    for i, fn in enumerate(ops.values()):
        close(outs[f"o{i}"], fn(a, b).astype(np.float32))
    for i, fn in enumerate(cmps.values()):
        assert outs[f"c{i}"].dtype == np.bool_
        np.testing.assert_array_equal(outs[f"c{i}"], fn(a, b))
    close(outs["s"], np.where(a > b, a, 2 - b))
    close(outs["k"], 1.5 / a)


def test_bias_scale_along_an_axis_cast_and_contiguous(tmp_path: Path) -> None:
    body = """  input x: [2, 3, 4]
  param v: [3]
  param u: [4]
  output b: [2, 3, 4] = bias_add(x, v)
  output s: [2, 3, 4] = scale_mul(x, u, axis=2)
  output n: [2, 3, 4] = bias_add(x, v, axis=-2)
  output i: i32[2, 3, 4] = cast(x * 3.0, i32)
  output h: [2, 3, 4] = cast(cast(x, f16), f32)
  output c: [2, 3, 4] = contiguous(transpose(transpose(x, [2, 1, 0]), [2, 1, 0]))"""
    x = rng().standard_normal((2, 3, 4), dtype=np.float32)
    v, u = np.array([1.0, -2.0, 0.5], np.float32), np.array([2.0, 0.5, -1.0, 3.0], np.float32)
    outs = translate_run(checked(tmp_path, body), {"x": x}, {"v": v, "u": u})
    close(outs["b"], x + v[None, :, None])
    close(outs["n"], x + v[None, :, None])
    close(outs["s"], x * u)
    assert outs["i"].dtype == np.int32
    np.testing.assert_array_equal(outs["i"], np.trunc(x * 3).astype(np.int32))
    close(outs["h"], x, rtol=0, atol=0)  # f32 mode: the f16 storage is not emulated
    close(outs["c"], x, rtol=0, atol=0)


# ---- convolutions, matmul -----------------------------------------------------------------------

def naive_conv(x: np.ndarray, w: np.ndarray, stride: tuple[int, ...], pre: tuple[int, ...],
               post: tuple[int, ...], dil: tuple[int, ...], groups: int) -> np.ndarray:
    """Cross-correlation by its definition: out[n, k, o] = sum over c in k's group and r of
    x_padded[n, c, o * stride + r * dil] * w[k, c, r]."""
    n = x.ndim - 2
    xp = np.pad(x.astype(np.float64), [(0, 0), (0, 0), *zip(pre, post, strict=True)])
    k_out, cg, kernel = w.shape[0], w.shape[1], w.shape[2:]
    sizes = [(xp.shape[2 + i] - dil[i] * (kernel[i] - 1) - 1) // stride[i] + 1 for i in range(n)]
    out = np.zeros((x.shape[0], k_out, *sizes))
    for o in np.ndindex(*sizes):
        for k in range(k_out):
            g = k // (k_out // groups)
            for r in np.ndindex(*kernel):
                at = tuple(o[i] * stride[i] + r[i] * dil[i] for i in range(n))
                window = xp[(slice(None), slice(g * cg, (g + 1) * cg), *at)]
                out[(slice(None), k, *o)] += window @ w[(k, slice(None), *r)]
    return out


def naive_conv_transpose(x: np.ndarray, w: np.ndarray, stride: tuple[int, ...], pad: tuple[int, ...],
                         dil: tuple[int, ...], opad: tuple[int, ...]) -> np.ndarray:
    """Each input element scatters x[n, k, i] * w[k, c, r] to out[n, c, i * stride + r * dil - pad]."""
    n = x.ndim - 2
    kernel = w.shape[2:]
    sizes = [(x.shape[2 + i] - 1) * stride[i] - 2 * pad[i] + dil[i] * (kernel[i] - 1) + 1 + opad[i]
             for i in range(n)]
    out = np.zeros((x.shape[0], w.shape[1], *sizes))
    for i in np.ndindex(*x.shape[2:]):
        for r in np.ndindex(*kernel):
            at = [i[a] * stride[a] + r[a] * dil[a] - pad[a] for a in range(n)]
            if all(0 <= at[a] < sizes[a] for a in range(n)):
                contribution = x[(slice(None), slice(None), *i)] @ w[(slice(None), slice(None), *r)]
                out[(slice(None), slice(None), *at)] += contribution
    return out


CONVS = {  # x shape, w shape, conv arguments, (stride, pre, post, dilation, groups)
    "2d asymmetric pad, stride, dilation, groups": (
        (2, 4, 7, 8), (6, 2, 3, 2),
        "stride=[2, 1], pre_pad=[1, 0], post_pad=[2, 1], dilation=[1, 2], groups=2",
        ((2, 1), (1, 0), (2, 1), (1, 2), 2)),
    "1d symmetric pad, depthwise": ((1, 3, 9), (3, 1, 3), "pad=1, stride=2, groups=3",
                                    ((2,), (1,), (1,), (1,), 3)),
    "3d": ((1, 2, 4, 5, 3), (3, 2, 2, 3, 1), "pad=[1, 0, 0], dilation=[2, 1, 1]",
           ((1, 1, 1), (1, 0, 0), (1, 0, 0), (2, 1, 1), 1)),
}


@pytest.mark.parametrize("case", CONVS)
def test_conv(tmp_path: Path, case: str) -> None:
    xs, ws, args, (stride, pre, post, dil, groups) = CONVS[case]
    r = rng()
    x, w = r.standard_normal(xs, dtype=np.float32), r.standard_normal(ws, dtype=np.float32)
    want = naive_conv(x, w, stride, pre, post, dil, groups)
    body = (f"  input x: {list(xs)}\n  param w: {list(ws)}\n"
            f"  output y: {list(want.shape)} = conv(x, w, {args})")
    close(translate_run(checked(tmp_path, body), {"x": x}, {"w": w})["y"], want.astype(np.float32))


@pytest.mark.parametrize("xs, ws, stride, pad, dil, opad", [
    ((1, 3, 4, 5), (3, 2, 3, 2), (2, 3), (1, 0), (1, 1), (1, 2)),
    ((2, 2, 5), (2, 3, 2), (1,), (0,), (2,), (1,)),
])
def test_conv_transpose(tmp_path: Path, xs: tuple[int, ...], ws: tuple[int, ...], stride: tuple[int, ...],
                        pad: tuple[int, ...], dil: tuple[int, ...], opad: tuple[int, ...]) -> None:
    r = rng()
    x, w = r.standard_normal(xs, dtype=np.float32), r.standard_normal(ws, dtype=np.float32)
    want = naive_conv_transpose(x, w, stride, pad, dil, opad)
    body = (f"  input x: {list(xs)}\n  param w: {list(ws)}\n  output y: {list(want.shape)} = "
            f"conv_transpose(x, w, stride={list(stride)}, pad={list(pad)}, dilation={list(dil)}, "
            f"output_pad={list(opad)})")
    close(translate_run(checked(tmp_path, body), {"x": x}, {"w": w})["y"], want.astype(np.float32))


def test_integer_conv_and_matmul_accumulate_exactly(tmp_path: Path) -> None:
    body = """  input x: i8[1, 2, 5, 5]
  param w: i8[3, 2, 3, 3]
  input a: i8[4, 6]
  input b: i8[6, 2]
  output y: i32[1, 3, 3, 3] = conv(x, w)
  output m: i32[4, 2] = matmul(a, b)"""
    r = np.random.default_rng(SEED)
    x, w = r.integers(-128, 128, (1, 2, 5, 5), np.int8), r.integers(-128, 128, (3, 2, 3, 3), np.int8)
    a, b = r.integers(-128, 128, (4, 6), np.int8), r.integers(-128, 128, (6, 2), np.int8)
    outs = translate_run(checked(tmp_path, body, precision="io=i8"), {"x": x, "a": a, "b": b},
                         {"w": w})
    assert outs["y"].dtype == outs["m"].dtype == np.int32
    np.testing.assert_array_equal(outs["y"], naive_conv(x, w, (1, 1), (0, 0), (0, 0), (1, 1), 1))
    np.testing.assert_array_equal(outs["m"], a.astype(np.int64) @ b)


def test_matmul_broadcasts_batch_axes(tmp_path: Path) -> None:
    body = "  input a: [2, 1, 3, 4]\n  input b: [5, 4, 2]\n  output y: [2, 5, 3, 2] = matmul(a, b)"
    r = rng()
    a, b = r.standard_normal((2, 1, 3, 4), dtype=np.float32), r.standard_normal((5, 4, 2), dtype=np.float32)
    want = np.einsum("xmk,zkn->xzmn", a[:, 0].astype(np.float64), b)  # axis 1 of a broadcasts
    close(translate_run(checked(tmp_path, body), {"a": a, "b": b})["y"], want.astype(np.float32))


# ---- norms, attention ---------------------------------------------------------------------------

def test_norms(tmp_path: Path) -> None:
    body = """  input x: [2, 3, 4, 5]
  param mean: [3]
  param var: [3]
  param g: [3]
  param h: [3]
  param s2: [4, 5]
  param b2: [4, 5]
  param s1: [5]
  param b1: [5]
  output bn: [2, 3, 4, 5] = batchnorm(x, mean, var, g, h, eps=0.01)
  output ln: [2, 3, 4, 5] = layernorm(x, s2, b2, eps=0.001)
  output rms: [2, 3, 4, 5] = rmsnorm(x, s1, eps=0.001)
  output rmsb: [2, 3, 4, 5] = rmsnorm(x, s1, bias=b1)
  output inorm: [2, 3, 4, 5] = instancenorm(x, g, h, eps=0.01)
  output gnorm: [2, 3, 4, 5] = groupnorm(x, g, h, groups=1, eps=0.01)"""
    r = rng()
    x = r.standard_normal((2, 3, 4, 5)).astype(np.float32) * 2 + 1
    w = {k: r.standard_normal(s, dtype=np.float32) for k, s in
         (("mean", 3), ("g", 3), ("h", 3), ("s2", (4, 5)), ("b2", (4, 5)), ("s1", 5), ("b1", 5))}
    w["var"] = r.uniform(0.5, 2, 3).astype(np.float32)
    outs = translate_run(checked(tmp_path, body), {"x": x}, w)
    x64 = x.astype(np.float64)

    def ch(v: np.ndarray) -> np.ndarray:
        return v.reshape(1, 3, 1, 1)

    def normal(axes: tuple[int, ...], eps: float) -> np.ndarray:
        m = x64.mean(axes, keepdims=True)
        return (x64 - m) / np.sqrt(((x64 - m) ** 2).mean(axes, keepdims=True) + eps)

    close(outs["bn"], (x64 - ch(w["mean"])) / np.sqrt(ch(w["var"]) + 0.01) * ch(w["g"]) + ch(w["h"]))
    close(outs["ln"], normal((2, 3), 0.001) * w["s2"] + w["b2"])
    rms = x64 / np.sqrt((x64**2).mean(-1, keepdims=True) + 0.001) * w["s1"]
    close(outs["rms"], rms)
    close(outs["rmsb"], x64 / np.sqrt((x64**2).mean(-1, keepdims=True) + 1e-5) * w["s1"] + w["b1"])
    close(outs["inorm"], normal((2, 3), 0.01) * ch(w["g"]) + ch(w["h"]))
    close(outs["gnorm"], normal((1, 2, 3), 0.01) * ch(w["g"]) + ch(w["h"]))


def naive_sdpa(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, causal: bool,
               window: int | None, bias: np.ndarray | None) -> np.ndarray:
    """Row by row: query head h reads kv head h // (Hq / Hk); key j is seen by query i when
    j <= i (causal) and j > i - window."""
    b_, hq, sq, _ = q.shape
    group = hq // k.shape[1]
    out = np.zeros((b_, hq, sq, v.shape[3]))
    for b, h, i in itertools.product(range(b_), range(hq), range(sq)):
        s = k[b, h // group] @ q[b, h, i].astype(np.float64) * scale
        if bias is not None:
            s = s + np.broadcast_to(bias, (b_, hq, sq, k.shape[2]))[b, h, i]
        seen = [j for j in range(k.shape[2])
                if (not causal or j <= i) and (window is None or j > i - window)]
        e = np.exp(s[seen] - s[seen].max())
        out[b, h, i] = (e / e.sum()) @ v[b, h // group, seen]
    return out


@pytest.mark.parametrize("args, causal, window, bias", [
    ("", False, None, False),
    ("causal=true, scale=0.3", True, None, False),  # Sq < Skv: top-left, not bottom-right
    ("causal=true, window=2, bias=bias", True, 2, True),
    ("window=3", False, 3, False),
])
def test_sdpa_gqa_causal_window_bias(tmp_path: Path, args: str, causal: bool, window: int | None,
                                     bias: bool) -> None:
    body = ("  input q: [2, 4, 5, 8]\n  input k: [2, 2, 6, 8]\n  input v: [2, 2, 6, 3]\n"
            "  input bias: [1, 4, 5, 6]\n"
            f"  output y: [2, 4, 5, 3] = sdpa(q, k, v{', ' + args if args else ''})")
    r = rng()
    t = {n: r.standard_normal(s, dtype=np.float32) for n, s in
         (("q", (2, 4, 5, 8)), ("k", (2, 2, 6, 8)), ("v", (2, 2, 6, 3)), ("bias", (1, 4, 5, 6)))}
    scale = 0.3 if "scale" in args else 1 / math.sqrt(8)
    want = naive_sdpa(t["q"], t["k"], t["v"], scale, causal, window, t["bias"] if bias else None)
    close(translate_run(checked(tmp_path, body), t)["y"], want.astype(np.float32))


# ---- reductions, pooling, resampling ------------------------------------------------------------

def test_reductions_and_genstats(tmp_path: Path) -> None:
    reductions = {"reduce_sum": lambda x, ax: x.sum(ax), "reduce_mean": lambda x, ax: x.mean(ax),
                  "reduce_max": lambda x, ax: x.max(ax), "reduce_min": lambda x, ax: x.min(ax),
                  "reduce_amax": lambda x, ax: np.abs(x).max(ax),
                  "reduce_prod": lambda x, ax: x.prod(ax),
                  "reduce_l1": lambda x, ax: np.abs(x).sum(ax),
                  "reduce_l2": lambda x, ax: np.sqrt((x * x).sum(ax))}
    assert set(reductions) == {n for n in OPS if n.startswith("reduce_")}
    lines = ["  input x: [2, 3, 4]"]
    for name in reductions:
        lines.append(f"  output {name}: [3] = {name}(x, axes=[0, -1])")
        lines.append(f"  output {name}_k: [2, 3, 1] = {name}(x, axes=[2], keepdims=true)")
    lines += ["  let (s, q) = genstats(x)", "  output sums: [1, 3, 1] = s", "  output squares: [1, 3, 1] = q"]
    x = rng().uniform(0.5, 1.5, (2, 3, 4)) * rng().choice([-1, 1], (2, 3, 4))
    x = x.astype(np.float32)
    outs = translate_run(checked(tmp_path, "\n".join(lines)), {"x": x})
    x64 = x.astype(np.float64)
    for name, fn in reductions.items():
        close(outs[name], fn(x64, (0, 2)))
        close(outs[f"{name}_k"], fn(x64, (2,))[:, :, None])
    close(outs["sums"], x64.sum((0, 2)).reshape(1, 3, 1))
    close(outs["squares"], (x64 * x64).sum((0, 2)).reshape(1, 3, 1))


def naive_pool(x: np.ndarray, window: tuple[int, ...], stride: tuple[int, ...], pad: tuple[int, ...],
               mode: str) -> np.ndarray:
    """Each output reads x at o * stride - pad + r; positions outside x are padding, never the
    maximum; "avg" divides by the positions inside x, "avg_pad" by the whole window."""
    n = x.ndim - 2
    sizes = [(x.shape[2 + i] + 2 * pad[i] - window[i]) // stride[i] + 1 for i in range(n)]
    out = np.zeros((*x.shape[:2], *sizes))
    for o in np.ndindex(*sizes):
        inside = [tuple(o[i] * stride[i] - pad[i] + r[i] for i in range(n)) for r in np.ndindex(*window)]
        inside = [p for p in inside if all(0 <= p[i] < x.shape[2 + i] for i in range(n))]
        vals = np.stack([x[(slice(None), slice(None), *p)] for p in inside], axis=-1)
        if mode == "max":
            out[(slice(None), slice(None), *o)] = vals.max(-1)
        else:
            count = len(inside) if mode == "avg" else math.prod(window)
            out[(slice(None), slice(None), *o)] = vals.sum(-1) / count
    return out


def test_pools(tmp_path: Path) -> None:
    body = """  input x: [1, 2, 6, 7]
  input z: [1, 2, 5]
  output m: [1, 2, 3, 4] = maxpool(x, window=[3, 2], stride=2, pad=1)
  output a: [1, 2, 3, 4] = avgpool(x, window=[3, 2], stride=2, pad=1)
  output c: [1, 2, 3, 4] = avgpool(x, window=[3, 2], stride=2, pad=1, count_pad=true)
  output d: [1, 2, 2, 3] = avgpool(x, window=[3, 2])
  output e: [1, 2, 3] = maxpool(z, window=2, stride=2, pad=1)"""
    r = rng()
    x = -np.abs(r.standard_normal((1, 2, 6, 7), dtype=np.float32))  # padding must not win a max
    z = -np.abs(r.standard_normal((1, 2, 5), dtype=np.float32))
    outs = translate_run(checked(tmp_path, body), {"x": x, "z": z})
    close(outs["m"], naive_pool(x, (3, 2), (2, 2), (1, 1), "max"))
    close(outs["a"], naive_pool(x, (3, 2), (2, 2), (1, 1), "avg"))
    close(outs["c"], naive_pool(x, (3, 2), (2, 2), (1, 1), "avg_pad"))
    close(outs["d"], naive_pool(x, (3, 2), (3, 2), (0, 0), "avg"))
    close(outs["e"], naive_pool(z, (2,), (2,), (1,), "max"))


def test_upsample_nearest_and_bilinear_half_pixel(tmp_path: Path) -> None:
    body = """  input x: [1, 1, 2, 2]
  input z: [1, 1, 3]
  output n: [1, 1, 4, 6] = upsample(x, factor=[2, 3])
  output b: [1, 1, 4, 4] = upsample(x, factor=2, mode="bilinear")
  output l: [1, 1, 6] = upsample(z, factor=2, mode="bilinear")"""
    x = np.array([[[[0.0, 1.0], [2.0, 3.0]]]], np.float32)
    z = np.array([[[0.0, 4.0, 8.0]]], np.float32)
    outs = translate_run(checked(tmp_path, body), {"x": x, "z": z})
    close(outs["n"], np.array([[[[0, 0, 0, 1, 1, 1]] * 2 + [[2, 2, 2, 3, 3, 3]] * 2]], np.float32))
    # Output i samples the input at (i + 0.5) / 2 - 0.5, clamped to [0, size - 1]:
    # 0, 0.25, 0.75, 1 along each axis.
    row = np.array([0, 0.25, 0.75, 1.0])
    close(outs["b"], (row[:, None] * 2 + row[None, :]).reshape(1, 1, 4, 4).astype(np.float32))
    close(outs["l"], np.array([[[0, 1, 3, 5, 7, 8]]], np.float32))


# ---- layout ops ---------------------------------------------------------------------------------

def test_concat_reshape_transpose_slice(tmp_path: Path) -> None:
    body = """  input x: [2, 4, 3, 5]
  input w: [2, 1, 3, 5]
  output t: [2, 3, 20] = reshape(transpose(relu(x), [0, 2, 1, 3]), [2, 3, 20])
  output c: [2, 5, 3, 5] = concat([x, w], axis=1)
  output s: [2, 2, 2, 5] = x[:, 1:3, -2:]
  output i: [4, 5] = x[1, :, 0]
  output r: [6, 20] = reshape(x, [6, -1])"""
    r = rng()
    x = r.standard_normal((2, 4, 3, 5), dtype=np.float32)
    w = r.standard_normal((2, 1, 3, 5), dtype=np.float32)
    outs = translate_run(checked(tmp_path, body), {"x": x, "w": w})
    close(outs["t"], np.maximum(x, 0).transpose(0, 2, 1, 3).reshape(2, 3, 20), rtol=0, atol=0)
    close(outs["c"], np.concatenate([x, w], axis=1), rtol=0, atol=0)
    close(outs["s"], x[:, 1:3, 1:3], rtol=0, atol=0)
    close(outs["i"], x[1, :, 0], rtol=0, atol=0)
    close(outs["r"], x.reshape(6, 20), rtol=0, atol=0)


def test_dynamic_dims_are_bound_at_translation(tmp_path: Path) -> None:
    body = """  dim N = 1..8
  dim H = 4..32
  input x: [N, 2, H]
  output y = maxpool(x, window=2)
  output z: [N, H] = reshape(x[:, 1:, :], [N, H])"""
    model = checked(tmp_path, body)
    with pytest.raises(tt.TranslationError, match="DimEnv"):  # floor(H / 2) needs the env
        tt.to_torch(model.graph, {"N": 3, "H": 11})
    x = rng().standard_normal((3, 2, 11), dtype=np.float32)
    outs = translate_run(model, {"x": x}, dims={"N": 3, "H": 11})
    close(outs["y"], x[:, :, :10].reshape(3, 2, 5, 2).max(-1), rtol=0, atol=0)
    close(outs["z"], x[:, 1, :], rtol=0, atol=0)


def test_the_program_traces_as_one_graph_for_torch_compile(tmp_path: Path) -> None:
    """No graph break (fullgraph) through params, scalars, views and a window op."""
    model = checked(tmp_path, "  input x: [1, 2, 4, 4]\n  param w: [3, 2, 3, 3]\n"
                    "  output y: [1, 3, 2, 2] = maxpool(relu(conv(x, w, pad=1)) * 2.0, window=2)")
    program = tt.to_torch(model.graph, {})
    program.load_weights({"w": rng().standard_normal((3, 2, 3, 3), dtype=np.float32)})
    x = torch.from_numpy(rng().standard_normal((1, 2, 4, 4), dtype=np.float32))
    compiled = torch.compile(program, backend="eager", fullgraph=True)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x=x)["y"], program(x=x)["y"], rtol=0, atol=0)
