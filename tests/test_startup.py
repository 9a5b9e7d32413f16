"""The start-up policy: one case per decision path, on recorded vs live fingerprints, and the
whole table: each environment field changed alone and in pairs, under each `on_mismatch` policy,
against expectations written here from docs/DESIGN.md ("Start-up and re-tuning")."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from dslc.core.errors import RunnerError
from dslc.runtime.records import Environment
from dslc.runtime.startup import decide

FIELDS = {"live": True, "cudnn_backend": 92100, "cudnn_frontend": "1.16.0", "cuda_runtime": 12090,
         "driver": 13000, "driver_release": "580.95", "device_name": "NVIDIA H200",
         "compute_capability": "9.0", "sm_count": 132, "memory_bytes": 150 << 30}


TUNED = Environment(**FIELDS)


def env(**fields: Any) -> Environment:
    return Environment(**{**FIELDS, **fields})


def live(**changes: Any) -> Environment:
    return env(**changes)


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
    deviceless = env(live=False, driver=None)
    assert decide(deviceless, live(driver="590.10")).action == "restore"


def test_unknown_policy_is_rejected() -> None:
    with pytest.raises(ValueError, match="on_mismatch"):
        decide(TUNED, live(), "sometimes")


# docs/DESIGN.md: a cuDNN, frontend or CUDA runtime upgrade replays; a changed driver re-times;
# a different GPU re-tunes; the memory size alone changes nothing.
WHAT_CHANGES = {"cudnn_backend": ("replay", 92200), "cudnn_frontend": ("replay", "1.17.0"),
                "cuda_runtime": ("replay", 13000), "driver": ("retime", 13010),
                "driver_release": ("retime", "590.10"), "device_name": ("retune", "NVIDIA B200"),
                "compute_capability": ("retune", "10.0"), "sm_count": ("retune", 148),
                "memory_bytes": ("restore", 80 << 30)}
STRENGTH = ["restore", "replay", "retime", "retune"]


def expected(action: str, policy: str) -> str | None:
    """What start-up does when the saved plans call for `action`, under `policy`; None: R0802.
    Restoring and replaying trust the recorded choice; re-timing and re-tuning measure, which
    "heuristic" replaces by the heuristics' choice and "error" refuses."""
    if action in ("restore", "replay") or policy == "retune":
        return action
    return "heuristic" if policy == "heuristic" else None


@pytest.mark.parametrize("policy", ["retune", "heuristic", "error"])
@pytest.mark.parametrize("fields", [*((f,) for f in WHAT_CHANGES),
                                    *itertools.combinations(WHAT_CHANGES, 2)],
                         ids=lambda f: "+".join(f))
def test_each_change_under_each_policy(fields: tuple[str, ...], policy: str) -> None:
    changed = {f: WHAT_CHANGES[f][1] for f in fields}
    strongest = max((WHAT_CHANGES[f][0] for f in fields), key=STRENGTH.index)
    want = expected(strongest, policy)
    if want is None:
        with pytest.raises(RunnerError) as err:
            decide(TUNED, live(**changed), policy)
        assert err.value.code == "R0802"
        for f in fields:
            assert f"{f} ({FIELDS[f]} -> {changed[f]})" in str(err.value)
        return
    d = decide(TUNED, live(**changed), policy)
    assert d.action == want
    assert sorted(c[0] for c in d.changes) == sorted(fields)
    for f, was, now, act in d.changes:
        assert (was, now, act) == (FIELDS[f], changed[f], WHAT_CHANGES[f][0])
        assert f"{f}: {was} -> {now} ({act})" in d.explain()


@pytest.mark.parametrize("policy", ["retune", "heuristic", "error"])
@pytest.mark.parametrize("field", sorted(WHAT_CHANGES))
def test_a_deviceless_bundle_never_measures_what_it_never_measured(field: str,
                                                                   policy: str) -> None:
    """Compiled without a GPU (`live` false): the plans are the heuristics' choice for the target
    profile. A library change still replays; a changed GPU re-tunes (or, by policy, takes the
    heuristics' choice or refuses); what nothing recorded cannot have changed."""
    d_data = {**FIELDS, "live": False, "cuda_runtime": None, "driver_release": None}
    deviceless = Environment(**d_data)
    d_fields = {k for k, v in d_data.items() if v is not None and k in WHAT_CHANGES}
    action, value = WHAT_CHANGES[field]
    if field not in d_fields:
        assert decide(deviceless, live(**{field: value}), policy).action == "restore"
        return
    want = expected(action, policy)
    if want is None:
        with pytest.raises(RunnerError, match="R0802"):
            decide(deviceless, live(**{field: value}), policy)
    else:
        assert decide(deviceless, live(**{field: value}), policy).action == want
