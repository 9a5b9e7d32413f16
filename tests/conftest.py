"""Shared test fixtures: `--bless` rewrites golden files; `gpu` tests skip without a device;
random inputs are reproducible: a failing test prints the seeds it drew from (`tests.helpers.rng`),
and hypothesis runs derandomized (the same examples in every run, a failure printed with its
`@reproduce_failure` blob; `pytest --hypothesis-seed=N` explores other examples, reproducibly)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from tests import helpers

ROOT = Path(__file__).resolve().parents[1]
pytest_plugins = ["tests.redis_server"]  # a real Redis server for the tuning-database tests

settings.register_profile("dslc", derandomize=True, print_blob=True)
settings.load_profile("dslc")


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


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Name the seeds of the test's random inputs under its failure; forget them after it."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.failed and helpers.SEEDS:
        text = "\n".join(helpers.SEEDS)
        if hasattr(report.longrepr, "addsection"):
            report.longrepr.addsection("random inputs of this test (reproduce with these seeds)",
                                       text)
        else:
            report.sections.append(("random inputs of this test", text))
    if call.when == "teardown":
        helpers.SEEDS.clear()
