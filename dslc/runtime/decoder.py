"""A decode loop over a model that keeps key/value caches (`cache_write`): the caches are
allocated once, zeroed, in their declared dtype and layout, and passed at every step with the
write position, which the decoder advances by the rows each step writes.

    dec = model.decoder(batch=1, max_len=1024)
    out = dec.step({"hidden_states": prompt})      # prefill: rows [0, S)
    out = dec.step({"hidden_states": token})       # then one row a step: [S, S + 1), ...

The caches are the same buffers at every step, so from the second step of a size on a plain
call replays one CUDA graph (`dslc.runtime.replay` records their pointers, never copies them).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from dslc.backend import device
from dslc.core.dims import Dim, format_dim
from dslc.core.errors import RunnerError
from dslc.ir.interp import concrete
from dslc.runtime.manifest import Manifest
from dslc.runtime.replay import Bound
from dslc.runtime.schedule import Schedule


class Model(Protocol):
    """What a decoder needs of a `dslc.runtime.model.Model` (which imports this module)."""

    program: Schedule
    manifest: Manifest

    def _bind(self, inputs: Mapping[str, Any]) -> Bound: ...

    def _run(self, refs: dict[str, device.ArrayRef], exe: Any, kind: str) -> dict[str, Any]: ...


class Decoder:
    """The caches of one decode loop and its position (see the module's doc)."""

    def __init__(self, model: Model, batch: int, max_len: int, kind: str = "torch") -> None:
        written = model.manifest.written
        if not written:
            raise RunnerError("R0201", f"model `{model.manifest.model}` writes no cache in "
                              "place (`cache_write`): call it directly")
        positions = {w.at for w in written}
        if len(positions) != 1 or None in positions:
            raise RunnerError("R0201", "a decoder passes one position input to every "
                              "`cache_write`, and this model writes at "
                              f"{sorted(str(p) for p in positions)}")
        rows = {w.rows for w in written}
        if len(rows) != 1:
            raise RunnerError("R0201", "a decoder advances one position for every cache, and "
                              f"this model's writes are {len(rows)} different row counts")
        self.model = model
        self.position_input = str(next(iter(positions)))
        self.rows: Dim = rows.pop()
        self.batch, self.max_len, self.kind = batch, max_len, kind
        self.caches = {w.input: self._allocate(w.input) for w in written}
        self.position = 0
        self._position = device.empty((1,), (1,), "i32", kind)

    def _allocate(self, name: str) -> device.ArrayRef:
        """A zeroed cache [batch, H, max_len, D] in the input's declared dtype and layout."""
        p = self.model.program
        node = p.nodes[p.inputs[name]]
        dims: dict[str, int] = {}
        for axis, want in ((0, self.batch), (2, self.max_len)):
            d = node.type.shape[axis]
            if isinstance(d, int):
                if d != want:
                    raise RunnerError("R0301", f"cache `{name}` holds {d} "
                                      f"{'rows' if axis == 0 else 'positions'}, not {want}")
            elif format_dim(d) in d.symbols():  # a dim of its own: the decoder's to choose
                dims[format_dim(d)] = want
            else:
                raise RunnerError("R0301", f"cache `{name}`: axis {axis} is "
                                  f"`{format_dim(d)}`, which a decoder cannot size")
        s = p.storage(p.inputs[name], dims)
        cache = device.empty(s.shape, s.strides, s.dtype, self.kind)
        _zero(cache.obj)
        return cache

    def reset(self) -> None:
        """Start a new sequence: position 0, caches zeroed."""
        self.position = 0
        for cache in self.caches.values():
            _zero(cache.obj)

    def step(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        """Run one step at the current position with the caches; advance it by the rows the step
        writes; the model's outputs."""
        _fill(self._position.obj, self.position)
        feed = {**inputs, **{n: c.obj for n, c in self.caches.items()},
                self.position_input: self._position.obj}
        refs, exe, kind = self.model._bind(feed)
        rows = int(concrete(self.rows, exe.dims, self.model.program.env))
        if self.position + rows > self.max_len:
            raise RunnerError("R0301", f"the caches hold {self.max_len} positions, and this "
                              f"step would write [{self.position}, {self.position + rows})")
        out = self.model._run(refs, exe, kind)
        self.position += rows
        return out


def _zero(obj: Any) -> None:
    if hasattr(obj, "zero_"):
        obj.zero_()
    else:
        obj[...] = 0


def _fill(obj: Any, value: int) -> None:
    """The position written on the device from a host integer (a kernel launch: no copy, no
    synchronisation)."""
    obj.fill_(value) if hasattr(obj, "fill_") else obj.fill(value)
