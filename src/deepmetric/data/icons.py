"""``icons``: the same freedesktop icon name (``printer``, ``user-trash``, ...) drawn by different artists' themes.

A class is one icon name; its instances are the drawings of it by the themes of fourteen pinned Debian packages
(``icons_catalogue.PACKAGES``), each theme a vendor. On first use the package client fetches the ``.deb`` files
(``apt-get download NAME=VERSION`` in a temporary folder; each file's SHA-256 checked against the one the Debian
archive publishes, pinned in the table), each package's file tree is read as ``dpkg-deb --fsys-tarfile`` streams it,
nothing installed, the themes are read (``icons_themes``), and the files of every name that at least four vendors draw
are written out of their packages and rendered at ``IMAGE_SIZE`` (SVGs with librsvg: ``icons_render``), copies are
removed (``icons_dedup``) and the rest written as PNGs to ``$DEEPMETRIC_DATA/icons/<vendor>/<name>.png`` with
``images.csv`` (what each image is), ``duplicates.csv`` (what was left out and why), each package's ``copyright`` file
and ``meta.json``. ``icons:PATH`` reads the fourteen ``.deb`` files from folder ``PATH`` instead (named as ``apt-get
download`` names them), with no network; they are checked every time, and a build of the same versions already there
is used rather than built again.

Why ``--fsys-tarfile`` and not ``dpkg-deb -x``: ``-x`` writes every file of the fourteen packages (800 MB in 178,000
files) for the 6,800 that are drawn, and deleting them afterwards took 5 of the 11.6 minutes of a build on this
project's machines; reading the stream lists the tree with the same tool and writes only the files drawn.

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

The images are the themes' artwork, read locally for research and never redistributed by this project; each
package's licence is its ``copyright`` file, kept in ``licences/`` (GPL, LGPL, CC BY and CC BY-SA; Tango's is in
the public domain).
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import logging
import os
import shutil
import subprocess
import tarfile
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO, Any

import numpy as np

from ..errors import DataError
from ..folders import source_folder
from ..io import file_sha256, fsync_dir, temporary_folder
from .download import _taking_turns
from .glyphs import data_home
from .icons_catalogue import ICON_NAME, MIN_VENDORS, PACKAGES, Package, training_names
from .icons_dedup import NEAR_IDENTICAL, SHARED_NEAR, SHARING, Candidate, Dropped, Look, look, select, sharing_vendors
from .icons_render import Unreadable, render, renderer, renderer_version
from .icons_themes import Drawing, Tree, archive_path, package_drawings, wanted_text
from .registry import register_dataset
from .table import RetrievalTable, check_counts

SOURCE_HOLDS = "the icon themes' .deb files"
"""What ``icons:PATH`` is the folder of."""

FORMAT_VERSION = 1
IMAGE_SIZE = 128
RECALL_AT = (1, 2, 4, 8)
CATALOGUE = "images.csv"
DUPLICATES = "duplicates.csv"
COLUMNS = ("name", "vendor", "image", "package", "theme", "file", "kind")
PUBLISHED = {"train": 1714, "test": 1735}
"""Split sizes for the pinned packages (``PACKAGES``); a table of them that differs is refused (``check_counts``)."""
PUBLISHED_FOR = {p.name: p.version for p in PACKAGES.values()}
"""The package versions ``PUBLISHED`` counts (a table of other packages is not checked)."""
MAX_UNREADABLE = 0.05
"""More than this fraction of drawings that cannot be drawn means the renderer, not the icons, is broken."""
log = logging.getLogger("deepmetric")

Fetcher = Callable[[Sequence[Package], Path], None]
"""Fetches packages' ``.deb`` files into a folder, named ``Package.deb`` (``apt_get_download``; tests give another)."""


# ---------------------------------------------------------------------------------------------- fetching


def check_deb(path: Path, package: Package) -> None:
    """Refuse a ``.deb`` whose SHA-256 differs from the one pinned for ``package``."""
    found = file_sha256(path)
    if found != package.sha256:
        raise DataError(f"icons: {path} is not {package.name} {package.version} as the Debian archive publishes it "
                        f"(its SHA-256 is {found[:16]}..., the pinned one {package.sha256[:16]}...); delete it and "
                        "fetch it again")


