"""A compiled model, ready to run: the bundle, the weights on the device, and per input size an
executable (plans, memory plan, arena, workspace). `Model` is what generated runners subclass.

    model = Model("build/resnet50/resnet50.bundle", "w.safetensors")
    out = model.run({"image": image})          # torch tensors in, torch tensors out
    fast = model.capture({"image": image})     # the whole schedule as one CUDA graph
    out = fast({"image": image})

From the second call at a size on, `run` replays a CUDA graph of that size too
(`dslc.runtime.replay`), with fresh outputs; `cuda_graphs=False` runs every call step by step.
A model with key/value caches runs a decode loop through `model.decoder(batch=, max_len=)`
(`dslc.runtime.decoder`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dslc import fsutil
from dslc.backend import device, environment, fused, gemv, merge
from dslc.backend.kernels import cache_write_part, gather_part, run_kernel
from dslc.backend.spec import GroupSpec, SpecError, group_spec
from dslc.core.dims import bucket_key
from dslc.core.errors import RunnerError
from dslc.ir.graph import stored_dtype
from dslc.ir.groups import make_group
from dslc.ir.interp import concrete_attrs
from dslc.ir.storage import Storage
from dslc.runtime import batches, fleet, params, plancache, profiling, startup
from dslc.runtime import bundle as bundlefile
from dslc.runtime.cachewrites import ROWS_AXIS, Recomputed
from dslc.runtime.decoder import Decoder
from dslc.runtime.inputs import bind_inputs
from dslc.runtime.manifest import Manifest
from dslc.runtime.plans import Ready, measure_here, plan_record, prepare, retime, retune
from dslc.runtime.records import BucketRecord, Environment, PlanRecord, StepRecord
from dslc.runtime.replay import Captured, Replays, stream_of
from dslc.runtime.schedule import ITEMSIZE, MemoryPlan, Schedule
from dslc.runtime.split import Split, split
from dslc.runtime.split import views as split_views
from dslc.runtime.tuningdb import TuningStore, open_store

LOG = logging.getLogger("dslc.runtime")
CHECKED_SIGNATURES = 256  # input signatures whose checks are remembered (a bound on memory)


class Executable:
    """Everything one input size needs: graphs, memory plan, arena, workspace."""

    def __init__(self, model: Model, dims: dict[str, int]) -> None:
        self.model = model
        self.dims = dims
        self.key = bucket_key(dims)
        self.memory: MemoryPlan = model.program.memory_plan(dims)
        # this size's bucket (None between buckets): where a kernel step runs its graph
        self.bucket = self.key if self.key in model.buckets else None
        self.graphs: dict[str, Ready] = {}
        self.splits: dict[str, Split] = {}  # by step name: its anchor alone, then a kernel
        decision = model.decision()
        specs = self._specs()
        shared = self._shared()
        for step, spec, plan in specs:
            where = f"group {step.name} ({step.signature}) at {self.key}"
            outcome = shared.get(step.signature)
            try:
                if outcome is not None:
                    ready = self._from_fleet(model.spec_from(spec.to_data()), outcome, where)
                elif plan is not None:
                    ready = self._saved(model.spec_from(spec.to_data()), plan, decision.action,
                                        where)
                else:
                    ready = self._between_buckets(spec, step, where)
            except RunnerError as err:
                if err.code != "R0802":
                    raise
                if model.program.has_kernel(step):
                    self._to_kernel(step, err)
                elif not self._split(step, where):
                    if not model.program.by_ops(step):
                        raise
                    self._to_kernel(step, err)
                continue
            model.startup.append({"bucket": self.key, "signature": step.signature,
                                  "how": ready.how, "seconds": ready.seconds,
                                  "kernel_cache": ready.kernel_cache})
            self.graphs[step.signature] = ready
        cupy = model.cupy
        self.arena = cupy.empty(max(self.memory.arena, 1), dtype=cupy.uint8)
        self._inner: dict[str, dict[str, Any]] = {}
        for step in model.program.steps:  # made before any call: none while one is captured
            if self._by_ops(step):
                self.inner(step)
        workspace = max((r.workspace for r in [*self.graphs.values(),
                                                *(p.ready for p in self.splits.values())]),
                        default=0)
        self.workspace = cupy.empty(max(workspace, 256), dtype=cupy.uint8)
        # Small kernel steps of no dependency between them run as one launch (`batches`); a
        # cache write may run as its value's writers (`cachewrites`).
        self.slots, self.recomputed = batches.plan(model.program, self.memory, self.bucket)
        self.bindings = {}
        for step in model.program.steps:
            if model.program.graph_here(step, self.bucket) and step.signature in self.graphs:
                spec = self.graphs[step.signature].spec
                self.bindings[step.name] = spec.bound([*step.inputs, *step.nodes])

    def _specs(self) -> list[tuple[StepRecord, Any, PlanRecord | None]]:
        """Per group signature: its first step, its spec at these dims (the bucket's, with its
        plan, or made from the graph), each checked against every step that binds it to memory
        (`Schedule.check_bindings`: BundleError if a tensor would reach past its value)."""
        m = self.model
        bucket = m.buckets.get(self.key)
        out: dict[str, tuple[StepRecord, Any, PlanRecord | None]] = {}
        for step in m.program.steps:
            if not m.program.graph_here(step, self.bucket):
                continue
            if step.signature not in out:
                entry = bucket.graphs.get(step.signature) if bucket is not None else None
                out[step.signature] = ((step, entry.spec, entry.plan) if entry is not None else
                                       (step, m.spec_at(step, self.dims), None))
            m.program.check_bindings(step, out[step.signature][1], self.memory.storage,
                                     self.dims, f"group {step.name} at {self.key}")
        return list(out.values())

    def _to_kernel(self, step: StepRecord, err: RunnerError) -> None:
        """A group with no cuDNN plan that runs on this GPU (a deviceless compile's, which could
        not try its plans: on an H200 cuDNN proposed no engine for a global average pool's
        reduction that the profile had taken) runs as fallback kernels, as a compile on this
        GPU would have made it, at every size."""
        self.model.program.kernels_here.add(step.signature)
        self.model.log.warning("%s; it runs as fallback kernels here", err.message)
        self.model.startup.append({"bucket": self.key, "signature": step.signature,
                                   "how": "kernel", "seconds": 0.0, "kernel_cache": False})

    def _split(self, step: StepRecord, where: str) -> bool:
        """A conv group with no plan that runs here and no kernel: its anchor alone, then its
        epilogue as one kernel, for each step of its signature (`runtime.split`). False where
        it cannot be split so."""
        m = self.model
        steps = [s for s in m.program.steps if s.signature == step.signature
                 and m.program.graph_here(s, self.bucket)]  # not a kernel step of one here
        try:
            parts = split(m.program, self.memory, steps, m.handle, where, m.log)
        except (RunnerError, SpecError):
            parts = None
        if parts is None:
            return False
        self.splits.update(parts)
        m.startup.append({"bucket": self.key, "signature": step.signature, "how": "split",
                          "seconds": next(iter(parts.values())).ready.seconds,
                          "kernel_cache": False})
        return True

    def _by_ops(self, step: StepRecord) -> bool:
        """Whether the step runs here as its ops' kernels one after the other."""
        p = self.model.program
        return (not p.graph_here(step, self.bucket) and step.name not in self.splits
                and p.by_ops(step) and not p.has_kernel(step))

    def inner(self, step: StepRecord) -> dict[str, Any]:
        """The inner values of a step run op by op (`Schedule.by_ops`), each in scratch of its
        own, laid out as its value would be stored and held in the dtype the reference holds
        a fused group's inner values in (`ir.graph.stored_dtype`)."""
        found = self._inner.get(step.name)
        if found is None:
            assert self.model.program.by_ops(step), step.name  # start-up chose it
            cupy, found = self.model.cupy, {}
            for name in step.nodes:
                if name in step.outputs:
                    continue
                s = self.model.program.storage(name, self.dims)  # not in the memory plan
                dt = cupy.dtype(device.KERNEL_DTYPES[stored_dtype(self.model.program.nodes[name],
                                                                  True)])
                memory = cupy.empty(max(s.span, 1), dt)
                found[name] = cupy.ndarray(s.shape, dt, memptr=memory.data,
                                           strides=tuple(x * dt.itemsize for x in s.strides))
            self._inner[step.name] = found
        return found

    def _shared(self) -> dict[str, fleet.Outcome]:
        """Where start-up does not trust the bucket's saved plans: the tuning database's, or
        measured here under the key's lease and published (`dslc.runtime.fleet`)."""
        m = self.model
        bucket = m.buckets.get(self.key)
        if bucket is None or m.tuning_db is None:
            return {}
        names = {s.signature: s.name for s in m.program.steps}

        def measure(w: fleet.Wanted) -> PlanRecord | None:
            return measure_here(w.spec, m.program.nodes, self.memory.storage, m.handle)

        return fleet.consult(m.tuning_db, m.live_environment(), m.decision(),
                             fleet.wanted_in(bucket, names), measure, m.log, m.fleet)

    def _from_fleet(self, spec: Any, outcome: fleet.Outcome, where: str) -> Ready:
        """A graph from what the database or this replica's measurement gave: a plan restored
        from its bytes (measured here, or on a host of the same driver), else replayed from its
        engine and knobs, or the heuristics' choice."""
        m = self.model
        ready = prepare(spec, outcome.plan, m.handle, where, m.log)
        if ready.how in ("restored", "replayed") and outcome.plan is not None:
            ready.how = "retuned" if outcome.how == "tuned" else "database"
        return ready

    def _saved(self, spec: Any, plan: PlanRecord, action: str, where: str) -> Ready:
        """A bucket's graph, as the start-up decision says (see `dslc.runtime.startup`)."""
        m = self.model
        if action == "retime":
            return retime(spec, plan, m.handle, self.memory.storage, m.program.nodes, where, m.log)
        if action == "retune":
            return retune(spec, m.program.nodes, self.memory.storage, m.handle, where, m.log)
        if action == "heuristic":
            return prepare(spec, None, m.handle, where, m.log)
        return prepare(spec, plan, m.handle, where, m.log)

    def _between_buckets(self, spec: Any, step: Any, where: str) -> Ready:
        """A size no bucket has: from the on-disk plan cache, else built from the heuristics'
        choice and put there for the next process. Not from a neighbouring bucket's engine and
        knobs: on the H200 such a plan, built for another size, computed an sdpa with a
        sliding window wrongly (generated programs found it)."""
        m = self.model
        path = m.plan_cache_file(spec)
        cached = plancache.load(path) if path is not None else None
        ready = None
        if m.shared_kernels:  # the sizes of one graph share compiled kernels (cuDNN's cache)
            try:
                ready = prepare(spec, cached, m.handle, where, m.log,
                                kernel_cache=m.kernel_cache(step.signature))
                ready.kernel_cache = ready.how != "restored"
            except RunnerError as err:  # no dynamic-shape plan for this graph
                m.log.info("%s: no plan with the kernel cache (%s); building without", where, err)
        if ready is None:
            ready = prepare(spec, cached, m.handle, where, m.log)
        if path is not None and ready.how != "restored":
            plan = plan_record(ready)
            if plan.serialized is not None:
                plancache.store(path, plan)
        return ready

    def storage(self, name: str) -> Storage:
        return self.memory.storage[name]


