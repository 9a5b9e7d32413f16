"""Independent PyTorch implementations of the convolutional model families in models/
(MobileNetV3 and ConvNeXt as torchvision builds them, YOLOv8's SPPF as ultralytics does), from
torch.nn layers: the same module tree, so the same state_dict keys in the same order, and the same
forward computation. Sizes are arguments where tests shrink them; the defaults are the ones the
.cgraph files declare."""

from __future__ import annotations

import torch
from torch import nn

# ---- MobileNetV3 (torchvision.models.mobilenetv3) ------------------------------------------------

def _conv_norm_act(cin: int, cout: int, k: int, stride: int = 1, groups: int = 1,
                   act: type[nn.Module] | None = nn.Hardswish) -> nn.Sequential:
    """torchvision.ops.Conv2dNormActivation with MobileNetV3's BatchNorm2d(eps=0.001)."""
    layers: list[nn.Module] = [nn.Conv2d(cin, cout, k, stride, (k - 1) // 2, groups=groups,
                                         bias=False), nn.BatchNorm2d(cout, eps=0.001)]
    if act is not None:
        layers.append(act())
    return nn.Sequential(*layers)


class SqueezeExcitation(nn.Module):
    """torchvision.ops.SqueezeExcitation with MobileNetV3's hardsigmoid gate."""

    def __init__(self, channels: int, squeeze: int) -> None:
        super().__init__()
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Conv2d(channels, squeeze, 1)
        self.fc2 = nn.Conv2d(squeeze, channels, 1)
        self.activation = nn.ReLU()
        self.scale_activation = nn.Hardsigmoid()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = self.fc2(self.activation(self.fc1(self.avgpool(x))))
        return self.scale_activation(scale) * x


class InvertedResidual(nn.Module):
    """torchvision's InvertedResidual for a block that expands, has SE and uses hardswish."""

    def __init__(self, cin: int, expanded: int, cout: int, k: int = 3, stride: int = 1) -> None:
        super().__init__()
        self.use_res_connect = stride == 1 and cin == cout
        self.block = nn.Sequential(
            _conv_norm_act(cin, expanded, 1),
            _conv_norm_act(expanded, expanded, k, stride, groups=expanded),
            SqueezeExcitation(expanded, _make_divisible(expanded // 4, 8)),
            _conv_norm_act(expanded, cout, 1, act=None))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.block(x)
        return y + x if self.use_res_connect else y


def _make_divisible(v: float, divisor: int) -> int:
    """torchvision's rounding of channel counts to a multiple of `divisor` (never 10% below)."""
    new_v = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return new_v + divisor if new_v < 0.9 * v else new_v


class MobileNetV3Blocks(nn.Module):
    """models/mobilenet_v3.cgraph: `features.11` (80 -> 112) and `features.12` (112, residual)
    of mobilenet_v3_large."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.ModuleDict({"11": InvertedResidual(80, 480, 112),
                                       "12": InvertedResidual(112, 672, 112)})

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        for block in self.features.values():
            features = block(features)
        return features


# ---- ConvNeXt (torchvision.models.convnext) ------------------------------------------------------

class Permute(nn.Module):
    def __init__(self, dims: list[int]) -> None:
        super().__init__()
        self.dims = dims

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.permute(x, self.dims)


class CNBlock(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.block = nn.Sequential(
            nn.Conv2d(dim, dim, kernel_size=7, padding=3, groups=dim, bias=True),
            Permute([0, 2, 3, 1]), nn.LayerNorm(dim, eps=1e-6),
            nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim),
            Permute([0, 3, 1, 2]))
        self.layer_scale = nn.Parameter(torch.ones(dim, 1, 1) * 1e-6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer_scale * self.block(x) + x  # stochastic depth: identity in eval


class ConvNeXtStage1(nn.Module):
    """models/convnext.cgraph: `features.1` of convnext_tiny, three blocks."""

    def __init__(self, dim: int = 96) -> None:
        super().__init__()
        self.features = nn.ModuleDict({"1": nn.Sequential(*(CNBlock(dim) for _ in range(3)))})

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.features["1"](features)


# ---- YOLOv8 SPPF (ultralytics.nn.modules) --------------------------------------------------------

class Conv(nn.Module):
    """ultralytics' Conv: conv without bias, BatchNorm2d (eps 1e-3, as initialize_weights sets
    it), SiLU."""

    def __init__(self, cin: int, cout: int, k: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, k, 1, k // 2, bias=False)
        self.bn = nn.BatchNorm2d(cout, eps=1e-3)
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.bn(self.conv(x)))


class SPPF(nn.Module):
    def __init__(self, cin: int, cout: int, k: int = 5) -> None:
        super().__init__()
        hidden = cin // 2
        self.cv1 = Conv(cin, hidden, 1)
        self.cv2 = Conv(hidden * 4, cout, 1)
        self.m = nn.MaxPool2d(kernel_size=k, stride=1, padding=k // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = [self.cv1(x)]
        y.extend(self.m(y[-1]) for _ in range(3))
        return self.cv2(torch.cat(y, 1))


class YoloSPPF(nn.Module):
    """models/yolo_sppf.cgraph: layer `model.9` of YOLOv8s."""

    def __init__(self, c: int = 512) -> None:
        super().__init__()
        self.model = nn.ModuleDict({"9": SPPF(c, c)})

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.model["9"](features)
