"""BN-Inception (Ioffe & Szegedy 2015, "Inception-v2"), the backbone of the thesis's BN-Inception rows
(HORDE Tables 5.1-5.2, MIRAGE) and of much of the field (multi-similarity, SoftTriple, ...).

The topology is the Caffe model that the field's PyTorch code converts (Cadene's ``pretrainedmodels``
``bninception``): convolutions with biases, each followed by BatchNorm and a ReLU; blocks of a 1x1 branch, a
1x1 -> 3x3 branch, a 1x1 -> 3x3 -> 3x3 branch and a 3x3 pooling branch (average, projected by a 1x1; max in
5b); blocks 3c and 4e halve the resolution (stride-2 3x3s and a max-pool, no 1x1 branch, no projection).
Pools round up (Caffe's ``ceil_mode``). Input: BGR, 0-255, minus the mean (104, 117, 128).

No weights ship here. ``bn_inception_state`` renames a converted state dict (``inception_3a_3x3_reduce_bn.
running_mean``, BatchNorm vectors stored as (1, C), the classifier ``last_linear`` or ``fc``) to these
modules, so that the usual file loads with ``model.weights`` (and ``model.trust_pickle`` for a ``.pth``).
"""

from __future__ import annotations

import re
from typing import cast

import torch
from torch import nn


def conv_bn_relu(cin: int, cout: int, kernel: int, stride: int = 1, padding: int = 0) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, kernel, stride, padding, bias=True), nn.BatchNorm2d(cout),
                         nn.ReLU(inplace=True))


class BNInceptionBlock(nn.Module):
    """``1x1 | 3x3_reduce -> 3x3 | double_3x3_reduce -> double_3x3_1 -> double_3x3_2 | pool (-> pool_proj)``,
    concatenated in that order. ``stride=2`` (3c, 4e): no 1x1 branch, stride-2 last 3x3s, a stride-2 max-pool
    without projection."""

    def __init__(self, cin: int, c1: int, c3r: int, c3: int, d3r: int, d3: int, pool: str, proj: int,
                 stride: int = 1):
        super().__init__()
        branches: dict[str, nn.Module] = {}
        if c1:
            branches["1x1"] = conv_bn_relu(cin, c1, 1)
        branches["3x3_reduce"] = conv_bn_relu(cin, c3r, 1)
        branches["3x3"] = conv_bn_relu(c3r, c3, 3, stride, 1)
        branches["double_3x3_reduce"] = conv_bn_relu(cin, d3r, 1)
        branches["double_3x3_1"] = conv_bn_relu(d3r, d3, 3, 1, 1)
        branches["double_3x3_2"] = conv_bn_relu(d3, d3, 3, stride, 1)
        if pool == "avg":
            branches["pool"] = nn.AvgPool2d(3, stride=1, padding=1, ceil_mode=True, count_include_pad=True)
        elif stride == 2:
            branches["pool"] = nn.MaxPool2d(3, stride=2, ceil_mode=True)
        else:
            branches["pool"] = nn.MaxPool2d(3, stride=1, padding=1, ceil_mode=True)
        if proj:
            branches["pool_proj"] = conv_bn_relu(cin, proj, 1)
        for name, module in branches.items():
            self.add_module(name, module)  # the converted model's names, some not identifiers ("1x1")
        self.out_channels = c1 + c3 + d3 + (proj or cin)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        branch = cast(dict[str, nn.Module], self._modules)  # each entry is a module __init__ added, never None
        outputs = [branch["1x1"](x)] if "1x1" in branch else []
        outputs.append(branch["3x3"](branch["3x3_reduce"](x)))
        outputs.append(branch["double_3x3_2"](branch["double_3x3_1"](branch["double_3x3_reduce"](x))))
        pooled = branch["pool"](x)
        outputs.append(branch["pool_proj"](pooled) if "pool_proj" in branch else pooled)
        return torch.cat(outputs, dim=1)


# (block, c1, 3x3 reduce, 3x3, double reduce, double 3x3, pool, pool proj, stride), from the converted
# Caffe model's layer shapes; input channels follow from the previous block.
BLOCKS = (
    ("3a", 64, 64, 64, 64, 96, "avg", 32, 1),
    ("3b", 64, 64, 96, 64, 96, "avg", 64, 1),
    ("3c", 0, 128, 160, 64, 96, "max", 0, 2),
    ("4a", 224, 64, 96, 96, 128, "avg", 128, 1),
    ("4b", 192, 96, 128, 96, 128, "avg", 128, 1),
    ("4c", 160, 128, 160, 128, 160, "avg", 128, 1),
    ("4d", 96, 128, 192, 160, 192, "avg", 128, 1),
    ("4e", 0, 128, 192, 192, 256, "max", 0, 2),
    ("5a", 352, 192, 320, 160, 224, "avg", 128, 1),
    ("5b", 352, 192, 320, 192, 224, "max", 128, 1),
)


def bn_inception_stages() -> list[tuple[str, nn.Module, int, int]]:
    """The network as ``(name, module, out_channels, stride)`` stages, up to inception 5b (no classifier):
    ``conv`` (the stem, 192 channels at stride 8), then ``inception3a`` ... ``inception5b``."""
    stem = nn.Sequential()
    stem.add_module("conv1_7x7_s2", conv_bn_relu(3, 64, 7, 2, 3))
    stem.add_module("pool1_3x3_s2", nn.MaxPool2d(3, stride=2, ceil_mode=True))
    stem.add_module("conv2_3x3_reduce", conv_bn_relu(64, 64, 1))
    stem.add_module("conv2_3x3", conv_bn_relu(64, 192, 3, 1, 1))
    stem.add_module("pool2_3x3_s2", nn.MaxPool2d(3, stride=2, ceil_mode=True))
    stages: list[tuple[str, nn.Module, int, int]] = [("conv", stem, 192, 8)]
    channels, stride = 192, 8
    for name, c1, c3r, c3, d3r, d3, pool, proj, block_stride in BLOCKS:
        block = BNInceptionBlock(channels, c1, c3r, c3, d3r, d3, pool, proj, block_stride)
        channels, stride = block.out_channels, stride * block_stride
        stages.append((f"inception{name}", block, channels, stride))
    return stages


_STEM_KEY = re.compile(r"^(conv1_7x7_s2|conv2_3x3_reduce|conv2_3x3)(_bn)?\.(\w+)$")
_BLOCK_KEY = re.compile(r"^inception_(\d[a-e])_(\w+?)(_bn)?\.(\w+)$")


def bn_inception_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A converted BN-Inception state dict in this module's names (see the module docstring): ``conv1_7x7_s2``
    -> ``conv.conv1_7x7_s2.0`` (``_bn``: ``.1``), ``inception_3a_double_3x3_1_bn`` -> ``inception3a.
    double_3x3_1.1``; BatchNorm vectors stored as (1, C) become (C,); the classifier is dropped. Keys already
    in this naming pass through."""
    renamed = {}
    for key, value in state.items():
        if key.split(".")[0] in ("last_linear", "fc"):
            continue
        stem, block = _STEM_KEY.match(key), _BLOCK_KEY.match(key)
        if stem:
            key = f"conv.{stem[1]}.{1 if stem[2] else 0}.{stem[3]}"
        elif block:
            key = f"inception{block[1]}.{block[2]}.{1 if block[3] else 0}.{block[4]}"
        renamed[key] = value.squeeze(0) if value.dim() == 2 and value.shape[0] == 1 else value
    return renamed
