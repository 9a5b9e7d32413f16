"""A Llama-style decoder at one token a step on this GPU (a GPU script, not a test): the layers of
models/llama_decode.cgraph (`decoder_step`, each declaring its own caches) stacked by `repeat` at
the sizes of a 1B model (d 2048, 32 query and 8 key/value heads of 64, SwiGLU 5632), a final
RMSNorm and a 32,000-token output projection; batch 1, a 1,024-position cache, bf16.

dslc (compiled and tuned for this GPU; the decoder's plain call and its captured CUDA graph)
against a PyTorch decode step written out here with a static cache (Hugging Face's Llama
arithmetic; the grouped query heads attend as the rows of their key/value head), recorded as a
CUDA graph, both fed the same weights: the logits of the first steps compared, then the median
per-token latency at one position, and the bound of reading every weight once per token at the
GPU's memory bandwidth.

    python scripts/bench_decode.py [--layers 16] [--position 1000] [--repeats 200] [--out F.json]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MAX, D, HEADS, KV_HEADS, HEAD_DIM, FFN, VOCAB, EPS, THETA = (1024, 2048, 32, 8, 64, 5632,
                                                             32000, 1e-5, 10000.0)
MODEL = """cgraph 0.1
import "std/nn.cgraph"                        # rms_norm
import "llama_layer.cgraph" as llama          # rotary_embedding, project
import "llama_decode.cgraph" as dec           # decoder_step

