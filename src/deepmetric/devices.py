"""Where deepmetric computes: ``train.device`` (or a command's ``--device``) as a torch device."""

from __future__ import annotations

import torch

from .errors import DeepMetricError

COMPUTE_DEVICES = ("cpu", "cuda")
"""The device types deepmetric runs a model on (torch knows 20 more: ``meta`` holds shapes without numbers)."""


def resolve_device(name: str, local_rank: int = 0, setting: str = "train.device") -> torch.device:
    """``train.device`` as a device (auto: this rank's GPU, else the CPU). ``cuda`` without an index is this rank's
    GPU too (``cuda:LOCAL_RANK``). A GPU becomes the current CUDA device, so that CUDA work given no device (NCCL's
    collectives, the cuda kNN engine) runs on it, not on GPU 0. ``setting`` names where ``name`` came from in the
    errors (``train.device``, or ``device`` for a command's ``--device`` or a Python ``device=``)."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise DeepMetricError(f"{setting}={name} but torch sees no CUDA device")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise DeepMetricError(f"device '{name}' is not one torch knows: give auto, cpu, cuda or cuda:N") from None
    if device.type not in COMPUTE_DEVICES:  # load_run(device='meta') loaded a run that could embed nothing
        raise DeepMetricError(f"device '{name}' is not one deepmetric computes on: give auto, cpu, cuda or cuda:N")
    if device.type == "cuda":
        if device.index is None:  # torch.cuda.set_device refuses a device without an index
            device = torch.device("cuda", local_rank)
        if device.index >= torch.cuda.device_count():
            raise DeepMetricError(f"{setting}={name} is GPU {device.index}, but torch sees "
                                  f"{torch.cuda.device_count()} CUDA device(s)")
        torch.cuda.set_device(device)
    return device