class Model:
    def __init__(self, bundle: str | Path, weights: str | Path | None = None, *,
                 on_mismatch: str = "retune", write_back: bool = False,
                 plan_cache: str | Path | None = "default", shared_kernels: bool = False,
                 tuning_db: str | Path | None = "default", tuning_wait_s: float = 120.0,
                 cuda_graphs: bool = True, log: logging.Logger | None = None) -> None:
        if on_mismatch not in startup.POLICIES:
            raise ValueError(f"on_mismatch must be one of {', '.join(startup.POLICIES)}")
        self.on_mismatch = on_mismatch
        # Where re-tuning looks first and publishes to: a path, redis://HOST:PORT/DB, "none"
        # or None; "default": $DSLC_TUNING_DB, else this machine's database (ValueError: a
        # value that names none). Replicas wait `tuning_wait_s` for another's measurement.
        self.tuning_db: TuningStore | None = (
            open_store(None if tuning_db == "default" else tuning_db or "none", "tuning_db"))
        if not tuning_wait_s >= 0:
            raise ValueError(f"tuning_wait_s must be a number of seconds, not {tuning_wait_s!r}")
        self.fleet = fleet.FleetOptions(wait_s=tuning_wait_s)
        self.write_back = write_back  # save re-made plans into the bundle (see `save_plans`)
        # Plans for sizes between buckets, kept across processes (None: memory only).
        self.plan_cache = (plancache.default_dir() if plan_cache == "default" else
                           Path(plan_cache) if plan_cache is not None else None)
        self._live: Environment | None = None
        # Sizes between buckets built with dynamic shapes and cuDNN's kernel cache: a second
        # size of a graph builds ~4x faster, but its plans ran ResNet-50 at batch 48 1.55x
        # slower on the H200 (docs/benchmarks.md), so it is opt-in, for many short-lived sizes.
        self.shared_kernels = shared_kernels
        self._kernel_caches: dict[str, Any] = {}  # cuDNN kernel caches by group signature
        # Plain calls replay a CUDA graph per size from their second call on (`run`).
        self.cuda_graphs = cuda_graphs
        self._replays = Replays()
        self._decision: startup.Decision | None = None
        self.path = Path(bundle)
        # Validated records; each bucket's cuDNN tensor bounds are checked by `Executable`.
        self.bundle = bundlefile.load(self.path, bindings=False)
        self.program = Schedule(self.bundle)
        self.manifest: Manifest = self.bundle.manifest  # what input checks and weights read
        self._spans = {i.name: i.span.to_data() for i in self.manifest.inputs}  # for errors
        self._checked: dict[tuple[Any, ...], dict[str, int]] = {}  # input signature -> dims
        self.buckets: dict[str, BucketRecord] = {b.key: b for b in self.bundle.buckets}
        self.log = log or LOG
        self.startup: list[dict[str, Any]] = []
        self._executables: dict[str, Executable] = {}
        self._weights: dict[str, Any] | None = None
        self._host_weights: dict[str, Any] | None = None
        self._prepared = False
        self._gpu: tuple[Any, Any] | None = None
        self._handle: Any = None
        if weights is not None:
            self.load_weights(weights)

    @property
    def payload(self) -> dict[str, Any]:
        """The bundle as plain data (its records are `bundle`)."""
        return self.bundle.to_data()

    # -- the device, loaded when first needed ---------------------------------------------------
    @property
    def cupy(self) -> Any:
        if self._gpu is None:
            self._gpu = device.require()
        return self._gpu[0]

    @property
    def handle(self) -> Any:
        if self._handle is None:
            cudnn = (self._gpu or device.require())[1]
            self._handle = cudnn.create_handle()
        return self._handle

    def close(self) -> None:
        """Give back the cuDNN handle and the device memory now (a service that loads and drops
        models keeps no handles alive; the model cannot run after this)."""
        if self._handle is not None:
            cudnn = (self._gpu or device.require())[1]
            cudnn.destroy_handle(self._handle)
            self._handle = None
        self._replays.clear()
        self._executables.clear()
        self._weights = None

    def decision(self) -> startup.Decision:
        """What start-up does with the saved plans here (decided once, logged)."""
        if self._decision is None:
            self.cupy  # noqa: B018 - R0801 without a GPU
            self._live = Environment.from_data(environment.live(), "live environment")
            self._decision = startup.decide(self.bundle.environment, self._live, self.on_mismatch)
            self.log.info("start-up of %s: %s", self.bundle.model, self._decision.explain())
        return self._decision

    def live_environment(self) -> Environment:
        self.decision()
        assert self._live is not None
        return self._live

    def spec_from(self, data: Mapping[str, Any]) -> GroupSpec:
        return GroupSpec.from_data(data)

    def spec_at(self, step: StepRecord, dims: dict[str, int]) -> GroupSpec:
        group = make_group(self.program.graph, list(step.nodes), step.pattern,
                           placement=self.program.placement)
        return group_spec(self.program.graph, group, dims, self.program.env,
                          self.program.placement)

    def kernel_cache(self, signature: str) -> Any:
        if signature not in self._kernel_caches:
            from dslc.backend.graphs import new_kernel_cache

            self._kernel_caches[signature] = new_kernel_cache()
        return self._kernel_caches[signature]

    def plan_cache_file(self, spec: Any) -> Path | None:
        if self.plan_cache is None:
            return None
        return plancache.path_for(self.plan_cache, spec, self.live_environment())

    # -- weights -------------------------------------------------------------------------------
    def load_weights(self, path: str | Path) -> None:
        """Read and check the weights now (R0202); they go to the GPU at the first call, where
        the load-time values are computed (so a runner imports and loads without a GPU).
        Weights prepared for this bundle (`dslc weights prepare`) hold those values already."""
        params.amaxes(self.program)  # an fp8 bundle without its scales: R0203, now
        prepared = params.read_prepared(Path(path), self.program)
        self._prepared = prepared is not None
        if prepared is None:
            tensors = params.read(Path(path), self.manifest)
            params.check_calibrated_with(self.program, tensors, Path(path))
        self._host_weights = prepared if prepared is not None else tensors
        self._replays.clear()  # their graphs read the weights they were recorded with
        self._weights = None

    def _device_weights(self) -> dict[str, Any]:
        if self._weights is None:
            if self._host_weights is None and self.manifest.params:
                raise RunnerError("R0202", "no weights loaded: pass a safetensors file to the "
                                  "runner, or call `load_weights(path)`")
            if self._host_weights is None:  # a model without params
                self._host_weights = {}
            self.cupy  # noqa: B018 - R0801 without a GPU
            if self._prepared:
                self._weights = {k: self.cupy.asarray(v) for k, v in self._host_weights.items()}
            else:
                self._weights = params.upload(self.program, self._host_weights,
                                              self.program.weights_used())
        return self._weights

    # -- running -------------------------------------------------------------------------------
    def executable(self, dims: dict[str, int]) -> Executable:
        key = bucket_key(dims)
        if key not in self._executables:
            self._handle_on_null_stream()
            self._executables[key] = Executable(self, dims)
            if self.write_back and self.decision().action != "restore":
                self.write_back = False  # once; save_plans prepares the other buckets
                self.save_plans()
        return self._executables[key]

    def _handle_on_null_stream(self) -> None:
        """Plans are built and restored with the handle on the null stream, and the per-step
        profile leaves it there. It keeps the stream of the last launch (a capture's own, the
        profile's, the caller's), which may be destroyed since: cuDNN crashed restoring a plan
        there (a segfault in `deserialize` at `dslc bench`'s second size, after the first
        size's profile, on an H100)."""
        if self._handle is not None:
            cudnn = (self._gpu or device.require())[1]
            cudnn.set_stream(handle=self._handle, stream=0)

    def save_plans(self, path: str | Path | None = None) -> Path:
        """Prepare every bucket here (as start-up decided: re-timed, re-tuned, replayed...) and
        write the bundle with these plans and this machine's environment, atomically, to `path`
        (default: the bundle itself), so that the next start-up here restores them."""
        plans = {}
        for bucket in self.bundle.buckets:
            exe = self.executable(dict(bucket.dims))
            for signature, entry in bucket.graphs.items():
                ready = exe.graphs.get(signature)
                if ready is None:  # no plan runs here: the step runs its fallback kernels
                    continue
                plans[(bucket.key, signature)] = entry.plan.updated(
                    {**plan_record(ready).to_data(), "made_at_startup": ready.how},
                    f"buckets.{bucket.key}.graphs.{signature}.plan")
        live = Environment.from_data(environment.live(properties=True))
        target = Path(path) if path is not None else self.path
        fsutil.write_bytes(target, bundlefile.pack(self.bundle.with_plans(plans, live)))
        self.log.info("saved the plans of %s for this machine to %s", self.bundle.model, target)
        return target

    def prepare(self, **dims: int) -> Executable:
        """Build (or restore) everything for these dim values now, not at the first call."""
        return self.executable({k: int(v) for k, v in dims.items()})

    def _check(self, inputs: Mapping[str, Any]) -> tuple[dict[str, device.ArrayRef],
                                                          dict[str, int]]:
        """The inputs as device arrays, checked, and the dim values they bind. What depends only
        on their shapes, strides and dtypes is checked once per such signature (the dims solved
        with exact fractions took ~0.4 ms a call of the BERT front on the H200, longer than
        its replayed graph); the alignment of each call's pointers is checked every call."""
        spans = self._spans
        refs = {name: device.as_array(obj, name, spans.get(name)) for name, obj in inputs.items()}
        key = tuple((name, r.shape, r.strides, r.dtype) for name, r in refs.items())
        dims = self._checked.get(key)
        if dims is None:
            dims = self._dims_of(refs)
            if len(self._checked) < CHECKED_SIGNATURES:
                self._checked[key] = dims
        for name, ref in refs.items():
            if ref.ptr % 16:  # cuDNN's kernels read 16-byte vectors
                raise RunnerError("R0501", f"input `{name}` starts at an address that is not "
                                  "16-byte aligned (a view into another tensor?); pass a copy "
                                  "(`x.clone()`)", spans.get(name))
        return refs, dims

    def _dims_of(self, refs: Mapping[str, device.ArrayRef]) -> dict[str, int]:
        """The dims the inputs bind (R0401 and the like from `bind_inputs`), their strides
        checked against the layouts the bundle planned (R0501)."""
        dims = bind_inputs(self.manifest, {k: (r.shape, r.dtype) for k, r in refs.items()})
        for name, ref in refs.items():
            want = self.program.storage(self.program.inputs[name], dims)
            # A size-1 axis may have any stride (PyTorch gives it one of its own choosing).
            if any(n > 1 and a != b for n, a, b in zip(ref.shape, ref.strides, want.strides,
                                                      strict=True)):
                order = self.program.nodes[self.program.inputs[name]].type.layout
                raise RunnerError("R0501", f"input `{name}` has strides {list(ref.strides)}, "
                                  f"expected {list(want.strides)} (layout {order}); make it "
                                  "contiguous in that layout", self._spans.get(name))
        return dims

    def _bind(self, inputs: Mapping[str, Any]) -> tuple[dict[str, device.ArrayRef], Executable,
                                                        str]:
        """What every call does first: weights on the GPU, the inputs checked, the executable of
        their sizes, and the array kind ("torch" or "cupy") outputs are made in."""
        self._device_weights()
        refs, dims = self._check(inputs)
        kind = "torch" if any(r.kind == "torch" for r in refs.values()) else "cupy"
        return refs, self.executable(dims), kind

    def run(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        """Run the model on `inputs` (by name); returns the outputs by name, on the caller's
        current stream, without waiting for them."""
        return self._run(*self._bind(inputs))

    def _run(self, refs: dict[str, device.ArrayRef], exe: Executable,
             kind: str) -> dict[str, Any]:
        if self.cuda_graphs:
            replayed = self._replays.call(self, refs, exe, kind)
            if replayed is not None:
                return replayed
        outputs = self._allocate_outputs(exe, kind)
        stream = stream_of(kind, self.cupy)
        self._launch(exe, refs, outputs, stream)
        return {name: self._output_view(exe, name, outputs, kind, refs)
                for name in self.program.outputs}

    def _allocate_outputs(self, exe: Executable, kind: str) -> dict[str, device.ArrayRef]:
        out = {}
        for value in self.program.outputs.values():
            base = exe.storage(value).base
            if base in out or base in self.program.load_time or \
                    self.program.nodes[base].op == "input":
                continue
            s = exe.storage(base)
            out[base] = device.empty(s.shape, s.strides, s.dtype, kind)
        return out

    def _output_view(self, exe: Executable, name: str, outputs: dict[str, device.ArrayRef],
                     kind: str, refs: Mapping[str, device.ArrayRef]) -> Any:
        """An output: its buffer, or a view of it. An output that is an input (or a view of
        one) is that input, as a PyTorch module returning its argument returns the same tensor;
        one computed from params alone is a view of the weights."""
        s = exe.storage(self.program.outputs[name])
        base = outputs.get(s.base)
        node = self.program.nodes[s.base]
        if base is None and node.op == "input":
            base = refs[node.attrs["name"]]
        if base is not None and s.offset == 0 and s.shape == base.shape and \
                s.strides == base.strides:
            return base.obj
        ptr = self._pointer(exe, self.program.outputs[name], refs, outputs)
        if kind == "torch" and base is not None and base.kind == "torch":
            import torch

            return torch.as_strided(base.obj, s.shape, s.strides, s.offset)
        return device.view(ptr, s.shape, s.strides, s.dtype)

    def _pointer(self, exe: Executable, name: str, refs: Mapping[str, device.ArrayRef],
                 outputs: Mapping[str, device.ArrayRef]) -> int:
        s = exe.storage(name)
        base = s.base
        node = self.program.nodes[base]
        if node.op == "input":
            ptr = refs[node.attrs["name"]].ptr
        elif base in outputs:
            ptr = outputs[base].ptr
        elif base in exe.memory.offsets:
            ptr = int(exe.arena.data.ptr) + exe.memory.offsets[base]
        else:
            assert self._weights is not None and base in self._weights, base
            ptr = int(self._weights[base].data.ptr)
        return ptr + s.offset * ITEMSIZE[s.dtype]

    def _launch(self, exe: Executable, refs: Mapping[str, device.ArrayRef],
                outputs: Mapping[str, device.ArrayRef], stream: Any) -> None:
        _, cudnn = self._gpu or device.require()
        cudnn.set_stream(handle=self.handle, stream=stream.ptr)
        workspace = int(exe.workspace.data.ptr)
        with stream:
            for slot in exe.slots:
                if len(slot) == 1 and slot[0].name not in exe.recomputed:
                    self._step(exe, slot[0], refs, outputs, workspace)
                else:
                    self._merged(exe, slot, refs, outputs, workspace)

    def _step(self, exe: Executable, step: Any, refs: Mapping[str, device.ArrayRef],
              outputs: Mapping[str, device.ArrayRef], workspace: int) -> None:
        parts = exe.splits.get(step.name)
        if parts is not None:
            pack = {uid: self._pointer(exe, value, refs, outputs) for uid, value in parts.bindings}
            parts.ready.graph.execute(pack, workspace, handle=self.handle)
            fused.run(parts.epilogue, *split_views(
                parts, lambda v: self._view(exe, v, refs, outputs), step.outputs))
            return
        if self.program.graph_here(step, exe.bucket):
            pack = {uid: self._pointer(exe, value, refs, outputs)
                    for uid, value in exe.bindings[step.name]}
            exe.graphs[step.signature].graph.execute(pack, workspace, handle=self.handle)
            return
        p = self.program.pointwise_kernel(step)
        if p is not None:
            fused.run(p, [self._view(exe, o.name, refs, outputs) for o in p.operands],
                      [self._view(exe, v, refs, outputs) for v in step.outputs])
            return
        g = self.program.matmul_kernel(step)
        if g is not None:
            gemv.run(g, [self._view(exe, name, refs, outputs) for name in g.operands],
                     [self._view(exe, v, refs, outputs) for v in step.outputs])
            return
        inner = exe.inner(step) if len(step.nodes) > 1 else {}  # `Schedule.by_ops`

        def view(v: str) -> Any:
            return inner[v] if v in inner else self._view(exe, v, refs, outputs)

        for name in step.nodes:
            node = self.program.nodes[name]
            run_kernel(node.op, [view(v) for v in node.inputs], view(name),
                       concrete_attrs(node, exe.dims, self.program.env))

    def _merged(self, exe: Executable, slot: list[StepRecord],
                refs: Mapping[str, device.ArrayRef], outputs: Mapping[str, device.ArrayRef],
                workspace: int) -> None:
        """Steps no one of which reads or writes what another writes, as one kernel
        (`backend.merge`); a step whose kernel cannot be a part here (an operand overlapping its
        result, a result large enough for the vector kernel) runs on its own first."""
        parts: list[merge.Part] = []
        for step in slot:
            again = exe.recomputed.get(step.name)
            if again is not None:
                parts += self._recomputed(exe, again, refs, outputs)
                continue
            part = None
            p = self.program.pointwise_kernel(step)
            if p is not None:
                part = fused.part(p, [self._view(exe, o.name, refs, outputs) for o in p.operands],
                                  [self._view(exe, v, refs, outputs) for v in step.outputs])
            else:
                node = self.program.nodes[step.nodes[0]]
                xs = [self._view(exe, v, refs, outputs) for v in node.inputs]
                y = self._view(exe, node.name, refs, outputs)
                part = cache_write_part(xs, y) if node.op == "cache_write" else \
                    gather_part(xs, y, concrete_attrs(node, exe.dims, self.program.env))
            if part is None:
                self._step(exe, step, refs, outputs, workspace)
            else:
                parts.append(part)
        merge.run(parts)

    def _recomputed(self, exe: Executable, again: Recomputed,
                    refs: Mapping[str, device.ArrayRef],
                    outputs: Mapping[str, device.ArrayRef]) -> list[merge.Part]:
        """A cache write as its value's writers' kernels storing into the cache's rows
        (`runtime.cachewrites`)."""
        at = self._view(exe, again.at, refs, outputs)
        parts = []
        for writer, region in zip(again.writers, again.regions, strict=True):
            p = self.program.pointwise_kernel(writer)
            assert p is not None, writer.name  # `cachewrites` takes no other writer
            ptr = self._pointer(exe, region.base, refs, outputs) + \
                region.offset * ITEMSIZE[region.dtype]
            y = device.view(ptr, region.shape, region.strides, region.dtype, device.STORED_AS)
            xs = [fused.operand_view(self._view(exe, o.name, refs, outputs), o)
                  for o in p.operands]
            part = fused.strided_part(p, xs, [y], (at, ROWS_AXIS, again.rows))
            if part is not None:
                parts.append(part)
        return parts

    def _view(self, exe: Executable, name: str, refs: Mapping[str, device.ArrayRef],
              outputs: Mapping[str, device.ArrayRef]) -> Any:
        node = self.program.nodes[name]
        if node.op == "scalar":  # a pass-by-value constant
            return self.cupy.asarray(float(node.attrs["value"]),
                                     dtype=device.CUPY_DTYPES[node.type.dtype])
        s = exe.storage(name)
        return device.view(self._pointer(exe, name, refs, outputs), s.shape, s.strides, s.dtype,
                           device.STORED_AS)

    def profile(self, inputs: Mapping[str, Any], repeats: int = 10) -> list[dict[str, Any]]:
        """Milliseconds per step (median over `repeats`), in schedule order, each step timed
        as it runs inside a replayed CUDA graph (`dslc.runtime.profiling`)."""
        return profiling.profile(self, inputs, repeats)

    def decoder(self, batch: int, max_len: int, kind: str = "torch") -> Decoder:
        """A decode loop over a model that writes key/value caches in place (`cache_write`):
        the caches [batch, H, max_len, D] allocated once and zeroed (torch tensors, or CuPy
        arrays with `kind="cupy"`); `step(inputs)` passes them with the position input,
        advances the position by the rows written, and returns the outputs; `reset()` starts
        a new sequence (`dslc.runtime.decoder`)."""
        return Decoder(self, batch, max_len, kind)

    def capture(self, inputs: Mapping[str, Any]) -> Captured:
        """The whole schedule at these inputs' sizes, recorded as one CUDA graph."""
        return Captured(self, inputs)
