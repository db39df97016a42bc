"""``emoji``: five companies' drawings of the same emoji, a real many-class, SOP-shaped retrieval set.

A class is one emoji; its instances are Apple's, Google's, Twitter's, Facebook's and JoyPixels' 64 x 64
drawings of it. The drawings ship in five pinned npm packages (``PACKAGES``): on first use ``npm pack`` fetches
each tarball, its sha512 is checked against the integrity hash the npm registry publishes for that version (pinned
here), and only the 64-px PNGs, ``emoji.json`` and the licence files are unpacked into ``$DEEPMETRIC_DATA/emoji``.
``emoji:PATH`` reads the tarballs (``NAME-VERSION.tgz``, as ``npm pack`` names them) or unpacked packages (a folder
``NAME`` or ``NAME-VERSION`` holding ``package.json``, or its ``package/``) from ``PATH``, with no network.

The protocol (``emoji_classes``, ``split_of``):

- classes are the base emoji of ``emoji.json`` (no skin-tone variant, no ``Component`` such as the bare skin-tone
  swatches) that all five vendors draw: 1,633 classes x 5 = 8,165 images for the pinned versions;
- a class is named by its ``unified`` code points and short name, e.g. ``1F600 grinning``;
- the split is class-disjoint, half/half, fixed: classes sorted by the SHA-256 of their code points, the first
  ceil(n/2) train (817 classes, 4,085 images) and the rest test (816, 4,080). A hash spreads every category over both
  halves; Unicode order would put every flag on one side;
- every test image queries the other test images (as in SOP); Recall@1, 2, 4, 8.

``emoji-skin`` adds each skin-tone variant that all five draw as a class of its own (e.g.
``1F44B-1F3FB waving-hand (light skin tone)``), on the same side of the split as its base emoji: a harder,
fine-grained variant, not the default.

The images are the vendors' artwork, read locally and never redistributed by this project. Their licences, as the
packages state them: emoji-datasource's code is MIT; Apple's images are (c) Apple Inc. and not licensed for commercial
use; Google's (Noto) are Apache 2.0; Twitter's (Twemoji) CC BY 4.0; Facebook's have no clear licence; JoyPixels'
(emoji-assets) come under the JoyPixels Free License (``LICENSE.md`` in the package).
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import math
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
from ..io import fsync_dir, temporary_folder
from .glyphs import data_home
from .table import RetrievalTable, check_counts

FORMAT_VERSION = 1
VENDORS = ("apple", "google", "twitter", "facebook", "joypixels")
RECALL_AT = (1, 2, 4, 8)
EXCLUDED_CATEGORIES = ("Component",)
SKIN_TONES = {"1F3FB": "light", "1F3FC": "medium-light", "1F3FD": "medium", "1F3FE": "medium-dark",
              "1F3FF": "dark"}
IMAGE_NAME = re.compile(r"^[0-9a-f]+(-[0-9a-f]+)*\.png$")
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


# ---------------------------------------------------------------------------------------------- the protocol

@dataclass(frozen=True)
class EmojiClass:
    """One class: its name, its base emoji's code points (which decide its side of the split), its category and the
    file name of each vendor's drawing."""

    name: str
    base: str
    category: str
    files: dict[str, str]


def split_of(base_unified: str) -> str:
    """The key that orders the classes for the split: SHA-256 of the base emoji's code points (upper case)."""
    return hashlib.sha256(base_unified.upper().encode("ascii")).hexdigest()


def _joypixels_file(entry: Mapping, available: set[str]) -> str | None:
    """JoyPixels files an emoji by its lower-case code points, some under the non-qualified form."""
    for key in (entry.get("unified"), entry.get("non_qualified")):
        if key and f"{key.lower()}.png" in available:
            return f"{key.lower()}.png"
    return None


def _drawings(entry: Mapping, available: Mapping[str, set[str]]) -> dict[str, str] | None:
    """Each vendor's file for ``entry`` (a base emoji or a skin variation), or None unless all five draw it."""
    files = {}
    for vendor in VENDORS:
        if vendor == "joypixels":
            name = _joypixels_file(entry, available[vendor])
        else:
            name = entry.get("image") if entry.get(f"has_img_{vendor}") else None
            name = name if name in available[vendor] else None
        if name is None:
            return None
        files[vendor] = name
    return files


def _skin_name(short_name: str, key: str) -> str:
    tones = [SKIN_TONES.get(part.upper(), part) for part in key.split("-")]
    return f"{short_name} ({', '.join(tones)} skin tone)"


