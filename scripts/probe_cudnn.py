"""What cuDNN does where its documentation leaves it open, asked of the GPU directly: findings of
generated programs are bisected here before a rule goes into the compiler (docs/DESIGN.md, "What
cuDNN needs of the memory it reads"). Diagnostics, not tests: each part prints what it saw.

    python scripts/probe_cudnn.py [--parts arena,bool,sdpa] [--jobs 8]

- arena: generated programs run with the runtime's arena and outputs filled with zeros, then
  with a poison byte: a kernel that adds into memory it should overwrite (an accumulating
  reduction) passes the first and fails the second.
- bool: what a stored `bool` tensor holds byte by byte (a byte per element, or bits packed),
  and a mask copied into another memory order.
- sdpa: cuDNN's attention against the reference over sequence lengths, windows, causal masks,
  heads, head sizes and biases; the configurations it computes wrongly.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

POISON = 0x47  # as f32 bytes 0x47474747, about 5.1e4; as f16 about 7.3


def _fill_arena(byte: int) -> None:
    """Every Executable's arena starts filled with `byte`, every output buffer too."""
    from dslc.backend import device
    from dslc.ir.interp import ITEMSIZE
    from dslc.runtime import model

    init = model.Executable.__init__
    empty = device.empty

    def patched(self: Any, *a: Any, **k: Any) -> None:
        init(self, *a, **k)
        self.arena.fill(byte)

    def filled(shape: tuple[int, ...], strides: tuple[int, ...], dtype: str, kind: str) -> Any:
        import cupy

        ref = empty(shape, strides, dtype, kind)
        span = 1 + sum((d - 1) * s for d, s in zip(shape, strides, strict=True))
        cupy.cuda.runtime.memset(ref.ptr, byte, span * ITEMSIZE[dtype])
        return ref

    model.Executable.__init__ = patched  # type: ignore[method-assign]
    device.empty = filled  # type: ignore[assignment]


def _program(task: tuple[int, int, int | None]) -> str:
    seed, index, byte = task
    from dslc.fuzz import gpu
    from dslc.fuzz.choices import Choices
    from dslc.fuzz.generate import generate

    if byte is not None:
        _fill_arena(byte)
    prog = generate(Choices(seed * 1_000_000 + index))
    outcome = gpu.run(prog, seed * 1_000_000 + index, localize=False)
    what = "zeros" if byte == 0 else "poison" if byte is not None else "as is"
    return f"seed {seed} program {index} ({what}): {outcome.status} {outcome.detail[:160]}"


def arena(jobs: int, programs: list[tuple[int, int]]) -> None:
    tasks = [(s, i, b) for s, i in programs for b in (None, 0, POISON)]
    with ProcessPoolExecutor(jobs, mp_context=get_context("spawn"), max_tasks_per_child=1) as pool:
        for line in pool.map(_program, tasks):
            print(line, flush=True)


def _case(source: str) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """The model compiled for this GPU, random inputs on the device, the reference's outputs."""
    from dslc.runtime import Model
    from tests.gpu.common import compile_source, random_inputs, reference, to_device

    bundle = compile_source(source, Path(tempfile.mkdtemp(prefix="probe-")))
    xs = random_inputs(bundle, seed=3)
    model = Model(bundle, bundle.with_suffix(".safetensors"), plan_cache=None)
    return model, to_device(xs, bundle), reference(bundle, xs)


def boolean() -> None:
    import numpy as np

    from tests.gpu.common import rel_error, to_host

    src = """model m {
  input a: [2, 8, 11, 6] @NHWC
  input b: [2, 8, 11, 6]
  let s = select(a > (-0.25), a, b)
  output o = s * 2.0
}"""
    model, dev, want = _case(src)
    exe = model.prepare()
    exe.arena.fill(0xAA)
    got = to_host(model.run(dev))
    off = exe.memory.offsets["s.cmp_gt"]
    raw = model.cupy.asnumpy(exe.arena[off:off + 2 * 8 * 11 * 6])
    print(f"bool stored by cmp_gt: {int(np.isin(raw, (0, 1)).sum())} of {raw.size} bytes are 0/1, "
          f"{int((raw == 0xAA).sum())} untouched; values seen {sorted(set(raw.tolist()))[:8]}; "
          f"select error {rel_error(got['o'], want['o']):.2e}")
    for name, src in {
        "mask copied NHWC -> NCHW": """model m {
  input a: [2, 8, 11, 6] @NHWC
  input b: [2, 8, 11, 6]
  output o = select(a > (-0.25), a, b)
}""",
        "bool input read by select": """model m {
  input m: bool[2, 8, 11, 6]
  input b: [2, 8, 11, 6]
  output o = select(m, b, b * 2.0)
}""",
        "mask of a fallback kernel's result read by select": """model m {
  input a: [2, 8, 11, 6]
  let p = maxpool(a, window=1)
  output o = select(p > 0.0, a, 2.0)
}""",
        "view of a mask read by select": """model m {
  input a: [2, 8, 11, 6]
  input b: [2, 11, 8, 6]
  output o = select(transpose(a > 0.0, [0, 2, 1, 3]), b, 1.5)
}""",
        "mask output as f32": """model m {
  input a: [2, 8, 11, 6]
  input b: [2, 8, 11, 6]
  output o = a > b
}""",
    }.items():
        model, dev, want = _case(src)
        got = to_host(model.run(dev))
        print(f"{name}: error {rel_error(got['o'], want['o']):.2e}", flush=True)