def _apt_error(stderr: str) -> str:
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("E:")]
    return (errors or lines or ["no message"])[0][:300]


def apt_get_download(packages: Sequence[Package], folder: Path) -> None:
    """Fetch ``packages``' ``.deb`` files into ``folder`` with Debian's own client (``apt-get download``)."""
    apt = shutil.which("apt-get")
    if apt is None:
        raise DataError("icons: fetching the icon themes needs Debian's package client apt-get, which is not here. "
                        "On another machine, fetch them with: apt-get download "
                        + " ".join(p.spec for p in packages) + "; then put the .deb files in a folder and use "
                        "--data icons:FOLDER")
    # apt-get's output (progress, notices) is captured, never left on this process's standard output
    result = subprocess.run([apt, "download", *(p.spec for p in packages)], cwd=folder, stdin=subprocess.DEVNULL,
                            capture_output=True, text=True, errors="replace")
    if result.returncode != 0:
        raise DataError(f"icons: apt-get download failed (exit {result.returncode}): {_apt_error(result.stderr)}. "
                        "The package lists may be stale (apt-get update, as root) or the registry unreachable; "
                        "without it, put the .deb files in a folder and use --data icons:FOLDER")


def fetch_debs(packages: Mapping[str, Package], folder: Path, fetch: Fetcher) -> dict[str, Path]:
    """Fetch every package into ``folder`` with ``fetch`` and check each file; returns them by package name."""
    log.info("icons: fetching %d Debian icon-theme packages with apt-get", len(packages))
    fetch(list(packages.values()), folder)
    found = {}
    for package in packages.values():
        path = folder / package.deb
        if not path.is_file():
            raise DataError(f"icons: apt-get download {package.spec} did not write {package.deb}")
        check_deb(path, package)
        found[package.name] = path
    return found


def find_deb(folder: Path, package: Package) -> Path:
    """``package``'s ``.deb`` in ``folder`` (as ``apt-get download`` names it, or with the epoch's colon), checked."""
    for name in (package.deb, package.deb.replace("%3a", ":")):
        if (folder / name).is_file():
            check_deb(folder / name, package)
            return folder / name
    others = sorted(p.name for p in folder.glob(f"{package.name}_*.deb"))
    hint = f" ({', '.join(others)} is another version)" if others else ""
    raise DataError(f"icons: {folder} has no {package.deb}{hint}; fetch it with: apt-get download {package.spec}")


# ---------------------------------------------------------------------------------------------- unpacking

@contextlib.contextmanager
def _file_tree(deb: Path) -> Iterator[IO[bytes]]:
    """The package's file tree as ``dpkg-deb --fsys-tarfile`` streams it (an uncompressed tar), read to its end."""
    dpkg_deb = shutil.which("dpkg-deb")
    if dpkg_deb is None:
        raise DataError("icons: unpacking the icon themes needs dpkg-deb (Debian's dpkg package), which is not here")
    with tempfile.TemporaryFile() as errors:
        process = subprocess.Popen([dpkg_deb, "--fsys-tarfile", str(deb)], stdin=subprocess.DEVNULL,
                                   stdout=subprocess.PIPE, stderr=errors)
        assert process.stdout is not None
        try:
            yield process.stdout
            process.stdout.read()  # to its end, whatever the reader left
        except (tarfile.TarError, OSError, EOFError) as error:
            process.kill()
            process.wait()
            errors.seek(0)
            reason = (errors.read().decode("utf-8", "replace").strip().splitlines() or [str(error)])[-1]
            raise DataError(f"icons: dpkg-deb cannot unpack {deb}: {reason}") from None
        except BaseException:
            process.kill()
            process.wait()
            raise
        finally:
            process.stdout.close()
        if process.wait() != 0:
            errors.seek(0)
            reason = (errors.read().decode("utf-8", "replace").strip().splitlines() or ["no message"])[-1]
            raise DataError(f"icons: dpkg-deb cannot unpack {deb}: {reason}")


