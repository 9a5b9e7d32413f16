"""Compile targets: a live GPU (a cuDNN handle), or a device profile for deviceless compiles.

`h200` (the default) is the profile shipped with dslc, captured on an H200 with
`cudnn.create_device_properties(0).serialize()`; `dslc target capture -o FILE.json` makes one
for the GPU it runs on, and `--target FILE.json` uses it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from dslc.core.errors import RunnerError

PROFILES = ("h200",)


class TargetError(Exception):
    """The target could not be loaded (a usage error)."""


@dataclass
class Target:
    name: str
    properties_json: str  # the device properties, as cuDNN serializes them
    live: bool = False  # compile on this machine's GPU (plans built and timed here)
    _handle: Any = None
    _properties: Any = None

    @property
    def info(self) -> dict[str, Any]:
        return dict(json.loads(self.properties_json))

    @property
    def device_name(self) -> str:
        return str(self.info.get("deviceName", self.name))

    @property
    def compute_capability(self) -> int:
        return int(self.info.get("deviceVer", 0))

    def properties(self) -> Any:
        import cudnn

        if self._properties is None:
            self._properties = cudnn.create_device_properties(self.properties_json)
        return self._properties

    def handle(self) -> Any:
        import cudnn

        if self._handle is None:
            self._handle = cudnn.create_handle()
        return self._handle


def _profile_text(name: str) -> str:
    return resources.files("dslc.compile").joinpath("targets", f"{name}.json").read_text()


def peaks(device_name: str) -> dict[str, Any] | None:
    """A GPU's peak math and memory rates by its name (targets/peaks.json: tensor-core TFLOP/s
    by operand dtype, the vector units' f32 TFLOP/s, memory GB/s), or None for one not listed."""
    table = json.loads(_profile_text("peaks"))
    entry = table.get(device_name)
    return dict(entry) if isinstance(entry, dict) else None


def require_device(what: str) -> None:
    """R0801 (exit code 3, as every command that finds no GPU) unless this machine has one."""
    if not live_device_available():
        raise RunnerError("R0801", f"{what} needs a GPU, and this machine has none")


def live_device_available() -> bool:
    try:
        import cupy

        return bool(cupy.cuda.runtime.getDeviceCount())
    except Exception:
        return False


def capture() -> str:
    """This machine's GPU 0 as a device profile (JSON)."""
    import cudnn

    props = cudnn.create_device_properties(0)
    text = props.serialize()
    return text if isinstance(text, str) else bytes(text).decode()


def load_target(spec: str | None) -> Target:
    """`device` (this machine's GPU), a shipped profile name, or a profile JSON file. The
    default: this machine's GPU if it has one, else the H200 profile."""
    if spec is None:
        spec = "device" if live_device_available() else "h200"
    if spec == "device":
        require_device("`--target device`")
        return Target("device", capture(), live=True)
    if spec in PROFILES:
        return Target(spec, _profile_text(spec))
    path = Path(spec)
    if path.suffix == ".json" or os.sep in spec or path.exists():  # it names a file
        if not path.exists():
            raise TargetError(f"`--target {spec}`: no such file (a profile JSON is made by `dslc "
                              "target capture` on the GPU)")
        if not path.is_file():
            raise TargetError(f"`--target {spec}` is not a file; name a profile JSON")
    else:
        raise TargetError(f"unknown target `{spec}`: use {', '.join(PROFILES)}, `device`, or a "
                          "profile JSON made by `dslc target capture`")
    try:
        text = path.read_text()
        json.loads(text)
    except (OSError, ValueError) as err:
        raise TargetError(f"cannot read the target profile `{spec}`: {err}") from err
    return Target(path.stem, text)
