"""PyTorch models the ONNX import tests export, written after the originals' module layout so the
state-dict names are theirs: torchvision's MobileNetV2 (`features.1.conv.0.0.weight`, ...) and
Hugging Face's GPT-2 block (`attn.c_attn.weight`, a Conv1D stored [in, out], the causal mask a
`where` on a lower triangle). ResNet-18/50 are tests/torch_models.py's."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def _conv_bn_act(cin: int, cout: int, k: int, stride: int = 1, groups: int = 1,
                 act: bool = True) -> nn.Sequential:
    """torchvision's Conv2dNormActivation: conv (no bias), batchnorm, ReLU6."""
    layers: list[nn.Module] = [nn.Conv2d(cin, cout, k, stride, (k - 1) // 2, groups=groups,
                                         bias=False), nn.BatchNorm2d(cout)]
    if act:
        layers.append(nn.ReLU6())
    return nn.Sequential(*layers)


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand: int) -> None:
        super().__init__()
        hidden = cin * expand
        self.use_res_connect = stride == 1 and cin == cout
        layers: list[nn.Module] = [_conv_bn_act(cin, hidden, 1)] if expand != 1 else []
        layers += [_conv_bn_act(hidden, hidden, 3, stride, groups=hidden),
                   nn.Conv2d(hidden, cout, 1, bias=False), nn.BatchNorm2d(cout)]
        self.conv = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv(x) if self.use_res_connect else self.conv(x)


class MobileNetV2(nn.Module):
    """torchvision.models.mobilenet_v2's layout (inverted residual settings t, c, n, s), at a
    width multiplier and class count small enough for a CPU test."""

    SETTINGS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
                (6, 160, 3, 2), (6, 320, 1, 1))

    def __init__(self, width: float = 1.0, classes: int = 10) -> None:
        super().__init__()

        def scaled(c: int) -> int:  # torchvision's _make_divisible(c * width, 8)
            v = max(8, int(c * width + 4) // 8 * 8)
            return v + 8 if v < 0.9 * c * width else v

        cin = scaled(32)
        last = scaled(1280) if width > 1.0 else 1280
        features: list[nn.Module] = [_conv_bn_act(3, cin, 3, 2)]
        for t, c, n, s in self.SETTINGS:
            for i in range(n):
                features.append(InvertedResidual(cin, scaled(c), s if i == 0 else 1, t))
                cin = scaled(c)
        features.append(_conv_bn_act(cin, last, 1))
        self.features = nn.Sequential(*features)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(last, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.adaptive_avg_pool2d(self.features(x), (1, 1))
        return self.classifier(torch.flatten(x, 1))


class Conv1D(nn.Module):
    """GPT-2's linear layer: weight stored [in, out], y = x W + b."""

    def __init__(self, out: int, cin: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(cin, out) * 0.02)
        self.bias = nn.Parameter(torch.randn(out) * 0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).reshape(
            *x.shape[:-1], self.weight.shape[1])


class GPT2Attention(nn.Module):
    bias: torch.Tensor

    def __init__(self, d: int, heads: int, positions: int) -> None:
        super().__init__()
        self.heads = heads
        self.c_attn, self.c_proj = Conv1D(3 * d, d), Conv1D(d, d)
        self.register_buffer("bias", torch.tril(torch.ones(positions, positions, dtype=torch.bool))
                             .view(1, 1, positions, positions), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.c_attn(x).split(d, dim=2)

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(b, s, self.heads, d // self.heads).permute(0, 2, 1, 3)

        q, k, v = heads(q), heads(k), heads(v)
        w = q @ k.transpose(-1, -2) / math.sqrt(d // self.heads)
        mask = self.bias[:, :, :s, :s]
        w = torch.where(mask, w, torch.tensor(torch.finfo(w.dtype).min, dtype=w.dtype))
        out = torch.softmax(w, dim=-1) @ v
        return self.c_proj(out.permute(0, 2, 1, 3).reshape(b, s, d))


class GPT2MLP(nn.Module):
    def __init__(self, d: int, hidden: int) -> None:
        super().__init__()
        self.c_fc, self.c_proj = Conv1D(hidden, d), Conv1D(d, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class GPT2Block(nn.Module):
    def __init__(self, d: int = 64, heads: int = 4, positions: int = 32) -> None:
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn, self.mlp = GPT2Attention(d, heads, positions), GPT2MLP(d, 4 * d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.attn(self.ln_1(x))
        return h + self.mlp(self.ln_2(h))