def emoji_classes(catalogue: list[Mapping], available: Mapping[str, set[str]], skin: bool = False) -> list[EmojiClass]:
    """The protocol's classes, in catalogue order: base emoji outside ``EXCLUDED_CATEGORIES`` drawn by all five
    vendors (``available``: the PNG names each vendor ships), and with ``skin`` their skin-tone variants drawn by all
    five."""
    classes = []
    for entry in catalogue:
        if entry.get("category") in EXCLUDED_CATEGORIES:
            continue
        files = _drawings(entry, available)
        if files is None:
            continue
        base = str(entry["unified"]).upper()
        classes.append(EmojiClass(f"{base} {entry['short_name']}", base, str(entry["category"]), files))
        if not skin:
            continue
        for key, variant in sorted((entry.get("skin_variations") or {}).items()):
            variant_files = _drawings(variant, available)
            if variant_files is not None:
                classes.append(EmojiClass(f"{str(variant['unified']).upper()} {_skin_name(entry['short_name'], key)}",
                                          base, str(entry["category"]), variant_files))
    return classes


def training_bases(classes: list[EmojiClass]) -> set[str]:
    """The base emoji whose classes train: the first ceil(n/2) of the base emoji sorted by ``split_of``."""
    bases = sorted({c.base for c in classes}, key=split_of)
    return set(bases[: math.ceil(len(bases) / 2)])


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
        try:
            version = json.loads((root / "package.json").read_text(encoding="utf-8")).get("version")
        except (OSError, ValueError) as error:
            raise DataError(f"emoji: {root / 'package.json'} cannot be read: {error}") from None
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
                    name.startswith(package.images) and IMAGE_NAME.match(name[len(package.images):]))
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
        if IMAGE_NAME.match(file.name) and file.is_file():
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


def build_emoji(root: Path | None = None, source: str | Path | None = None, progress: bool = True,
                packages: Mapping[str, Package] | None = None) -> Path:
    """Fetch (or read from ``source``) the five packages (default ``PACKAGES``) and unpack their drawings into
    ``root`` (default ``data_home()/emoji``); the folder appears complete, with its ``meta.json``, or not at all."""
    root = Path(root) if root is not None else data_home() / "emoji"
    packages = PACKAGES if packages is None else packages
    tmp = temporary_folder(root)
    try:
        with tempfile.TemporaryDirectory(prefix=".emoji-download.", dir=root.parent) as download:
            counts = {}
            for i, package in enumerate(packages.values(), 1):
                if source is not None:
                    found = find_source(Path(source), package)
                else:
                    log.info("emoji: fetching %s with npm (%d/%d)", package.spec, i, len(packages))
                    found = npm_pack(package, Path(download))
                counts[package.vendor] = _unpack(found, package, tmp, progress)
                if found.is_file() and source is None:
                    found.unlink()  # a tarball of 60-130 MB is not kept once unpacked
        if not (tmp / CATALOGUE_VENDOR / "emoji.json").is_file():
            raise DataError(f"emoji: {packages[CATALOGUE_VENDOR].spec} has no emoji.json")
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
        meta = json.loads((root / "meta.json").read_text())
    except (OSError, ValueError):
        return False
    return meta.get("format") == FORMAT_VERSION and meta.get("packages") == {
        p.vendor: p.spec for p in packages.values()}


# ---------------------------------------------------------------------------------------------- the table

def load_emoji(path: str | Path | None = None, check: bool = True, skin: bool = False, root: str | Path | None = None,
               packages: Mapping[str, Package] | None = None, progress: bool = True) -> RetrievalTable:
    """The emoji table (``skin``: with the skin-tone variants), building ``root`` (default ``data_home()/emoji``)
    first when it is missing or holds other package versions; ``path`` is where the packages are read from instead
    of npm. ``check`` refuses split sizes other than the pinned versions' (``PUBLISHED``)."""
    name = "emoji-skin" if skin else "emoji"
    root = Path(root) if root is not None else data_home() / "emoji"
    packages = PACKAGES if packages is None else packages
    if not _is_built(root, packages):
        build_emoji(root, source=path, progress=progress, packages=packages)
    catalogue = json.loads((root / CATALOGUE_VENDOR / "emoji.json").read_text(encoding="utf-8"))
    available = {v: {p.name for p in (root / v / "64").glob("*.png")} for v in VENDORS}
    classes = emoji_classes(catalogue, available, skin=skin)
    if len(classes) < 4:
        raise DataError(f"emoji: only {len(classes)} emoji are drawn by all five vendors in {root}; rebuild it")
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

