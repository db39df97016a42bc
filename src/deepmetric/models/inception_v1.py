"""The original Inception-v1 (Caffe's ``bvlc_googlenet``), which ABE, DIABLO, HORDE and DeML used.

torchvision's ``googlenet`` differs: it builds the "5x5" branch with a 3x3 convolution and uses
BatchNorm instead of convolution biases. The papers' parameter counts hold for this architecture only
(GoogLeNet without classifier + a 1024 -> 512 embedding = 6,497,840 = ABE Table 1's 0.65 x 10^7).
No pretrained weights ship here; a converted Caffe state dict with these module names can be loaded
from a safetensors file (``model.weights``). Caffe's preprocessing is BGR, 0-255, mean-subtracted.
"""

from __future__ import annotations

import functools

import torch
from torch import nn


def conv_relu(cin: int, cout: int, kernel: int, stride: int = 1, padding: int = 0) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, kernel, stride, padding, bias=True), nn.ReLU(inplace=True))


class Inception(nn.Module):
    """Four parallel branches concatenated: 1x1 | 1x1 -> 3x3 | 1x1 -> 5x5 | 3x3 max-pool -> 1x1."""

    def __init__(self, cin: int, c1: int, c3r: int, c3: int, c5r: int, c5: int, cp: int):
        super().__init__()
        self.branch1 = conv_relu(cin, c1, 1)
        self.branch3 = nn.Sequential(conv_relu(cin, c3r, 1), conv_relu(c3r, c3, 3, padding=1))
        self.branch5 = nn.Sequential(conv_relu(cin, c5r, 1), conv_relu(c5r, c5, 5, padding=2))
        self.branch_pool = nn.Sequential(nn.MaxPool2d(3, stride=1, padding=1), conv_relu(cin, cp, 1))
        self.out_channels = c1 + c3 + c5 + cp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.branch1(x), self.branch3(x), self.branch5(x), self.branch_pool(x)], dim=1)


# (name, c1, c3 reduce, c3, c5 reduce, c5, pool proj) of bvlc_googlenet's deploy.prototxt
INCEPTION_BLOCKS = {
    "inception3a": (192, 64, 96, 128, 16, 32, 32),
    "inception3b": (256, 128, 128, 192, 32, 96, 64),
    "inception4a": (480, 192, 96, 208, 16, 48, 64),
    "inception4b": (512, 160, 112, 224, 24, 64, 64),
    "inception4c": (512, 128, 128, 256, 24, 64, 64),
    "inception4d": (512, 112, 144, 288, 32, 64, 64),
    "inception4e": (528, 256, 160, 320, 32, 128, 128),
    "inception5a": (832, 256, 160, 320, 32, 128, 128),
    "inception5b": (832, 384, 192, 384, 48, 128, 128),
}


def inception_v1_stages() -> list[tuple[str, nn.Module, int, int]]:
    """The network as ``(name, module, out_channels, stride)`` stages, up to inception 5b (no classifier)."""
    lrn = functools.partial(nn.LocalResponseNorm, size=5, alpha=1e-4, beta=0.75)
    stem = nn.Sequential(
        conv_relu(3, 64, 7, stride=2, padding=3),
        nn.MaxPool2d(3, stride=2, ceil_mode=True),
        lrn(),
        conv_relu(64, 64, 1),
        conv_relu(64, 192, 3, padding=1),
        lrn(),
        nn.MaxPool2d(3, stride=2, ceil_mode=True),
    )
    stages: list[tuple[str, nn.Module, int, int]] = [("conv", stem, 192, 8)]
    stride = 8
    for name, spec in INCEPTION_BLOCKS.items():
        block = Inception(*spec)
        stages.append((name, block, block.out_channels, stride))
        if name in ("inception3b", "inception4e"):
            stride *= 2
            pool_name = "pool3" if name == "inception3b" else "pool4"
            stages.append((pool_name, nn.MaxPool2d(3, stride=2, ceil_mode=True), block.out_channels, stride))
    return stages