def _spec(ops: list[tuple[str, str, tuple[str, ...]]], dtypes: dict[str, str],
          outputs: set[str]) -> Any:
    """A hand-made GroupSpec over [2, 8, 11, 6] row-major tensors; `s` (-0.25) and `z` (0) are
    [1, 1, 1, 1] tensors, as dslc gives a comparison its scalar operand."""
    from dslc.backend.spec import GroupSpec, OpSpec, TensorSpec

    dims, strides = (2, 8, 11, 6), (528, 66, 6, 1)
    made = {node for node, _, _ in ops}
    names = [n for _, _, ins in ops for n in ins if n not in made]
    tensors = []
    for name in dict.fromkeys(names):
        if name in ("s", "z"):
            tensors.append(TensorSpec(name, len(tensors) + 1, (1, 1, 1, 1), (1, 1, 1, 1), "f32",
                                      "input"))
        else:
            tensors.append(TensorSpec(name, len(tensors) + 1, dims, strides, dtypes[name], "input"))
    for node, _, _ in ops:
        tensors.append(TensorSpec(node, len(tensors) + 1, dims, strides, dtypes[node],
                                  "output" if node in outputs else "virtual"))
    return GroupSpec("probe", tuple(tensors),
                     tuple(OpSpec(n, op, ins, {}, "f32") for n, op, ins in ops), "f32", "f32", "f32")


def masks() -> None:
    """How a mask can cross from one cuDNN graph to another: kept inside one graph, or stored
    as BOOLEAN, UINT8, INT8 or f32 (then compared with 0 by its reader), or given as bytes."""
    import cudnn
    import cupy
    import numpy as np

    from dslc.backend import graphs

    handle = cudnn.create_handle()
    g = np.random.default_rng(5)
    x = g.standard_normal((2, 8, 11, 6)).astype(np.float32)
    y = g.standard_normal((2, 8, 11, 6)).astype(np.float32)
    want = np.where(x > -0.25, x, y)
    dev = {"x": cupy.asarray(x), "y": cupy.asarray(y),
           "s": cupy.full(1, -0.25, dtype=cupy.float32), "z": cupy.zeros(1, dtype=cupy.float32)}

    def run(spec: Any) -> str:
        try:
            built = graphs.build(spec, handle)
        except graphs.GraphError as err:
            return f"rejected: {err}"
        if not built.has_plan:
            return f"no plan: {built.note}"
        ws = cupy.empty(max(built.workspace, 1), dtype=cupy.uint8)
        pack = {t.uid: int(dev[t.name].data.ptr) for t in spec.tensors
                if t.role in ("input", "output")}
        built.graph.execute(pack, int(ws.data.ptr), handle=handle)
        cupy.cuda.runtime.deviceSynchronize()
        return "ran"

    one = _spec([("m", "cmp_gt", ("x", "s")), ("o", "select", ("m", "x", "y"))],
                {"x": "f32", "y": "f32", "m": "bool", "o": "f32"}, {"o"})
    dev["o"] = cupy.full(x.shape, 7.0, dtype=cupy.float32)
    print(f"mask inside one graph: {run(one)}, error "
          f"{float(abs(cupy.asnumpy(dev['o']) - want).max()):.2e}", flush=True)
    for dtype in ("bool", "u8", "i8", "f32"):
        itemsize = 4 if dtype == "f32" else 1
        dev["m"] = cupy.full(x.size * itemsize, 0xAA, dtype=cupy.uint8)
        write = _spec([("m", "cmp_gt", ("x", "s"))], {"x": "f32", "m": dtype}, {"m"})
        said = run(write)
        raw = cupy.asnumpy(dev["m"]).view(np.float32 if dtype == "f32" else np.uint8)
        if dtype == "f32":
            read = _spec([("k", "cmp_ne", ("m", "z")), ("o", "select", ("k", "x", "y"))],
                         {"m": "f32", "x": "f32", "y": "f32", "k": "bool", "o": "f32"}, {"o"})
        else:
            read = _spec([("o", "select", ("m", "x", "y"))],
                         {"m": dtype, "x": "f32", "y": "f32", "o": "f32"}, {"o"})
        dev["o"] = cupy.full(x.shape, 7.0, dtype=cupy.float32)
        said2 = run(read)
        print(f"mask stored as {dtype}: write {said}, bytes as numpy's "
              f"{bool((raw.reshape(-1)[:x.size] == (x > -0.25).reshape(-1)).all())}; "
              f"read {said2}, error {float(abs(cupy.asnumpy(dev['o']) - want).max()):.2e}",
              flush=True)
    dev["m"] = cupy.asarray((x > -0.25).astype(np.uint8))
    read = _spec([("o", "select", ("m", "x", "y"))],
                 {"m": "bool", "x": "f32", "y": "f32", "o": "f32"}, {"o"})
    dev["o"] = cupy.full(x.shape, 7.0, dtype=cupy.float32)
    print(f"mask given as bytes, read as BOOLEAN: {run(read)}, error "
          f"{float(abs(cupy.asnumpy(dev['o']) - want).max()):.2e}", flush=True)
    for dtype in ("u8", "f32"):
        dev["m"] = cupy.asarray((x > -0.25).astype(np.uint8 if dtype == "u8" else np.float32))
        read = _spec([("k", "cmp_ne", ("m", "z")), ("o", "select", ("k", "x", "y"))],
                     {"m": dtype, "x": "f32", "y": "f32", "k": "bool", "o": "f32"}, {"o"})
        dev["o"] = cupy.full(x.shape, 7.0, dtype=cupy.float32)
        print(f"mask given as {dtype} bytes, compared with 0 inside the reader: {run(read)}, "
              f"error {float(abs(cupy.asnumpy(dev['o']) - want).max()):.2e}", flush=True)


