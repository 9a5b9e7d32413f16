"""The start-up policy: one case per decision path, on recorded vs live fingerprints."""

from __future__ import annotations

from typing import Any

import pytest

from dslc.runtime.errors import RunnerError
from dslc.runtime.startup import decide

TUNED = {"live": True, "cudnn_backend": 92100, "cudnn_frontend": "1.16.0", "cuda_runtime": 12090,
         "driver": 13000, "driver_release": "580.95", "device_name": "NVIDIA H200",
         "compute_capability": "9.0", "sm_count": 132, "memory_bytes": 150 << 30}


def live(**changes: Any) -> dict[str, Any]:
    return {**TUNED, **changes}


def test_same_environment_restores() -> None:
    d = decide(TUNED, live())
    assert d.action == "restore" and not d.changes
    assert "restore" in d.explain()


def test_memory_size_alone_still_restores() -> None:
    assert decide(TUNED, live(memory_bytes=80 << 30)).action == "restore"


@pytest.mark.parametrize("field", ["cudnn_backend", "cudnn_frontend", "cuda_runtime"])
def test_library_change_replays(field: str) -> None:
    d = decide(TUNED, live(**{field: "other"}))
    assert d.action == "replay"
    assert d.changes[0][0] == field and "replay" in d.explain()


@pytest.mark.parametrize("field,value", [("driver", 13010), ("driver_release", "590.10")])
def test_driver_change_retimes(field: str, value: Any) -> None:
    assert decide(TUNED, live(**{field: value})).action == "retime"


@pytest.mark.parametrize("field,value", [("device_name", "NVIDIA H100 80GB HBM3"),
                                         ("compute_capability", "10.0"), ("sm_count", 114)])
def test_gpu_change_retunes(field: str, value: Any) -> None:
    assert decide(TUNED, live(**{field: value})).action == "retune"


def test_strongest_change_wins() -> None:
    d = decide(TUNED, live(cudnn_backend=92200, driver="590.10", device_name="B200"))
    assert d.action == "retune" and len(d.changes) == 3


def test_heuristic_policy_takes_heuristics_instead_of_measuring() -> None:
    assert decide(TUNED, live(driver="590.10"), "heuristic").action == "heuristic"
    # ... but a library change alone still replays the recorded engines.
    assert decide(TUNED, live(cudnn_backend=92200), "heuristic").action == "replay"


def test_error_policy_refuses_with_the_changed_fields() -> None:
    with pytest.raises(RunnerError) as err:
        decide(TUNED, live(device_name="B200"), "error")
    assert err.value.code == "R0802" and "device_name (NVIDIA H200 -> B200)" in str(err.value)


def test_untuned_bundle_restores_what_it_has() -> None:
    # Compiled deviceless: nothing was measured, so there is nothing to distrust or re-time.
    deviceless = {**TUNED, "live": False, "driver": None}
    assert decide(deviceless, live(driver="590.10")).action == "restore"


def test_unknown_policy_is_rejected() -> None:
    with pytest.raises(ValueError, match="on_mismatch"):
        decide(TUNED, live(), "sometimes")
