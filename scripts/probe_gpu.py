"""Where the time goes, on the GPU: the pooling kernels against PyTorch, the phases of a cold
start (imports, context, plan restore sequential against threaded), the kernels of one
encoder layer in dslc and in PyTorch (CUPTI, through torch.profiler), and which forms of a
standalone pointwise graph with a broadcast operand get a cuDNN engine (and a matrix of
operand shapes, memory orders and dtypes, checked against numpy), and the depthwise convs of
the model families in dslc's kernel, in cuDNN and in PyTorch, and the split-key attention
kernel at several splits and cache lengths against PyTorch's attention, and the few-row matmul
kernel at every cut over a decoder's projections against cuBLAS, and ResNet's stem conv over 3
channels, padded to 4 and 8, and over its 2x2 space-to-depth. Diagnostics for the benchmarks in
docs/benchmarks.md, not a benchmark itself.

    python scripts/probe_gpu.py --out DIR [--skip PARTS | --only PARTS]  (pool, cold, layer,
        broadcast, matrix, depthwise, attention, gemv, stem)
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))


def pool(out: Path) -> dict[str, Any]:
    import cupy
    import torch
    from bench_gpu import timed

    from dslc.backend import kernels

    rows: dict[str, Any] = {}
    for n, c, hw in ((256, 64, 112), (32, 64, 112), (8, 96, 57)):
        x = cupy.random.default_rng(0).standard_normal((n, hw, hw, c), dtype=cupy.float32)
        x = x.astype(cupy.float16).transpose(0, 3, 1, 2)
        ho = (hw + 2 - 3) // 2 + 1
        y = cupy.empty((n, ho, ho, c), dtype=cupy.float16).transpose(0, 3, 1, 2)
        attrs = {"window": [3, 3], "stride": [2, 2], "pad": [1, 1]}
        run = lambda x=x, y=y, attrs=attrs: kernels.maxpool([x], y, attrs)  # noqa: E731
        vec = timed(run, 30)
        got = cupy.asnumpy(y.astype(cupy.float32))
        original = kernels.vector_width
        kernels.vector_width = lambda *a: 1  # type: ignore[assignment]
        try:
            scalar = timed(run, 30)
        finally:
            kernels.vector_width = original
        tx = torch.as_tensor(x, device="cuda")
        want = torch.nn.functional.max_pool2d(tx, 3, 2, 1)
        tms = timed(lambda tx=tx: torch.nn.functional.max_pool2d(tx, 3, 2, 1), 30)
        err = float(abs(got - want.float().cpu().numpy()).max())
        key = f"maxpool n{n} c{c} {hw}x{hw}"
        rows[key] = {"vector_ms": vec, "scalar_ms": scalar, "torch_ms": tms, "max_abs_err": err,
                     "GBps_vector": (x.nbytes + y.nbytes) / vec / 1e6}
        print(key, rows[key], flush=True)
    return rows


def cold(out: Path) -> dict[str, Any]:
    """bench_tune's cold start on an untuned batch-1 bundle, then its parts: what importing
    CuPy costs, and the CUDA context, cuDNN and plan restores timed alone."""
    from bench_tune import cold_start

    res: dict[str, Any] = {}
    build = out / "r50"
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "dslc", "compile", str(ROOT / "models/resnet50.cgraph"),
                    "-o", str(build), "--bucket", "N=1", "--no-tune", "-q"], check=True)
    res["compile_s"] = time.perf_counter() - t
    bundle = build / "resnet50.bundle"
    subprocess.run([sys.executable, "-m", "dslc", "weights", "random",
                    str(ROOT / "models/resnet50.cgraph"), "-o",
                    str(bundle.with_suffix(".safetensors"))], check=True)
    res["runs"] = cold_start(bundle, math.nan, out)["runs"]  # no tuning here: no ratio
    proc = subprocess.run([sys.executable, "-X", "importtime", "-c", "import cupy"],
                          capture_output=True, text=True)
    lines = [ln for ln in proc.stderr.splitlines() if "|" in ln and "cumulative" not in ln]
    top = sorted(lines, key=lambda ln: -int(ln.split("|")[1]))[:12]
    res["cupy_import_top"] = top
    print("\n".join(top), flush=True)
    res["parts"] = []
    libs: list[str] = []
    for attempt in range(4):  # plain, then with the libraries preloaded in a thread
        cmd = [sys.executable, "-c", PARTS, str(bundle)] + (libs if attempt >= 2 else [])
        parts = subprocess.run(cmd, capture_output=True, text=True)
        print(parts.stdout[-3000:], parts.stderr[-2000:], flush=True)
        if parts.returncode == 0:
            row = json.loads(parts.stdout.strip().splitlines()[-1])
            libs = libs or [lib for lib in row.pop("libs") if "libcudnn" in lib]
            row.pop("libs", None)
            res["parts"].append(row)
    return res


PARTS = """
import json, sys, time, threading, ctypes
from concurrent.futures import ThreadPoolExecutor
T0 = time.perf_counter()
preload = sys.argv[2:]  # libraries to dlopen in a background thread (ctypes releases the GIL)
if preload:
    def load():
        for lib in preload:
            ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)
    worker = threading.Thread(target=load, daemon=True); worker.start()
