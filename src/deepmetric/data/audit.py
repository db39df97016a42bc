"""Check a data set before training: every image decodes (and its bounding box, if the table has boxes,
overlaps it), no path is listed twice, no training class has a single image. Problems are collected, not
raised one at a time, so the user sees them all at once.

Decoding uses PIL's draft mode (JPEGs decoded at reduced size), which still reads every byte of the file,
so truncated and corrupt files are caught at a fraction of the cost of a full decode; files are checked
on a thread pool (PIL releases the GIL while decoding). Unusual but valid formats (CMYK, 16-bit,
palette, alpha, grayscale) are not problems: ``images.to_rgb`` converts them.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from ..errors import DataError
from ..progress import progress_bar
from .images import box_problem, clip_box
from .table import RetrievalTable


@dataclass(frozen=True)
class BadItem:
    """One problem: the row (or -1 for a whole class), what it names, and what is wrong."""

    row: int
    item: str
    problem: str

    def line(self) -> str:
        return f"{self.item}: {self.problem}"


def image_problem(path: str, box: Sequence[float] | None = None) -> str | None:
    """Why ``path`` cannot be used as an image (or ``box`` cut from it), or None when it decodes."""
    file = Path(path)
    try:
        size = file.stat().st_size
    except FileNotFoundError:
        return "missing file"
    except OSError as error:
        return f"cannot be read ({error.strerror or error})"
    if not file.is_file():
        return "not a regular file"
    if size == 0:
        return "empty file (0 bytes)"
    if not os.access(file, os.R_OK):
        return "cannot be read (permission denied)"
    try:
        with Image.open(file) as image:
            if box is not None and clip_box(box, *image.size) is None:
                return box_problem(box, *image.size)
            if image.format == "JPEG":
                image.draft("RGB", (64, 64))
            image.load()
    except UnidentifiedImageError:
        return "not an image PIL can identify"
    except PermissionError:
        return "cannot be read (permission denied)"
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as error:
        return f"corrupt or truncated ({error})"
    return None


def audit_images(table: RetrievalTable, workers: int = 4, progress: bool = True) -> list[BadItem]:
    """Undecodable images and paths listed more than once (the first listing is kept)."""
    if table.in_memory:
        return []
    problems: list[BadItem] = []
    paths = [str(p) for p in table.images]
    seen: set[str] = set()
    for row, path in enumerate(paths):
        real = os.path.realpath(path)
        if real in seen:
            problems.append(BadItem(row, path, "listed more than once"))
        seen.add(real)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        boxes = [None] * len(paths) if table.boxes is None else table.boxes.tolist()
        results = pool.map(image_problem, paths, boxes)
        for row, problem in enumerate(progress_bar(results, total=len(paths), desc="checking images", unit="image",
                                           disable=not progress, leave=False)):
            if problem:
                problems.append(BadItem(row, paths[row], problem))
    return problems


def singleton_classes(table: RetrievalTable) -> list[BadItem]:
    """Training and validation classes with a single image (no positive pair; a query without a match)."""
    problems = []
    for split in ("train", "val"):
        rows = np.flatnonzero(table.splits == split)
        classes, counts = np.unique(table.labels[rows], return_counts=True)
        for label in classes[counts == 1]:
            row = int(rows[table.labels[rows] == label][0])
            problems.append(BadItem(row, f"class {label} ({split})", "has a single image: it gives no positive pair"))
    return problems


def audit_table(table: RetrievalTable, workers: int = 4, progress: bool = True) -> list[BadItem]:
    """Every problem of ``table``, sorted by row."""
    problems = audit_images(table, workers, progress) + singleton_classes(table)
    return sorted(problems, key=lambda p: (p.row, p.item))


def report(problems: list[BadItem], limit: int = 50) -> str:
    lines = [p.line() for p in problems[:limit]]
    if len(problems) > limit:
        lines.append(f"... and {len(problems) - limit:,} more")
    return "\n  ".join(lines)


def drop_bad_items(table: RetrievalTable, problems: list[BadItem]) -> RetrievalTable:
    """The table without the rows named by ``problems`` (a duplicate keeps its first listing)."""
    bad_rows = {p.row for p in problems}
    keep = np.array([row not in bad_rows for row in range(len(table))], dtype=bool)
    return table.subset(keep)


def check_table(table: RetrievalTable, skip_bad: bool, progress: bool = True) -> tuple[RetrievalTable,
                                                                                         list[BadItem]]:
    """Audit ``table``: raise one DataError naming every problem, or (``skip_bad``) drop the bad rows."""
    problems = audit_table(table, progress=progress)
    if not problems:
        return table, []
    if not skip_bad:
        raise DataError(f"{table.name}: {len(problems):,} problem(s) found before training; fix them or pass "
                        f"--skip-bad-images (data.skip_bad_images=true) to leave them out:\n  {report(problems)}")
    kept = drop_bad_items(table, problems)
    orphans = singleton_classes(kept)  # classes left with one image once their bad images are gone
    return (drop_bad_items(kept, orphans), problems + orphans) if orphans else (kept, problems)
