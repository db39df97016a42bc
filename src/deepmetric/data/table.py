"""``RetrievalTable``: one table of images with label, split and query/gallery flags.

Every loader returns one of these. Images are either file paths (decoded on access) or rows of an
in-memory ``uint8`` array of shape (N, H, W) or (N, H, W, 3). Splits are ``train``, ``val`` and
``test``; ``is_query`` / ``is_gallery`` say which test rows are queries and which are searched (the
In-Shop protocol); for the other benchmarks every test row is both, and a query's own row is removed
from its ranking by index. An optional ``boxes`` column (bounding boxes, the cropped CUB and Cars
variants) makes every access return the box's pixels instead of the whole image.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import DataError
from .images import crop_to_box, read_image

SPLITS = ("train", "val", "test")


def check_protocol(table: RetrievalTable) -> None:
    """The zero-shot protocol's promises, checked when a data set is loaded (before any training): a test split
    with queries and a gallery, and test (and validation) classes that no training row has. A test class that
    was trained on would be reported as "unseen" with an inflated Recall@K."""
    test = table.splits == "test"
    if not test.any():
        raise DataError(f"{table.name} has no test rows (split 'test'): zero-shot retrieval is measured on test "
                        "classes that training never saw")
    for flag, role in ((table.is_query, "query"), (table.is_gallery, "gallery")):
        if not (test & flag).any():
            raise DataError(f"{table.name}: no test row is a {role} (is_{role} is false on all "
                            f"{int(test.sum()):,} test rows); the test split needs queries and a gallery")
    trained = table.labels[table.splits == "train"]
    for split in ("val", "test"):
        shared = np.intersect1d(trained, table.labels[table.splits == split])
        if len(shared):
            shown = ", ".join(table.class_names.get(int(c), str(int(c))) for c in shared[:5])
            raise DataError(f"{table.name}: {len(shared):,} {split} class(es) also have training rows (e.g. {shown});"
                            f" zero-shot retrieval {'selects' if split == 'val' else 'tests'} on classes that "
                            "training never saw: give them their own labels or move their rows")


@dataclass
class RetrievalTable:
    """A table of N images: ``images`` (paths or array), ``labels``, ``splits``, ``is_query``, ``is_gallery``."""

    name: str
    images: list[str] | np.ndarray
    labels: np.ndarray
    splits: np.ndarray
    is_query: np.ndarray
    is_gallery: np.ndarray
    recall_at: tuple[int, ...] = (1, 2, 4, 8)
    class_names: dict[int, str] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    boxes: np.ndarray | None = None
    """(N, 4) bounding boxes (left, top, right, bottom) in pixels, right and bottom exclusive, or None."""

    def __post_init__(self) -> None:
        n = len(self.images)
        self.labels = np.asarray(self.labels, dtype=np.int64)
        self.splits = np.asarray(self.splits, dtype=object)
        self.is_query = np.asarray(self.is_query, dtype=bool)
        self.is_gallery = np.asarray(self.is_gallery, dtype=bool)
        for column in ("labels", "splits", "is_query", "is_gallery"):
            if len(getattr(self, column)) != n:
                raise DataError(f"{self.name}: column '{column}' has {len(getattr(self, column))} rows, "
                                f"expected {n} (one per image)")
        if self.boxes is not None:
            self._check_boxes(n)
        unknown = sorted(set(self.splits.tolist()) - set(SPLITS))
        if unknown:
            raise DataError(f"{self.name}: unknown split value(s) {unknown}; expected one of {list(SPLITS)}")
        if isinstance(self.images, np.ndarray):
            if self.images.dtype != np.uint8 or self.images.ndim not in (3, 4):
                raise DataError(f"{self.name}: in-memory images must be uint8 (N,H,W) or (N,H,W,3), "
                                f"got {self.images.dtype} {self.images.shape}")

    def _check_boxes(self, n: int) -> None:
        self.boxes = np.asarray(self.boxes, dtype=np.float64)
        if self.boxes.shape != (n, 4):
            raise DataError(f"{self.name}: bounding boxes have shape {self.boxes.shape}, expected ({n}, 4)")
        empty = np.flatnonzero(~((self.boxes[:, 2] > self.boxes[:, 0]) & (self.boxes[:, 3] > self.boxes[:, 1])))
        if len(empty):
            shown = ", ".join(f"{self.describe(int(i))} {tuple(self.boxes[i].tolist())}" for i in empty[:5])
            raise DataError(f"{self.name}: {len(empty):,} empty bounding box(es) (right <= left or bottom <= top), "
                            f"e.g. {shown}")

    def __len__(self) -> int:
        return len(self.images)

    @property
    def in_memory(self) -> bool:
        return isinstance(self.images, np.ndarray)

    def image(self, index: int) -> np.ndarray:
        """The image of row ``index`` (its bounding box when the table has boxes) as a uint8 (H, W, 3) RGB array."""
        if isinstance(self.images, np.ndarray):  # in memory
            array = self.images[index]
            array = np.repeat(array[:, :, None], 3, axis=2) if array.ndim == 2 else array
        else:
            array = read_image(self.images[index])
        return array if self.boxes is None else crop_to_box(array, self.boxes[index], self.describe(index))

    def describe(self, index: int) -> str:
        """A human name for row ``index`` (its path, or its position in memory)."""
        return str(self.images[index]) if not self.in_memory else f"{self.name}[{index}]"

    def subset(self, rows: np.ndarray) -> RetrievalTable:
        """A new table holding only ``rows`` (indices or a boolean mask), in that order."""
        rows = np.flatnonzero(rows) if np.asarray(rows).dtype == bool else np.asarray(rows, dtype=np.int64)
        images = self.images[rows] if isinstance(self.images, np.ndarray) else [self.images[i] for i in rows]
        return RetrievalTable(
            name=self.name, images=images, labels=self.labels[rows], splits=self.splits[rows],
            is_query=self.is_query[rows], is_gallery=self.is_gallery[rows], recall_at=self.recall_at,
            class_names=self.class_names, meta=dict(self.meta),
            boxes=None if self.boxes is None else self.boxes[rows],
        )

    def split(self, name: str) -> RetrievalTable:
        if name not in SPLITS:
            raise DataError(f"unknown split '{name}'; expected one of {list(SPLITS)}")
        return self.subset(self.splits == name)

    def count(self, name: str) -> int:
        return int((self.splits == name).sum())

    def classes(self, name: str | None = None) -> np.ndarray:
        labels = self.labels if name is None else self.labels[self.splits == name]
        return np.unique(labels)

    def summary(self) -> str:
        parts = []
        for name in SPLITS:
            n = self.count(name)
            if n:
                parts.append(f"{name} {n:,} images / {len(self.classes(name)):,} classes")
        return f"{self.name}: " + ", ".join(parts)

    def digest(self) -> str:
        """A digest of the table as the ranks of a distributed run use it: its rows' labels, splits, query and
        gallery flags and boxes, and each image's file name (not its folder: two machines may hold the data set in
        different places) or, for in-memory images, their pixels. Two machines whose copies of a data set differ (a
        glyphs set rendered from other fonts, a folder with another file) give different digests."""
        h = hashlib.sha256(self.name.encode())
        for column in (self.labels, self.is_query, self.is_gallery):
            h.update(np.ascontiguousarray(column).tobytes())
        h.update("\n".join(str(s) for s in self.splits).encode())
        if self.boxes is not None:
            h.update(np.ascontiguousarray(self.boxes).tobytes())
        if isinstance(self.images, np.ndarray):
            h.update(str(self.images.shape).encode())
            h.update(np.ascontiguousarray(self.images).data)
        else:
            h.update("\n".join(os.path.basename(str(path)) for path in self.images).encode())
        return h.hexdigest()


RetrievalDataset = RetrievalTable
"""The old name of ``RetrievalTable`` (it is a table, not a torch ``Dataset``: ``data.torch_dataset.ImageDataset``
is); kept for one release."""


def check_paths_exist(name: str, paths: list[str], root: Path | str) -> None:
    """Fail with the missing files named (up to ten) when any listed image is absent."""
    missing = [p for p in paths if not Path(p).is_file()]
    if missing:
        shown = "\n  ".join(missing[:10])
        more = f"\n  ... and {len(missing) - 10:,} more" if len(missing) > 10 else ""
        raise DataError(f"{name}: {len(missing):,} image(s) listed under {root} do not exist:\n  {shown}{more}")


TEST_COUNTS = ("test", "query", "gallery")  # the published sizes the evaluation protocol depends on


def count_mismatches(table: RetrievalTable, expected: dict[str, int]) -> dict[str, tuple[int, int]]:
    """``{split: (published, found)}`` for every size of ``expected`` that ``table`` does not have."""
    found = {
        "train": table.count("train") + table.count("val"),
        "test": table.count("test"),
        "query": int((table.is_query & (table.splits == "test")).sum()),
        "gallery": int((table.is_gallery & (table.splits == "test")).sum()),
    }
    return {k: (v, found[k]) for k, v in expected.items() if found[k] != v}


def _test_mismatches(table: RetrievalTable) -> dict[str, tuple[int, int]] | None:
    """``count_mismatches`` of the test-side published sizes (None for data sets without published sizes)."""
    expected = table.meta.get("published_counts")
    if not expected:
        return None
    return count_mismatches(table, {k: v for k, v in expected.items() if k in TEST_COUNTS})


def test_sizes_match(table: RetrievalTable) -> bool | None:
    """Whether the test split has its published sizes (None for data sets without published sizes)."""
    wrong = _test_mismatches(table)
    return None if wrong is None else not wrong


def recheck_test_counts(table: RetrievalTable, enabled: bool) -> None:
    """After rows were left out (``data.skip_bad_images``): the test split's published sizes again, so that an
    evaluation on fewer test images than the protocol's stops (``enabled=False``: goes on; the test record
    says so). Training images left out do not change the protocol's test and are not checked."""
    if enabled and "test" in set(table.splits.tolist()):
        _refuse(f"{table.name} once its bad images were left out (data.skip_bad_images)", _test_mismatches(table) or {})


def check_counts(name: str, table: RetrievalTable, expected: dict[str, int], enabled: bool) -> None:
    """Compare split sizes with the published ones; ``enabled=False`` records the mismatch instead."""
    wrong = count_mismatches(table, expected)
    table.meta["published_counts"] = expected
    table.meta["counts_match"] = not wrong
    if enabled:
        _refuse(name, wrong)


def _refuse(name: str, wrong: dict[str, tuple[int, int]]) -> None:
    if wrong:
        detail = ", ".join(f"{k}: expected {e:,}, found {f:,}" for k, (e, f) in wrong.items())
        raise DataError(f"{name}: split sizes differ from the published ones ({detail}); results would not "
                        "be comparable with the papers. Pass data.check_counts=false to use it anyway.")
