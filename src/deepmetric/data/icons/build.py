"""Building the ``icons`` folder: the drawings of every name that at least ``MIN_VENDORS`` vendors draw are written
out of their packages, rendered at ``IMAGE_SIZE``, deduplicated (``dedup``) and written as
``<vendor>/<name>.png`` with ``images.csv``, ``duplicates.csv``, the packages' licences and ``meta.json``
(``build_icons``).

**Stored size: 128 px.** Emoji ship 64-px drawings and training upsamples them (``data.image_size``, 160 px in the
emoji studies); icons are drawn by hand for their sizes, and 128 px is about the largest these themes draw or scale
to (Tango, Faenza, bloom, Nuovo and gartoon in SVG; oxygen, nuoveXT2, Moka at 64@2x and elementary-xfce in 128-px
bitmaps; GNOME and MATE have only 48-px bitmaps for a third of their names), so an icon is stored near its own
drawing and SVGs are drawn at 128 directly. A 256-px store would quadruple the disk and the decoding for detail few
themes have; a smaller one would discard what the SVG themes draw.

The build is atomic: it is assembled in a temporary folder beside ``$DEEPMETRIC_DATA/icons`` and renamed there only
once complete (``meta.json`` last), so a failed build (a package missing or of another version, the registry
unreachable, a full disk) is one ``DataError`` and leaves what was there before. Nothing deepmetric did not create
is deleted or replaced: an ``icons`` folder without this project's ``meta.json``, or a symbolic link there, is
refused before anything is fetched. A build whose files were damaged since (``images.csv`` unreadable, an image
missing) is one ``DataError`` naming what is wrong: delete the folder to build it again. A build of other package
versions (or of an older format) is replaced.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import os
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ...errors import DataError
from ...folders import source_folder
from ...io.files import file_sha256, fsync_dir, temporary_folder
from ..glyphs import data_home
from ..turns import taking_turns
from .catalogue import ICON_NAME, MIN_VENDORS, PACKAGES, Package
from .dedup import NEAR_IDENTICAL, SHARED_NEAR, SHARING, Candidate, Dropped, Look, look, select, sharing_vendors
from .fetch import SOURCE_HOLDS, Fetcher, apt_get_download, fetch_debs, find_deb
from .render import Unreadable, render, renderer, renderer_version
from .themes import Drawing, package_drawings
from .unpack import extract, keep_licence, read_package

FORMAT_VERSION = 1
IMAGE_SIZE = 128
CATALOGUE = "images.csv"
DUPLICATES = "duplicates.csv"
COLUMNS = ("name", "vendor", "image", "package", "theme", "file", "kind")
MAX_UNREADABLE = 0.05
"""More than this fraction of drawings that cannot be drawn means the renderer, not the icons, is broken."""
log = logging.getLogger("deepmetric")


# ---------------------------------------------------------------------------------------------- rendering

def _kind(path: str) -> str:
    return Path(path).suffix.lower().lstrip(".")


def _render_all(files: Sequence[tuple[str, Path, str]], folder: Path, size: int, program: str,
                progress: bool) -> tuple[dict[str, Look], dict[str, str], dict[str, str]]:
    """Render every (key, file, kind) into ``folder/<i>.png``; returns by key each file's ``Look``, its bytes' hash
    and, for the files that could not be drawn, why."""
    from PIL import Image

    from ...progress import progress_bar

    def one(item: tuple[int, tuple[str, Path, str]]) -> tuple[str, Look | None, str, str]:
        index, (key, file, kind) = item
        content = file_sha256(file)
        try:
            rgba = render(file, kind, size, program)
        except Unreadable as error:
            return key, None, content, str(error)
        Image.fromarray(rgba, "RGBA").save(folder / f"{index}.png")
        return key, look(rgba), content, ""

    looks, contents, failures = {}, {}, {}
    workers = max(1, min(8, os.cpu_count() or 1))
    with ThreadPoolExecutor(workers) as pool:
        results = pool.map(one, enumerate(files))
        for file, seen, content, failure in progress_bar(results, total=len(files), desc="rendering icons",
                                                         unit="icon", disable=not progress):
            contents[file] = content
            if seen is None:
                failures[file] = failure
            else:
                looks[file] = seen
    return looks, contents, failures


# ---------------------------------------------------------------------------------------------- building

def _is_ours(root: Path) -> bool:
    """Whether ``root/meta.json`` is this loader's marker (of any version): deepmetric built the folder."""
    try:
        meta = json.loads((root / "meta.json").read_bytes())
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(meta, dict) and meta.get("dataset") == "icons" and isinstance(meta.get("format"), int)


