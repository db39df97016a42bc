"""``icons``: the same freedesktop icon name (``printer``, ``user-trash``, ...) drawn by different artists' themes.

A class is one icon name; its instances are the drawings of it by the themes of fourteen pinned Debian packages
(``icons_catalogue.PACKAGES``), each theme a vendor. On first use the package client fetches the ``.deb`` files
(``apt-get download NAME=VERSION`` in a temporary folder; each file's SHA-256 checked against the one the Debian
archive publishes, pinned in the table), each package's file tree is read as ``dpkg-deb --fsys-tarfile`` streams it,
nothing installed, the themes are read (``icons_themes``), and the files of every name that at least four vendors draw
are written out of their packages and rendered at ``icons_build.IMAGE_SIZE`` (SVGs with librsvg: ``icons_render``),
copies are removed (``icons_dedup``) and the rest written as PNGs to ``$DEEPMETRIC_DATA/icons/<vendor>/<name>.png`` with
``images.csv`` (what each image is), ``duplicates.csv`` (what was left out and why), each package's ``copyright`` file
and ``meta.json``. ``icons:PATH`` reads the fourteen ``.deb`` files from folder ``PATH`` instead (named as ``apt-get
download`` names them), with no network; they are checked every time, and a build of the same versions already there
is used rather than built again.

The images are the themes' artwork, read locally for research and never redistributed by this project; each
package's licence is its ``copyright`` file, kept in ``licences/`` (GPL, LGPL, CC BY and CC BY-SA; Tango's is in
the public domain).

The steps, one module each: ``icons_catalogue`` (the pinned packages and the split), ``icons_fetch`` (the ``.deb``
files, fetched or found, and checked), ``icons_unpack`` (a package's file tree, streamed), ``icons_themes`` (which
theme is a vendor and which file it draws for a name), ``icons_render`` (drawing one file), ``icons_dedup`` (the
copies left out) and ``icons_build`` (rendering, deduplicating and writing the build atomically); this module reads
the build as the data set's table.
"""

from __future__ import annotations

import csv
import io
import logging
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from ..errors import DataError
from ..folders import source_folder
from .glyphs import data_home
from .icons_build import CATALOGUE, COLUMNS, build_icons, is_built, pinned
from .icons_catalogue import ICON_NAME, PACKAGES, Package, training_names
from .icons_fetch import SOURCE_HOLDS, Fetcher, find_deb
from .registry import register_dataset
from .table import RetrievalTable, check_counts

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
