"""A trained run in Python: ``load_run`` and ``TrainedRun.embed``, with exactly the preprocessing and model
``deepmetric embed`` uses."""

from __future__ import annotations

import dataclasses
import numbers
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..config import RunConfig
from ..config.validate import set_inference
from ..data.image_inputs import ImageInput, ImagesTable, image_items
from ..devices import resolve_device
from ..errors import CheckpointError, DataError
from ..evaluation import EmbedSettings, embed_table
from ..models import Embedder
from ..models.inference import InferenceForward
from .folder import CHECKPOINTS, RunDir
from .model import model_from_checkpoint


def check_batch_size(batch_size: Any) -> int | None:
    """``batch_size`` as an ``int`` (numpy's integers too), or None; refused when it is not a whole number >= 1 (0 fell
    back to the run's default silently; -1, 2.5 and '4' were errors from torch's DataLoader or a comparison)."""
    if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral)
                                   or batch_size < 1):
        raise DataError(f"batch_size must be a whole number of images, 1 or more (or None: the run's eval.batch_size), "
                        f"not {batch_size!r}")
    return None if batch_size is None else int(batch_size)


class TrainedRun:
    """A trained run's model, ready to embed images exactly as ``deepmetric embed`` does (``load_run`` makes one).

    Attributes:
        path: the run directory.
        config: its resolved config (``RUN/config.yaml``).
        checkpoint: the checkpoint file whose weights were loaded.
        step: the training step of that checkpoint (None when it does not say).
        model: the ``Embedder``, in eval mode while embedding, on ``device``.
        device: where the model runs.
        image_size: the test-time image size (``data.image_size``, unless given at construction: a run loaded by
            an ``Index`` embeds at the size its gallery was embedded at, the index's).
        test_resize: the test-time resize (``data.test_resize``; likewise).

    Examples:
        >>> run = deepmetric.load_run("runs/cub", device="cpu")
        >>> run.embed(["a.jpg", PIL.Image.open("b.png")]).shape   # (2, run.embedding_dim)
    """

    def __init__(self, path: Path, config: RunConfig, model: Embedder, checkpoint: Path, state: dict[str, Any],
                 device: torch.device, image_size: int | None = None, test_resize: str | None = None):
        self.path = path
        self.config = config
        self.model = model
        self.checkpoint = checkpoint
        self.step: int | None = state.get("step")
        self.device = device
        self.image_size: int = config.data.image_size if image_size is None else int(image_size)
        self.test_resize: str = config.data.test_resize if test_resize is None else test_resize
        self._forward: tuple[tuple[Any, ...], InferenceForward] | None = None

    @property
    def embedding_dim(self) -> int:
        """D, the width of the model's embeddings (a head may round the configured size down: DeML's 504 of 512)."""
        return int(self.model.embedding_dim)

    def __repr__(self) -> str:
        return (f"TrainedRun({str(self.path)!r}, checkpoint={self.checkpoint.name!r}, step={self.step}, "
                f"{self.embedding_dim}-d, {self.image_size} px {self.test_resize}, device={str(self.device)!r})")

    def to(self, device: str | torch.device) -> TrainedRun:
        """Move the model to ``device`` (``cpu``, ``cuda``, ``cuda:1``, ``auto``: a GPU when torch sees one);
        returns the run.

        Examples:
            >>> run = deepmetric.load_run("runs/cub").to("cpu")
        """
        target = resolve_device(str(device), setting="device")
        if target != self.device:
            self.model.to(target)
            self.device = target
        return self

    def set_inference(self, amp: str | bool | None = None, compile: bool | None = None) -> TrainedRun:
        """Embed from now on under ``amp``'s autocast (``bf16``, ``fp16``; ``False`` for float32) and, with
        ``compile``, through ``torch.compile`` (the run's ``eval.amp`` and ``eval.compile``; None keeps its setting);
        returns the run. Embeddings stay float32 and l2-normalised.

        Examples:
            >>> run = deepmetric.load_run("runs/cub", device="cuda").set_inference(amp="bf16", compile=True)
        """
        set_inference(self.config, amp, compile)
        return self

    @property
    def forward(self) -> InferenceForward:
        """``model(images)`` as the embedding pass calls it: under the run's ``eval.amp``, compiled with
        ``eval.compile`` (compiled once, reused while the device and settings stay)."""
        settings = EmbedSettings.from_config(self.config, self.device, False)
        key = (self.device, settings.amp, settings.compile)
        if self._forward is None or self._forward[0] != key:
            self._forward = key, settings.forward(self.model)
        return self._forward[1]

    def embed_settings(self, count: int, batch_size: int | None = None, progress: bool | None = None) -> EmbedSettings:
        """How ``count`` images are embedded: the run's settings, as ``deepmetric embed`` takes them
        (``EmbedSettings.from_config``), with this run's size and resize. ``progress`` None: a bar (on standard
        error) when there is more than one batch. A single batch is decoded in this process, without workers."""
        batch_size = check_batch_size(batch_size)
        settings = EmbedSettings.from_config(self.config, self.device, False, batch_size)
        show = count > settings.batch_size if progress is None else progress
        settings = dataclasses.replace(settings, image_size=self.image_size, test_resize=self.test_resize,
                                       progress=show)
        return settings if count > settings.batch_size else dataclasses.replace(settings, num_workers=0)

    def embed(self, images: ImageInput | Sequence[ImageInput], batch_size: int | None = None,
              device: str | torch.device | None = None, progress: bool | None = None) -> np.ndarray:
        """(N, D) float32 l2-normalised embeddings of ``images``, one row per image in order (N = 1 for one image).

        The numbers are those ``deepmetric embed`` writes for the same files: a file is read by the library's reader
        (``deepmetric.data.images.read_image``: any PIL mode to RGB, transparency composited on white), a PIL image
        or array goes through the same ``to_rgb``, then the run's ``TestTransform`` and model, in batches.

        Args:
            images: one image or a list of them: file paths (str or Path), PIL images (any mode), uint8 numpy arrays
                (H, W) gray, (H, W, 3) RGB or (H, W, 4) RGBA, tensors (C, H, W) or (H, W) of uint8 or floats in
                [0, 1]; a 4-D array (N, H, W, C) or tensor (N, C, H, W) is a batch.
            batch_size: images per forward pass (default: the run's ``eval.batch_size``, as the CLI).
            device: move the model there first (it stays there; see ``to``); default: where it is.
            progress: a progress bar on standard error; None: when there is more than one batch.

        Examples:
            >>> x = run.embed(["cat.png", np.zeros((32, 32, 3), np.uint8)])
            >>> x.shape, float(x[0] @ x[1])   # ((2, D), the cosine similarity of the two)
        """
        batch_size = check_batch_size(batch_size)
        items = image_items(images)
        if device is not None:
            self.to(device)
        if not items:
            return np.zeros((0, self.embedding_dim), dtype=np.float32)
        table = ImagesTable.of(items)
        embeddings = embed_table(self.model, table, self.embed_settings(len(items), batch_size, progress))
        return embeddings.astype(np.float32, copy=False)