def check_ours(root: Path) -> None:
    """Refuse to build when ``root`` is there and was not made by this project: building would replace it."""
    if root.is_symlink():
        raise DataError(f"icons: {root} is a symbolic link; deepmetric never replaces what it did not create. "
                        "Remove the link (or set DEEPMETRIC_DATA to another folder) and run again to build the set")
    if root.exists() and not _is_ours(root):
        raise DataError(f"icons: {root} exists but was not built by deepmetric (it holds no meta.json of ours); "
                        "deepmetric never deletes what it did not create: move it away (or set DEEPMETRIC_DATA to "
                        "another folder) and run again to build the set")


def pinned(packages: Mapping[str, Package]) -> dict[str, str]:
    """Each package's version, by name, as ``meta.json`` records them."""
    return {p.name: p.version for p in packages.values()}


def _order(drawing: Drawing, package_index: int) -> tuple:
    """Which of two copies is kept (``dedup.select``): a name's own file before an alias, then the drawing made
    nearer the stored size (GNOME's 256-px drawing before Adwaita's legacy 48-px one), then the package order."""
    return drawing.alias, drawing.rank[:2], package_index, drawing.vendor, drawing.name


def _write_csv(path: Path, header: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    path.write_text(buffer.getvalue(), encoding="utf-8")


def _choose(drawings: dict[str, dict[str, Drawing]], vendor_index: dict[str, int], looks: Mapping[str, Look],
            contents: Mapping[str, str], key: Callable[[Drawing], str],
            ) -> tuple[list[Candidate], list[Dropped], set[str], set[frozenset[str]]]:
    """Remove copies and keep the names drawn by ``MIN_VENDORS``; a name that falls short no longer blocks its copies
    elsewhere, so the selection is run again until the names stay the same (``key``: a drawing's file as ``looks``
    and ``contents`` name it). Also returns the vendor pairs found to share artwork."""
    names = {n for n, c in Counter(n for d in drawings.values() for n in d).items() if c >= MIN_VENDORS}
    shared: set[frozenset[str]] | None = None
    while True:
        candidates = [Candidate(d.vendor, d.name, _order(d, vendor_index[d.vendor]), key(d), contents.get(key(d), ""))
                      for found in drawings.values() for d in found.values() if d.name in names]
        if shared is None:  # measured once, on every name drawn by enough vendors
            shared = sharing_vendors(candidates, looks)
        kept, dropped = select(candidates, looks, shared=shared)
        counts = Counter(c.name for c in kept)
        remaining = {n for n in names if counts[n] >= MIN_VENDORS}
        if remaining == names:
            return kept, dropped, names, shared
        names = remaining


def build_icons(root: Path | None = None, source: str | Path | None = None, progress: bool = True,
                packages: Mapping[str, Package] | None = None, fetch: Fetcher | None = None,
                size: int = IMAGE_SIZE) -> Path:
    """Fetch (or read from folder ``source``) the packages (default ``PACKAGES``), render and deduplicate their
    drawings into ``root`` (default ``data_home()/icons``); the folder appears complete or not at all."""
    root = Path(root) if root is not None else data_home() / "icons"
    packages = PACKAGES if packages is None else packages
    fetch = apt_get_download if fetch is None else fetch
    folder = source_folder("icons", source, SOURCE_HOLDS) if source is not None else None
    program = renderer()
    check_ours(root)
    try:
        root.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise DataError(f"icons: cannot write to {root.parent}: {error.strerror or error}; set DEEPMETRIC_DATA to a "
                        "folder you can write") from None
    with taking_turns(root.parent / f".{root.name}.lock", "icons"):
        check_ours(root)  # again: it may have been made while this process waited
        if is_built(root, packages, size):
            return root
        try:
            return _build(root, folder, packages, fetch, size, program, progress)
        except OSError as error:
            raise DataError(f"icons: cannot write the build next to {root}: {error.strerror or error}") from None


def _read_packages(packages: Mapping[str, Package], debs: Mapping[str, Path], tmp: Path,
                   size: int) -> tuple[dict[str, dict[str, Drawing]], dict[str, str]]:
    """Every vendor's drawing of every name (``themes``), and each vendor's package; the licences into
    ``tmp``."""
    drawings: dict[str, dict[str, Drawing]] = {}
    vendor_package: dict[str, str] = {}
    for package in packages.values():
        tree = read_package(debs[package.name])
        keep_licence(tree, package, tmp)
        for vendor, found in package_drawings(tree, size).items():
            if vendor in vendor_package or not ICON_NAME.fullmatch(vendor):
                raise DataError(f"icons: {package.name} ships theme {vendor!r}, which "
                                + (f"{vendor_package[vendor]} ships too" if vendor in vendor_package else
                                   "cannot name a folder"))
            drawings[vendor], vendor_package[vendor] = found, package.name
    return drawings, vendor_package


def _draw(drawings: Mapping[str, Mapping[str, Drawing]], vendor_package: Mapping[str, str],
          debs: Mapping[str, Path], work: Path, size: int, program: str, progress: bool, delete_debs: bool,
          ) -> tuple[list[tuple[str, Path, str]], dict[str, Look], dict[str, str], dict[str, str]]:
    """Write out of their packages and render the files of every name drawn by ``MIN_VENDORS``; returns the files
    (key ``package/path``, where, kind) and, by key, their ``Look``, their bytes' hash and why one failed."""
    wanted = {n for n, c in Counter(n for d in drawings.values() for n in d).items() if c >= MIN_VENDORS}
    needed: dict[str, set[str]] = {}
    for vendor, found in drawings.items():
        needed.setdefault(vendor_package[vendor], set()).update(d.file for d in found.values() if d.name in wanted)
    log.info("icons: %d vendors in %d packages; %s names drawn by %d or more; unpacking and rendering %s files at "
             "%d px", len(drawings), len(debs), f"{len(wanted):,}", MIN_VENDORS,
             f"{sum(map(len, needed.values())):,}", size)
    files: list[tuple[str, Path, str]] = []
    for name, paths in needed.items():
        extract(debs[name], paths, work / "files" / name)
        files.extend((f"{name}/{path}", work / "files" / name / path, _kind(path)) for path in sorted(paths))
        if delete_debs:
            debs[name].unlink()  # its files are out
    (work / "rendered").mkdir()
    looks, contents, failures = _render_all(files, work / "rendered", size, program, progress)
    if files and len(failures) > MAX_UNREADABLE * len(files):
        example = next(iter(failures.items()))
        raise DataError(f"icons: {len(failures):,} of {len(files):,} icons could not be drawn (e.g. {example[0]}: "
                        f"{example[1]}); is {program} working?")
    return files, looks, contents, failures


def _build(root: Path, folder: Path | None, packages: Mapping[str, Package], fetch: Fetcher, size: int,
           program: str, progress: bool) -> Path:
    tmp = temporary_folder(root)
    work = Path(tempfile.mkdtemp(prefix=".icons-work.", dir=root.parent))  # the drawn files, out of their packages
    try:
        if folder is not None:
            debs = {p.name: find_deb(folder, p) for p in packages.values()}
        else:
            (work / "debs").mkdir()
            debs = fetch_debs(packages, work / "debs", fetch)
        drawings, vendor_package = _read_packages(packages, debs, tmp, size)
        files, looks, contents, failures = _draw(drawings, vendor_package, debs, work, size, program, progress,
                                                 delete_debs=folder is None)

        def key(drawing: Drawing) -> str:
            return f"{vendor_package[drawing.vendor]}/{drawing.file}"

        vendor_index = {v: list(packages).index(p) for v, p in vendor_package.items()}
        kept, dropped, names, shared = _choose(drawings, vendor_index, looks, contents, key)
        if shared:
            log.info("icons: vendors that share artwork (compared within %s, not %s): %s", SHARED_NEAR,
                     NEAR_IDENTICAL, ", ".join(" and ".join(sorted(p)) for p in sorted(shared, key=sorted)))
        if len(names) < 4:
            raise DataError(f"icons: only {len(names)} icon names are drawn by {MIN_VENDORS} or more vendors once "
                            "copies are removed; the protocol needs at least 4")
        dropped = [d for d in dropped if d.candidate.name in names]
        _write(tmp, kept, dropped, drawings, vendor_package, {k: i for i, (k, _, _) in enumerate(files)},
               work / "rendered", failures)
        meta: dict[str, Any] = {
            "dataset": "icons", "format": FORMAT_VERSION, "size": size, "packages": pinned(packages),
            "renderer": renderer_version(program), "near_identical": NEAR_IDENTICAL, "sharing": SHARING,
            "shared_near": SHARED_NEAR, "min_vendors": MIN_VENDORS,
            "sharing_vendors": sorted(sorted(p) for p in shared),
            "source": str(folder) if folder is not None else "apt-get", "images": len(kept),
            "classes": len(names), "vendors": dict(sorted(Counter(c.vendor for c in kept).items())),
            "dropped": dict(sorted(Counter(d.reason for d in dropped).items()))}
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2))
        check_ours(root)
        if root.exists():  # a build of ours, of other versions or rules
            shutil.rmtree(root)
        os.replace(tmp, root)
        fsync_dir(root.parent)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    dropped_text = ", ".join(f"{n:,} {r}" for r, n in meta["dropped"].items()) or "none"
    log.info("icons: %s images of %s icon names by %d vendors written to %s (copies and blanks left out: %s)",
             f"{meta['images']:,}", f"{meta['classes']:,}", len(meta["vendors"]), root, dropped_text)
    return root