t = time.perf_counter(); import cupy; r = {'import cupy': time.perf_counter() - t}
t = time.perf_counter(); cupy.cuda.runtime.free(0); r['context'] = time.perf_counter() - t
t = time.perf_counter(); import cudnn; r['import cudnn'] = time.perf_counter() - t
t = time.perf_counter(); h = cudnn.create_handle(); r['cudnn handle'] = time.perf_counter() - t
from dslc.runtime import Model
from dslc.backend import graphs
m = Model(sys.argv[1])
blobs = [g['plan']['serialized'] for b in m.payload['buckets'] for g in b['graphs'].values()]
if preload:
    t = time.perf_counter(); worker.join(); r['wait preload'] = time.perf_counter() - t
t = time.perf_counter(); graphs.restore(blobs[0], h); r['restore first'] = time.perf_counter() - t
t = time.perf_counter(); [graphs.restore(b, h) for b in blobs]
r['restore all after'] = time.perf_counter() - t
with ThreadPoolExecutor(8) as pool:
    t = time.perf_counter(); list(pool.map(lambda b: graphs.restore(b, h), blobs))
    r['restore 8 threads'] = time.perf_counter() - t
r['plans'] = len(blobs)
r['total'] = time.perf_counter() - T0
libs = sorted({ln.split()[-1] for ln in open('/proc/self/maps')
               if any(k in ln for k in ('libcudnn', 'libcublas', 'libnvrtc'))})
