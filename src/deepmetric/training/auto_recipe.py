"""The settings ``deepmetric train --data folder:X`` chooses from the data when no ``--config`` is given.

The papers' defaults (224 px, rates of 1e-5, 1,000 steps, no validation) are made for photographs of 100-11,000
classes; a demo preset is made for its own data (``demo-emoji`` trains at 64 px, for 300 steps, at rates made for
735 classes, and selects its checkpoint on 5 classes of a 45-class folder: it barely beat the untrained backbone
there, issue 53). This recipe reads the training split instead and chooses, each choice with its reason:

- **image size**: the median shorter side of (up to ``SIZE_SAMPLE``) training images, to the nearest multiple of
  32, within 64-224 px: training above the images' own size only upsamples them, and 224 px is the papers' size
  for photographs.
- **validation**: ``VAL_SHARE`` of the training classes, at least ``MIN_VAL_CLASSES`` and never leaving fewer than
  ``MIN_TRAIN_CLASSES`` to train on; with fewer classes than both need, none: a fixed budget and the last step.
- **P x K batch**: K images a class (the median class's count, 2-4), P classes (up to ``BATCH // K``, no more than
  the training classes with 2 images or more).
- **steps**: ``EPOCHS`` passes over the training images, within ``MIN_STEPS``-``MAX_STEPS``; validation
  ``VALIDATIONS`` times over the run, the checkpoint selected by validation MAP@R (Recall@1 of a few dozen
  validation images moves in coarse steps); early stopping after ``PATIENCE`` validations without a better one.
- **embedding**: with the ``gap`` head, the backbone's pooled features themselves (``model.embedding_dim=0``), so
  that training starts from the untrained backbone's own embedding; a new 512-d layer starts from a random
  projection, which on a small icon set ended well below the pooled features on validation and on test, and on
  glyphs level with them (docs/getting-started.md). Other heads keep their own dimension.
- **rates**: 1e-3 for the new layers and 1e-4 for the pretrained backbone (the emoji and glyphs presets' rates, which
  move an ImageNet backbone within a few hundred steps), BatchNorm statistics frozen.
- **augmentation**: the crop keeps the whole object (scale range [1.0, 1.3]) and images are not mirrored, since
  the recipe cannot know whether the classes have a direction (text, arrows, pointing hands).
- the untrained backbone is evaluated too (``eval.baseline``), on validation as well, so that the run can say
  whether training beat it.

Every choice is a config layer below the user's ``key=value`` overrides, which win.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image

from ..data.table import RetrievalTable

SIZE_SAMPLE = 200
MIN_SIZE, MAX_SIZE, SIZE_STEP = 64, 224, 32
VAL_SHARE, MIN_VAL_CLASSES, MIN_TRAIN_CLASSES = 0.2, 10, 20
BATCH, MAX_K = 64, 4
EPOCHS, MIN_STEPS, MAX_STEPS = 20, 100, 1000
VALIDATIONS, PATIENCE = 20, 5
LR, LR_BACKBONE = 1e-3, 1e-4


@dataclass(frozen=True)
class Choice:
    """One setting the recipe chose, and why."""

    key: str
    value: Any
    why: str

    def line(self) -> str:
        return f"{self.key}={_shown(self.value)}: {self.why}"


def _shown(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    if isinstance(value, list):
        return "[" + ", ".join(_shown(v) for v in value) + "]"
    return str(value)


def image_size(paths: Sequence[Any] | np.ndarray, sample: int = SIZE_SAMPLE) -> tuple[int, int]:
    """The training size for images ``paths`` (files, or arrays held in memory; an evenly spaced sample of at most
    ``sample``): their median shorter side rounded to a multiple of ``SIZE_STEP`` within ``MIN_SIZE``-``MAX_SIZE``;
    and that median. Unreadable images are skipped here (the run's own image check names them)."""
    chosen = paths if len(paths) <= sample else [paths[int(i)] for i in np.linspace(0, len(paths) - 1, sample)]
    sides = []
    for item in chosen:
        if isinstance(item, np.ndarray):  # a data set held in memory (glyphs, digits): (H, W[, C])
            sides.append(min(item.shape[:2]))
            continue
        try:
            with Image.open(item) as image:  # reads the header only
                sides.append(min(image.size))
        except (OSError, ValueError, Image.DecompressionBombError):
            continue
    if not sides:
        return MAX_SIZE, 0
    median = int(np.median(sides))
    return int(min(MAX_SIZE, max(MIN_SIZE, SIZE_STEP * round(median / SIZE_STEP)))), median


def validation_classes(classes: int) -> int:
    """How many of ``classes`` training classes select the checkpoint (0: none)."""
    wanted = max(MIN_VAL_CLASSES, round(VAL_SHARE * classes))
    return wanted if classes - wanted >= MIN_TRAIN_CLASSES else 0


def auto_recipe(table: RetrievalTable, head: str = "gap") -> list[Choice]:
    """The recipe's choices for ``table`` (its training split) and the run's ``head``, in the order they are said."""
    train = table.split("train")
    classes, counts = np.unique(train.labels, return_counts=True)
    n_classes, n_images = len(classes), len(train)
    size, median_side = image_size(train.images)
    if not median_side:
        why = "no training image could be read to measure; the papers' size"
    else:
        why = f"the training images' median shorter side is {median_side} px" + (
            f"; the recipe trains at {MIN_SIZE}-{MAX_SIZE} px" if not MIN_SIZE <= median_side <= MAX_SIZE else "")
    choices = [Choice("data.image_size", size, why)]
    n_val = validation_classes(n_classes)
    if n_val:
        choices.append(Choice("data.val_fraction", n_val / n_classes,
                              f"{n_val} of the {n_classes} training classes select the checkpoint, "
                              f"{n_classes - n_val} train"))
    else:
        choices.append(Choice("data.val_fraction", 0.0,
                              f"{n_classes} training classes are too few to hold {MIN_VAL_CLASSES} out and train on "
                              f"{MIN_TRAIN_CLASSES}: no validation, a fixed budget, the last step kept (so few "
                              "classes may teach less than the backbone knows: the test table shows both)"))
    median_count = int(np.median(counts))
    k = min(MAX_K, max(2, median_count))
    usable = int((counts >= 2).sum()) - n_val  # at least: the validation classes are drawn at random
    p = max(2, min(BATCH // k, usable))
    choices.append(Choice("data.samples_per_class", k, f"K: the median class has {median_count} images"))
    choices.append(Choice("data.classes_per_batch", p, f"P: a batch of {p} x {k} = {p * k} images "
                          f"(at least {usable} training classes have 2 or more)"))
    images = round(n_images * (n_classes - n_val) / n_classes)
    steps = int(min(MAX_STEPS, max(MIN_STEPS, math.ceil(EPOCHS * images / (p * k)))))
    choices.append(Choice("train.steps", steps, f"about {EPOCHS} passes over about {images:,} training images, "
                          f"within {MIN_STEPS}-{MAX_STEPS}"))
    if n_val:
        every = max(1, steps // VALIDATIONS)
        choices.append(Choice("train.eval_every", every, f"{VALIDATIONS} validations over the run"))
        choices.append(Choice("train.checkpoint_every", every, "a checkpoint at each validation"))
        val_images = max(1, n_images - images)
        choices.append(Choice("train.select_by", "map@r", f"Recall@1 over about {val_images:,} validation images "
                              f"moves in steps of {100 / val_images:.2g} points; MAP@R uses every relevant image of "
                              "each query"))
        choices.append(Choice("train.patience", PATIENCE, f"stop after {PATIENCE} validations without a better one"))
    else:
        every = max(1, steps // 4)
        choices.append(Choice("train.checkpoint_every", every, "four checkpoints over the run"))
    if head == "gap":
        choices.append(Choice("model.embedding_dim", 0, "the backbone's pooled features, trained: training starts "
                              "from the untrained backbone's embedding (a new 512-d layer would start from a random "
                              "projection, which a small folder's training does not make up for)"))
    choices += [
        Choice("train.lr", LR, "the new layers' rate of the emoji and glyphs presets" + (
            " (the pooled features have none: only the backbone's rate moves them)" if head == "gap" else "")),
        Choice("train.lr_backbone", LR_BACKBONE, "the pretrained backbone's rate of those presets"),
        Choice("model.freeze_bn", True, "a small batch's statistics would replace ImageNet's"),
        Choice("data.resize_range", [1.0, 1.3], "the crop keeps the whole object"),
        Choice("data.flip", False, "not mirrored: classes may have a direction (text, arrows)"),
        Choice("eval.baseline", True, "the untrained backbone is evaluated too, to show what training adds"),
    ]
    return choices


def as_layer(choices: list[Choice]) -> dict[str, dict[str, Any]]:
    """The choices as a config layer (``{"data": {"image_size": 128, ...}, ...}``)."""
    layer: dict[str, dict[str, Any]] = {}
    for choice in choices:
        section, key = choice.key.split(".", 1)
        layer.setdefault(section, {})[key] = choice.value
    return layer


def applies_to(spec: str) -> bool:
    """Whether a data spec is a user's own data (a folder or a CSV table), which no preset was made for."""
    return spec.split(":", 1)[0] in ("folder", "csv")