def read_package(deb: Path) -> Tree:
    """The package's file tree (``icons_themes.Tree``), with its themes' ``index.theme`` and its ``copyright``;
    nothing is installed or written."""
    with _file_tree(deb) as stream:
        return Tree.from_tar(stream, wanted_text)


def extract(deb: Path, paths: set[str], target: Path) -> None:
    """Write the regular files ``paths`` (inside the package) of ``deb`` under ``target``, at the same paths."""
    with _file_tree(deb) as stream, tarfile.open(fileobj=stream, mode="r|") as archive:
        for member in archive:
            path = archive_path(member.name)
            if path in paths and member.isfile():
                handle = archive.extractfile(member)
                if handle is not None:
                    (target / path).parent.mkdir(parents=True, exist_ok=True)
                    (target / path).write_bytes(handle.read())


def _keep_licence(tree: Tree, package: Package, target: Path) -> None:
    text = tree.texts.get(tree.resolve(f"usr/share/doc/{package.name}/copyright") or "")
    if text is not None:
        (target / "licences").mkdir(exist_ok=True)
        (target / "licences" / f"{package.name}.copyright").write_bytes(text)


# ---------------------------------------------------------------------------------------------- rendering

def _kind(path: str) -> str:
    return Path(path).suffix.lower().lstrip(".")


def _render_all(files: Sequence[tuple[str, Path, str]], folder: Path, size: int, program: str,
                progress: bool) -> tuple[dict[str, Look], dict[str, str], dict[str, str]]:
    """Render every (key, file, kind) into ``folder/<i>.png``; returns by key each file's ``Look``, its bytes' hash
    and, for the files that could not be drawn, why."""
    from PIL import Image

    from ..progress import progress_bar

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


def _pinned(packages: Mapping[str, Package]) -> dict[str, str]:
    return {p.name: p.version for p in packages.values()}


def _order(drawing: Drawing, package_index: int) -> tuple:
    """Which of two copies is kept (``icons_dedup.select``): a name's own file before an alias, then the drawing made
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
    with _taking_turns(root.parent / f".{root.name}.lock", "icons"):
        check_ours(root)  # again: it may have been made while this process waited
        if _is_built(root, packages, size):
            return root
        try:
            return _build(root, folder, packages, fetch, size, program, progress)
        except OSError as error:
            raise DataError(f"icons: cannot write the build next to {root}: {error.strerror or error}") from None


def _read_packages(packages: Mapping[str, Package], debs: Mapping[str, Path], tmp: Path,
                   size: int) -> tuple[dict[str, dict[str, Drawing]], dict[str, str]]:
    """Every vendor's drawing of every name (``icons_themes``), and each vendor's package; the licences into
    ``tmp``."""
    drawings: dict[str, dict[str, Drawing]] = {}
    vendor_package: dict[str, str] = {}
    for package in packages.values():
        tree = read_package(debs[package.name])
        _keep_licence(tree, package, tmp)
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
            "dataset": "icons", "format": FORMAT_VERSION, "size": size, "packages": _pinned(packages),
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


def _is_built(root: Path, packages: Mapping[str, Package], size: int = IMAGE_SIZE) -> bool:
    """Whether ``root`` is a complete build of ``packages`` at ``size`` by today's rules (its ``meta.json`` says
    so); a build of other versions or rules is built again."""
    try:
        meta = json.loads((root / "meta.json").read_bytes())
    except (OSError, ValueError, RecursionError):
        return False
    return (isinstance(meta, dict) and meta.get("dataset") == "icons" and meta.get("format") == FORMAT_VERSION
            and meta.get("size") == size and meta.get("packages") == _pinned(packages)
            and meta.get("near_identical") == NEAR_IDENTICAL and meta.get("sharing") == SHARING
            and meta.get("shared_near") == SHARED_NEAR and meta.get("min_vendors") == MIN_VENDORS)


# ---------------------------------------------------------------------------------------------- the table

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
    if not _is_built(root, packages):
        build_icons(root, source=folder, progress=progress, packages=packages, fetch=fetch)
        if not _is_built(root, packages):
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
    check_counts("icons", table, PUBLISHED, check and _pinned(packages) == PUBLISHED_FOR)
    return table
