"""``emoji``: five companies' drawings of the same emoji, a real many-class, SOP-shaped retrieval set.

A class is one emoji; its instances are Apple's, Google's, Twitter's, Facebook's and JoyPixels' 64 x 64
drawings of it. The drawings ship in five pinned npm packages (``PACKAGES``): on first use ``npm pack`` fetches
each tarball, its sha512 is checked against the integrity hash the npm registry publishes for that version (pinned
here), and only the 64-px PNGs, ``emoji.json`` and the licence files are unpacked into ``$DEEPMETRIC_DATA/emoji``.
``emoji:PATH`` reads the tarballs (``NAME-VERSION.tgz``, as ``npm pack`` names them) or unpacked packages (a folder
``NAME`` or ``NAME-VERSION`` holding ``package.json``, or its ``package/``) from ``PATH``, with no network.
``PATH`` must exist and hold the five pinned packages, checked every time (a tarball's sha512, a folder's
``package.json`` version); when ``$DEEPMETRIC_DATA/emoji`` already holds a build of those same versions (from npm or
another ``PATH``) that build is used, not unpacked again: it is the same drawings. A ``PATH`` that does not exist is
refused (``emoji: no such folder: PATH``), never replaced by an earlier build.

Everything read is checked before the folder counts as built: a ``package.json`` that is not an object with a
``version``, an ``emoji.json`` that is not valid JSON or not a list of records with the fields the protocol reads
(``unified`` code points, ``short_name``, ``category``, ``image``, ...), or too few emoji drawn by all five, is one
``DataError`` naming the file and what is wrong, and leaves no ``meta.json``: the build is unpacked in a temporary
folder and renamed to ``$DEEPMETRIC_DATA/emoji`` only once its catalogue has been read.

The protocol, which emoji are classes (1,633 drawn by all five, 8,165 images), their names and their fixed
class-disjoint split (817 / 816 classes), and ``emoji-skin``'s skin-tone classes, is ``emoji_catalogue``'s.

The images are the vendors' artwork, read locally and never redistributed by this project. Their licences, as the
packages state them: emoji-datasource's code is MIT; Apple's images are (c) Apple Inc. and not licensed for commercial
use; Google's (Noto) are Apache 2.0; Twitter's (Twemoji) CC BY 4.0; Facebook's have no clear licence; JoyPixels'
(emoji-assets) come under the JoyPixels Free License (``LICENSE.md`` in the package).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import DataError
from ..folders import source_folder
from ..io.files import fsync_dir, temporary_folder
from .emoji_catalogue import VENDORS, EmojiClass, emoji_classes, kind_of, read_catalogue, training_bases
from .glyphs import data_home
from .registry import register_dataset
from .table import RetrievalTable, check_counts
from .turns import taking_turns, unwritable

SOURCE_HOLDS = "the five packages' tarballs"
"""What ``emoji:PATH`` is the folder of."""

FORMAT_VERSION = 1
RECALL_AT = (1, 2, 4, 8)
IMAGE_NAME = re.compile(r"[0-9a-f]+(-[0-9a-f]+)*\.png")  # matched whole (fullmatch)
log = logging.getLogger("deepmetric")


@dataclass(frozen=True)
class Package:
    """One npm package of drawings: where its 64-px PNGs sit in the tarball and the registry's integrity hash."""

    vendor: str
    name: str
    version: str
    integrity: str
    images: str  # the folder of 64-px PNGs inside the tarball

    @property
    def spec(self) -> str:
        return f"{self.name}@{self.version}"

    @property
    def tarball(self) -> str:
        """The file name ``npm pack`` gives it."""
        return f"{self.name}-{self.version}.tgz"


def _datasource(vendor: str, integrity: str) -> Package:
    return Package(vendor, f"emoji-datasource-{vendor}", "16.0.0", integrity, f"package/img/{vendor}/64/")


PACKAGES: dict[str, Package] = {p.vendor: p for p in (
    _datasource("apple",
                "sha512-dVYjsK0FnCry9F+PBtnivhG2K0xdwlmqYaSgiUtztUdAGPYiHYhZcVKvNBqC791g2qyEcFNTBO6utg4eQ3uLTw=="),
    _datasource("google",
                "sha512-ZRexfzs7MVoLnmzZmNsO4TKhnAJp5D++Vm6PpUpH/jEQQlemp3l88CjZ+DoZ2faM9R4QxZkOPJCoT8DlPhfQ3A=="),
    _datasource("twitter",
                "sha512-7F+uCuHH+7Qnrc15P5tnbvKkg9E6tlzi4MnT2uW1RlN4pLYTza6cP/dstIfSDMtpjFLWuZewWg8jBbuL2eyELQ=="),
    _datasource("facebook",
                "sha512-b9ZxJdB7nMWGckH1vyCjPSosaa6MJYuojPPFiQ0LmDIZS8vlG454XKcmTFKrXIMAA72O4MRJMYFhvWI8pjyciQ=="),
    Package("joypixels", "emoji-assets", "11.0.0",
            "sha512-JvU2JU2QR4g/l+usNyh9CgxPZ6ow+Ik/KSGbLMOoFiGBMg+kZK1W3kFLo+zSSMVG3a25tG5lWwP2cxHkl6Kp7A==",
            "package/png/64/"),
)}
CATALOGUE_VENDOR = "apple"
"""Whose ``emoji.json`` lists the emoji (the four emoji-datasource packages of one version ship the same file)."""
KEPT_FILES = ("package/package.json", "package/LICENSE", "package/LICENSE.md", "package/README.md")

