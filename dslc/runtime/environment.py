"""The environment a bundle was compiled (or tuned) in, and the one it runs in: cuDNN backend and
frontend versions, CUDA runtime, driver, device name, compute capability, SM count, memory."""

from __future__ import annotations

import json
from typing import Any

FIELDS = ("cudnn_backend", "cudnn_frontend", "cuda_runtime", "driver", "device_name",
          "compute_capability", "sm_count", "memory_bytes")


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


def live() -> dict[str, Any]:
    """This machine's GPU 0 (needs CuPy and a driver)."""
    import cupy

    props = cupy.cuda.runtime.getDeviceProperties(0)
    name = props["name"]
    name = name.decode() if isinstance(name, bytes) else str(name)
    out = {**_cudnn_versions(), "cuda_runtime": int(cupy.cuda.runtime.runtimeGetVersion()),
           "driver": int(cupy.cuda.runtime.driverGetVersion()), "device_name": name,
           "compute_capability": f"{props['major']}.{props['minor']}",
           "sm_count": int(props["multiProcessorCount"]), "memory_bytes": int(props["totalGlobalMem"]),
           "live": True}
    try:
        from dslc.compile.target import capture

        out["device_properties"] = capture()
    except Exception:
        out["device_properties"] = None
    return out