r['libs'] = libs
print(json.dumps(r))
"""


def kernels(fn: Any, calls: int = 20) -> list[tuple[float, int, str]]:
    """(microseconds per call, launches per call, name) of every device activity of `fn()`
    (`dslc.backend.torch_side.kernels`, which `dslc bench --kernels` lists)."""
    from dslc.backend.torch_side import kernels as listed

    return [(r["us"], round(r["launches"]), r["name"][:90]) for r in listed(fn, calls)]


def layer(out: Path) -> dict[str, Any]:
    """The encoder layer, tuned as scripts/bench_tune.py tunes it, replayed as CUDA graphs:
    what runs on the GPU per call, for dslc and for PyTorch, against the replay time."""
    import torch
    from bench_gpu import timed, torch_cuda_graph
    from bench_tune import layer_source
    from safetensors.numpy import load_file

    from dslc.runtime import Model
    from tests.torch_models import Encoder

    src = out / "layer" / "encoder_layer.cgraph"
    src.parent.mkdir(parents=True, exist_ok=True)
    src.write_text(layer_source())
    subprocess.run([sys.executable, "-m", "dslc", "compile", str(src), "-o", str(src.parent),
                    "--no-tune", "-q"], check=True)
    bundle = src.parent / "vit_b_encoder.bundle"
    weights = bundle.with_suffix(".safetensors")
    subprocess.run([sys.executable, "-m", "dslc", "weights", "random", str(src), "-o",
                    str(weights)], check=True)
    subprocess.run([sys.executable, "-m", "dslc", "tune", str(bundle), "--budget", "3",
                    "--tuning-db", "none", "-q"], check=True)
    torch.manual_seed(0)
    x = torch.randn(8, 512, 1024, device="cuda").to(torch.bfloat16)
    net = Encoder(d=1024, heads=16, layers=1)
    net.load_state_dict({k: torch.from_numpy(v.astype("float32"))
                         for k, v in load_file(str(weights)).items()})
    net = net.eval().cuda().to(torch.bfloat16)
    model = Model(bundle, weights)
    captured = model.capture({"tokens": x})
    res: dict[str, Any] = {}
    with torch.no_grad():
        replay = torch_cuda_graph(net, x)
        for name, fn in (("dslc graph", lambda: captured({"tokens": x})),
                         ("torch graph", replay),
                         ("dslc eager", lambda: model.run({"tokens": x}))):
            rows = kernels(fn)
            ms = timed(fn, 50)
            res[name] = {"ms": ms, "kernel_us": sum(r[0] for r in rows), "rows": rows}
            print(f"-- {name}: {ms * 1e3:.1f} us per call, {sum(r[0] for r in rows):.1f} us of "
                  f"device work in {sum(r[1] for r in rows)} launches")
            for us, count, key in rows:
                print(f"{us:9.1f} us x{count:<3} {key}")
    return res


# Standalone pointwise ops whose operand broadcasts, as the family models have them (the rotary
# table over the heads, position embeddings over the batch, squeeze-excite's scale over the
# pixels, a mask over the queries): on the H200 their graphs got "No valid engine configs".
BROADCASTS = {
    "rotary": "model m {\n  precision io=bf16\n  input x: [1, 32, 1, 64]\n"
              "  input cos: [1, 64]\n  output y = x * cos\n}\n",
    "position": "model m {\n  precision io=bf16\n  input x: [8, 197, 768]\n"
                "  input pos: [1, 197, 768]\n  output y = x + pos\n}\n",
    "excite": "model m {\n  precision io=f16\n  layout NHWC\n  input x: [32, 672, 14, 14]\n"
              "  input s: [32, 672, 1, 1]\n  output y = x * s\n}\n",
    "mask": "model m {\n  input m: [8, 1, 1, 128]\n  output y = (1.0 - m) * -10000.0\n}\n",
}


def broadcast(out: Path) -> dict[str, Any]:
    """Each case's cuDNN graph as dslc makes it, and with each broadcast operand given the
    result's dims and stride 0 on the broadcast axes: whether cuDNN offers an engine."""
    import dataclasses
    import tempfile

    import cudnn

    from dslc.backend import graphs
    from dslc.backend.spec import group_spec
    from dslc.backend.target import live_device_available, load_target
    from dslc.diag.diagnostic import Sink
    from dslc.pipeline import Options, front_end, lower_and_fuse

    # no GPU: the graphs still build deviceless (the H200 profile), with no engine to offer
    target = load_target("device" if live_device_available() else "h200")
    handle = cudnn.create_handle() if target.live else None
    properties = None if target.live else target.properties()
    rows: dict[str, Any] = {}
    for name, text in BROADCASTS.items():
        path = Path(tempfile.mkdtemp()) / f"{name}.cgraph"
        path.write_text(text)
        model = front_end(path, Options(), Sink()).model
        assert model is not None, name
        _, plan = lower_and_fuse(model)
        [group] = [g for g in plan.groups if g.nodes]  # one op: one graph
        spec = group_spec(plan.graph, group, {}, model.env, plan.placement)
        result = next(t for t in spec.tensors if t.role == "output")
        full = tuple(dataclasses.replace(
            t, dims=result.dims, strides=tuple(0 if d == 1 and n > 1 else s for d, n, s in
                                               zip(t.dims, result.dims, t.strides, strict=True)))
            if t.role == "input" and t.dims != result.dims else t for t in spec.tensors)
        # and with the operand as if it were full (its own packed strides at the result's dims):
        # whether the broadcast itself is what cuDNN has no engine for
        packed = tuple(dataclasses.replace(t, dims=result.dims, strides=result.strides)
                       if t.role == "input" and t.dims != result.dims else t for t in spec.tensors)
        for form, variant in (("as made", spec),
                              ("stride 0", dataclasses.replace(spec, tensors=full)),
                              ("no bcast", dataclasses.replace(spec, tensors=packed))):
            built = graphs.build(variant, handle, properties, as_given=True)
            rows[f"{name} {form}"] = {"candidates": built.candidates,
                                      "engine": built.engine_id, "note": built.note}
            print(f"{name:9s} {form:9s} candidates {built.candidates}, engine "
                  f"{built.engine_id}: {built.note[:120]}", flush=True)
    return rows


# Standalone `x * b` over x [8, 64, 16, 16]: which operand shapes (b broadcasting over the
# axes marked 1), memory orders and dtypes get a cuDNN engine, and whether it computes right.
_SHAPES = {"full": (8, 64, 16, 16), "c": (1, 64, 1, 1), "nc": (8, 64, 1, 1), "hw": (1, 1, 16, 16),
           "nhw": (8, 1, 16, 16), "chw": (1, 64, 16, 16), "n": (8, 1, 1, 1), "w": (1, 1, 1, 16),
           "one": (1, 1, 1, 1)}


