"""models/llama_decode.cgraph at small sizes, f32, on the reference backend: a decode loop
(prefill, then one token a step, the caches carried from step to step as the runtime updates
them in place) against a decode loop written here by hand in PyTorch, as Hugging Face's
LlamaDecoderLayer runs with a growing key/value cache; prefill-then-decode against one causal
pass over the whole sequence; and the step compiled deviceless as declared (bf16)."""

from __future__ import annotations

import math
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from dslc.backend.target import load_target
from dslc.check.checker import CheckedModel
from dslc.compile.stage import compile_model
from dslc.core.types import PrecisionSpec
from dslc.diag.diagnostic import Sink
from dslc.emit import bundle as emit_bundle
from dslc.ir import interp
from dslc.ir.graph import Graph
from dslc.pipeline import Options, front_end, lower_and_fuse
from dslc.runtime.bundle import read
from dslc.runtime.schedule import Schedule
from tests.conftest import ROOT
from tests.helpers import rel_error, rng

SMALL = {"D": 64, "HEADS": 4, "KV_HEADS": 2, "FFN": 96}
B, MAX, HEADS, KV, HD, THETA, EPS = 2, 64, 4, 2, 16, 500000.0, 1e-5
CACHES = [f"model.layers.{layer}.{kv}_cache" for layer in (0, 1) for kv in ("k", "v")]


def small_model_text() -> str:
    """The file as written, with its static sizes bound smaller."""
    text = (ROOT / "models" / "llama_decode.cgraph").read_text()
    for dim, size in SMALL.items():
        text, found = re.subn(rf"^(\s*dim {dim} = )[^\s#]+", rf"\g<1>{size}", text, flags=re.M)
        assert found == 1, dim
    return text


def small_model(tmp_path: Path) -> CheckedModel:
    """The small model checked in f32 for the reference backend."""
    path = tmp_path / "llama_decode.cgraph"
    path.write_text(small_model_text())
    sink = Sink()
    model = front_end(path, Options(include_dirs=[ROOT / "models"], precision=PrecisionSpec(),
                                    backend="reference"), sink).model
    assert model is not None, [d.message for d in sink.diagnostics]
    return model


def random_weights(model: CheckedModel) -> dict[str, np.ndarray]:
    r = rng("llama decode", "weights")
    out = {}
    for p in model.params:
        scale = 1.0 if p.path.endswith("layernorm.weight") else 1 / math.sqrt(p.shape[-1])
        out[p.path] = (1.0 + 0.1 * r.standard_normal(p.shape) if scale == 1.0 else
                       scale * r.standard_normal(p.shape)).astype(np.float32)
    return out


class DslcLoop:
    """The reference executor as a decode loop: caches zeroed once, each step's writes kept."""

    def __init__(self, graph: Graph, model: CheckedModel, weights: dict[str, np.ndarray]) -> None:
        self.graph, self.env, self.weights = graph, model.env, weights
        self.caches = {n: np.zeros((B, KV, MAX, HD), np.float32) for n in CACHES}
        self.position = 0

    def step(self, x: np.ndarray) -> np.ndarray:
        inputs = {"hidden_states": x, "position": np.array([self.position], np.int32),
                  **self.caches}
        out, written = interp.run_in_place(self.graph, inputs, self.weights, self.env)
        assert set(written) == set(CACHES)
        self.caches = written
        self.position += x.shape[1]
        return out["out"]


# ---- the PyTorch side, by hand ------------------------------------------------------------------

def _rms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w


