"""The bridge from a ``RetrievalTable`` to torch's ``DataLoader``."""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from .sampler import PKSampler
from .table import RetrievalTable


class ImageDataset(Dataset):
    """Items are ``(image tensor, label, row)``; an item key is a row or a ``(row, seed)`` pair.

    ``transform(image, seed)`` makes the tensor (``TrainTransform``: the augmentation is a function of the seed;
    ``TestTransform`` ignores it); ``labels`` replaces the table's (the trainer gives class indices). With a
    ``PKSampler`` as the ``DataLoader``'s ``batch_sampler``, each key is ``(row, seed)``: the batches and their
    augmentations are those ``deepmetric train`` draws for the same seed.
    """

    def __init__(self, table: RetrievalTable, transform: Callable[[np.ndarray, int], torch.Tensor],
                 labels: np.ndarray | None = None):
        self.table = table
        self.transform = transform
        self.labels = table.labels if labels is None else np.asarray(labels, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.table)

    def __getitem__(self, key: int | tuple[int, int]) -> tuple[torch.Tensor, int, int]:
        row, seed = key if isinstance(key, tuple) else (key, 0)
        return self.transform(self.table.image(row), seed), int(self.labels[row]), row


CUDA_WORKERS = 12
"""Most DataLoader workers by default on a GPU: on an H200 with 16 CPUs, 12 workers with pinned batches fed the
emoji GAP run at 224 px at 0.87 (float32) and 1.10 (bf16) of its rate on batches already on the GPU, 6 workers
at 0.68 and 0.72, unpinned batches at 0.63 (docs/benchmarks/gpu.md, "3. The real data path")."""


def loader_workers(num_workers: int | None, device: str | torch.device = "cpu") -> int:
    """``data.num_workers`` as the loader takes it. None: 0 on the CPU (workers would only compete with training
    for its cores), and on a GPU ``CUDA_WORKERS`` or, with fewer CPUs, all but one of this process's share of them
    (``LOCAL_WORLD_SIZE`` processes on the machine)."""
    if num_workers is not None:
        return num_workers
    if torch.device(device).type != "cuda":
        return 0
    share = (os.cpu_count() or 1) // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    return max(0, min(CUDA_WORKERS, share - 1))


def loader_pins(pin_memory: bool | None, device: str | torch.device = "cpu") -> bool:
    """``data.pin_memory`` as the loader takes it. None: page-locked batches on a GPU only (their copy to the GPU
    overlaps the step), none on the CPU."""
    return torch.device(device).type == "cuda" if pin_memory is None else pin_memory


def uint8_batches(device: str | torch.device = "cpu") -> bool:
    """Whether the trainer's and the embedding pass's loaders carry uint8 pixels (``TrainTransform`` and
    ``TestTransform`` with ``uint8=True``), made floats on the device by ``transforms.as_unit_float``: on a GPU, where
    the batches cross from the loader's workers to the training process and are copied to the GPU, a quarter of the
    bytes each time (``benchmarks/loader_dtype.py``). Not on the CPU, where the float conversion would only move from
    the transform to the loop: the same floats either way, bit for bit."""
    return torch.device(device).type == "cuda"


def training_loader(dataset: ImageDataset, sampler: PKSampler, num_workers: int | None = 0,
                    pin_memory: bool | None = None, device: str | torch.device = "cpu") -> DataLoader:
    """The training batches of ``sampler``; ``num_workers`` and ``pin_memory`` as ``loader_workers`` and
    ``loader_pins`` resolve them for ``device``."""
    workers = loader_workers(num_workers, device)
    return DataLoader(dataset, batch_sampler=sampler, num_workers=workers, pin_memory=loader_pins(pin_memory, device),
                      persistent_workers=workers > 0)


def inference_loader(dataset: Dataset, batch_size: int, num_workers: int | None = 0,
                     pin_memory: bool | None = None, device: str | torch.device = "cpu") -> DataLoader:
    """Batches of ``dataset`` in order; workers and pinning as in ``training_loader``."""
    return DataLoader(dataset, batch_size=batch_size, shuffle=False, num_workers=loader_workers(num_workers, device),
                      pin_memory=loader_pins(pin_memory, device))
