"""Independent PyTorch implementations of the attention model families in models/ (ViT-B/16
as torchvision builds it, BERT and Llama as Hugging Face transformers do, a Stable Diffusion
UNet stage as diffusers does), from torch.nn layers: the same module tree, so the same state_dict
keys in the same order, and the same forward computation. Sizes are arguments: the defaults are
the ones the .cgraph files declare, tests build smaller ones."""

from __future__ import annotations

import math
from collections import OrderedDict

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

# ---- ViT-B/16 (torchvision.models.vision_transformer) --------------------------------------------

class EncoderBlock(nn.Module):
    def __init__(self, d: int, heads: int, mlp: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(d, eps=1e-6)
        self.self_attention = nn.MultiheadAttention(d, heads, batch_first=True)
        self.ln_2 = nn.LayerNorm(d, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(d, mlp), nn.GELU(), nn.Dropout(0.0),
                                 nn.Linear(mlp, d), nn.Dropout(0.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.ln_1(x)
        y, _ = self.self_attention(y, y, y, need_weights=False)
        h = y + x
        return h + self.mlp(self.ln_2(h))


class ViTEncoder(nn.Module):
    """torchvision's Encoder up to its first layer (its dropout is the identity at inference;
    the layers after the first and the final `ln` are left out)."""

    def __init__(self, seq: int, d: int, heads: int, mlp: int) -> None:
        super().__init__()
        self.pos_embedding = nn.Parameter(torch.empty(1, seq, d))
        self.layers = nn.Sequential(OrderedDict(encoder_layer_0=EncoderBlock(d, heads, mlp)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x + self.pos_embedding)


class ViTFront(nn.Module):
    """models/vit_front.cgraph: vit_b_16's patch embedding, class token, position embeddings and
    `encoder.layers.encoder_layer_0`."""

    def __init__(self, image: int = 224, patch: int = 16, d: int = 768, heads: int = 12,
                 mlp: int = 3072) -> None:
        super().__init__()
        self.patch, self.d = patch, d
        self.conv_proj = nn.Conv2d(3, d, kernel_size=patch, stride=patch)
        self.class_token = nn.Parameter(torch.zeros(1, 1, d))
        self.encoder = ViTEncoder((image // patch) ** 2 + 1, d, heads, mlp)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        n, _, h, w = image.shape
        x = self.conv_proj(image).reshape(n, self.d, (h // self.patch) * (w // self.patch))
        x = torch.cat([self.class_token.expand(n, -1, -1), x.permute(0, 2, 1)], dim=1)
        return self.encoder(x)


# ---- BERT (transformers.models.bert.modeling_bert) -----------------------------------------------

class BertEmbeddings(nn.Module):
    position_ids: torch.Tensor

    def __init__(self, vocab: int, positions: int, types: int, d: int) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab, d, padding_idx=0)
        self.position_embeddings = nn.Embedding(positions, d)
        self.token_type_embeddings = nn.Embedding(types, d)
        self.LayerNorm = nn.LayerNorm(d, eps=1e-12)
        self.dropout = nn.Dropout(0.0)
        self.register_buffer("position_ids", torch.arange(positions).expand((1, -1)),
                             persistent=False)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        position_ids = self.position_ids[:, :input_ids.shape[1]]
        embeddings = self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)
        embeddings = embeddings + self.position_embeddings(position_ids)
        return self.dropout(self.LayerNorm(embeddings))


class BertSelfAttention(nn.Module):
    """The eager attention: softmax(q k^T / sqrt(d) + mask) v, written out."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.query, self.key, self.value = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(b, s, self.heads, d // self.heads).permute(0, 2, 1, 3)

        scores = heads(self.query(x)) @ heads(self.key(x)).transpose(-1, -2)
        probs = torch.softmax(scores / math.sqrt(d // self.heads) + mask, dim=-1)
        return (probs @ heads(self.value(x))).permute(0, 2, 1, 3).reshape(b, s, d)


class BertOutputLN(nn.Module):
    """BertSelfOutput / BertOutput: dense, then LayerNorm of it plus the residual."""

    def __init__(self, cin: int, d: int) -> None:
        super().__init__()
        self.dense = nn.Linear(cin, d)
        self.LayerNorm = nn.LayerNorm(d, eps=1e-12)
        self.dropout = nn.Dropout(0.0)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dropout(self.dense(x)) + residual)


class BertAttention(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.self = BertSelfAttention(d, heads)
        self.output = BertOutputLN(d, d)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.output(self.self(x, mask), x)


class BertIntermediate(nn.Module):
    def __init__(self, d: int, ffn: int) -> None:
        super().__init__()
        self.dense = nn.Linear(d, ffn)
        self.intermediate_act_fn = nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.intermediate_act_fn(self.dense(x))


class BertLayer(nn.Module):
    def __init__(self, d: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.attention = BertAttention(d, heads)
        self.intermediate = BertIntermediate(d, ffn)
        self.output = BertOutputLN(ffn, d)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        attention = self.attention(x, mask)
        return self.output(self.intermediate(attention), attention)


class BertEncoder(nn.Module):
    """BertEncoder with its first layer only."""

    def __init__(self, d: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.layer = nn.ModuleList([BertLayer(d, heads, ffn)])

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        for layer in self.layer:
            x = layer(x, mask)
        return x


class BertFront(nn.Module):
    """models/bert.cgraph: BertModel's embeddings and `encoder.layer.0`; the attention mask
    becomes Hugging Face's extended mask, (1 - mask) * the dtype's most negative value."""

    def __init__(self, vocab: int = 30522, positions: int = 512, types: int = 2, d: int = 768,
                 heads: int = 12, ffn: int = 3072) -> None:
        super().__init__()
        self.embeddings = BertEmbeddings(vocab, positions, types, d)
        self.encoder = BertEncoder(d, heads, ffn)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                attention_mask: torch.Tensor) -> torch.Tensor:
        x = self.embeddings(input_ids, token_type_ids)
        extended = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
        return self.encoder(x, extended)



def bert_inputs(g: np.random.Generator, vocab: int, batch: int, seq: int) -> dict[str, np.ndarray]:
    """Inputs as a tokenizer makes them: token ids (0 at padding, BERT's [PAD]), segment ids 0
    then 1, and a padding mask (1 for a token): the first sequence full, the others shorter."""
    lengths = np.array([seq, *g.integers(2, seq, batch - 1)])
    mask = (np.arange(seq)[None, :] < lengths[:, None]).astype(np.int64)
    ids = g.integers(1, vocab, (batch, seq)) * mask
    types = (np.arange(seq)[None, :] >= lengths[:, None] // 2).astype(np.int64) * mask
    return {"input_ids": ids, "token_type_ids": types, "attention_mask": mask}

# ---- Stable Diffusion 1.5 (diffusers.models) -----------------------------------------------------

class ResnetBlock2D(nn.Module):
    def __init__(self, cin: int, cout: int, temb: int, groups: int, eps: float) -> None:
        super().__init__()
        self.norm1 = nn.GroupNorm(groups, cin, eps=eps, affine=True)
        self.conv1 = nn.Conv2d(cin, cout, 3, 1, 1)
        self.time_emb_proj = nn.Linear(temb, cout)
        self.norm2 = nn.GroupNorm(groups, cout, eps=eps, affine=True)
        self.dropout = nn.Dropout(0.0)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1)
        self.nonlinearity = nn.SiLU()
        self.conv_shortcut = nn.Conv2d(cin, cout, 1) if cin != cout else None
        self.output_scale_factor = 1.0

    def forward(self, x: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
        h = self.conv1(self.nonlinearity(self.norm1(x)))
        h = h + self.time_emb_proj(self.nonlinearity(temb))[:, :, None, None]
        h = self.conv2(self.dropout(self.nonlinearity(self.norm2(h))))
        shortcut = self.conv_shortcut(x) if self.conv_shortcut is not None else x
        return (shortcut + h) / self.output_scale_factor


class Attention(nn.Module):
    """diffusers' Attention with AttnProcessor2_0 (no q/k/v bias)."""

    def __init__(self, d: int, heads: int, context: int | None = None) -> None:
        super().__init__()
        self.heads = heads
        self.to_q = nn.Linear(d, d, bias=False)
        self.to_k = nn.Linear(context or d, d, bias=False)
        self.to_v = nn.Linear(context or d, d, bias=False)
        self.to_out = nn.ModuleList([nn.Linear(d, d), nn.Dropout(0.0)])

    def forward(self, x: torch.Tensor, context: torch.Tensor | None = None) -> torch.Tensor:
        context = x if context is None else context
        b = x.shape[0]

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(b, -1, self.heads, t.shape[-1] // self.heads).transpose(1, 2)

        out = F.scaled_dot_product_attention(heads(self.to_q(x)), heads(self.to_k(context)),
                                             heads(self.to_v(context)))
        out = out.transpose(1, 2).reshape(b, -1, x.shape[-1])
        return self.to_out[1](self.to_out[0](out))


class GEGLU(nn.Module):
    def __init__(self, d: int, inner: int) -> None:
        super().__init__()
        self.proj = nn.Linear(d, inner * 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden, gate = self.proj(x).chunk(2, dim=-1)
        return hidden * F.gelu(gate)


class FeedForward(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.net = nn.ModuleList([GEGLU(d, 4 * d), nn.Dropout(0.0), nn.Linear(4 * d, d)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for module in self.net:
            x = module(x)
        return x


class BasicTransformerBlock(nn.Module):
    def __init__(self, d: int, heads: int, context: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(d)
        self.attn1 = Attention(d, heads)
        self.norm2 = nn.LayerNorm(d)
        self.attn2 = Attention(d, heads, context)
        self.norm3 = nn.LayerNorm(d)
        self.ff = FeedForward(d)

    def forward(self, x: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        x = self.attn1(self.norm1(x)) + x
        x = self.attn2(self.norm2(x), context) + x
        return self.ff(self.norm3(x)) + x


class Transformer2DModel(nn.Module):
    def __init__(self, c: int, heads: int, context: int, groups: int) -> None:
        super().__init__()
        self.norm = nn.GroupNorm(groups, c, eps=1e-6, affine=True)
        self.proj_in = nn.Conv2d(c, c, 1)
        self.transformer_blocks = nn.ModuleList([BasicTransformerBlock(c, heads, context)])
        self.proj_out = nn.Conv2d(c, c, 1)

    def forward(self, x: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        y = self.proj_in(self.norm(x)).permute(0, 2, 3, 1).reshape(b, h * w, c)
        for block in self.transformer_blocks:
            y = block(y, context)
        y = y.reshape(b, h, w, c).permute(0, 3, 1, 2).contiguous()
        return self.proj_out(y) + x


class CrossAttnDownBlock2D(nn.Module):
    """diffusers' CrossAttnDownBlock2D with its first resnet and transformer only."""

    def __init__(self, cin: int, cout: int, temb: int, context: int, heads: int,
                 groups: int) -> None:
        super().__init__()
        self.resnets = nn.ModuleList([ResnetBlock2D(cin, cout, temb, groups, 1e-5)])
        self.attentions = nn.ModuleList([Transformer2DModel(cout, heads, context, groups)])

    def forward(self, x: torch.Tensor, temb: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        for resnet, attention in zip(self.resnets, self.attentions, strict=True):
            x = attention(resnet(x, temb), context)
        return x


class SDDownBlock1(nn.Module):
    """models/sd_down_block.cgraph: `down_blocks.1` of SD 1.5's UNet, its first resnet and its
    first transformer (the rest of the stage, a second pair and the downsampler, left out)."""

    def __init__(self, cin: int = 320, cout: int = 640, temb: int = 1280, context: int = 768,
                 heads: int = 8, groups: int = 32) -> None:
        super().__init__()
        self.down_blocks = nn.ModuleDict(
            {"1": CrossAttnDownBlock2D(cin, cout, temb, context, heads, groups)})

    def forward(self, sample: torch.Tensor, temb: torch.Tensor,
                encoder_hidden_states: torch.Tensor) -> torch.Tensor:
        return self.down_blocks["1"](sample, temb, encoder_hidden_states)


# ---- Llama (transformers.models.llama.modeling_llama) --------------------------------------------

def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., :x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


class LlamaRotaryEmbedding(nn.Module):
    """rope_type "default": cos and sin of position * inv_freq, the frequencies repeated."""

    inv_freq: torch.Tensor

    def __init__(self, head_dim: int, theta: float) -> None:
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float()
                                    / head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
        inv = self.inv_freq[None, :, None].float().expand(position_ids.shape[0], -1, 1)
        freqs = (inv @ position_ids[:, None, :].float()).transpose(1, 2)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


class LlamaAttention(nn.Module):
    def __init__(self, d: int, heads: int, kv_heads: int) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, d // heads
        self.q_proj = nn.Linear(d, heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(d, kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(d, kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(heads * self.head_dim, d, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(b, s, -1, self.head_dim).transpose(1, 2)

        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        q, k, v = heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x))
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        group = self.heads // self.kv_heads  # repeat_kv
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, -1))


class LlamaMLP(nn.Module):
    def __init__(self, d: int, ffn: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(d, ffn, bias=False)
        self.up_proj = nn.Linear(d, ffn, bias=False)
        self.down_proj = nn.Linear(ffn, d, bias=False)
        self.act_fn = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, d: int, heads: int, kv_heads: int, ffn: int, eps: float) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(d, heads, kv_heads)
        self.mlp = LlamaMLP(d, ffn)
        self.input_layernorm = nn.RMSNorm(d, eps=eps)
        self.post_attention_layernorm = nn.RMSNorm(d, eps=eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return h + self.mlp(self.post_attention_layernorm(h))


class LlamaModel(nn.Module):
    """LlamaModel's decoder stack with its first layer only (no embeddings, no final norm), the
    positions of a prompt: 0..S-1."""

    def __init__(self, d: int, heads: int, kv_heads: int, ffn: int, theta: float,
                 eps: float) -> None:
        super().__init__()
        self.layers = nn.ModuleList([LlamaDecoderLayer(d, heads, kv_heads, ffn, eps)])
        self.rotary_emb = LlamaRotaryEmbedding(d // heads, theta)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        b, s, _ = hidden_states.shape
        positions = torch.arange(s, device=hidden_states.device).expand(b, -1)
        cos, sin = self.rotary_emb(hidden_states, positions)
        for layer in self.layers:
            hidden_states = layer(hidden_states, cos, sin)
        return hidden_states


class LlamaLayer(nn.Module):
    """models/llama_layer.cgraph: `model.layers.0` of Llama 3 8B at prefill, positions 0..S-1."""

    def __init__(self, d: int = 4096, heads: int = 32, kv_heads: int = 8, ffn: int = 14336,
                 theta: float = 500000.0, eps: float = 1e-5) -> None:
        super().__init__()
        self.model = LlamaModel(d, heads, kv_heads, ffn, theta, eps)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.model(hidden_states)


# ---- Whisper's audio encoder (transformers.models.whisper.modeling_whisper) ---------------------

class WhisperAttention(nn.Module):
    """Self-attention as Whisper's: q scaled by head_dim ** -0.5, k_proj without a bias."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, d // heads
        self.k_proj = nn.Linear(d, d, bias=False)
        self.v_proj = nn.Linear(d, d)
        self.q_proj = nn.Linear(d, d)
        self.out_proj = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(b, s, self.heads, self.head_dim).transpose(1, 2)

        q = heads(self.q_proj(x) * self.head_dim ** -0.5)
        scores = q @ heads(self.k_proj(x)).transpose(-1, -2)
        ctx = torch.softmax(scores.float(), dim=-1).to(q.dtype) @ heads(self.v_proj(x))
        return self.out_proj(ctx.transpose(1, 2).reshape(b, s, d))


class WhisperEncoderLayer(nn.Module):
    def __init__(self, d: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.self_attn = WhisperAttention(d, heads)
        self.self_attn_layer_norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, ffn)
        self.fc2 = nn.Linear(ffn, d)
        self.final_layer_norm = nn.LayerNorm(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.self_attn(self.self_attn_layer_norm(x))
        return h + self.fc2(F.gelu(self.fc1(self.final_layer_norm(h))))


class WhisperEncoder(nn.Module):
    def __init__(self, mels: int, positions: int, d: int, heads: int, ffn: int,
                 layers: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv1d(mels, d, kernel_size=3, padding=1)
        self.conv2 = nn.Conv1d(d, d, kernel_size=3, stride=2, padding=1)
        self.embed_positions = nn.Embedding(positions, d)
        self.layers = nn.ModuleList([WhisperEncoderLayer(d, heads, ffn) for _ in range(layers)])
        self.layer_norm = nn.LayerNorm(d)

    def forward(self, input_features: torch.Tensor) -> torch.Tensor:
        x = F.gelu(self.conv2(F.gelu(self.conv1(input_features)))).permute(0, 2, 1)
        x = x + self.embed_positions.weight[: x.shape[1]]
        for layer in self.layers:
            x = layer(x)
        return self.layer_norm(x)


class WhisperAudioEncoder(nn.Module):
    """models/whisper_encoder.cgraph: WhisperModel's `encoder` (whisper-tiny sizes by default)."""

    def __init__(self, mels: int = 80, positions: int = 1500, d: int = 384, heads: int = 6,
                 ffn: int = 1536, layers: int = 4) -> None:
        super().__init__()
        self.encoder = WhisperEncoder(mels, positions, d, heads, ffn, layers)

    def forward(self, input_features: torch.Tensor) -> torch.Tensor:
        return self.encoder(input_features)