def matrix(out: Path) -> dict[str, Any]:
    """Each form built as given (`as_given`: not renamed by `backend.channels_last`)."""
    import cudnn
    import cupy
    import numpy as np

    from dslc.backend import graphs
    from dslc.backend.channels_last import packed_strides as _packed
    from dslc.backend.spec import GroupSpec, OpSpec, TensorSpec

    handle = cudnn.create_handle()
    orders = {"nchw": (0, 1, 2, 3), "nhwc": (0, 2, 3, 1)}
    rows: dict[str, Any] = {}
    rng = np.random.default_rng(0)
    for dtype, npt in (("f16", np.float16), ("f32", np.float32)):
        for layout, order in orders.items():
            y_dims = _SHAPES["full"]
            for shape_name, b_dims in _SHAPES.items():
                forms = {"packed": _packed(b_dims, order)}
                if shape_name != "full":
                    forms["stride0"] = tuple(0 if d == 1 else s for d, s in
                                             zip(b_dims, _packed(b_dims, order), strict=True))
                for form, b_strides in forms.items():
                    for first in (("x", "b"), ("b", "x")) if dtype == "f16" else (("x", "b"),):
                        bd = y_dims if form == "stride0" else b_dims
                        ys = _packed(y_dims, order)
                        tensors = (TensorSpec("x", 1, y_dims, ys, dtype, "input"),
                                   TensorSpec("b", 2, bd, b_strides, dtype, "input"),
                                   TensorSpec("y", 3, y_dims, ys, dtype, "output"))
                        spec = GroupSpec("probe", tensors, (OpSpec("y", "mul", first, {}, "f32"),),
                                         dtype, "f32", "f32")
                        key = f"{dtype} {layout} b={shape_name} {form} {first[0]}*{first[1]}"
                        try:
                            built = graphs.build(spec, handle, as_given=True)
                        except graphs.GraphError as err:
                            rows[key] = {"error": str(err)[:100]}
                            print(f"{key:34s} rejected: {str(err)[:90]}", flush=True)
                            continue
                        row: dict[str, Any] = {"candidates": built.candidates,
                                               "engine": built.engine_id}
                        if built.has_plan:
                            x = rng.standard_normal(y_dims).astype(npt)
                            b = rng.standard_normal(b_dims).astype(npt)
                            # memory as the strides say: x in its order, b packed or its own
                            xm = cupy.asarray(np.ascontiguousarray(x.transpose(order)))
                            bm = cupy.asarray(np.ascontiguousarray(b.transpose(order)))
                            ym = cupy.zeros(xm.shape, dtype=npt)
                            ws = cupy.empty(max(built.workspace, 1), dtype=cupy.uint8)
                            built.graph.execute({1: xm.data.ptr, 2: bm.data.ptr, 3: ym.data.ptr},
                                                ws.data.ptr, handle=handle)
                            cupy.cuda.Device().synchronize()
                            got = cupy.asnumpy(ym).transpose(np.argsort(order))
                            want = (x.astype(np.float32) * b.astype(np.float32))
                            row["error"] = float(np.abs(got - want).max() / np.abs(want).max())
                        rows[key] = row
                        print(f"{key:34s} candidates {built.candidates:2d} engine "
                              f"{built.engine_id} error {row.get('error', '-')}", flush=True)
    return rows


# Depthwise convs of the model families (N, C, H, k, stride), f16 channels-last.
_DEPTHWISE = [(32, 96, 56, 7, 1), (32, 192, 28, 7, 1), (32, 384, 14, 7, 1), (32, 768, 7, 7, 1),
              (32, 480, 14, 3, 1), (32, 672, 14, 5, 1), (32, 144, 56, 3, 1), (32, 96, 112, 3, 2),
              (256, 144, 56, 3, 1), (1, 96, 56, 7, 1)]


