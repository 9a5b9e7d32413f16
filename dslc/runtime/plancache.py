"""The on-disk layer of the plan cache: plans made at run time (for sizes between buckets) kept
under the user cache folder, one small file per (group graph, environment), so the next process
on this machine restores them in milliseconds instead of building them again.

The layers, nearest first: the process's executables (memory), the bundle's buckets, this cache,
then a build seeded by the nearest bucket's engine. A file that is unreadable (not a regular
file, larger than `MAX_BYTES`, not msgpack, not a valid plan record: every number bounded as a
bundle's are), or a plan that no longer deserializes, falls through to the next layer
(`plans.prepare` replays or rebuilds), and the next store overwrites it.
Writes are atomic (write and rename), so concurrent processes never see a partial file; two
writers of one key write equivalent plans.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import msgpack

from dslc import fsutil
from dslc.backend.spec import GroupSpec
from dslc.runtime.records import BundleError, Environment, PlanRecord

LOG = logging.getLogger("dslc.runtime")
MAX_BYTES = 16 << 20  # one plan: a serialized cuDNN plan is kilobytes
ENV_FIELDS = ("device_name", "compute_capability", "sm_count", "cudnn_backend", "cudnn_frontend",
              "driver")


def default_dir() -> Path:
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("dslc")) / "plans"


def path_for(root: Path, spec: GroupSpec, env: Environment) -> Path:
    """The file of a group graph's plan (its concrete cuDNN form, names included: they are the
    tensor names the plan was built with) in an environment."""
    text = json.dumps([spec.data(), [getattr(env, k) for k in ENV_FIELDS]], sort_keys=True,
                      default=str)
    return root / f"{hashlib.sha256(text.encode()).hexdigest()[:32]}.plan"


def load(path: Path) -> PlanRecord | None:
    try:
        plan = PlanRecord.from_data(msgpack.unpackb(fsutil.read_limited(path, MAX_BYTES),
                                                    raw=False, strict_map_key=False), "plan")
    except FileNotFoundError:
        return None
    except (OSError, BundleError, RecursionError, ValueError, TypeError, msgpack.UnpackException,
            ) as err:  # a damaged file: rebuild, and overwrite it
        LOG.debug("plan cache %s unreadable (%s)", path, err)
        return None
    return plan if plan.serialized else None


def store(path: Path, plan: PlanRecord) -> None:
    try:
        fsutil.write_bytes(path, msgpack.packb(plan.to_data(), use_bin_type=True))
    except OSError as err:  # a read-only cache folder costs speed, not correctness
        LOG.debug("plan cache %s not written (%s)", path, err)
