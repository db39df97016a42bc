"""Reading one icon-theme package: its themes' ``index.theme``, its vendors and each vendor's file per name.

A package is read from its file tree as ``dpkg-deb --fsys-tarfile`` streams it (``Tree.from_tar``): every path, what
it is (file, folder, symbolic or hard link) and the few small text files the protocol reads (``index.theme``,
``copyright``); only the files chosen to be drawn are written out afterwards (``unpack.extract``). Links are
followed inside the package only: an absolute target is taken from the package's root (``/usr/share/icons/x`` is the
package's ``usr/share/icons/x``), and a link that leaves the package, loops or leads nowhere (a file of another
package) is no icon. The rules (which themes are vendors, which files are icons, which file of a name is drawn) are
``catalogue``'s.
"""

from __future__ import annotations

import configparser
import tarfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import IO, TypeGuard

from .catalogue import (
    EXTENSIONS,
    ICON_NAME,
    IconFolder,
    folder_kind,
    is_symbolic,
    is_symbolic_folder,
    is_vendor_theme,
    rank,
    vendor_themes,
)

THEMES = "usr/share/icons"
MAX_LINKS = 40
"""Symbolic links followed for one path before it counts as a loop (Linux's own limit)."""


def archive_path(name: str) -> str | None:
    """A tar member's name as a plain relative path (``./usr/x/`` is ``usr/x``); None when it climbs out (``..``)."""
    parts = [p for p in name.split("/") if p not in ("", ".")]
    return None if ".." in parts else "/".join(parts)


@dataclass
class Tree:
    """The file tree of one package: ``kinds`` maps each path (relative, ``/``-separated) to ``file``, ``dir``,
    ``link`` (a symbolic link, its target in ``targets``) or ``hard`` (a hard link to the archive path in
    ``targets``); ``texts`` holds the small text files read on the way."""

    kinds: dict[str, str] = field(default_factory=lambda: {"": "dir"})
    targets: dict[str, str] = field(default_factory=dict)
    texts: dict[str, bytes] = field(default_factory=dict)
    children: dict[str, set[str]] = field(default_factory=dict)

    def add(self, path: str, kind: str, target: str = "") -> None:
        """Record ``path`` (and the folders above it, which an archive need not list)."""
        parts = path.split("/")
        for depth in range(1, len(parts)):
            folder = "/".join(parts[:depth])
            self.kinds.setdefault(folder, "dir")
            self.children.setdefault("/".join(parts[:depth - 1]), set()).add(parts[depth - 1])
        self.kinds[path] = kind
        self.children.setdefault("/".join(parts[:-1]), set()).add(parts[-1])
        if target:
            self.targets[path] = target

    @classmethod
    def from_tar(cls, stream: IO[bytes], keep: Callable[[str], bool]) -> Tree:
        """The tree of a package's uncompressed data archive read from ``stream``, the regular files for which
        ``keep(path)`` is true read into ``texts``."""
        tree = cls()
        with tarfile.open(fileobj=stream, mode="r|") as archive:
            for member in archive:
                path = archive_path(member.name)
                if not path:
                    continue
                if member.isdir():
                    tree.add(path, "dir")
                elif member.issym():
                    tree.add(path, "link", member.linkname)
                elif member.islnk():
                    tree.add(path, "hard", "/" + (archive_path(member.linkname) or ""))
                elif member.isfile():
                    tree.add(path, "file")
                    if keep(path):
                        handle = archive.extractfile(member)
                        if handle is not None:
                            tree.texts[path] = handle.read()
        return tree

    def resolve(self, path: str) -> str | None:
        """``path`` with every link followed inside the package; None when it leaves the package, loops or does not
        exist."""
        parts = [p for p in path.split("/") if p]
        resolved: list[str] = []
        links = 0
        while parts:
            part = parts.pop(0)
            if part == ".":
                continue
            if part == "..":
                if not resolved:
                    return None
                resolved.pop()
                continue
            current = "/".join([*resolved, part])
            kind = self.kinds.get(current)
            if kind is None:
                return None
            if kind in ("link", "hard"):
                links += 1
                if links > MAX_LINKS:
                    return None
                target = self.targets.get(current, "")
                if target.startswith("/"):
                    resolved = []
                parts = [p for p in target.split("/") if p] + parts
                continue
            resolved.append(part)
        return "/".join(resolved)

    def is_file(self, path: str | None) -> TypeGuard[str]:
        return path is not None and self.kinds.get(path) == "file"

    def is_dir(self, path: str | None) -> TypeGuard[str]:
        return path is not None and self.kinds.get(path) == "dir"

    def listdir(self, path: str) -> Iterator[str]:
        """The names in folder ``path`` (as the archive lists them), sorted."""
        yield from sorted(self.children.get(path, ()))

    def text(self, path: str | None) -> str | None:
        """A file read on the way (``from_tar``'s ``keep``), as text; None if it was not."""
        data = self.texts.get(path or "")
        return None if data is None else data.decode("utf-8", errors="replace")


@dataclass(frozen=True)
class Drawing:
    """A vendor's drawing of one icon name: the theme and the file (``listed``: its path in the package, as the
    theme lists it; ``file``: the file itself, every link followed)."""

    vendor: str
    name: str
    theme: str
    listed: str
    file: str
    rank: tuple

    @property
    def kind(self) -> str:
        """``svg``, ``png`` or ``xpm``: the file's own extension, else the listed one."""
        suffix = PurePosixPath(self.file).suffix.lower()
        return (suffix if suffix in EXTENSIONS else PurePosixPath(self.listed).suffix.lower()).lstrip(".")

    @property
    def alias(self) -> bool:
        """Whether the name reaches a file of another name (a symbolic link from one name to another)."""
        return PurePosixPath(self.file).name.rsplit(".", 1)[0] != self.name