PUBLISHED = {"emoji": {"train": 4085, "test": 4080}, "emoji-skin": {"train": 5485, "test": 5955}}
"""Split sizes for the pinned package versions; a table that differs is refused (``data.check_counts``)."""


# ---------------------------------------------------------------------------------------------- fetching

def _integrity(path: Path) -> str:
    digest = hashlib.sha512()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return "sha512-" + base64.b64encode(digest.digest()).decode("ascii")


def check_tarball(path: Path, package: Package) -> None:
    """Refuse a tarball whose sha512 differs from the registry's published integrity for ``package``."""
    found = _integrity(path)
    if found != package.integrity:
        raise DataError(f"emoji: {path} is not {package.spec} as the npm registry publishes it (its sha512 is "
                        f"{found[:27]}..., the registry's is {package.integrity[:27]}...); delete it and fetch "
                        "it again")


def npm_pack(package: Package, folder: Path) -> Path:
    """Fetch ``package``'s tarball into ``folder`` with npm's own client and check its integrity."""
    npm = shutil.which("npm")
    if npm is None:
        raise DataError(f"emoji: fetching {package.spec} needs npm, which is not installed (Debian: apt-get install "
                        "npm; or https://nodejs.org). Without npm, put the five tarballs ("
                        f"{', '.join(p.tarball for p in PACKAGES.values())}) in a folder and use --data emoji:FOLDER")
    # npm's output (its JSON answer, notices, progress) is captured, never left on this process's standard output
    result = subprocess.run([npm, "pack", package.spec, "--json", "--pack-destination", str(folder)],
                            stdin=subprocess.DEVNULL, capture_output=True, text=True, errors="replace")
    if result.returncode != 0:
        reason = (result.stderr.strip().splitlines() or ["no message"])[-1]
        raise DataError(f"emoji: npm pack {package.spec} failed (exit {result.returncode}): {reason}")
    path = folder / package.tarball
    if not path.is_file():
        raise DataError(f"emoji: npm pack {package.spec} did not write {path}")
    check_tarball(path, package)
    return path


def _unpacked_root(folder: Path) -> Path | None:
    for candidate in (folder / "package", folder):
        if (candidate / "package.json").is_file():
            return candidate
    return None


def _package_version(path: Path) -> str:
    """The ``version`` of an unpacked package's ``package.json``."""
    try:
        manifest = json.loads(path.read_bytes())
    except OSError as error:
        raise DataError(f"emoji: {path} cannot be read: {error.strerror or error}") from None
    except (ValueError, RecursionError) as error:
        raise DataError(f"emoji: {path} is not valid JSON: {error}") from None
    if not isinstance(manifest, dict):
        raise DataError(f"emoji: {path} must be an object with the package's name and version, not "
                        f"{kind_of(manifest)}")
    version = manifest.get("version")
    if not isinstance(version, str):
        raise DataError(f"emoji: {path} has no version string ('version' is {kind_of(version)})")
    return version


def find_source(source: Path, package: Package) -> Path:
    """``package``'s tarball or unpacked folder in ``source``, its version checked."""
    tarball = source / package.tarball
    if tarball.is_file():
        check_tarball(tarball, package)
        return tarball
    for folder in (source / package.name, source / f"{package.name}-{package.version}"):
        root = _unpacked_root(folder)
        if root is None:
            continue
        version = _package_version(root / "package.json")
        if version != package.version:
            raise DataError(f"emoji: {root} holds {package.name} {version}; the emoji protocol is defined on "
                            f"{package.version} (npm pack {package.spec})")
        return root
    others = sorted(p.name for p in source.glob(f"{package.name}-*.tgz"))
    hint = f" ({', '.join(others)} is another version)" if others else ""
    raise DataError(f"emoji: {source} has no {package.tarball} and no unpacked {package.name}/ folder{hint}; "
                    f"fetch it with: npm pack {package.spec}")


# ---------------------------------------------------------------------------------------------- unpacking