def depthwise(out: Path) -> dict[str, Any]:
    """Each depthwise conv three ways: dslc's kernel (backend/depthwise.py), cuDNN's graph as
    dslc builds it, alone and with its bias in the same graph (each plan of the heuristics'
    list), and PyTorch's conv2d (groups=C, channels-last); the kernel checked against PyTorch."""
    import cudnn
    import cupy
    import torch
    from bench_gpu import timed

    from dslc.backend import kernels

    handle = cudnn.create_handle()
    rows: dict[str, Any] = {}
    for n, c, h, k, stride in _DEPTHWISE:
        pad = k // 2
        ho = (h + 2 * pad - k) // stride + 1
        x = torch.randn(n, c, h, h, device="cuda").half().contiguous(memory_format=torch.channels_last)
        f = (torch.randn(c, 1, k, k, device="cuda") / k).half().contiguous(
            memory_format=torch.channels_last)
        y = torch.empty(n, c, ho, ho, device="cuda").half().contiguous(
            memory_format=torch.channels_last)
        attrs = {"stride": [stride] * 2, "pre_pad": [pad] * 2, "post_pad": [pad] * 2,
                 "dilation": [1, 1], "groups": c}
        xs, ys = [cupy.asarray(x), cupy.asarray(f)], cupy.asarray(y)
        kernel_ms = timed(lambda xs=xs, ys=ys, attrs=attrs: kernels.run_kernel("conv", xs, ys,
                                                                               attrs), 30)
        want = torch.nn.functional.conv2d(x, f, stride=stride, padding=pad, groups=c)
        err = float((y.float() - want.float()).abs().max() / want.float().abs().max())
        torch_ms = timed(lambda x=x, f=f, stride=stride, pad=pad, c=c: torch.nn.functional.conv2d(
            x, f, stride=stride, padding=pad, groups=c), 30)
        b = torch.randn(1, c, 1, 1, device="cuda").half()
        z = torch.empty_like(y)
        conv_ms = _cudnn_ms(handle, n, c, h, k, ho, attrs, {1: x.data_ptr(), 2: f.data_ptr(),
                                                             3: y.data_ptr()}, bias=False)
        fused_ms = _cudnn_ms(handle, n, c, h, k, ho, attrs, {1: x.data_ptr(), 2: f.data_ptr(),
                                                              4: b.data_ptr(), 5: z.data_ptr()},
                             bias=True)
        key = f"n{n} c{c} {h}x{h} k{k} s{stride}"
        rows[key] = {"kernel_ms": kernel_ms, "torch_ms": torch_ms, "error": err,
                     "cudnn_conv": conv_ms, "cudnn_conv_bias": fused_ms,
                     "GBps_kernel": (x.numel() + y.numel()) * 2 / kernel_ms / 1e6}
        print(f"{key:24s} kernel {kernel_ms:.4f} ({rows[key]['GBps_kernel']:.0f} GB/s, err "
              f"{err:.1e}); cuDNN conv {_plans(conv_ms)}, conv+bias {_plans(fused_ms)}; torch "
              f"{torch_ms:.4f}", flush=True)
    return rows


def _plans(times: list[float]) -> str:
    """The heuristics' first plan's time, and the fastest of them."""
    return f"{times[0]:.4f} (best {min(times):.4f} of {len(times)})" if times else "-"


def _cudnn_ms(handle: Any, n: int, c: int, h: int, k: int, ho: int, attrs: dict[str, Any],
              pack: dict[int, int], bias: bool) -> list[float]:
    """Milliseconds of each of cuDNN's plans (the heuristics' order) for the f16 channels-last
    depthwise conv as dslc builds it, alone or with a per-channel bias in the same graph."""
    return _conv_plans_ms(handle, (n, c, h, h), (c, 1, k, k), (n, c, ho, ho), attrs, pack,
                          ("add",) if bias else ())


def _conv_plans_ms(handle: Any, x_dims: tuple[int, ...], w_dims: tuple[int, ...],
                   y_dims: tuple[int, ...], attrs: dict[str, Any], pack: dict[int, int],
                   epilogue: tuple[str, ...]) -> list[float]:
    """Milliseconds of each of cuDNN's plans (the heuristics' order) for an f16 channels-last
    conv as dslc builds it (x uid 1, w 2, y 3), then an epilogue in the same graph: "add" a
    per-channel bias (uid 4), "relu"; the last value (uid 5 where there is an epilogue) is the
    output."""
    from bench_gpu import timed

    from dslc.backend import graphs
    from dslc.backend.channels_last import packed_strides
    from dslc.backend.spec import GroupSpec, OpSpec, TensorSpec

    nhwc = (0, 2, 3, 1)

    def t(name: str, uid: int, dims: tuple[int, ...], role: str) -> TensorSpec:
        # virtual values in f32, as dslc's groups keep them (cuDNN's fused conv engines take
        # no f16 intermediate: with one, the heuristics offered 4 slow plans for the stem)
        return TensorSpec(name, uid, dims, packed_strides(dims, nhwc),
                          "f32" if role == "virtual" else "f16", role)

    tensors = [t("x", 1, x_dims, "input"), t("w", 2, w_dims, "input"),
               t("y", 3, y_dims, "virtual" if epilogue else "output")]
    ops = [OpSpec("y", "conv", ("x", "w"), attrs, "f32")]
    last = "y"
    for i, op in enumerate(epilogue):
        name = f"e{i}"
        if op == "add":
            tensors.append(t("b", 4, (1, y_dims[1], 1, 1), "input"))
            ops.append(OpSpec(name, "add", (last, "b"), {}, "f32"))
        else:
            ops.append(OpSpec(name, op, (last,), {}, "f32"))
        final = i == len(epilogue) - 1
        tensors.append(t(name, 5 if final else 10 + i, y_dims, "output" if final else "virtual"))
        last = name
    spec = GroupSpec("probe", tuple(tensors), tuple(ops), "f16", "f32", "f32")
    times: list[float] = []
    try:
        import cupy

        g = graphs.make_graph(spec, handle, None, None, True)
        g.create_execution_plans(graphs.HEURISTICS)
        for i in range(g.get_execution_plan_count()):
            try:
                g.build_plan_at_index(i)
            except Exception:
                continue
            ws = cupy.empty(max(1, int(g.get_workspace_size())), dtype=cupy.uint8)
            times.append(timed(lambda g=g, ws=ws, i=i: g.execute_plan_at_index(
                pack, ws.data.ptr, i, handle=handle), 20))
    except Exception as err:
        print("cuDNN:", str(err)[:160], flush=True)
    return times


