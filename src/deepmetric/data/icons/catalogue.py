"""The icons protocol: the pinned Debian packages, which themes are vendors, which files are icons, the split.

- ``PACKAGES``: the fourteen Debian icon-theme packages (bookworm), each pinned by version and by the SHA-256 the
  Debian archive publishes for that ``.deb`` (``apt-cache show NAME=VERSION``); no other theme goes in.
- A **vendor** is a theme folder ``usr/share/icons/THEME`` with an ``index.theme``; a theme that inherits (its
  ``Inherits=`` key, followed within the same package) from another theme of its package is a variant of it (dark,
  darker, light, ...) and is folded into it: it only supplies the names the theme it derives from lacks
  (``vendor_themes``). ``hicolor`` (the fallback theme any package may add to) and ``default`` are no vendors, nor is
  a monochrome theme (``Paper-Mono-Dark``: ``MONOCHROME``).
- An **icon** is a ``.svg``, ``.png`` or ``.xpm`` file in a folder its theme's ``index.theme`` lists (the folders a
  desktop searches, as the freedesktop Icon Theme Specification says); its name is the file name without the
  extension. Symbolic icons are out: a name ending in ``-symbolic`` (or ``.symbolic``, GTK's pre-rendered ones), and
  every folder with ``symbolic`` in its path (``symbolic/``, ``scalable/...-symbolic``).
- Of a vendor's files for one name, the one drawn nearest the stored size is taken (``rank``): a folder drawn at
  that size first (a scalable folder whose range covers it, or a fixed one of that size), then larger ones (scaled
  down, the smallest first), then scalable ones drawn for smaller sizes (``scalable-up-to-32``: an SVG scales
  without loss, but its drawing is simplified for small sizes), then smaller bitmaps (scaled up, the largest first).
- A **class** is an icon name that at least ``MIN_VENDORS`` (4) vendors draw once copies are removed
  (``dedup``); its instances are the vendors' drawings.
- The split is class-disjoint, half/half and fixed, as emoji's: names sorted by the SHA-256 of the name, the first
  ceil(n/2) train and the rest test (``training_names``); ``data.val_fraction`` carves a seeded validation split out
  of the training names (``data.val_seed``), as for every data set.

Fetching the packages: ``fetch.py``; unpacking them: ``unpack.py``; reading a theme: ``themes.py``;
rendering, deduplicating and writing the build: ``build.py``; reading it as a table: ``table.py``.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

MIN_VENDORS = 4
"""A class needs this many vendors' drawings once copies are removed."""
EXTENSIONS = (".svg", ".png", ".xpm")
"""Icon files, as the Icon Theme Specification lists them (best first when one folder holds several)."""
NOT_VENDORS = ("hicolor", "default")
"""Theme folders that are no vendor's style: freedesktop's fallback theme, the alias of the default cursor theme."""
MONOCHROME = re.compile(r"(?:^|[^a-z])(?:mono|monochrome|symbolic)(?:[^a-z]|$)", re.IGNORECASE)
"""A theme whose folder or ``Name=`` says it is monochrome (``Paper-Mono-Dark``) is no vendor."""
ICON_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+@-]{0,199}")
"""A usable icon name (matched whole): it names the stored file, so no path separator and no leading dot."""


@dataclass(frozen=True)
class Package:
    """One Debian package: its version and the SHA-256 the Debian archive publishes for its ``.deb``."""

    name: str
    version: str
    sha256: str
    architecture: str = "all"

    @property
    def spec(self) -> str:
        """What ``apt-get download`` is asked for: ``NAME=VERSION``."""
        return f"{self.name}={self.version}"

    @property
    def deb(self) -> str:
        """The file name ``apt-get download`` gives it (an epoch's colon written ``%3a``)."""
        return f"{self.name}_{self.version.replace(':', '%3a')}_{self.architecture}.deb"


PACKAGES: dict[str, Package] = {p.name: p for p in (
    Package("adwaita-icon-theme", "43-1", "4b67610565d16b604d3efd9908e8e4b5d71873c5d0f9347433df509020f22af7"),
    Package("gnome-icon-theme", "3.12.0-5", "243520edcff2c309065b7e12ae08f666580e6098ecafa0c0f7d28c75aedcfdc3"),
    Package("tango-icon-theme", "0.8.90-11", "dff317aca52fde744b884a02dd9fc2702a0cc6aaecc22271b5abf6906cd90b94"),
    Package("oxygen-icon-theme", "5:5.103.0-1", "3e49023e148906e41457a98a19a09858ddd761ef4f212fa356232924b3cebcce"),
    Package("mate-icon-theme", "1.26.0-1", "356945b21bf2449ab4d3c0cead5abbc84fab247b140c6d0252263470df49dc54"),
    Package("elementary-xfce-icon-theme", "0.17-1",
            "012bd2eda0e19b162b9cdc167e904a4a4254f7c2e6409862d0f29a56d3630b75"),
    Package("faenza-icon-theme", "1.3.1-3", "0ba952f8c066ba427182d165b48453cad6360bd4c62ee1abfbec464662e92b2c"),
    Package("faba-icon-theme", "4.3-1", "749f12745e6d037b5cfd12b23a7e2e04e9020d083c7de05e6d9807feeb029fba"),
    Package("moka-icon-theme", "5.5.0-2", "b55540ac018cbb2b2d87f9db451e977d43436069070916025d58ad903fc83117"),
    Package("paper-icon-theme", "1.5.0+git20200312.aa3e8af-4",
            "06ce9ee1b11d46aac18e1df9e97c72df7b494e6a5c593d5f5ee595a78c779fcb"),
    Package("lxde-icon-theme", "0.5.1-2.1", "1b47e4879bf8b456c4d801d9d6a2035550bc50184dea05148e8b6e30c61b5ccd"),
    Package("gnome-icon-theme-nuovo", "0.5-4.2", "41c702c1fdc2e66dccabc6009bac668ba4d5575960823f24f57d46e9679aab74"),
    Package("gnome-icon-theme-gartoon", "0.5-5", "266fa7a6bf94396c7dbff39ed3f04fa2b7c99837172fdebb781b491b4d218bff"),
    Package("deepin-icon-theme", "2021.11.24-1", "ee8875442e7a022c991b68be0fa4d26c7fddc2db62db2db91183239094f64d3e"),
)}
"""The icon themes of the protocol, by package name, in the order that decides which copy of shared artwork is kept
(an earlier package's: GNOME's before MATE's fork, Faba's before Moka's and Paper's)."""