def _tar_members(path: Path, package: Package) -> Iterator[tuple[str, bytes]]:
    """(path inside the package, bytes) of the files kept: the 64-px PNGs, ``emoji.json`` and the licence files.
    Only regular files with plain names are read, and nothing is extracted by the archive's own paths."""
    try:
        with tarfile.open(path, "r:gz") as archive:
            for member in archive:
                name = member.name
                keep = name in KEPT_FILES or name == "package/emoji.json" or (
                    name.startswith(package.images) and IMAGE_NAME.fullmatch(name[len(package.images):]))
                if keep and member.isfile():
                    handle = archive.extractfile(member)
                    if handle is not None:
                        yield name, handle.read()
    except (tarfile.TarError, OSError, EOFError) as error:
        raise DataError(f"emoji: {path} cannot be read as a tarball: {error}") from None


def _folder_members(root: Path, package: Package) -> Iterator[tuple[str, bytes]]:
    inside = package.images.removeprefix("package/")
    for name in ("package.json", "LICENSE", "LICENSE.md", "README.md", "emoji.json"):
        if (root / name).is_file():
            yield f"package/{name}", (root / name).read_bytes()
    images = root / inside
    if not images.is_dir():
        raise DataError(f"emoji: {root} has no {inside} folder of 64-px drawings")
    for file in sorted(images.iterdir()):
        if IMAGE_NAME.fullmatch(file.name) and file.is_file():
            yield package.images + file.name, file.read_bytes()


def _unpack(source: Path, package: Package, target: Path, progress: bool) -> int:
    """Write ``package``'s kept files into ``target/<vendor>/``; returns the number of drawings."""
    from ..progress import progress_bar

    members = _tar_members(source, package) if source.is_file() else _folder_members(source, package)
    vendor_dir = target / package.vendor
    (vendor_dir / "64").mkdir(parents=True)
    count = 0
    for name, data in progress_bar(members, desc=f"unpacking {package.vendor}", unit="file", disable=not progress):
        if name.startswith(package.images):
            (vendor_dir / "64" / name[len(package.images):]).write_bytes(data)
            count += 1
        else:
            (vendor_dir / name.removeprefix("package/")).write_bytes(data)
    if count == 0:
        raise DataError(f"emoji: {source} holds no 64-px drawings under {package.images}")
    return count


def _origin(found: Path, package: Package, fetched: bool, member: str) -> str:
    """How messages name ``member`` (``package/emoji.json``) of ``package`` read from ``found``."""
    if fetched:
        return f"{member} of {package.spec} (fetched with npm)"
    return f"{member} in {found}" if found.is_file() else str(found / member.removeprefix("package/"))


def _check_drawn(catalogue: list[dict], root: Path, where: str) -> list[EmojiClass]:
    """The classes of ``catalogue`` over the drawings in ``root``; too few for the protocol is refused."""
    available = {v: {p.name for p in (root / v / "64").glob("*.png")} for v in VENDORS}
    classes = emoji_classes(catalogue, available)
    if len(classes) < 4:
        raise DataError(f"emoji: {where} lists only {len(classes)} emoji that all five vendors draw; the protocol "
                        "needs at least 4")
    return classes


def build_emoji(root: Path | None = None, source: str | Path | None = None, progress: bool = True,
                packages: Mapping[str, Package] | None = None) -> Path:
    """Fetch (or read from folder ``source``) the five packages (default ``PACKAGES``) and unpack their drawings
    into ``root`` (default ``data_home()/emoji``); the folder appears complete, its catalogue read and its
    ``meta.json`` written, or not at all (a build that fails leaves what was there before)."""
    root = Path(root) if root is not None else data_home() / "emoji"
    packages = PACKAGES if packages is None else packages
    folder = source_folder("emoji", source, SOURCE_HOLDS) if source is not None else None
    tmp = temporary_folder(root)
    where = f"package/emoji.json of {CATALOGUE_VENDOR}'s package"
    try:
        with tempfile.TemporaryDirectory(prefix=".emoji-download.", dir=root.parent) as download:
            counts = {}
            for i, package in enumerate(packages.values(), 1):
                if folder is not None:
                    found = find_source(folder, package)
                else:
                    log.info("emoji: fetching %s with npm (%d/%d)", package.spec, i, len(packages))
                    found = npm_pack(package, Path(download))
                counts[package.vendor] = _unpack(found, package, tmp, progress)
                if package.vendor == CATALOGUE_VENDOR:
                    where = _origin(found, package, folder is None, "package/emoji.json")
                if found.is_file() and folder is None:
                    found.unlink()  # a tarball of 60-130 MB is not kept once unpacked
        catalogue_file = tmp / CATALOGUE_VENDOR / "emoji.json"
        if not catalogue_file.is_file():
            raise DataError(f"emoji: {where} does not exist: {packages[CATALOGUE_VENDOR].spec} has no emoji.json")
        _check_drawn(read_catalogue(catalogue_file.read_bytes(), where), tmp, where)  # before it counts as built
        meta = {"format": FORMAT_VERSION, "packages": {p.vendor: p.spec for p in packages.values()},
                "drawings": counts, "source": str(source) if source is not None else "npm"}
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2))
        if root.exists():
            shutil.rmtree(root)
        os.replace(tmp, root)
        fsync_dir(root.parent)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    log.info("emoji: %s drawings of %d vendors written to %s", f"{sum(counts.values()):,}", len(packages), root)
    return root