def stem(out: Path) -> dict[str, Any]:
    """ResNet's stem conv (7x7, stride 2, pad 3, 64 filters over 224x224, f16 channels-last)
    with its bias and relu, as cuDNN runs it with the image's 3 channels and with the channels
    padded with zeros to 4 and 8 (the weights padded at load time, the image copied into a
    wider buffer: the copy is timed too); PyTorch's conv2d + relu beside it."""
    import cudnn
    import torch
    from bench_gpu import timed

    handle = cudnn.create_handle()
    rows: dict[str, Any] = {}
    attrs = {"stride": [2, 2], "pre_pad": [3, 3], "post_pad": [3, 3], "dilation": [1, 1],
             "groups": 1}
    cl = torch.channels_last
    for n in (32, 256):
        image = torch.randn(n, 3, 224, 224, device="cuda").half().contiguous(memory_format=cl)
        w3 = (torch.randn(64, 3, 7, 7, device="cuda") / 12).half()
        b = torch.randn(1, 64, 1, 1, device="cuda").half()
        want = torch.relu(torch.nn.functional.conv2d(image, w3, stride=2, padding=3) + b)
        torch_ms = timed(lambda image=image, w3=w3: torch.relu(torch.nn.functional.conv2d(
            image.contiguous(memory_format=cl), w3.contiguous(memory_format=cl), stride=2,
            padding=3)), 20)
        print(f"N={n} torch conv+relu {torch_ms:.4f}", flush=True)
        for c in (3, 4, 8):
            x = torch.zeros(n, c, 224, 224, device="cuda").half().contiguous(memory_format=cl)
            x[:, :3] = image
            w = torch.zeros(64, c, 7, 7, device="cuda").half()
            w[:, :3] = w3
            w = w.contiguous(memory_format=cl)
            y = torch.empty(n, 64, 112, 112, device="cuda").half().contiguous(memory_format=cl)
            pack = {1: x.data_ptr(), 2: w.data_ptr(), 4: b.data_ptr(), 5: y.data_ptr()}
            plans = _conv_plans_ms(handle, (n, c, 224, 224), (64, c, 7, 7), (n, 64, 112, 112),
                                   attrs, pack, ("add", "relu"))
            err = float((y.float() - want.float()).abs().max() / want.float().abs().max())
            copy_ms = timed(lambda x=x, image=image: x[:, :3].copy_(image), 20) if c > 3 else 0.0
            rows[f"N={n} C={c}"] = {"plans_ms": plans, "copy_ms": copy_ms, "error": err,
                                    "torch_ms": torch_ms}
            print(f"N={n} C={c}: cuDNN {_plans(plans)}; pad copy {copy_ms:.4f}; error of the "
                  f"last plan {err:.1e}", flush=True)
        for group in (3, 4):
            rows[f"N={n} s2d{4 * group}"] = _stem_s2d(handle, image, w3, b, want, group)
    return rows