def _write(tmp: Path, kept: list[Candidate], dropped: list[Dropped],
           drawings: Mapping[str, Mapping[str, Drawing]], vendor_package: Mapping[str, str],
           index_of: Mapping[str, int], rendered: Path, failures: Mapping[str, str]) -> None:
    """The kept images, ``images.csv`` and ``duplicates.csv`` into ``tmp``."""
    rows = []
    for candidate in sorted(kept, key=lambda c: (c.name, c.order)):
        drawing = drawings[candidate.vendor][candidate.name]
        image = f"{candidate.vendor}/{candidate.name}.png"
        (tmp / candidate.vendor).mkdir(exist_ok=True)
        os.replace(rendered / f"{index_of[candidate.file]}.png", tmp / image)
        rows.append((candidate.name, candidate.vendor, image, vendor_package[candidate.vendor], drawing.theme,
                     drawing.listed, drawing.kind))
    _write_csv(tmp / CATALOGUE, COLUMNS, rows)
    lines = []
    for item in dropped:
        drawing = drawings[item.candidate.vendor][item.candidate.name]
        kept_as = f"{item.kept.vendor}/{item.kept.name}" if item.kept is not None else ""
        why = failures.get(item.candidate.file, "") if item.reason == "unreadable" else ""
        lines.append((item.candidate.name, item.candidate.vendor, drawing.listed, item.reason, kept_as,
                      "" if item.distance is None else item.distance, why))
    _write_csv(tmp / DUPLICATES, ("name", "vendor", "file", "reason", "copy_of", "distance", "detail"), lines)


def is_built(root: Path, packages: Mapping[str, Package], size: int = IMAGE_SIZE) -> bool:
    """Whether ``root`` is a complete build of ``packages`` at ``size`` by today's rules (its ``meta.json`` says
    so); a build of other versions or rules is built again."""
    try:
        meta = json.loads((root / "meta.json").read_bytes())
    except (OSError, ValueError, RecursionError):
        return False
    return (isinstance(meta, dict) and meta.get("dataset") == "icons" and meta.get("format") == FORMAT_VERSION
            and meta.get("size") == size and meta.get("packages") == pinned(packages)
            and meta.get("near_identical") == NEAR_IDENTICAL and meta.get("sharing") == SHARING
            and meta.get("shared_near") == SHARED_NEAR and meta.get("min_vendors") == MIN_VENDORS)