def _is_built(root: Path, packages: Mapping[str, Package]) -> bool:
    try:
        meta = json.loads((root / "meta.json").read_bytes())
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(meta, dict) and meta.get("format") == FORMAT_VERSION and meta.get("packages") == {
        p.vendor: p.spec for p in packages.values()}


def _built_catalogue(root: Path, packages: Mapping[str, Package]) -> list[dict] | None:
    """``root``'s catalogue when ``root`` holds a complete build of ``packages`` (its ``meta.json`` names them and its
    ``emoji.json`` reads), else None; a build whose catalogue does not read is logged, to be built again."""
    if not _is_built(root, packages):
        return None
    file = root / CATALOGUE_VENDOR / "emoji.json"
    try:
        return read_catalogue(file.read_bytes(), str(file))
    except OSError as error:
        problem = f"{file} cannot be read: {error.strerror or error}"
    except DataError as error:
        problem = str(error).removeprefix("emoji: ")
    log.warning("emoji: %s is not a complete build (%s); building it again", root, problem)
    return None


# ---------------------------------------------------------------------------------------------- the table

@register_dataset("emoji", "folder")
def load_emoji(path: str | Path | None = None, check: bool = True, skin: bool = False, root: str | Path | None = None,
               packages: Mapping[str, Package] | None = None, progress: bool = True) -> RetrievalTable:
    """The emoji table (``skin``: with the skin-tone variants), building ``root`` (default ``data_home()/emoji``)
    first when it is missing or holds other package versions; ``path`` is the folder the packages are read from
    instead of npm: it must exist and hold them (checked, and unpacked only when ``root`` holds no build of the same
    versions). ``check`` refuses split sizes other than the pinned versions' (``PUBLISHED``)."""
    name = "emoji-skin" if skin else "emoji"
    root = Path(root) if root is not None else data_home() / "emoji"
    packages = PACKAGES if packages is None else packages
    # the path first: never an earlier build in its place
    folder = source_folder("emoji", path, SOURCE_HOLDS) if path is not None else None
    catalogue = _built_catalogue(root, packages)
    if catalogue is None:
        try:
            root.parent.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise unwritable("emoji", root.parent, error) from None
        with taking_turns(root.parent / f".{root.name}.lock", "emoji"):  # two trainings started together
            catalogue = _built_catalogue(root, packages)  # built by the process this one waited for
            if catalogue is None:
                build_emoji(root, source=folder, progress=progress, packages=packages)
                catalogue = _built_catalogue(root, packages)
        if catalogue is None:
            raise DataError(f"emoji: {root} was built but does not read back; another process may be writing it")
    elif folder is not None:  # the same versions are built: PATH is checked to hold them, not unpacked again
        for package in packages.values():
            find_source(folder, package)
        log.info("emoji: %s holds the packages %s was built from; using that build", path, root)
    available = {v: {p.name for p in (root / v / "64").glob("*.png")} for v in VENDORS}
    classes = emoji_classes(catalogue, available, skin=skin)
    if len(classes) < 4:
        raise DataError(f"emoji: only {len(classes)} emoji are drawn by all five vendors in {root}; delete it to "
                        "build it again")
    train = training_bases(classes)
    images, labels, splits = [], [], []
    for label, emoji in enumerate(classes):
        side = "train" if emoji.base in train else "test"
        for vendor in VENDORS:
            images.append(str(root / vendor / "64" / emoji.files[vendor]))
            labels.append(label)
            splits.append(side)
    ones = np.ones(len(labels), dtype=bool)
    table = RetrievalTable(
        name=name, images=images, labels=np.array(labels, dtype=np.int64), splits=np.array(splits, dtype=object),
        is_query=ones, is_gallery=ones, recall_at=RECALL_AT,
        class_names={i: c.name for i, c in enumerate(classes)},
        meta={"root": str(root), "vendors": list(VENDORS), "skin": skin})
    check_counts(name, table, PUBLISHED[name], check)
    return table


register_dataset("emoji-skin", "folder", functools.partial(load_emoji, skin=True))