# ---------------------------------------------------------------------------------------------- names and themes

def is_symbolic(name: str) -> bool:
    """Whether icon ``name`` is a symbolic (monochrome, recoloured by the desktop) icon."""
    return name.endswith(("-symbolic", ".symbolic")) or "-symbolic." in name


def is_symbolic_folder(relative: str) -> bool:
    """Whether a theme's folder (its path inside the theme) holds symbolic icons."""
    return "symbolic" in relative.lower()


def is_vendor_theme(folder: str, name: str) -> bool:
    """Whether theme ``folder`` (``Name=`` ``name``) can be a vendor: not freedesktop's fallback, not monochrome."""
    return folder.lower() not in NOT_VENDORS and not MONOCHROME.search(folder) and not MONOCHROME.search(name)


def vendor_themes(inherits: Mapping[str, Iterable[str]]) -> dict[str, list[str]]:
    """The vendors of one package: each theme it ships (``inherits``: folder -> its ``Inherits=`` entries) whose
    inheritance within the package ends at it, with the themes folded into it, itself first, then by folder name.

    A theme's parent is the first entry of its ``Inherits=`` that is another theme of the package; its vendor is the
    parent's vendor (a loop ends at the folder that sorts first)."""
    def parent(theme: str) -> str | None:
        return next((t for t in inherits[theme] if t in inherits and t != theme), None)

    def root(theme: str) -> str:
        seen = [theme]
        while (up := parent(seen[-1])) is not None and up not in seen:
            seen.append(up)
        if up is not None:  # a loop: its members' first folder ends it
            loop = seen[seen.index(up):]
            return min(loop)
        return seen[-1]

    vendors: dict[str, list[str]] = {}
    for theme in sorted(inherits):
        vendors.setdefault(root(theme), []).append(theme)
    return {v: sorted(themes, key=lambda t: (t != v, t)) for v, themes in sorted(vendors.items())}


# ---------------------------------------------------------------------------------------------- which file

@dataclass(frozen=True)
class IconFolder:
    """One folder of a theme as its ``index.theme`` describes it: its path inside the theme and the range of pixel
    sizes its icons are drawn for (``low`` to ``high``: its ``Size`` for a fixed folder, ``MinSize``-``MaxSize``
    for a scalable one, ``Size`` +- ``Threshold`` otherwise; times its ``Scale``)."""

    path: str
    kind: str  # "fixed", "scalable" or "threshold"
    low: int
    high: int
    order: int = 0  # its place in ``Directories`` (the specification's tie-break)


def folder_kind(value: str) -> str:
    """``Type=``'s value, read as desktops do: case aside, by its start (``Fixe``, ``scalable``)."""
    value = value.strip().lower()
    return "fixed" if value.startswith("fix") else "scalable" if value.startswith("sca") else "threshold"


def rank(folder: IconFolder, extension: str, size: int) -> tuple:
    """The sort key of a file of ``folder`` (``extension``: ``.svg``, ``.png``, ``.xpm``) for drawing it at ``size``
    pixels: smaller is better (the module docstring gives the order)."""
    vector = extension == ".svg"
    if folder.low <= size <= folder.high:
        group, distance = 0, 0
    elif folder.low > size:
        group, distance = 1, folder.low - size
    elif vector:
        group, distance = 2, size - folder.high
    else:
        group, distance = 3, size - folder.high
    return group, distance, EXTENSIONS.index(extension), folder.order, folder.path


# ---------------------------------------------------------------------------------------------- the split

def split_key(name: str) -> str:
    """What orders the classes for the split: the SHA-256 of the icon name."""
    return hashlib.sha256(name.encode("utf-8")).hexdigest()


def training_names(names: Iterable[str]) -> set[str]:
    """The icon names whose classes train: the first ceil(n/2) of ``names`` sorted by ``split_key``."""
    ordered = sorted(set(names), key=split_key)
    return set(ordered[: math.ceil(len(ordered) / 2)])
