"""The ``icons`` data set's table: the build read as a ``RetrievalTable`` (``load_icons``), registered as
``icons[:PATH]``; the package's ``__init__`` tells the whole build."""

from __future__ import annotations

import csv
import io
import logging
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from ...errors import DataError
from ...folders import source_folder
from ..glyphs import data_home
from ..registry import register_dataset
from ..table import RetrievalTable, check_counts
from .build import CATALOGUE, COLUMNS, build_icons, is_built, pinned
from .catalogue import ICON_NAME, PACKAGES, Package, training_names
from .fetch import SOURCE_HOLDS, Fetcher, find_deb

RECALL_AT = (1, 2, 4, 8)
PUBLISHED = {"train": 1714, "test": 1735}
"""Split sizes for the pinned packages (``PACKAGES``); a table of them that differs is refused (``check_counts``)."""
PUBLISHED_FOR = {p.name: p.version for p in PACKAGES.values()}
"""The package versions ``PUBLISHED`` counts (a table of other packages is not checked)."""
log = logging.getLogger("deepmetric")


def read_catalogue(root: Path) -> list[dict[str, str]]:
    """``root/images.csv``'s rows, each image checked to exist; a damaged build is one ``DataError``."""
    file = root / CATALOGUE

    def damaged(problem: str) -> DataError:
        return DataError(f"icons: {root} is damaged: {problem}; it is deepmetric's build: delete the folder and run "
                         "again to build it anew")

    try:
        rows = list(csv.DictReader(io.StringIO(file.read_text(encoding="utf-8"))))
    except OSError as error:
        raise damaged(f"{file} cannot be read ({error.strerror or error})") from None
    except (UnicodeDecodeError, csv.Error) as error:
        raise damaged(f"{file} is not a CSV file ({error})") from None
    if not rows or any(set(COLUMNS) - set(r) or any(r.get(c) is None for c in COLUMNS) for r in rows):
        raise damaged(f"{file} is not the catalogue of the build (columns {', '.join(COLUMNS)}, one row an image)")
    bad = [r["image"] for r in rows if not (ICON_NAME.fullmatch(r["name"]) and ICON_NAME.fullmatch(r["vendor"])
                                            and r["image"] == f"{r['vendor']}/{r['name']}.png")]
    if bad:
        raise damaged(f"{file} lists images that are not <vendor>/<name>.png (e.g. {bad[0]!r})")
    missing = [r["image"] for r in rows if not (root / r["image"]).is_file()]
    if missing:
        raise damaged(f"{len(missing):,} image(s) it lists are missing (e.g. {root / missing[0]})")
    return rows


@register_dataset("icons", "folder")
def load_icons(path: str | Path | None = None, check: bool = True, root: str | Path | None = None,
               packages: Mapping[str, Package] | None = None, fetch: Fetcher | None = None,
               progress: bool = True) -> RetrievalTable:
    """The icons table, building ``root`` (default ``data_home()/icons``) first when it holds no build of
    ``packages`` (default ``PACKAGES``); ``path`` is the folder the ``.deb`` files are read from instead of
    ``apt-get``: it must exist and hold them (checked, and unpacked only when ``root`` holds no build of the same
    versions). ``check`` refuses split sizes other than the pinned packages' (``PUBLISHED``)."""
    root = Path(root) if root is not None else data_home() / "icons"
    packages = PACKAGES if packages is None else packages
    # the path first: never an earlier build in its place
    folder = source_folder("icons", path, SOURCE_HOLDS) if path is not None else None
    if not is_built(root, packages):
        build_icons(root, source=folder, progress=progress, packages=packages, fetch=fetch)
        if not is_built(root, packages):
            raise DataError(f"icons: {root} was built but does not read back; another process may be writing it")
    elif folder is not None:  # the same versions are built: PATH is checked to hold them, not unpacked again
        for package in packages.values():
            find_deb(folder, package)
        log.info("icons: %s holds the packages %s was built from; using that build", path, root)
    rows = read_catalogue(root)
    names = sorted({r["name"] for r in rows})
    label_of = {n: i for i, n in enumerate(names)}
    train = training_names(names)
    order = {name: i for i, name in enumerate(packages)}
    rows.sort(key=lambda r: (label_of[r["name"]], order.get(r["package"], len(order)), r["vendor"]))
    labels = np.array([label_of[r["name"]] for r in rows], dtype=np.int64)
    splits = np.array(["train" if r["name"] in train else "test" for r in rows], dtype=object)
    ones = np.ones(len(rows), dtype=bool)
    vendors = sorted({r["vendor"] for r in rows})
    table = RetrievalTable(
        name="icons", images=[str(root / r["image"]) for r in rows], labels=labels, splits=splits, is_query=ones,
        is_gallery=ones, recall_at=RECALL_AT, class_names=dict(enumerate(names)),
        meta={"root": str(root), "vendors": vendors})  # a row's vendor: its image's folder
    log.info("icons: %s images of %s icon names by %d vendors: train %s classes (%s images), test %s (%s)",
             f"{len(rows):,}", f"{len(names):,}", len(vendors), f"{len(train):,}",
             f"{int((splits == 'train').sum()):,}", f"{len(names) - len(train):,}",
             f"{int((splits == 'test').sum()):,}")
    check_counts("icons", table, PUBLISHED, check and pinned(packages) == PUBLISHED_FOR)
    return table
