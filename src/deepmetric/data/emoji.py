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
IMAGE_NAME = re.compile(r"[0-9a-f]+(-[0-9a-f]+)*\.png")  # matched whole (fullmatch)
CODE_POINTS = re.compile(r"[0-9A-Fa-f]{1,6}(-[0-9A-Fa-f]{1,6})*")
"""``unified``, ``non_qualified``, a skin variation's key: hexadecimal code points joined by ``-`` (``1F44B-1F3FB``)."""
MAX_LISTED = 10  # malformed records a refusal lists before it counts the rest
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


def _kind(value: object) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number" if isinstance(value, (int, float)) else type(value).__name__)


def _record_problems(record: object, what: str, base: bool) -> list[str]:
    """What is wrong with one ``emoji.json`` record (``base``: an emoji; else a skin variation): the fields the
    protocol reads and their types."""
    if not isinstance(record, dict):
        return [f"{what} is {_kind(record)}, not an object"]
    problems = []
    required = {"unified": "code points", "image": "a string"}
    if base:
        required.update(short_name="a string", category="a string")
    for field, expected in required.items():
        value = record.get(field)
        if field not in record:
            problems.append(f"{what} has no '{field}'")
        elif not isinstance(value, str):
            problems.append(f"{what}: '{field}' must be {expected}, not {_kind(value)}")
        elif field == "unified" and not CODE_POINTS.fullmatch(value):
            problems.append(f"{what}: 'unified' must be hexadecimal code points such as '1F44B-1F3FB', not "
                            f"{value[:40]!r}")
        elif field == "short_name" and not (value and value.isprintable()):
            problems.append(f"{what}: 'short_name' {value[:40]!r} must be a non-empty printable name")
    non_qualified = record.get("non_qualified")
    if non_qualified is not None and not (isinstance(non_qualified, str) and CODE_POINTS.fullmatch(non_qualified)):
        problems.append(f"{what}: 'non_qualified' must be code points or null, not {non_qualified!r:.40}")
    for vendor in VENDORS:
        flag = record.get(f"has_img_{vendor}")
        if flag is not None and not isinstance(flag, bool):
            problems.append(f"{what}: 'has_img_{vendor}' must be true or false, not {_kind(flag)}")
    if not base:
        return problems
    variations = record.get("skin_variations")
    if variations is not None and not isinstance(variations, dict):
        return [*problems, f"{what}: 'skin_variations' must be an object, not {_kind(variations)}"]
    for key, variation in (variations or {}).items():
        if not CODE_POINTS.fullmatch(key):
            problems.append(f"{what}: skin variation {key[:40]!r} is not named by code points")
        problems.extend(_record_problems(variation, f"{what}'s skin variation {key[:40]!r}", base=False))
    return problems


def read_catalogue(data: bytes, where: str) -> list[dict]:
    """``emoji.json``'s records, each checked for the fields the protocol reads (``where``: the file, as messages
    name it); anything else is one ``DataError`` listing what is wrong."""
    try:
        catalogue = json.loads(data)
    except (ValueError, RecursionError) as error:  # invalid JSON or UTF-8; nesting too deep
        raise DataError(f"emoji: {where} is not valid JSON: {error}") from None
    if not isinstance(catalogue, list):
        raise DataError(f"emoji: {where} must be a list of emoji records, not {_kind(catalogue)}")
    problems, seen = [], {}
    for number, record in enumerate(catalogue):
        unified = record.get("unified") if isinstance(record, dict) else None
        what = f"record {number}" + (f" ({unified[:40]!r})" if isinstance(unified, str) else "")
        found = _record_problems(record, what, base=True)
        problems.extend(found)
        if found:
            continue
        for variation in [record, *(record.get("skin_variations") or {}).values()]:
            unified = variation["unified"].upper()
            if unified in seen:
                problems.append(f"{what}: code points {unified} are already those of record {seen[unified]}")
            seen.setdefault(unified, number)
    if problems:
        more = f"\n  ... and {len(problems) - MAX_LISTED} more" if len(problems) > MAX_LISTED else ""
        raise DataError(f"emoji: {where} is not the emoji-datasource catalogue ({len(problems)} problem(s)):\n  "
                        + "\n  ".join(problems[:MAX_LISTED]) + more)
    return catalogue


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
                        f"{_kind(manifest)}")
    version = manifest.get("version")
    if not isinstance(version, str):
        raise DataError(f"emoji: {path} has no version string ('version' is {_kind(version)})")
    return version


def source_folder(source: str | Path) -> Path:
    """``emoji:PATH``'s folder: one that does not exist is refused, naming it."""
    folder = Path(source)
    if not folder.is_dir():
        raise DataError(f"emoji: no such folder: {source}" if not folder.exists() else
                        f"emoji: {source} is not a folder (expected the folder of the five packages' tarballs)")
    return folder


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
    folder = source_folder(source) if source is not None else None
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

def load_emoji(path: str | Path | None = None, check: bool = True, skin: bool = False, root: str | Path | None = None,
               packages: Mapping[str, Package] | None = None, progress: bool = True) -> RetrievalTable:
    """The emoji table (``skin``: with the skin-tone variants), building ``root`` (default ``data_home()/emoji``)
    first when it is missing or holds other package versions; ``path`` is the folder the packages are read from
    instead of npm: it must exist and hold them (checked, and unpacked only when ``root`` holds no build of the same
    versions). ``check`` refuses split sizes other than the pinned versions' (``PUBLISHED``)."""
    name = "emoji-skin" if skin else "emoji"
    root = Path(root) if root is not None else data_home() / "emoji"
    packages = PACKAGES if packages is None else packages
    folder = source_folder(path) if path is not None else None  # first: never an earlier build in its place
    catalogue = _built_catalogue(root, packages)
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

