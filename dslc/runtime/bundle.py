"""The bundle file: msgpack, no pickle. An envelope {magic, schema_version, checksum, payload}
holds the payload (itself msgpack bytes) and the SHA-256 of those bytes; the reader checks all
three and says what is wrong in one sentence.

Payload, schema 1: model, source, dslc version, created; manifest (inputs, outputs, params,
dims, buckets, with spans); graph (the lowered IR, dims, load-time values); steps (the schedule:
cuDNN graphs and fallback kernels, with the reasons for splits); buckets (per bucket: for each
group signature its spec and plan: engine id, knobs, serialized plan, workspace; the memory
plan); environment (where it was compiled, or tuned).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import msgpack

MAGIC = "dslc-bundle"
SCHEMA_VERSION = 1


class BundleError(Exception):
    """The file is not a usable bundle (a one-sentence reason)."""


def pack(payload: dict[str, Any]) -> bytes:
    body = msgpack.packb(payload, use_bin_type=True)
    envelope = {"magic": MAGIC, "schema_version": SCHEMA_VERSION,
                "checksum": hashlib.sha256(body).hexdigest(), "payload": body}
    return bytes(msgpack.packb(envelope, use_bin_type=True))


def unpack(data: bytes, source: str = "the bundle") -> dict[str, Any]:
    try:
        envelope = msgpack.unpackb(data, raw=False)
    except Exception as err:
        raise BundleError(f"{source} is not a dslc bundle (not msgpack: {err})") from err
    if not isinstance(envelope, dict) or envelope.get("magic") != MAGIC:
        raise BundleError(f"{source} is not a dslc bundle (no `{MAGIC}` magic)")
    version = envelope.get("schema_version")
    if version != SCHEMA_VERSION:
        raise BundleError(f"{source} has bundle schema {version}; this dslc reads schema "
                          f"{SCHEMA_VERSION} (recompile the model)")
    body = envelope.get("payload")
    if not isinstance(body, bytes) or hashlib.sha256(body).hexdigest() != envelope.get("checksum"):
        raise BundleError(f"{source} is corrupt (checksum mismatch): recompile or copy it again")
    payload = msgpack.unpackb(body, raw=False, strict_map_key=False)
    if not isinstance(payload, dict):
        raise BundleError(f"{source} has a malformed payload")
    return payload


def read(path: Path) -> dict[str, Any]:
    try:
        data = Path(path).read_bytes()
    except OSError as err:
        raise BundleError(f"cannot read `{path}`: {err.strerror or err}") from err
    return unpack(data, f"`{path}`")
