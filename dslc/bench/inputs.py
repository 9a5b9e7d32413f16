"""Random inputs for a benchmark (never zeros: a model that ignored its input would pass), and
how two runs' outputs are compared."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from dslc.ir.interp import NUMPY_DTYPES, concrete
from dslc.runtime.schedule import Schedule

# Largest |ours - reference| over largest |reference|, by the output's dtype; integer and
# boolean outputs must match exactly.
TOLERANCE = {"f32": 5e-3, "f16": 1.5e-2, "bf16": 3e-2}


def random_inputs(program: Schedule, dims: Mapping[str, int], seed: int = 0,
                  ) -> dict[str, np.ndarray]:
    """Normal floats; integers (ids) below the row count of every table they index (`gather`),
    else 0 or 1 (an attention mask, whose other values would push scores past f16's range);
    booleans half true."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, node_name in program.inputs.items():
        node = program.nodes[node_name]
        shape = program.storage(node_name, dims).shape
        dtype = node.type.dtype
        if dtype == "bool":
            out[name] = rng.random(shape) < 0.5
        elif dtype in ("i8", "u8", "i32", "i64"):
            out[name] = rng.integers(0, id_bound(program, node_name, dims), shape).astype(
                NUMPY_DTYPES[dtype])
        else:
            out[name] = rng.standard_normal(shape).astype(np.float32)
    return out


def id_bound(program: Schedule, value: str, dims: Mapping[str, int]) -> int:
    """The fewest rows of the tables `value` indexes directly, at these dims (2 if none)."""
    rows = [int(concrete(program.nodes[n.inputs[0]].type.shape[int(n.attrs.get("axis", 0))],
                         dims, program.env))
            for n in program.graph.nodes if n.op == "gather" and n.inputs[1:2] == (value,)]
    return max(min(rows, default=2), 1)


def rel_error(ours: np.ndarray, reference: np.ndarray) -> float:
    """max |ours - reference| / max |reference| (the absolute error where the reference is 0)."""
    a = np.asarray(ours, np.float64)
    b = np.asarray(reference, np.float64)
    if a.shape != b.shape:
        return float("inf")
    if a.size == 0:
        return 0.0
    scale = float(np.abs(b).max())
    return float(np.abs(a - b).max() / (scale if scale > 0 else 1.0))


def tolerance(dtype: str) -> float:
    return TOLERANCE.get(dtype, 0.0)
