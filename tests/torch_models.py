"""Independent PyTorch implementations of the example models, with the same parameter names, so
they load the state_dict that dslc's reference executor is given (PyTorch CPU, f32)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class MLP(nn.Module):
    """models/mlp.cgraph: weights stored [in, out], used as x @ w + b."""

    def __init__(self) -> None:
        super().__init__()
        for name, shape in (("w1", (784, 512)), ("w2", (512, 512)), ("w3", (512, 10))):
            self.register_parameter(name, nn.Parameter(torch.empty(shape)))
        for name, n in (("b1", 512), ("b2", 512), ("b3", 10)):
            self.register_parameter(name, nn.Parameter(torch.empty(n)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h1 = F.relu(x @ self.w1 + self.b1)
        h2 = F.gelu(h1 @ self.w2 + self.b2)
        return h2 @ self.w3 + self.b3


def _conv_bn(cin: int, cout: int, k: int, stride: int = 1, pad: int = 0) -> tuple[nn.Conv2d, nn.BatchNorm2d]:
    return nn.Conv2d(cin, cout, k, stride, pad, bias=False), nn.BatchNorm2d(cout)


class BasicBlock(nn.Module):
    def __init__(self, cin: int, planes: int, stride: int) -> None:
        super().__init__()
        self.conv1, self.bn1 = _conv_bn(cin, planes, 3, stride, 1)
        self.conv2, self.bn2 = _conv_bn(planes, planes, 3, 1, 1)
        self.downsample = (nn.Sequential(*_conv_bn(cin, planes, 1, stride))
                           if stride != 1 or cin != planes else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        return F.relu(y + (self.downsample(x) if self.downsample is not None else x))


class Bottleneck(nn.Module):
    def __init__(self, cin: int, planes: int, stride: int) -> None:
        super().__init__()
        self.conv1, self.bn1 = _conv_bn(cin, planes, 1)
        self.conv2, self.bn2 = _conv_bn(planes, planes, 3, stride, 1)
        self.conv3, self.bn3 = _conv_bn(planes, planes * 4, 1)
        self.downsample = (nn.Sequential(*_conv_bn(cin, planes * 4, 1, stride))
                           if stride != 1 or cin != planes * 4 else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return F.relu(y + (self.downsample(x) if self.downsample is not None else x))


class ResNet(nn.Module):
    """torchvision's ResNet (v1.5: stride on the 3x3 of the bottleneck)."""

    def __init__(self, block: type[nn.Module], layers: list[int]) -> None:
        super().__init__()
        self.conv1, self.bn1 = _conv_bn(3, 64, 7, 2, 3)
        expansion = 4 if block is Bottleneck else 1
        cin = 64
        for i, (planes, n) in enumerate(zip((64, 128, 256, 512), layers, strict=True)):
            blocks = []
            for j in range(n):
                blocks.append(block(cin, planes, 2 if j == 0 and i > 0 else 1))
                cin = planes * expansion
            setattr(self, f"layer{i + 1}", nn.Sequential(*blocks))
        self.fc = nn.Linear(cin, 1000)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 3, 2, 1)
        for i in range(1, 5):
            x = getattr(self, f"layer{i}")(x)
        return self.fc(x.mean(dim=(2, 3)))


def resnet18() -> ResNet:
    return ResNet(BasicBlock, [2, 2, 2, 2])


def resnet50() -> ResNet:
    return ResNet(Bottleneck, [3, 4, 6, 3])


class Attention(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (nn.Linear(d, d) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape

        def split(t: torch.Tensor) -> torch.Tensor:
            return t.reshape(b, s, self.heads, d // self.heads).transpose(1, 2)

        ctx = F.scaled_dot_product_attention(split(self.q_proj(x)), split(self.k_proj(x)),
                                             split(self.v_proj(x)))
        return self.out_proj(ctx.transpose(1, 2).reshape(b, s, d))


class FFN(nn.Module):
    def __init__(self, d: int, hidden: int) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, hidden), nn.Linear(hidden, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class EncoderLayer(nn.Module):
    def __init__(self, d: int, heads: int, hidden: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d, eps=1e-6), nn.LayerNorm(d, eps=1e-6)
        self.attn, self.ffn = Attention(d, heads), FFN(d, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.attn(self.ln1(x))
        return h + self.ffn(self.ln2(h))


class Encoder(nn.Module):
    """models/encoder.cgraph: pre-LN layers under `encoder.layer.{i}`, final LN `encoder.ln`."""

    def __init__(self, d: int = 768, heads: int = 12, layers: int = 12) -> None:
        super().__init__()
        self.encoder = nn.Module()
        self.encoder.layer = nn.ModuleList(EncoderLayer(d, heads, 4 * d) for _ in range(layers))
        self.encoder.ln = nn.LayerNorm(d, eps=1e-6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.encoder.layer:
            x = layer(x)
        return self.encoder.ln(x)


class DoubleConv(nn.Module):
    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.conv1, self.bn1 = _conv_bn(cin, cout, 3, 1, 1)
        self.conv2, self.bn2 = _conv_bn(cout, cout, 3, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x))))))


class Down(nn.Module):
    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.conv = DoubleConv(cin, cout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.max_pool2d(x, 2, 2))


class Up(nn.Module):
    def __init__(self, cin: int, cskip: int, cout: int) -> None:
        super().__init__()
        self.upconv = nn.ConvTranspose2d(cin, cin // 2, 2, 2)
        self.conv = DoubleConv(cin // 2 + cskip, cout)

    def forward(self, x: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        return self.conv(torch.cat([self.upconv(x), skip], dim=1))


class UNet(nn.Module):
    """models/unet.cgraph."""

    def __init__(self) -> None:
        super().__init__()
        self.inc = DoubleConv(3, 32)
        self.down1, self.down2 = Down(32, 64), Down(64, 128)
        self.up1, self.up2 = Up(128, 64, 64), Up(64, 32, 32)
        self.outc = nn.Conv2d(32, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        inc = self.inc(x)
        d1 = self.down1(inc)
        d2 = self.down2(d1)
        return torch.sigmoid(self.outc(self.up2(self.up1(d2, d1), inc)))
