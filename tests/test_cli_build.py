"""`dslc compile --dump` and `dslc run --backend reference` from the command line."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tests.helpers import precision_tolerance, rel_error, rng, run_cli


def test_compile_dump_all_writes_the_four_stages(tmp_path: Path) -> None:
    run = run_cli("compile", "models/mlp.cgraph", "--dump", "all", "-o", str(tmp_path))
    assert run.code == 0, run.stderr
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["1.ast.txt", "2.types.txt", "3.ir.txt", "4.fused.txt", "mnist_mlp.bundle",
                     "mnist_mlp_runner.py"]
    assert "Model @4:1 name='mnist_mlp'" in (tmp_path / "1.ast.txt").read_text()
    assert "input x: f16[N, 784]" in (tmp_path / "2.types.txt").read_text()
    assert "= bias_add(" in (tmp_path / "3.ir.txt").read_text()
    assert "# 3 groups (3 distinct)" in (tmp_path / "4.fused.txt").read_text()
    assert "==> 4.fused.txt <==" in run.stdout


def test_compile_of_a_library_file_says_so() -> None:
    run = run_cli("compile", "models/resnet.cgraph")
    assert run.code == 1 and "declares no model" in run.stderr


def test_run_reference_writes_what_pytorch_computes(tmp_path: Path) -> None:
    """The MLP's logits from `dslc run --backend reference` equal PyTorch's (tests/torch_models.py)
    run in f16 on the same weights file and input, within the f16 tolerance of its depth."""
    import torch
    from safetensors.numpy import load_file

    from tests.torch_models import MLP

    w = tmp_path / "w.safetensors"
    assert run_cli("weights", "random", "models/mlp.cgraph", "-o", str(w)).code == 0
    x = tmp_path / "x.npy"
    np.save(x, rng("cli run x").standard_normal((5, 784)).astype(np.float16))
    out = tmp_path / "out.npz"
    run = run_cli("run", "models/mlp.cgraph", "--backend", "reference", "--weights", str(w),
                  "--input", f"x={x}", "-o", str(out))
    assert run.code == 0, run.stderr
    logits = np.load(out)["logits"]
    assert logits.shape == (5, 10) and logits.dtype == np.float32

    with torch.device("meta"):
        net = MLP()
    state = {k: torch.from_numpy(v) for k, v in load_file(str(w)).items()}
    assert all(v.dtype == torch.float16 for v in state.values())
    net.load_state_dict(state, strict=True, assign=True)
    with torch.no_grad():
        theirs = net(torch.from_numpy(np.load(x))).float().numpy()
    # x @ w1 + b1, relu, @ w2 + b2, gelu, @ w3 + b3: 7 rounding ops on the path (relu is exact)
    tolerance = precision_tolerance("f16", 7)
    assert rel_error(logits, theirs) <= tolerance


def test_run_refuses_an_input_of_the_wrong_dtype(tmp_path: Path) -> None:
    w = tmp_path / "w.safetensors"
    assert run_cli("weights", "random", "models/mlp.cgraph", "-o", str(w)).code == 0
    x = tmp_path / "x.npy"
    np.save(x, np.zeros((4, 784), np.float32))
    run = run_cli("run", "models/mlp.cgraph", "--weights", str(w), "--input", f"x={x}",
                  "-o", str(tmp_path / "o.npz"))
    assert run.code == 1
    assert run.stderr.strip() == ("error[R0401]: input `x` is f32, expected f16 "
                                  "(declared at models/mlp.cgraph:8:3)")
    assert not (tmp_path / "o.npz").exists()


def test_run_rejects_inputs_outside_the_declared_range(tmp_path: Path) -> None:
    w = tmp_path / "w.safetensors"
    run_cli("weights", "random", "models/mlp.cgraph", "-o", str(w))
    x = tmp_path / "x.npy"
    np.save(x, np.zeros((300, 784), np.float16))
    run = run_cli("run", "models/mlp.cgraph", "--weights", str(w), "--input", f"x={x}",
                  "-o", str(tmp_path / "o.npz"))
    assert run.code == 1
    assert run.stderr.strip() == ("error[R0601]: dim `N` is 300, outside 1..256 "
                                  "(declared at models/mlp.cgraph:6:3)")


def test_run_names_a_missing_input(tmp_path: Path) -> None:
    w = tmp_path / "w.safetensors"
    run_cli("weights", "random", "models/mlp.cgraph", "-o", str(w))
    run = run_cli("run", "models/mlp.cgraph", "--weights", str(w), "-o", str(tmp_path / "o.npz"))
    assert run.code == 1 and "error[R0201]: input `x` is missing" in run.stderr
