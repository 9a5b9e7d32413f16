"""`dslc compile --fp8 auto` on the GPU: the four GPT-2 blocks of models/gpt_block.cgraph (16
matmuls asking for fp8, four kinds of four) at B1 S1024, each kind timed in fp8 alone against
the model in fp16, the chosen set within the error budget on the samples: the model built is never slower than
its fp16 form as measured, every matmul's step says what was measured, and it runs."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from dslc.weights import random_weights, save
from tests.conftest import ROOT
from tests.gpu.common import to_device, to_host
from tests.helpers import check_source, run_cli

pytestmark = pytest.mark.gpu


def test_fp8_auto_keeps_only_what_is_faster_within_the_budget_and_runs(tmp_path: Path) -> None:
    from dslc.runtime import Model
    from dslc.runtime.bundle import load

    source = (ROOT / "models" / "gpt_block.cgraph").read_text()
    model = check_source(source, tmp_path, "gpt_block.cgraph").model
    weights = tmp_path / "w.safetensors"
    save(weights, random_weights(model.params, seed=7))
    samples = np.random.default_rng(5).standard_normal((2, 1, 1024, 768)).astype(np.float16)
    np.savez(tmp_path / "s.npz", hidden_states=samples)
    out = tmp_path / "out"
    run = run_cli("compile", str(tmp_path / "gpt_block.cgraph"), "-o", str(out), "--fp8", "auto",
                  "--weights", str(weights), "--data", str(tmp_path / "s.npz"),
                  "--bucket", "B=1,S=1024", "--max-error", "0.08", "--no-tune")
    print(run.stderr)
    assert run.code == 0, run.stderr
    found = re.search(r"model: ([\d.]+) ms with (\d+) of 16 ops in fp8, against ([\d.]+) ms "
                      r"in fp16; error on the samples ([\d.e+-]+)", run.stderr)
    assert found is not None
    ms, chosen, fp16_ms, error = (float(found.group(i)) for i in range(1, 5))
    assert ms <= fp16_ms and error <= 0.08
    bundle = load(out / "gpt_block.bundle")
    said = [s for s in bundle.steps if "fp8 measured" in s.reason]
    assert len(said) == 16 and (bundle.calibration is not None) == (chosen > 0)
    x = samples[0]
    y = to_host(Model(out / "gpt_block.bundle", out / "gpt_block.safetensors").run(
        to_device({"hidden_states": x}, out / "gpt_block.bundle")))["hidden"]
    assert np.isfinite(y).all()