def load_run(path: str | os.PathLike[str], checkpoint: str | os.PathLike[str] = "auto",
             device: str | torch.device | None = None) -> TrainedRun:
    """Load a trained run directory's model, to embed images with exactly its preprocessing (``TrainedRun.embed``).

    Args:
        path: the run directory (``deepmetric train --out``).
        checkpoint: ``auto`` (the default, as the CLI's ``--checkpoint``): ``best`` when the run has one (it had a
            validation split), else ``last``; ``best`` or ``last`` for that one; or the path of a checkpoint file.
        device: where the model runs (``cpu``, ``cuda``, ``cuda:1``, ``auto``); default (None): the run's
            ``train.device`` as the CLI resolves it, so ``auto``, the usual setting, is a GPU when torch sees one,
            else the CPU. Give ``device="cpu"`` to keep a GPU free, or for a run trained with ``train.device=cuda``
            loaded on a machine without one.

    Examples:
        >>> import deepmetric
        >>> run = deepmetric.load_run("runs/cub")
        >>> run.checkpoint.name, run.embedding_dim, run.image_size   # ('best.safetensors', 512, 224)
        >>> x = run.embed(["a.jpg", "b.png"])                       # == `deepmetric embed runs/cub` of the two files
    """
    run_dir = RunDir(path)
    return open_run(run_dir, run_dir.config(), checkpoint, device)


def open_run(run_dir: RunDir, config: RunConfig, checkpoint: str | os.PathLike[str] = "auto",
             device: str | torch.device | None = None, image_size: int | None = None,
             test_resize: str | None = None) -> TrainedRun:
    """``load_run`` of a run whose config was read already (``config.yaml`` is read once), embedding at
    ``image_size`` with ``test_resize`` when given (an index's, which its gallery was embedded at), else the run's."""
    target = (resolve_device(config.train.device) if device is None
              else resolve_device(str(device), setting="device"))
    if str(checkpoint) in CHECKPOINTS:
        file = run_dir.checkpoint(str(checkpoint))
    else:
        file = Path(checkpoint)
        if not file.is_file():
            raise CheckpointError(f"checkpoint {file} is not a file (give auto, best, last or a checkpoint file)")
    model, state = model_from_checkpoint(file, target)
    model.set_channels_last(config.train.channels_last)
    return TrainedRun(run_dir.path, config, model, file, state, target, image_size, test_resize)
