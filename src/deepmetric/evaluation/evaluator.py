"""Embed a data set split with a model and compute its retrieval metrics."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..data.table import RetrievalTable
from ..data.torch_dataset import ImageDataset, inference_loader, uint8_batches
from ..data.transforms import TestTransform, as_unit_float
from ..distributed import DistContext, gather_rows, shard_rows
from ..models.heads import HeadOutput
from ..models.inference import InferenceForward
from ..models.modes import eval_mode
from ..progress import progress_bar
from .metrics import PerQuery, compute_metrics_per_query
from .rerank import Rerank


@dataclass(frozen=True)
class EmbedSettings:
    """How a table is embedded: what travels together from the config to every embedding pass.

    Args:
        image_size: side of the test image (``data.image_size``).
        test_resize: how it is resized (``data.test_resize``, ``data/resizing.py``).
        batch_size: images per forward pass (``eval.batch_size``).
        device: where the model runs.
        num_workers: DataLoader workers decoding images (``data.num_workers``; None: as ``loader_workers`` says
            for ``device``).
        pin_memory: page-locked batches (``data.pin_memory``; None: on a GPU only).
        progress: show a progress bar.
        amp: the forward pass under ``bf16`` or ``fp16`` autocast, or None for float32 (``eval.amp``).
        compile: the model through ``torch.compile`` (``eval.compile``).
    """

    image_size: int
    test_resize: str = "resize"
    batch_size: int = 128
    device: str | torch.device = "cpu"
    num_workers: int | None = 0
    progress: bool = True
    pin_memory: bool | None = None
    amp: str | None = None
    compile: bool = False

    @classmethod
    def from_config(cls, config: Any, device: str | torch.device, progress: bool = True,
                    batch_size: int | None = None) -> EmbedSettings:
        """The settings of a run's config (``data`` and ``eval`` sections) on ``device``."""
        d, e = config.data, config.eval
        amp = e.amp if isinstance(e.amp, str) else ("bf16" if e.amp else None)  # (``true``: bf16, as train.amp)
        return cls(d.image_size, d.test_resize, batch_size or e.batch_size, device, d.num_workers, progress,
                   d.pin_memory, amp, bool(e.compile))

    def forward(self, model: torch.nn.Module) -> InferenceForward:
        """What the embedding pass calls on each batch: ``model`` under these settings' autocast and compile."""
        return InferenceForward(model, self.device, self.amp, self.compile)


@torch.no_grad()
def embed_outputs(model: torch.nn.Module, table: RetrievalTable, settings: EmbedSettings,
                  select: Callable[[HeadOutput], dict[str, torch.Tensor]], desc: str = "embedding",
                  context: DistContext | None = None) -> dict[str, np.ndarray]:
    """``{name: (N, D) float32}`` for every row of ``table``, in row order: ``select`` picks the named
    tensors of each batch's ``HeadOutput`` (the model runs in eval mode).

    Under torch.distributed (``context``) each rank embeds rows ``rank::world`` and every rank gets all N."""
    context = context or DistContext()
    rows = shard_rows(len(table), context)
    transform = TestTransform(settings.image_size, settings.test_resize, uint8=uint8_batches(settings.device))
    dataset = torch.utils.data.Subset(ImageDataset(table, transform), rows.tolist())
    loader = inference_loader(dataset, settings.batch_size, settings.num_workers, settings.pin_memory, settings.device)
    forward = settings.forward(model)
    chunks: dict[str, list[torch.Tensor]] = {}
    with eval_mode(model):
        for images, _, _ in progress_bar(loader, desc=desc, unit="batch", disable=not settings.progress,
                                         leave=False):
            images = as_unit_float(images.to(settings.device, non_blocking=True))
            for name, value in select(forward(images)).items():
                chunks.setdefault(name, []).append(to_host_queued(value))
    host_copies_done(torch.device(settings.device))
    gathered = {name: torch.cat(values) for name, values in chunks.items()}
    if context.enabled:
        gathered = {name: gather_rows(rows.to(settings.device), len(table), context).cpu()
                    for name, rows in gathered.items()}
    return {name: rows.numpy() for name, rows in gathered.items()}


