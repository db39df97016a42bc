"""``data.cache``: the training split decoded once, the augmentation run on the training device.

``ImageCache.build`` reads every training image once with the table's own reader (``RetrievalTable.image``: the
same RGB conversion, bounding-box crop and checks as without the cache), keeps it as uint8 at ``cached_size`` (at
most the longest side the augmentation can ask for, ``ceil(hi x image_size)``: larger pixels would only be thrown
away by every crop, and a bounded size is what lets a batch be one tensor) and holds all of them on the training
device when it is a GPU with room for them, else in this process's memory. It first estimates the bytes from the
image headers and refuses, saying what to do, when they would not fit.

``CachedBatches`` then yields what the DataLoader yields, ``(images, labels, rows)``, for each batch of the P x K
sampler: the images augmented on the device by ``BatchedTrainTransform`` from the sampler's per-sample seeds, so
the trainer does not know which of the two fed it, and a resumed run sees the batches of an uninterrupted one. On a
GPU each batch is made one ahead by a background thread (``prefetch.py``) while the GPU runs the step before.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from ..errors import DataError
from ..progress import progress_bar
from .batched_transforms import BatchedTrainTransform, cache_image, cached_size, largest_side
from .images import clip_box
from .prefetch import prefetched
from .table import RetrievalTable

log = logging.getLogger("deepmetric")

HOST_SHARE = 0.8
"""The largest share of the memory available to this process that the cache may take on the CPU."""
GPU_SHARE = 0.5
"""The largest share of the GPU's free memory that the cache may take (the rest is the training step's)."""


def available_memory() -> int:
    """Bytes of memory available to new allocations (``MemAvailable`` of /proc/meminfo; elsewhere the free
    physical pages)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def free_gpu_memory(device: torch.device) -> int:
    """Bytes free on CUDA ``device``."""
    return int(torch.cuda.mem_get_info(device)[0])


def read_shape(table: RetrievalTable, row: int) -> tuple[int, int]:
    """(height, width) of row ``row`` as ``table.image`` gives it, from the file's header (no decoding)."""
    if isinstance(table.images, np.ndarray):  # in memory
        height, width = table.images.shape[1:3]
    else:
        try:
            with Image.open(table.images[row]) as image:
                width, height = image.size
        except (OSError, ValueError, SyntaxError) as error:
            raise DataError(f"image {table.describe(row)} cannot be read: {error}") from None
    if table.boxes is not None:
        box = clip_box(table.boxes[row], width, height)
        if box is None:  # table.image names the problem when it reads it
            return 1, 1
        width, height = box[2] - box[0], box[3] - box[1]
    return int(height), int(width)


def _bytes_text(count: float) -> str:
    """``count`` bytes in GiB, or below one GiB in MiB, below one MiB in KiB (a glyphs cache of 66 MiB read
    "0.06 GiB", a test's of 10 KiB "0.00 GiB")."""
    if count >= 2**30:
        return f"{count / 2**30:.2f} GiB"
    return f"{count / 2**20:.1f} MiB" if count >= 2**20 else f"{count / 2**10:.1f} KiB"


def cache_device(needed: int, device: torch.device) -> torch.device:
    """Where a cache of ``needed`` bytes for training on ``device`` is kept: on it when it is a GPU where they take at
    most ``GPU_SHARE`` of its free memory, else (saying so for a GPU) in this process's memory."""
    if device.type != "cuda":
        return torch.device("cpu")
    free = free_gpu_memory(device)
    if needed <= GPU_SHARE * free:
        return device
    log.info("data.cache: %s of images would take more than %.0f%% of the GPU's free %s; kept in memory and copied "
             "a batch at a time", _bytes_text(needed), 100 * GPU_SHARE, _bytes_text(free))
    return torch.device("cpu")


class ImageCache:
    """The decoded training images: ``images[i]`` (3, h, w) uint8 and ``shapes[i]`` its (height, width) as read,
    for row i of the table it was built from; ``device`` where they are kept."""

    def __init__(self, images: list[torch.Tensor], shapes: list[tuple[int, int]], device: torch.device):
        self.images, self.shapes, self.device = images, shapes, device

    @property
    def nbytes(self) -> int:
        return sum(image.numel() for image in self.images)

    @staticmethod
    def estimate(table: RetrievalTable, size: int, resize_range: tuple[float, float], pad: str,
                 progress: bool = False) -> tuple[list[tuple[int, int]], int]:
        """Each row's shape as read and the bytes of all rows at ``cached_size``."""
        rows: Iterable[int] = range(len(table))
        if not table.in_memory:
            rows = progress_bar(rows, desc="cache: image sizes", unit="image", disable=not progress)
        shapes = [read_shape(table, row) for row in rows]
        return shapes, sum(3 * h * w for h, w in (cached_size(*s, size, resize_range, pad) for s in shapes))

    @classmethod
    def build(cls, table: RetrievalTable, size: int, resize_range: tuple[float, float], pad: str,
              device: str | torch.device = "cpu", progress: bool = False) -> ImageCache:
        """Decode every row of ``table`` at ``cached_size`` onto ``device`` when it is a GPU where the images take
        at most ``GPU_SHARE`` of its free memory, else into this process's memory, if they take at most
        ``HOST_SHARE`` of what is available there (else DataError, before decoding anything)."""
        shapes, needed = cls.estimate(table, size, resize_range, pad, progress)
        where = cache_device(needed, torch.device(device))
        if where.type == "cpu":
            available = available_memory()
            if needed > HOST_SHARE * available:
                limit = largest_side(size, resize_range)
                raise DataError(
                    f"data.cache: the {len(table):,} training images decoded (longer side up to {limit} px, "
                    f"ceil(data.resize_range[1] x data.image_size)) need about {_bytes_text(needed)}, more than "
                    f"{100 * HOST_SHARE:.0f}% of the {_bytes_text(available)} of memory available; set "
                    f"data.cache=false (images are then decoded for each batch), or lower data.image_size or "
                    f"data.resize_range[1]")
        images = []
        for row in progress_bar(range(len(table)), desc="cache: decoding", unit="image", disable=not progress):
            image = cache_image(table.image(row), size, resize_range, pad)
            images.append(image.to(where))
        cache = cls(images, shapes, where)
        log.info("data.cache: %d training images decoded once, %s on %s", len(images), _bytes_text(cache.nbytes), where)
        return cache


class CachedBatches:
    """The training batches of ``sampler`` from ``cache``: ``(images, labels, rows)`` as the DataLoader gives them,
    with images (B, 3, size, size) float in [0, 1] and labels on ``device``; made one ahead by a background thread
    with ``prefetch`` (default: on a GPU, where the thread's work overlaps the step's; on the CPU both would share the
    same cores)."""

    def __init__(self, cache: ImageCache, sampler: Iterable[list[tuple[int, int]]], labels: np.ndarray,
                 transform: BatchedTrainTransform, device: str | torch.device, prefetch: bool | None = None):
        self.cache, self.sampler, self.transform = cache, sampler, transform
        self.labels = torch.as_tensor(np.asarray(labels, dtype=np.int64))
        self.device = torch.device(device)
        self.prefetch = self.device.type == "cuda" if prefetch is None else prefetch

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        return prefetched(self._batches()) if self.prefetch else self._batches()

    def _batches(self) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        for batch in self.sampler:
            rows = torch.tensor([row for row, _ in batch], dtype=torch.int64)
            images = self.transform([self.cache.images[row] for row, _ in batch],
                                    [self.cache.shapes[row] for row, _ in batch], [seed for _, seed in batch],
                                    self.device)
            yield images, self.labels[rows].to(self.device, non_blocking=True), rows

