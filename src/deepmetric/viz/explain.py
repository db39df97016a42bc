"""``deepmetric explain``: what a trained run's head attends to (DGML §3.3, eqs. 9-10; Figures 3-4).

Two jobs, for any head that returns ``HeadOutput.attention`` (B, P, h, w):

- ``explain_images``: for each image, every group's map upsampled to the network's input and overlaid;
- ``explain_dataset``: for each group, the ``top`` images of a data set split whose map reaches the
  highest weight (the paper's "12 attention maps containing the top attentive weights"; the selection
  rule is unstated, the peak of each map is used), one row per group.

Images are shown as the network saw them (the run's test-time resize). A head without attention maps
stops with one message before anything is written.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import torch

from ..config import RunConfig
from ..data import check_data_path, load_dataset
from ..data.listing import files_table, first_of_each, folder_holding, image_sources, list_images_of
from ..data.table import RetrievalTable
from ..data.torch_dataset import ImageDataset, inference_loader
from ..data.transforms import TestTransform
from ..devices import resolve_device
from ..errors import DataError, DeepMetricError
from ..io.files import atomic_write_bytes
from ..models import Embedder
from ..models.heads import HEADS, head_class
from ..progress import progress_bar
from ..runs.checkpoint import checkpoint_state
from ..runs.folder import RunDir
from ..runs.model import load_run_model
from .overlays import image_overlays, top_images_grid


def no_maps(head: str) -> DeepMetricError:
    """The error for a head without attention maps, naming the heads that have them."""
    with_maps = ", ".join(name for name in sorted(HEADS) if head_class(name).has_attention_maps)
    return DeepMetricError(f"head '{head}' returns no attention maps, so there is nothing to explain; explain works "
                           f"with heads that attend over positions ({with_maps})")


def check_head_has_maps(run_dir: str | Path, which: str) -> None:
    """Refuse a run whose head declares no attention maps (``Head.has_attention_maps``), from its checkpoint's header
    alone: building and loading a GAP run's model took 12 s before the same refusal. A spec that does not name a
    head deepmetric has is left to the loader, which names what is wrong with it."""
    spec = checkpoint_state(RunDir(run_dir).checkpoint(which)).get("model_spec")
    head = spec.get("head") if isinstance(spec, dict) else None
    if isinstance(head, str) and head in HEADS and not head_class(head).has_attention_maps:
        raise no_maps(head)


def _load(run_dir: str | Path, which: str) -> tuple[Embedder, RunConfig, torch.device]:
    """The run's model in eval mode; stops here, before any data is read, if its head has no attention (from the
    checkpoint's header, before the model is built)."""
    check_head_has_maps(run_dir, which)
    device = resolve_device(RunDir(run_dir).config().train.device)
    model, config, _ = load_run_model(run_dir, which, device)
    size = config.data.image_size
    with torch.no_grad():  # the declaration kept by its output (tests/test_head_contract.py checks each head)
        if model.eval()(torch.zeros(1, 3, size, size, device=device)).attention is None:
            raise no_maps(model.spec["head"])
    return model, config, device


def _attention_batches(model: Embedder, table: RetrievalTable, config: RunConfig, device: torch.device,
                       batch_size: int | None, progress: bool) -> Iterator[tuple[torch.Tensor, ...]]:
    """Yield (input images (B, 3, H, W), attention (B, P, h, w) on CPU, table rows)."""
    dataset = ImageDataset(table, TestTransform(config.data.image_size, config.data.test_resize))
    loader = inference_loader(dataset, batch_size or config.eval.batch_size, config.data.num_workers,
                              config.data.pin_memory, device)
    for images, _, rows in progress_bar(loader, desc="attention", unit="batch", disable=not progress, leave=False):
        with torch.no_grad():
            attention = model(images.to(device)).attention
        yield images, attention.float().cpu(), rows


def _as_image(tensor: torch.Tensor) -> np.ndarray:
    """(3, H, W) in [0, 1] -> (H, W, 3) array for drawing."""
    return tensor.permute(1, 2, 0).clamp(0, 1).numpy()