model llama_decode_bench {
  precision io=bf16, intermediate=f32, compute=f32
  dim B = 1
  dim S = 1
  dim MAX = @MAX
  dim D = @D
  dim HEADS = @HEADS
  dim KV_HEADS = @KV_HEADS
  dim HEAD_DIM = D / HEADS
  dim FFN = @FFN
  dim VOCAB = @VOCAB
  param lm_head.weight: [VOCAB, D]

  input hidden_states: [B, S, D]
  input position: i32[1]
  let positions  = arange(S, dtype=i32) + position
  let kv_len     = expand(positions[S - 1:S] + full([1], 1), [B])
  let (cos, sin) = llama.rotary_embedding(positions, head_dim=HEAD_DIM, theta=@THETA)
  let layers = repeat @LAYERS dec.decoder_step(hidden_states, cos, sin, position, kv_len,
                                    max_len=MAX, heads=HEADS, kv_heads=KV_HEADS,
                                    head_dim=HEAD_DIM, ffn=FFN, eps=@EPS)
      as "model.layers.{i}"
  let norm = rms_norm(layers, eps=@EPS) as "model.norm"
  output logits = llama.project(norm, lm_head.weight)
}
"""


def model_text(layers: int) -> str:
    text = MODEL
    for key, value in (("@LAYERS", layers), ("@MAX", MAX), ("@D", D), ("@HEADS", HEADS),
                       ("@KV_HEADS", KV_HEADS), ("@FFN", FFN), ("@VOCAB", VOCAB),
                       ("@THETA", THETA), ("@EPS", EPS)):
        text = text.replace(key, str(value))
    return text


def random_weights(bundle: Path, path: Path) -> dict[str, Any]:
    """Each param of the bundle, made on the GPU (1.1 billion values: numpy would take a
    minute): norms near 1, projections N(0, 0.02^2); saved for dslc, returned for PyTorch."""
    import torch
    from safetensors.torch import save_file

    from dslc.runtime.bundle import read
    from dslc.runtime.schedule import Schedule

    g = torch.Generator(device="cuda").manual_seed(0)
    out = {}
    for p in Schedule(read(bundle)).bundle.manifest.params:
        shape = tuple(d for d in p.shape if isinstance(d, int))
        assert len(shape) == len(p.shape), p.name  # params are static
        if len(shape) == 1:
            w = 1.0 + 0.05 * torch.randn(shape, generator=g, device="cuda")
        else:
            w = 0.02 * torch.randn(shape, generator=g, device="cuda")
        out[p.name] = w.to(torch.bfloat16)
    save_file({k: v.cpu() for k, v in out.items()}, str(path))
    return out


class TorchDecoder:
    """One token a step with static caches [1, KV_HEADS, MAX, HEAD_DIM] per layer: the new
    key and value written at `position` (index_copy_: capturable), attention over the cache
    with the positions past it masked. Query heads h*G..h*G+G-1 share key/value head h, so at
    one token they attend as G query rows of it (no copy of the cache per step)."""

    def __init__(self, w: dict[str, Any], layers: int, device: str = "cuda",
                 dtype: Any = None) -> None:
        import torch

        self.w, self.layers = w, layers
        self.dtype = dtype or torch.bfloat16
        cache = (1, KV_HEADS, MAX, HEAD_DIM)
        self.k = [torch.zeros(cache, dtype=self.dtype, device=device) for _ in range(layers)]
        self.v = [torch.zeros(cache, dtype=self.dtype, device=device) for _ in range(layers)]
        self.x = torch.zeros((1, 1, D), dtype=self.dtype, device=device)
        self.position = torch.zeros(1, dtype=torch.int32, device=device)
        self.keys = torch.arange(MAX, device=device)
        self.inv_freq = 1.0 / THETA ** (torch.arange(0, HEAD_DIM, 2, device=device).float()
                                        / HEAD_DIM)

    def _norm(self, x: Any, name: str) -> Any:
        import torch

        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS)
        return self.w[name] * h.to(self.dtype)

    @staticmethod
    def _rotate(x: Any, cos: Any, sin: Any) -> Any:
        import torch

        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rotated * sin

    def step(self) -> Any:
        import torch
        import torch.nn.functional as F

        freqs = self.position.float()[:, None] * self.inv_freq[None]
        emb = torch.cat([freqs, freqs], dim=-1)
        cos, sin = emb.cos().to(self.dtype), emb.sin().to(self.dtype)
        at = self.position.long()
        mask = (self.keys <= self.position.long())[None, None, None, :]
        x = self.x
        for i in range(self.layers):
            p = f"model.layers.{i}."
            h = self._norm(x, p + "input_layernorm.weight")
            q = (h @ self.w[p + "self_attn.q_proj.weight"].T).view(1, 1, HEADS, HEAD_DIM)
            k = (h @ self.w[p + "self_attn.k_proj.weight"].T).view(1, 1, KV_HEADS, HEAD_DIM)
            v = (h @ self.w[p + "self_attn.v_proj.weight"].T).view(1, 1, KV_HEADS, HEAD_DIM)
            q = self._rotate(q.transpose(1, 2), cos, sin)  # [1, HEADS, 1, HEAD_DIM]
            k = self._rotate(k.transpose(1, 2), cos, sin)
            self.k[i].index_copy_(2, at, k)
            self.v[i].index_copy_(2, at, v.transpose(1, 2))
            grouped = q.reshape(1, KV_HEADS, HEADS // KV_HEADS, HEAD_DIM)
            a = F.scaled_dot_product_attention(grouped, self.k[i], self.v[i], attn_mask=mask)
            x = x + a.reshape(1, 1, D) @ self.w[p + "self_attn.o_proj.weight"].T
            h = self._norm(x, p + "post_attention_layernorm.weight")
            gate = h @ self.w[p + "mlp.gate_proj.weight"].T
            up = h @ self.w[p + "mlp.up_proj.weight"].T
            x = x + (F.silu(gate) * up) @ self.w[p + "mlp.down_proj.weight"].T
        return self._norm(x, "model.norm.weight") @ self.w["lm_head.weight"].T


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--position", type=int, default=1000, help="the step timed")
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--steps", type=int, default=6, help="steps compared from position 0")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--search", choices=("heuristics", "exhaustive"), default="heuristics",
                    help="the candidates dslc's tuning measures (`dslc compile --search`)")
    ap.add_argument("--budget", type=float, default=20.0,
                    help="seconds of tuning per graph (`dslc compile --budget`)")
    ap.add_argument("--fusion", choices=("keep", "measure"), default="measure",
                    help="`dslc tune --fusion`: measure also times each pointwise graph and "
                         "the attention as one kernel against cuDNN's graph")
    ap.add_argument("--kernels", action="store_true",
                    help="then the GPU kernels of one replay of each CUDA graph (torch.profiler)")
    ap.add_argument("--profile", action="store_true",
                    help="then each step's time, summed over layers (CUDA events around each step, "
                         "outside a CUDA graph: host launch costs included)")
    args = ap.parse_args()

    import torch

    from dslc.backend.target import peaks
    from dslc.backend.timing import median_ms
    from dslc.backend.torch_side import cuda_graph
    from dslc.runtime import Model

    tmp = Path(tempfile.mkdtemp())
    source = tmp / "llama_decode_bench.cgraph"
    source.write_text(model_text(args.layers))
    start = time.monotonic()
    built = subprocess.run([sys.executable, "-m", "dslc", "compile", str(source), "-I",
                            str(ROOT / "models"), "--target", "device", "--search", args.search,
                            "--budget", str(args.budget),
                            "-o", str(tmp), "-q"],
                           capture_output=True, text=True, check=False)
    if built.returncode != 0:
        print(built.stderr[-3000:])
        return 1
    bundle = tmp / "llama_decode_bench.bundle"
    if args.fusion == "measure":
        built = subprocess.run([sys.executable, "-m", "dslc", "tune", str(bundle), "--fusion",
                                "measure", "--budget", str(args.budget), "-q"],
                               capture_output=True, text=True, check=False)
        lines = [line for line in built.stdout.splitlines()
                 if "backend measured" in line or "joined with" in line]
        taken = [line for line in lines if line.endswith(": one kernel")]
        print(f"tune --fusion measure: {len(taken)} of {len(lines)} steps (or pairs of steps) "
              "run as one kernel")
        # the first layer's choices (the others repeat them) and the steps outside the layers
        print("\n".join(line[:300] for line in lines
                        if "layers." not in line or re.search(r"layers\.0\b", line)))
        if args.out:
            args.out.with_suffix(".tune.txt").write_text(built.stdout)
        if built.returncode != 0:
            print(built.stderr[-3000:])
            return 1
    compile_s = time.monotonic() - start
    w = random_weights(bundle, bundle.with_suffix(".safetensors"))
    weight_bytes = sum(t.numel() * t.element_size() for t in w.values())
    model = Model(bundle, bundle.with_suffix(".safetensors"))
    dec = model.decoder(batch=1, max_len=MAX)
    ref = TorchDecoder(w, args.layers)

    g = torch.Generator(device="cuda").manual_seed(1)
    errors = []
    with torch.no_grad():
        for step in range(args.steps):  # both from an empty cache, the same tokens
            x = torch.randn(1, 1, D, generator=g, device="cuda").to(torch.bfloat16)
            ours = dec.step({"hidden_states": x})["logits"].float()
            ref.x.copy_(x)
            ref.position.fill_(step)
            theirs = ref.step().float()
            errors.append(float((ours - theirs).abs().max() / theirs.abs().max()))
    print(f"logits of steps 0..{args.steps - 1}, relative error against PyTorch: "
          + ", ".join(f"{e:.2e}" for e in errors), flush=True)

    # the step at one position, timed: the same row rewritten, the cache's first rows filled
    position = torch.full((1,), args.position, dtype=torch.int32, device="cuda")
    feed = {"hidden_states": x, "position": position,
            **{name: c.obj for name, c in dec.caches.items()}}
    plain_ms = median_ms(lambda: model.run(feed), args.repeats)
    fast = model.capture(feed)
    fast(feed)
    graph_ms = median_ms(fast.replay, args.repeats)  # as PyTorch's: inputs in place
    call_ms = median_ms(lambda: fast(feed), args.repeats)  # the token and position copied in
    ref.position.fill_(args.position)
    with torch.no_grad():
        replay = cuda_graph(ref.step)
    torch_ms = median_ms(replay, args.repeats)
    info = peaks(torch.cuda.get_device_name())
    bound_ms = weight_bytes / (info["memory_gbps"] * 1e9) * 1e3 if info else float("nan")
    report = {"layers": args.layers, "position": args.position, "compile_s": compile_s,
              "weight_gb": weight_bytes / 1e9, "bound_ms": bound_ms, "dslc_plain_ms": plain_ms,
              "dslc_graph_ms": graph_ms, "dslc_graph_call_ms": call_ms,
              "torch_graph_ms": torch_ms,
              "rel_errors": errors, "steps": len(model.program.steps),
              "kernel_steps": sum(s.kind == "kernel" for s in model.program.steps)}
    print(f"| layers | weights GB | bound ms | dslc ms | dslc graph ms | graph call ms | "
          f"torch graph ms | x torch | steps (kernels) |\n|---|---|---|---|---|---|---|---|---|\n"
          f"| {args.layers} | {weight_bytes / 1e9:.3f} | {bound_ms:.3f} | {plain_ms:.3f} | "
          f"{graph_ms:.3f} | {call_ms:.3f} | {torch_ms:.3f} | {torch_ms / graph_ms:.2f} | "
          f"{report['steps']} ({report['kernel_steps']}) |")
    print(f"compiled and tuned in {compile_s:.0f} s; worst relative error {max(errors):.2e}")
    if args.profile:
        print_profile(model.profile(feed, repeats=20))
    if args.kernels:
        for who, run, ms in (("dslc", fast.replay, graph_ms), ("torch", replay, torch_ms)):
            print_kernels(who, run, ms)
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))
    return 0


def print_kernels(who: str, replay: Any, graph_ms: float) -> None:
    """The kernels a CUDA graph's replay runs (CUPTI through torch.profiler), by name: where a
    token's time goes inside the graph, and how much of it no kernel runs (launch gaps)."""
    from probe_gpu import kernels

    rows = kernels(replay, calls=10)
    busy = sum(r[0] for r in rows) / 1e3
    print(f"{who}: kernels {busy:.3f} ms of the graph's {graph_ms:.3f} ms per replay "
          f"({sum(r[1] for r in rows)} kernels)")
    for us, n, name in rows[:14]:
        print(f"  {us / 1e3:8.4f} ms {n:>4}x  {name}")


def print_profile(rows: list[dict[str, Any]]) -> None:
    """Steps alike across layers (`model.layers.N.` dropped from the name) summed: where a
    token's time goes, the largest first."""
    total: dict[str, list[float]] = {}
    for r in rows:
        key = re.sub(r"model\.layers\.\d+", "L", r["step"]) + f" [{r['pattern']}]"
        total.setdefault(key, []).append(r["ms"])
    print(f"{'step (summed over layers)':<60} {'n':>3} {'ms':>8} {'ms each':>8}")
    for key, ms in sorted(total.items(), key=lambda kv: -sum(kv[1])):
        print(f"{key[:60]:<60} {len(ms):>3} {sum(ms):>8.4f} {sum(ms) / len(ms):>8.4f}")
    print(f"{'all steps':<60} {len(rows):>3} {sum(r['ms'] for r in rows):>8.4f}")


if __name__ == "__main__":
    sys.exit(main())
