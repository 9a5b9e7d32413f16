"""The bundle file: msgpack, no pickle. An envelope {magic, schema_version, checksum, payload}
holds the payload (itself msgpack bytes) and the SHA-256 of those bytes; the reader checks all
three and says what is wrong in one sentence.

The checksum catches damage, not edits: a payload changed and re-hashed reads as well as one the
compiler wrote. So the reader trusts nothing in it. Only a regular file of at most `MAX_BYTES`
is read (never a FIFO, a device or a folder), into at most `MAX_CONTAINERS` maps and lists;
msgpack's own errors (truncated, extra data, nesting too deep, ...) are reported; and the
payload is validated whole against its schema
through the typed records of `dslc.runtime.records` (types, required fields, ranges,
cross-references, every cuDNN tensor within the memory it is bound to: `BundleError` naming
the field) before anything reads it. (The runtime's `Model` checks the last point per bucket
when it first runs at that size, where it computes the memory layout anyway: checking every
bucket up front took a third of a second of the encoder's start-up.)

Payload, schema 1: model, source, dslc version, created; manifest (inputs, outputs, params,
dims, buckets, with spans); graph (the lowered IR, dims, load-time values); steps (the schedule:
cuDNN graphs and fallback kernels, with the reasons for splits); buckets (per bucket: for each
group signature its spec and plan: engine id, knobs, serialized plan, workspace; the memory
plan); environment (where it was compiled, or tuned).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgpack

from dslc.fsutil import UnreadableFile, read_limited
from dslc.runtime.records import Bundle, BundleError
from dslc.runtime.schedule import Schedule, check_buckets

__all__ = ["MAGIC", "MAX_BYTES", "SCHEMA_VERSION", "Bundle", "BundleError", "load", "pack",
           "read", "unpack"]

MAGIC = "dslc-bundle"
SCHEMA_VERSION = 1
# What a file may make in memory: bundles hold no weights (ResNet-50's is under 1 MiB deviceless,
# a few MiB tuned, with 14,000 maps and lists). Python objects take up to ~20x the msgpack bytes
# (64x for empty lists, hence the count), so these bound a hostile file to about a GiB.
MAX_BYTES = 64 << 20
MAX_CONTAINERS = 4_000_000


def pack(payload: Bundle | Mapping[str, Any]) -> bytes:
    data = payload.to_data() if isinstance(payload, Bundle) else payload
    body = msgpack.packb(data, use_bin_type=True)
    envelope = {"magic": MAGIC, "schema_version": SCHEMA_VERSION,
                "checksum": hashlib.sha256(body).hexdigest(), "payload": body}
    return bytes(msgpack.packb(envelope, use_bin_type=True))


def _msgpack(data: bytes, source: str, what: str) -> Any:
    made = 0

    def counted(container: Any) -> Any:
        nonlocal made
        made += 1
        if made > MAX_CONTAINERS:
            raise BundleError(f"{source} is not a dslc bundle ({what} holds more than "
                              f"{MAX_CONTAINERS:,} maps and lists)")
        return container

    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=False, list_hook=counted,
                               object_hook=counted)
    except BundleError:
        raise
    except Exception as err:  # ExtraData, FormatError, StackError, ValueError, TypeError, ...
        reason = str(err).splitlines()[0][:120] if str(err) else type(err).__name__
        raise BundleError(f"{source} is not a dslc bundle ({what} is not msgpack: "
                          f"{reason})") from err


def unpack_payload(data: bytes, source: str = "the bundle") -> Mapping[str, Any]:
    """The payload's plain data, from the envelope (checked), not yet validated."""
    envelope = _msgpack(data, source, "the file")
    if not isinstance(envelope, dict) or envelope.get("magic") != MAGIC:
        raise BundleError(f"{source} is not a dslc bundle (no `{MAGIC}` magic)")
    version = envelope.get("schema_version")
    if version != SCHEMA_VERSION:
        shown = version if isinstance(version, int) else "of an unknown kind"
        raise BundleError(f"{source} has bundle schema {shown}; this dslc reads schema "
                          f"{SCHEMA_VERSION} (recompile the model)")
    body = envelope.get("payload")
    if not isinstance(body, bytes) or hashlib.sha256(body).hexdigest() != envelope.get("checksum"):
        raise BundleError(f"{source} is corrupt (checksum mismatch): recompile or copy it again")
    payload = _msgpack(body, source, "its payload")
    if not isinstance(payload, dict):
        raise BundleError(f"{source} has a malformed payload (not a map)")
    return payload


def unpack(data: bytes, source: str = "the bundle", bindings: bool = True) -> Bundle:
    """The payload's records, validated whole (BundleError naming the field otherwise);
    `bindings=False` leaves each bucket's tensor bounds to the caller (`check_bucket`)."""
    payload = unpack_payload(data, source)
    try:
        bundle = Bundle.from_data(payload)
        if bindings:
            check_buckets(Schedule(bundle))
    except BundleError as err:
        raise BundleError(f"{source} is not a valid bundle: {err}") from err
    except RecursionError as err:  # data nested past what any bundle holds
        raise BundleError(f"{source} is not a valid bundle: nested too deep") from err
    return bundle


def load(path: Path, bindings: bool = True) -> Bundle:
    """The bundle at `path` as validated records (`bindings`: see `unpack`)."""
    try:
        data = read_limited(Path(path), MAX_BYTES)
    except UnreadableFile as err:
        raise BundleError(f"cannot read `{path}` as a bundle: {err.strerror}") from err
    except OSError as err:
        raise BundleError(f"cannot read `{path}`: {err.strerror or err}") from err
    return unpack(data, f"`{path}`", bindings)


def read(path: Path) -> dict[str, Any]:
    """The bundle at `path`, validated, as plain data (for code that edits it: the tuner)."""
    return load(path).to_data()