def _stem_s2d(handle: Any, image: Any, w3: Any, b: Any, want: Any, group: int) -> dict[str, Any]:
    """The stem as a 4x4 stride-1 conv over the image's 2x2 space-to-depth: the padded image's
    pixel (2i + p, 2j + q, c) becomes channel (2p + q) * group + c of pixel (i, j), the 7x7
    kernel padded to 8x8 with zeros splits the same way (tap (2a + p, 2b + q) at (a, b)), so
    [N, 115, 115, 4 * group] in, [N, 112, 112, 64] out. group 4 pads each pixel's 3 channels to
    4 (16 in all, cuDNN's tensor-core multiple). The rearranging copy is timed in PyTorch (four
    strided copies into a zeroed buffer: not a kernel's best)."""
    import torch
    from bench_gpu import timed

    n, cl = image.shape[0], torch.channels_last
    c = 4 * group
    nhwc = image.permute(0, 2, 3, 1)  # a view: the image is channels-last in memory
    s = torch.zeros(n, 115, 115, 2, 2, group, device="cuda", dtype=torch.half)

    def rearrange() -> None:
        # padded row 2i + p is image row 2i + p - 3: p = 1 takes even rows from i = 1, p = 0
        # odd rows from i = 2 (and the same for columns)
        for p in (0, 1):
            for q in (0, 1):
                i0, j0 = 2 - p, 2 - q
                s[:, i0:i0 + 112, j0:j0 + 112, p, q, :3] = nhwc[:, 1 - p::2, 1 - q::2, :]

    rearrange()
    x = s.view(n, 115, 115, c).permute(0, 3, 1, 2)  # NCHW dims over channels-last memory
    w8 = torch.zeros(64, 3, 8, 8, device="cuda", dtype=torch.half)
    w8[:, :, :7, :7] = w3
    w = torch.zeros(64, 4, 4, 2, 2, group, device="cuda", dtype=torch.half)  # k, a, b, p, q, c
    w[..., :3] = w8.view(64, 3, 4, 2, 4, 2).permute(0, 2, 4, 3, 5, 1)
    w = w.view(64, 4, 4, c).permute(0, 3, 1, 2)  # NCHW dims over channels-last memory
    y = torch.empty(n, 64, 112, 112, device="cuda").half().contiguous(memory_format=cl)
    pack = {1: x.data_ptr(), 2: w.data_ptr(), 4: b.data_ptr(), 5: y.data_ptr()}
    attrs = {"stride": [1, 1], "pre_pad": [0, 0], "post_pad": [0, 0], "dilation": [1, 1],
             "groups": 1}
    plans = _conv_plans_ms(handle, (n, c, 115, 115), (64, c, 4, 4), (n, 64, 112, 112), attrs,
                           pack, ("add", "relu"))
    err = float((y.float() - want.float()).abs().max() / want.float().abs().max())
    copy_ms = timed(rearrange, 20)
    print(f"N={n} space-to-depth, {c} channels: cuDNN {_plans(plans)}; rearranging copy "
          f"{copy_ms:.4f}; error of the last plan {err:.1e}", flush=True)
    return {"plans_ms": plans, "copy_ms": copy_ms, "error": err}


def attention(out: Path) -> dict[str, Any]:
    """The split-key attention kernel (backend/attention.py) alone, one query of 32 heads over
    8 KV heads of 64 dims (f16, the cache's valid rows 3 short of its length), at several
    splits and cache lengths, against PyTorch's attention over the valid rows (cuDNN): kernel
    microseconds per call (CUPTI), and the kernel checked against PyTorch."""
    rows: dict[str, Any] = {}
    for keys in (64, 256, 1024, 4096):
        rows.update(_attention_at(keys))
    return rows


def _attention_at(keys: int) -> dict[str, Any]:
    import cupy
    import numpy as np
    import torch
    import torch.nn.functional as F

    from dslc.backend import attention as kernel

    g = cupy.random.default_rng(keys)
    q = g.standard_normal((1, 1, 32, 64), dtype=cupy.float32).astype(cupy.float16)
    q = q.transpose(0, 2, 1, 3)  # stored BSHD, as a decoder's
    k, v = (g.standard_normal((1, 8, keys, 64), dtype=cupy.float32).astype(cupy.float16)
            for _ in range(2))
    lens = cupy.asarray(np.array([keys - 3], np.int32))
    y = cupy.empty((1, 1, 32, 64), cupy.float16).transpose(0, 2, 1, 3)
    a = {"operands": ("q", "k", "v", "kv_len"), "scale": None, "causal": True,
         "align": "bottom_right", "window": None}
    chosen = kernel.splits
    rows: dict[str, Any] = {}
    try:
        for n in (4, 8, 16, 32):
            kernel.splits = lambda _rows, _keys, n=n: n  # type: ignore[assignment]
            us = kernels(lambda: kernel.attend([q, k, v, lens], y, a), 50)[0][0]
            rows[f"keys {keys} splits {n}"] = us
            print(f"keys {keys}, splits {n}: {us:.2f} us", flush=True)
    finally:
        kernel.splits = chosen
    tq, tk, tv = (torch.as_tensor(t, device="cuda") for t in (q, k, v))

    def reference() -> Any:
        return F.scaled_dot_product_attention(tq, tk[:, :, :keys - 3], tv[:, :, :keys - 3],
                                              enable_gqa=True)

    kernel.attend([q, k, v, lens], y, a)
    want = reference().float()
    err = float((torch.as_tensor(y, device="cuda").float() - want).abs().max()
                / want.abs().max())
    torch_us = sum(us for us, _, _ in kernels(reference, 50))
    rows[f"keys {keys} torch"] = torch_us
    rows[f"keys {keys} error"] = err
    print(f"keys {keys}: splits chosen {chosen(8, keys)}; PyTorch {torch_us:.2f} us; "
          f"relative error {err:.2e}", flush=True)
    return rows


