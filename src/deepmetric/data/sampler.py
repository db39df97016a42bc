"""The P x K batch sampler: P classes, K images of each, deterministic by seed and step.

A batch is a pure function of ``(seed, step)``, so a resumed run draws exactly the batches an
uninterrupted run would, and each rank of a distributed run takes its own contiguous slice of the
same global batch.

Coverage follows the authors' generator: in each epoch the classes are shuffled and consumed P at a
time, so a class appears at most once per epoch (the ``len(classes) mod P`` classes left at the end of a
shuffle sit that epoch out, a different set after each reshuffle); a class's images are read in disjoint chunks of a
per-class shuffled cycle, so a batch holds K distinct images of a class that has them, and a class
with fewer than K images repeats its images as evenly as possible (each at most ``ceil(K / n)`` times).
Classes with a single image give no positive pair and are left out (as in the authors' code).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from ..errors import DataError


def _rng(*keys: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([int(k) & 0xFFFFFFFF for k in keys]))


def sample_seed(seed: int, step: int, position: int) -> int:
    """The augmentation seed of the sample at ``position`` of the batch of ``step``."""
    return int(np.random.SeedSequence([seed, step, position, 0x5EED]).generate_state(1)[0])


class PKSampler:
    """Yields, for each step, the list of ``(row, augmentation seed)`` pairs of this rank's batch."""

    def __init__(self, labels: np.ndarray, classes_per_batch: int, samples_per_class: int, seed: int = 0,
                 start_step: int = 0, num_steps: int | None = None, rank: int = 0, world_size: int = 1):
        labels = np.asarray(labels)
        classes, counts = np.unique(labels, return_counts=True)
        self.dropped_classes = classes[counts < 2]
        classes = classes[counts >= 2]
        if len(classes) < classes_per_batch:
            raise DataError(f"a P x K batch needs {classes_per_batch} classes with at least 2 images each, "
                            f"but the training split has {len(classes)}: set data.classes_per_batch="
                            f"{max(len(classes), 2)} or fewer")
        batch = classes_per_batch * samples_per_class
        if batch % world_size:
            raise DataError(f"the global batch of {batch} images does not split evenly over {world_size} ranks")
        self.classes = classes
        self.rows_of = {int(c): np.flatnonzero(labels == c) for c in classes}
        self.P, self.K, self.seed = classes_per_batch, samples_per_class, seed
        self.start_step, self.num_steps = start_step, num_steps
        self.rank, self.world_size = rank, world_size
        self.steps_per_epoch = len(classes) // classes_per_batch

    def classes_of_step(self, step: int) -> np.ndarray:
        epoch, slot = divmod(step, self.steps_per_epoch)
        order = _rng(self.seed, epoch, 1).permutation(len(self.classes))
        return self.classes[order[slot * self.P:(slot + 1) * self.P]]

    def _rows_of_class(self, label: int, occurrence: int) -> np.ndarray:
        """The K rows the class contributes the ``occurrence``-th time it is drawn.

        With n >= K images: disjoint chunks of K from a shuffled cycle (floor(n/K) chunks per cycle; the
        n mod K left over wait for the next shuffle), so a batch never repeats an image. With n < K:
        shuffled copies of the class concatenated and cut at K, so each image appears floor(K/n) or
        ceil(K/n) times.
        """
        rows, k = self.rows_of[label], self.K
        n = len(rows)
        if n >= k:
            cycle, chunk = divmod(occurrence, n // k)
            order = _rng(self.seed, label, cycle, 2).permutation(n)
            return rows[order[chunk * k:(chunk + 1) * k]]
        copies = -(-k // n)
        order = np.concatenate([_rng(self.seed, label, occurrence, c, 3).permutation(n) for c in range(copies)])
        return rows[order[:k]]

    def global_batch(self, step: int) -> list[int]:
        """All P*K rows of ``step``, class-major (the K images of a class are adjacent)."""
        epoch = step // self.steps_per_epoch
        rows: list[int] = []
        for label in self.classes_of_step(step):
            rows.extend(self._rows_of_class(int(label), epoch).tolist())
        return rows

    def batch(self, step: int) -> list[tuple[int, int]]:
        """This rank's slice of the global batch, each row with its augmentation seed."""
        rows = self.global_batch(step)
        share = len(rows) // self.world_size
        lo = self.rank * share
        return [(rows[i], sample_seed(self.seed, step, i)) for i in range(lo, lo + share)]

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        step = self.start_step
        while self.num_steps is None or step < self.num_steps:
            yield self.batch(step)
            step += 1

    def __len__(self) -> int:
        if self.num_steps is None:
            raise TypeError("an endless sampler has no length")
        return max(0, self.num_steps - self.start_step)