def _int(value: str | None) -> int | None:
    try:
        return int(str(value).strip())
    except ValueError:
        return None


class _CaseSensitiveParser(configparser.RawConfigParser):
    """Keys as written (``Size``, ``MinSize``): configparser lower-cases them by default."""

    def optionxform(self, optionstr: str) -> str:
        return optionstr


def read_index(text: str) -> tuple[str, tuple[str, ...], list[IconFolder]] | None:
    """An ``index.theme``'s ``Name``, ``Inherits`` and the folders it lists (``Directories`` and GTK's
    ``ScaledDirectories``) with their sizes; None when it has no ``[Icon Theme]`` group. A folder without a valid
    ``Size`` is skipped, as desktops skip it."""
    parser = _CaseSensitiveParser(strict=False, interpolation=None, delimiters=("=",), comment_prefixes=("#", ";"),
                                  inline_comment_prefixes=None)
    try:
        parser.read_string(text)
    except configparser.Error:
        return None
    if not parser.has_section("Icon Theme"):
        return None
    head = parser["Icon Theme"]
    inherits = tuple(t.strip() for t in head.get("Inherits", "").split(",") if t.strip())
    listed = [d.strip() for key in ("Directories", "ScaledDirectories")
              for d in head.get(key, "").split(",") if d.strip()]
    folders, seen = [], set()
    for order, path in enumerate(listed):
        if path in seen or not parser.has_section(path):
            continue
        seen.add(path)
        section = parser[path]
        size = _int(section.get("Size"))
        if size is None or size <= 0:
            continue
        scale = max(_int(section.get("Scale", "1")) or 1, 1)
        kind = folder_kind(section.get("Type", "Threshold"))
        if kind == "fixed":
            low = high = size
        elif kind == "scalable":
            low, high = _int(section.get("MinSize")) or size, _int(section.get("MaxSize")) or size
        else:
            threshold = _int(section.get("Threshold", "2"))
            threshold = 2 if threshold is None else threshold
            low, high = size - threshold, size + threshold
        folders.append(IconFolder(path, kind, low * scale, high * scale, order))
    return head.get("Name", "").strip(), inherits, folders


def wanted_text(path: str) -> bool:
    """The small files the protocol reads: each theme's ``index.theme`` and each package's ``copyright``."""
    return (path.startswith(THEMES + "/") and path.count("/") == 4 and path.endswith("/index.theme")) or (
        path.startswith("usr/share/doc/") and path.endswith("/copyright"))


def package_themes(tree: Tree) -> dict[str, tuple[str, tuple[str, ...], list[IconFolder]]]:
    """The themes of the package that can be vendors (``is_vendor_theme``), by folder name."""
    themes: dict[str, tuple[str, tuple[str, ...], list[IconFolder]]] = {}
    base = tree.resolve(THEMES)
    if not tree.is_dir(base):
        return themes
    for entry in tree.listdir(base):
        text = tree.text(tree.resolve(f"{base}/{entry}/index.theme"))
        if text is None:
            continue
        read = read_index(text)
        if read is not None and is_vendor_theme(entry, read[0]):
            themes[entry] = read
    return themes


def _theme_files(tree: Tree, theme: str, folders: list[IconFolder], size: int) -> dict[str, tuple[tuple, str, str]]:
    """Theme ``theme``'s best file per icon name: (its rank, its listed path, the file itself)."""
    best: dict[str, tuple[tuple, str, str]] = {}
    for folder in folders:
        if is_symbolic_folder(folder.path):
            continue
        listed_dir = f"{THEMES}/{theme}/{folder.path}"
        real_dir = tree.resolve(listed_dir)
        if not tree.is_dir(real_dir):
            continue
        for entry in tree.listdir(real_dir):
            stem, dot, extension = entry.rpartition(".")
            extension = f".{extension.lower()}"
            if not dot or extension not in EXTENSIONS or not ICON_NAME.fullmatch(stem) or is_symbolic(stem):
                continue
            key = rank(folder, extension, size)
            if stem in best and best[stem][0] <= key:
                continue
            file = tree.resolve(f"{real_dir}/{entry}")
            if tree.is_file(file):
                best[stem] = (key, f"{listed_dir}/{entry}", file)
    return best


def package_drawings(tree: Tree, size: int) -> dict[str, dict[str, Drawing]]:
    """Each vendor's drawing of each icon name in the package, by vendor then name: the vendor theme's own file,
    else that of the first theme folded into it that has one (``vendor_themes``)."""
    themes = package_themes(tree)
    vendors = vendor_themes({folder: inherits for folder, (_, inherits, _) in themes.items()})
    found: dict[str, dict[str, Drawing]] = {}
    for vendor, members in vendors.items():
        drawings: dict[str, Drawing] = {}
        for theme in members:
            for name, (key, listed, file) in _theme_files(tree, theme, themes[theme][2], size).items():
                drawings.setdefault(name, Drawing(vendor, name, theme, listed, file, key))
        if drawings:
            found[vendor] = drawings
    return found