def output_names(files: list[Path], root: Path) -> list[str]:
    """One distinct PNG name per image: its path under ``root`` without suffix, ``__`` between folders
    (``sub/x.jpg`` -> ``sub__x.png``); a name that repeats (``dup.jpg`` beside ``dup.png``, ``sub/x.png`` beside
    ``sub__x.png``) gets ``-2``, ``-3``, … in the order of ``files`` (two images had written one overlay)."""
    names, taken = [], set()
    for file in files:
        relative = file.relative_to(root) if root.is_dir() else Path(file.name)
        stem = "__".join(relative.with_suffix("").parts)
        name, number = f"{stem}.png", 1
        while name.lower() in taken:  # case-insensitive file systems too
            number += 1
            name = f"{stem}-{number}.png"
        taken.add(name.lower())
        names.append(name)
    return names


def overlay_files(sources: list[str | os.PathLike]) -> tuple[Path, list[Path]]:
    """``(root, files)``: the images of ``sources`` (``image_sources``) and the folder their overlays are named
    below (``output_names``): the path given, or for several the folder holding all their images, whose files are
    then absolute and each drawn once (``first_of_each``: an image given twice would write two overlays)."""
    files = list_images_of(sources)
    if len(sources) == 1:
        return Path(sources[0]), files
    files = first_of_each([Path(os.path.abspath(file)) for file in files], {})
    return folder_holding(files), files


def explain_images(run_dir: str | Path, images: str | Path | Sequence[str | Path], out: str | Path,
                   which: str = "auto", batch_size: int | None = None, progress: bool = True) -> list[Path]:
    """Write ``OUT/<image>.png`` per image: the input and each group's upsampled attention over it. ``images`` is
    an image, a folder or a ``.txt`` list, or several of these (``overlay_files``)."""
    sources = image_sources(images)
    root, files = overlay_files(sources)  # a missing image is named before the model loads
    model, config, device = _load(run_dir, which)
    table = files_table(" ".join(map(str, sources)), files)
    out = Path(out)
    names = output_names(files, root)
    written = []
    for batch, attention, rows in _attention_batches(model, table, config, device, batch_size, progress):
        for image, maps, row in zip(batch, attention, rows.tolist(), strict=True):
            path = out / names[row]
            title = f"{files[row].name} — {model.spec['head']}, {len(maps)} {model.head.part_name}s"
            atomic_write_bytes(path, image_overlays(_as_image(image), maps, title, model.head.part_name))
            written.append(path)
    return written


def explain_dataset(run_dir: str | Path, out: str | Path, data_spec: str | None = None, split: str = "test",
                    top: int = 12, which: str = "auto", batch_size: int | None = None,
                    progress: bool = True) -> Path:
    """Write ``OUT/top<k>-<split>.png``: per group, the ``top`` images of ``split`` with the highest peak."""
    if top < 1:
        raise DeepMetricError(f"--top must be at least 1, got {top}")
    check_data_path(data_spec or RunDir(run_dir).config().data.spec)  # a missing data folder, before the model
    model, config, device = _load(run_dir, which)
    d = config.data
    if data_spec and data_spec != d.spec:
        d.spec, d.val_fraction = data_spec, 0.0
    table = load_dataset(d.spec, seed=d.seed, check_counts=d.check_counts, val_fraction=d.val_fraction,
                         val_seed=d.val_seed)
    if table.count(split) == 0:
        raise DataError(f"{d.spec} has no '{split}' images")
    part = table.split(split)
    maps = torch.cat([attention for _, attention, _ in
                      _attention_batches(model, part, config, device, batch_size, progress)])  # (N, P, h, w)
    peaks = maps.flatten(2).amax(dim=2)  # (N, P)
    transform = TestTransform(config.data.image_size, config.data.test_resize)
    rows = []
    for group in range(maps.shape[1]):
        chosen = peaks[:, group].topk(min(top, len(part))).indices.tolist()
        rows.append([(_as_image(transform(part.image(i))), maps[i, group],
                      f"{part.class_names.get(int(part.labels[i]), part.labels[i])} {float(peaks[i, group]):.2f}")
                     for i in chosen])
    path = Path(out) / f"top{top}-{split}.png"
    title = (f"{model.spec['head']}: per {model.head.part_name}, the {top} {split} images of {config.data.spec} "
             "with the highest attention peak (caption: class, peak weight)")
    atomic_write_bytes(path, top_images_grid(rows, title, model.head.part_name))
    return path