def to_host_queued(value: torch.Tensor) -> torch.Tensor:
    """``value`` as float32 on the host. From a CUDA tensor the copy is queued into page-locked memory behind the
    batch's kernels instead of waiting for them (a per-batch ``.cpu()`` held the loop until each batch's forward pass
    had run, so the GPU idled while the host fetched and queued the next batch): read it only after
    ``host_copies_done``."""
    value = value.detach().float()
    if value.device.type != "cuda":
        return value.cpu()
    return torch.empty(value.shape, dtype=value.dtype, pin_memory=True).copy_(value, non_blocking=True)


def host_copies_done(device: torch.device) -> None:
    """Wait for the copies ``to_host_queued`` queued on ``device`` (one wait for the whole pass)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def embed_table(model: torch.nn.Module, table: RetrievalTable, settings: EmbedSettings, desc: str = "embedding",
                context: DistContext | None = None) -> np.ndarray:
    """(N, D) float32 l2-normalised embeddings of every row of ``table``, in row order (all N on every rank)."""
    embeddings = embed_outputs(model, table, settings, lambda output: {"embedding": output.embedding}, desc, context)
    return embeddings.get("embedding", np.zeros((0, getattr(model, "embedding_dim", 0)), dtype=np.float32))


def split_metrics(embeddings: np.ndarray, table: RetrievalTable, recall_at: Sequence[int],
                  nmi: bool = True, engine: str = "auto", progress: bool = True,
                  rerank: Rerank | None = None) -> dict[str, float | None]:
    """Metrics of one split's embeddings under its query/gallery flags (``progress``, ``rerank``: as
    ``compute_metrics``).

    Queries are the ``is_query`` rows and the gallery the ``is_gallery`` rows; a row that is both is
    removed from its own ranking by index.
    """
    return split_metrics_per_query(embeddings, table, recall_at, nmi, engine, progress, rerank)[0]


def split_metrics_per_query(embeddings: np.ndarray, table: RetrievalTable, recall_at: Sequence[int],
                            nmi: bool = True, engine: str = "auto", progress: bool = True,
                            rerank: Rerank | None = None) -> tuple[dict[str, float | None], PerQuery]:
    """``split_metrics`` and each query's results (``PerQuery``, the ``is_query`` rows in order), from one ranking."""
    rows = np.arange(len(table))
    query_rows, gallery_rows = rows[table.is_query], rows[table.is_gallery]
    position_in_gallery = np.full(len(table), -1)
    position_in_gallery[gallery_rows] = np.arange(len(gallery_rows))
    self_index = torch.as_tensor(position_in_gallery[query_rows])
    x = torch.nn.functional.normalize(torch.as_tensor(embeddings).float(), dim=1)
    labels = torch.as_tensor(table.labels)
    return compute_metrics_per_query(x[query_rows], labels[query_rows], x[gallery_rows], labels[gallery_rows],
                                     self_index if (self_index >= 0).any() else None, recall_at, nmi, engine=engine,
                                     progress=progress, rerank=rerank)


def evaluate(model: torch.nn.Module, table: RetrievalTable, split: str, settings: EmbedSettings,
             recall_at: Sequence[int] | None = None, nmi: bool = True, engine: str = "auto",
             context: DistContext | None = None) -> dict[str, float | None]:
    """Embed ``split`` of ``table`` and return its retrieval metrics.

    Args:
        model: an ``Embedder`` (any module returning a ``HeadOutput``).
        table: the data set table; ``split`` is ``train``, ``val`` or ``test``.
        settings: how to embed (``EmbedSettings(image_size=224)``, or ``EmbedSettings.from_config``).
        recall_at: the ranks K of Recall@K (default: the data set's standard ranks, thesis §2.6.2).
        nmi: also compute NMI (a k-means of the query embeddings).
        engine: the exact kNN engine (``evaluation/engines.py``).
        context: torch.distributed ranks sharing the embedding pass.

    Returns:
        ``{"recall@K": ..., "map@r": ..., "r_precision": ..., "nmi": ...}`` as fractions (``nmi`` None when
        undefined), as ``retrieval_metrics``.
    """
    part = table.split(split)
    embeddings = embed_table(model, part, settings, desc=f"embedding {split}", context=context)
    return split_metrics(embeddings, part, recall_at or table.recall_at, nmi, engine, settings.progress)