def _rotary(positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = 1.0 / THETA ** (torch.arange(0, HD, 2, dtype=torch.float64) / HD)
    freqs = positions.double()[:, None] * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = torch.cat([-x[..., HD // 2:], x[..., :HD // 2]], dim=-1)
    return x * cos + half * sin


def torch_layer(x: torch.Tensor, past: tuple[torch.Tensor, torch.Tensor], start: int,
                w: dict[str, torch.Tensor], prefix: str,
                ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """LlamaDecoderLayer over S new tokens at positions start.., the cache grown by torch.cat
    (as Hugging Face's DynamicCache): every query sees the past and the new keys up to its own."""
    b, s, _ = x.shape

    def proj(h: torch.Tensor, name: str) -> torch.Tensor:
        return h @ w[f"{prefix}.{name}.weight"].T

    h = _rms(x, w[f"{prefix}.input_layernorm.weight"])
    q = proj(h, "self_attn.q_proj").view(b, s, HEADS, HD).transpose(1, 2)
    k = proj(h, "self_attn.k_proj").view(b, s, KV, HD).transpose(1, 2)
    v = proj(h, "self_attn.v_proj").view(b, s, KV, HD).transpose(1, 2)
    cos, sin = _rotary(torch.arange(start, start + s))
    q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
    keys, values = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
    kk = keys.repeat_interleave(HEADS // KV, dim=1)
    vv = values.repeat_interleave(HEADS // KV, dim=1)
    scores = q @ kk.transpose(-1, -2) / math.sqrt(HD)
    query_at = torch.arange(start, start + s)[:, None]
    key_at = torch.arange(keys.shape[2])[None, :]
    scores = scores.masked_fill(key_at > query_at, float("-inf"))
    ctx = torch.softmax(scores, dim=-1) @ vv
    attn = proj(ctx.transpose(1, 2).reshape(b, s, HEADS * HD), "self_attn.o_proj")
    h = x + attn
    post = _rms(h, w[f"{prefix}.post_attention_layernorm.weight"])
    mlp = proj(torch.nn.functional.silu(proj(post, "mlp.gate_proj")) * proj(post, "mlp.up_proj"),
               "mlp.down_proj")
    return h + mlp, (keys, values)


class TorchLoop:
    def __init__(self, weights: dict[str, np.ndarray]) -> None:
        self.w = {k: torch.from_numpy(v).double() for k, v in weights.items()}
        empty = torch.zeros(B, KV, 0, HD, dtype=torch.float64)
        self.past = [(empty, empty), (empty, empty)]
        self.position = 0

    def step(self, x: np.ndarray) -> np.ndarray:
        h = torch.from_numpy(x).double()
        for i in range(2):
            h, self.past[i] = torch_layer(h, self.past[i], self.position, self.w,
                                          f"model.layers.{i}")
        self.position += x.shape[1]
        return h.numpy()


# ---- the tests ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[Graph, CheckedModel,
                                                              dict[str, np.ndarray]]:
    model = small_model(tmp_path_factory.mktemp("llama_decode"))
    lowered, _ = lower_and_fuse(model)
    return lowered, model, random_weights(model)


def _tokens(n: int, key: str) -> np.ndarray:
    return rng("llama decode", key).standard_normal((B, n, SMALL["D"])).astype(np.float32)


def test_params_are_hugging_faces_names(setup: tuple[Graph, CheckedModel, dict]) -> None:
    _, model, _ = setup
    layer = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
             "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", "input_layernorm",
             "post_attention_layernorm"]
    assert [p.path for p in model.params] == [f"model.layers.{i}.{m}.weight" for i in (0, 1)
                                              for m in layer]


def test_decode_loop_equals_pytorchs(setup: tuple[Graph, CheckedModel, dict]) -> None:
    """A 5-token prompt, then 4 steps of one token: each step's output, and the caches' filled
    rows (the other rows stay zero), equal PyTorch's decode loop."""
    graph, model, weights = setup
    ours, theirs = DslcLoop(graph, model, weights), TorchLoop(weights)
    for i, n in enumerate([5, 1, 1, 1, 1]):
        x = _tokens(n, f"step {i}")
        assert rel_error(ours.step(x), theirs.step(x)) <= 1e-5, i
    assert ours.position == theirs.position == 9
    for layer in (0, 1):
        keys, values = theirs.past[layer]
        for name, want in ((f"model.layers.{layer}.k_cache", keys),
                           (f"model.layers.{layer}.v_cache", values)):
            cache = ours.caches[name]
            assert rel_error(cache[:, :, :9], want.numpy()) <= 1e-5, name
            assert not cache[:, :, 9:].any(), name


def test_prefill_then_decode_equals_one_causal_pass(setup: tuple[Graph, CheckedModel, dict],
                                                    ) -> None:
    """The sequence decoded as a prompt of 4 then 3 single tokens equals the 7 tokens in one
    step from position 0 (dslc's own causal pass), and PyTorch's full pass without a cache."""
    graph, model, weights = setup
    seq = _tokens(7, "sequence")
    pieces = [seq[:, :4], seq[:, 4:5], seq[:, 5:6], seq[:, 6:7]]
    loop = DslcLoop(graph, model, weights)
    stepped = np.concatenate([loop.step(p) for p in pieces], axis=1)
    whole = DslcLoop(graph, model, weights).step(seq)
    assert rel_error(stepped, whole) <= 1e-5
    assert rel_error(whole, TorchLoop(weights).step(seq)) <= 1e-5


def test_the_decode_step_compiles_deviceless(tmp_path: Path) -> None:
    """As declared (bf16) at the small sizes, for the H200 profile: both attentions are cuDNN
    graphs with the padding mask, the four cache writes fallback kernels writing in place, and
    the caches take no arena bytes."""
    text = small_model_text()
    path = tmp_path / "llama_decode.cgraph"
    path.write_text(text)
    sink = Sink()
    model = front_end(path, Options(include_dirs=[ROOT / "models"]), sink).model
    assert model is not None, [d.message for d in sink.diagnostics]
    lowered, plan = lower_and_fuse(model)
    bucket = {"B": 1, "S": 1, "MAX": 4096}
    c = compile_model(model, lowered, plan, load_target("h200"), buckets=[bucket])
    nodes = c.graph.by_name()
    ops = Counter((s.kind, nodes[s.group.nodes[0]].op) for s in c.steps)
    assert ops[("kernel", "cache_write")] == 4 and ops[("graph", "sdpa")] == 2
    assert ops[("kernel", "expand")] == 1  # the lengths broadcast over the batch, exactly
    for (_, signature), built in c.builds.items():
        if any(nodes[n].op == "sdpa" for s in c.steps if s.group.signature == signature
               for n in s.group.nodes):
            assert "'use_padding_mask': True" in str(built.graph)
    path = tmp_path / "decode.bundle"
    emit_bundle.write(path, emit_bundle.records(c))
    program = Schedule(read(path))
    assert program.written_inputs() == set(CACHES)
    assert {w.at for w in program.bundle.manifest.written} == {"position"}
    memory = program.memory_plan(bucket)
    assert not set(CACHES) & set(memory.offsets)
