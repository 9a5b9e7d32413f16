"""Shared test fixtures: `--bless` rewrites golden files; `gpu` tests skip without a device."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--bless", action="store_true",
                     help="rewrite the expected output of golden tests from the current output")


@pytest.fixture
def bless(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--bless"))


def _have_gpu() -> bool:
    try:
        import cupy

        return bool(cupy.cuda.runtime.getDeviceCount())
    except Exception:
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if any("gpu" in item.keywords for item in items) and not _have_gpu():
        skip = pytest.mark.skip(reason="needs an NVIDIA GPU (run scripts/gpu_check.sh on one)")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


@pytest.fixture(autouse=True)
def _repo_cwd(monkeypatch: pytest.MonkeyPatch) -> None:
    """Diagnostics name files relative to the cwd: run every test from the repository root."""
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("NO_COLOR", "1")
    os.environ.pop("FORCE_COLOR", None)
