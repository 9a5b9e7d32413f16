"""The environment a bundle was compiled (or tuned) in, and the one it runs in: cuDNN backend and
frontend versions, CUDA runtime, driver, device name, compute capability, SM count, memory."""

from __future__ import annotations

import json
from typing import Any

from dslc.backend.target import capture

FIELDS = ("cudnn_backend", "cudnn_frontend", "cuda_runtime", "driver", "driver_release",
          "device_name", "compute_capability", "sm_count", "memory_bytes")


def driver_release() -> str | None:
    """The kernel driver's release ("580.159.04"): driverGetVersion only gives the CUDA API level
    it supports, which stays the same across most driver updates."""
    try:
        with open("/proc/driver/nvidia/version") as f:
            for word in f.readline().split():
                if word.count(".") >= 1 and word.replace(".", "").isdigit():
                    return word
    except OSError:
        pass
    return None


def _cudnn_versions() -> dict[str, Any]:
    try:
        import cudnn

        return {"cudnn_backend": int(cudnn.backend_version()), "cudnn_frontend": cudnn.__version__}
    except Exception:
        return {"cudnn_backend": None, "cudnn_frontend": None}


def from_profile(properties_json: str) -> dict[str, Any]:
    """What a deviceless compile knows: the target profile, and the cuDNN it compiled with."""
    info = json.loads(properties_json)
    cc = int(info.get("deviceVer", 0))
    return {**_cudnn_versions(), "cuda_runtime": None, "driver": info.get("driverVer"),
            "device_name": info.get("deviceName"), "compute_capability": f"{cc // 100}.{cc % 100 // 10}",
            "sm_count": info.get("multiProcessorCount"), "memory_bytes": info.get("totalGlobalMem"),
            "device_properties": properties_json, "live": False}


def live(properties: bool = False) -> dict[str, Any]:
    """This machine's GPU 0 (needs CuPy and a driver); with `properties`, also the full
    device-properties JSON (what a bundle records; start-up's comparison does not need it)."""
    import cupy

    props = cupy.cuda.runtime.getDeviceProperties(0)
    name = props["name"]
    name = name.decode() if isinstance(name, bytes) else str(name)
    out = {**_cudnn_versions(), "cuda_runtime": int(cupy.cuda.runtime.runtimeGetVersion()),
           "driver": int(cupy.cuda.runtime.driverGetVersion()),
           "driver_release": driver_release(), "device_name": name,
           "compute_capability": f"{props['major']}.{props['minor']}",
           "sm_count": int(props["multiProcessorCount"]), "memory_bytes": int(props["totalGlobalMem"]),
           "live": True, "device_properties": None}
    if not properties:
        return out
    try:
        out["device_properties"] = capture()
    except Exception:
        out["device_properties"] = None
    return out
