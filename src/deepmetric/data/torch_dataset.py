"""The bridge from a ``RetrievalTable`` to torch's ``DataLoader``."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from .sampler import PKSampler
from .table import RetrievalTable


class ImageDataset(Dataset):
    """Items are ``(image tensor, label, row)``; an item key is a row or a ``(row, seed)`` pair."""

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


def training_loader(dataset: ImageDataset, sampler: PKSampler, num_workers: int = 0) -> DataLoader:
    return DataLoader(dataset, batch_sampler=sampler, num_workers=num_workers,
                      persistent_workers=num_workers > 0)


def inference_loader(dataset: ImageDataset, batch_size: int, num_workers: int = 0) -> DataLoader:
    return DataLoader(dataset, batch_size=batch_size, shuffle=False, num_workers=num_workers)