def _sdpa_source(b: int, h: int, hk: int, s: int, d: int, dtype: str, causal: bool,
                 window: int | None, bias: str | None, layout: str) -> str:
    """q, k, v as [B, H, S, D] inputs, or as [B, S, H, D] inputs transposed (BSHD strides)."""
    extra = f", window={window}" if window else ""
    bias_line = f"  param bias: {bias}\n" if bias else ""
    extra += ", bias=bias" if bias else ""
    shape = (lambda n: f"[{b}, {n}, {s}, {d}]") if layout == "bhsd" else \
        (lambda n: f"[{b}, {s}, {n}, {d}]")
    read = (lambda v: v) if layout == "bhsd" else (lambda v: f"transpose({v}, [0, 2, 1, 3])")
    return f"""model m {{
  precision io={dtype}
  input q: {shape(h)}
  input k: {shape(hk)}
  input v: {shape(hk)}
{bias_line}  output o = sdpa({read("q")}, {read("k")}, {read("v")}, causal={str(causal).lower()}{extra})
}}"""


def _sdpa_one(cfg: tuple[Any, ...]) -> str:
    from tests.gpu.common import TOLERANCE, rel_error, to_host

    try:
        model, dev, want = _case(_sdpa_source(*cfg))
        err = rel_error(to_host(model.run(dev))["o"], want["o"])
        steps = [s.kind for s in model.program.steps]
        verdict = "WRONG" if err > TOLERANCE[cfg[5]] else "ok"
        return f"{verdict} {err:.2e} {steps} b{cfg[0]} h{cfg[1]}/{cfg[2]} s{cfg[3]} d{cfg[4]} " \
               f"{cfg[5]} causal={cfg[6]} window={cfg[7]} bias={cfg[8]} {cfg[9]}"
    except Exception as err:  # a probe reports, it does not stop
        return f"ERROR {type(err).__name__}: {str(err)[:200]} {cfg}"


def sdpa(jobs: int) -> None:
    cfgs = []
    for s, window, (h, hk), d, layout in itertools.product(
            (4, 6, 8, 16, 64), (None, 2, 4), ((1, 1), (2, 2), (4, 2)), (8, 16), ("bhsd", "bshd")):
        cfgs.append((1 if h == 1 else 2, h, hk, s, d, "bf16", True, window, None, layout))
    for s, (b, h), layout in itertools.product((6, 16, 64), ((1, 1), (2, 2)), ("bhsd", "bshd")):
        cfgs.append((b, h, h, s, 8, "bf16", False, None, f"[{b}, {h}, {s}, {s}]", layout))
    with ProcessPoolExecutor(jobs, mp_context=get_context("spawn")) as pool:
        lines = list(pool.map(_sdpa_one, cfgs))
    for line in sorted(lines):
        print(line)
    print(f"sdpa: {sum(x.startswith('WRONG') for x in lines)} wrong, "
          f"{sum(x.startswith('ERROR') for x in lines)} errors of {len(lines)}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--parts", default="arena,bool,mask,sdpa")
    p.add_argument("--jobs", type=int, default=8)
    p.add_argument("--programs", default="",
                   help="seed:index,... for the arena part (generated programs)")
    args = p.parse_args()
    parts = args.parts.split(",")
    if "bool" in parts:
        boolean()
    if "mask" in parts:
        masks()
    if "arena" in parts and args.programs:
        arena(args.jobs, [tuple(map(int, x.split(":"))) for x in args.programs.split(",")])
    if "sdpa" in parts:
        sdpa(args.jobs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