GEMV_SHAPES = {  # (N, K) of a 1B Llama decoder's projections (d 2048, GQA 32/8, SwiGLU 5632)
    "qkv packed": (3072, 2048), "o_proj": (2048, 2048), "up": (5632, 2048),
    "gate+up packed": (11264, 2048), "down": (2048, 5632), "lm_head": (32000, 2048)}


def gemv(out: Path) -> dict[str, Any]:
    """The few-row matmul kernel (backend/gemv.py) at every cut (`gemv.Shape`) over a decoder's
    projection sizes, its weight read cold (copies over four times the L2, one a call), against
    cuBLAS (CuPy's matmul) and the current `shape_for` choice: microseconds a call (the GPU's
    time, `timing.gpu_ms`, median of 40), the read's TB/s, and the error against numpy."""
    import itertools

    from dslc.backend import gemv as kernel

    cuts = [kernel.Shape(c, w, s, u) for c, w, s, u in itertools.product(
        (1, 2, 4, 8), (4, 8), (1, 2, 4, 8), (1, 2, 4)) if s <= w]
    return {f"{name} rows {m}": _gemv_at(n, k, m, cuts, name)
            for (name, (n, k)), m in itertools.product(GEMV_SHAPES.items(), (1, 4))}


def _gemv_at(n: int, k: int, m: int, cuts: list[Any], name: str) -> dict[str, Any]:
    import itertools

    import cupy
    import numpy as np

    from dslc.backend import gemv as kernel
    from dslc.backend.timing import gpu_ms

    rng = np.random.default_rng(n + k + m)
    copies = max(2, math.ceil(200e6 / (n * k * 2)))
    ws = [cupy.asarray(rng.standard_normal((n, k), dtype=np.float32).astype(np.float16))
          for _ in range(copies)]
    x = cupy.asarray(rng.standard_normal((m, k), dtype=np.float32).astype(np.float16))
    y = cupy.empty((m, n), cupy.float16)
    want = cupy.asnumpy(x).astype(np.float64) @ cupy.asnumpy(ws[0]).astype(np.float64).T
    g = kernel.alone("x", "w", "f16")
    turn = itertools.count()

    def timed(call: Any) -> float:
        return float(np.median(gpu_ms(cupy, lambda: call(ws[next(turn) % copies]),
                                      lambda: None, 40))) * 1e3

    def tbps(us: float) -> float:
        return n * k * 2 / us / 1e6

    row: dict[str, Any] = {"cublas_us": timed(lambda w: cupy.matmul(x, w.T))}
    for cut in [None, *cuts]:
        if cut is not None and m * cut.columns > 32:
            continue
        kernel.run(g, [x, ws[0].T], [y], cut)
        err = float(np.abs(cupy.asnumpy(y) - want).max() / np.abs(want).max())
        label = "chosen" if cut is None else (
            f"c{cut.columns} w{cut.warps} s{cut.split} u{cut.unroll}")
        row[label] = timed(lambda w, cut=cut: kernel.run(g, [x, w.T], [y], cut))
        assert err < 2e-3, (name, m, label, err)
    top = sorted((v, c) for c, v in row.items() if c[0] == "c" and c[1].isdigit())
    print(f"{name} N{n} K{k} rows {m}: cuBLAS {row['cublas_us']:.2f} us "
          f"({tbps(row['cublas_us']):.2f} TB/s), chosen {row['chosen']:.2f} "
          f"({tbps(row['chosen']):.2f}), best {top[0][1]} {top[0][0]:.2f} "
          f"({tbps(top[0][0]):.2f})", flush=True)
    print("   fastest:", ", ".join(f"{c} {v:.2f}" for v, c in top[:8]), flush=True)
    ws.clear()
    cupy.get_default_memory_pool().free_all_blocks()
    return row


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=Path("gpu-out"))
    parser.add_argument("--skip", default="")
    parser.add_argument("--only", default="", help="these parts alone (comma-separated)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {}
    for name, fn in (("pool", pool), ("cold", cold), ("layer", layer), ("broadcast", broadcast),
                     ("matrix", matrix), ("depthwise", depthwise), ("attention", attention),
                     ("gemv", gemv), ("stem", stem)):
        if name in args.skip.split(",") or (args.only and name not in args.only.split(",")):
            continue
        print(f"== {name}", flush=True)
        try:
            results[name] = fn(args.out)
        except Exception as err:  # one part failing must not hide the others
            import traceback

            traceback.print_exc()
            results[name] = {"error": repr(err)}
    (args.out / "probe.json").write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
