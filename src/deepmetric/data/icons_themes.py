"""Reading one unpacked icon-theme package: its themes' ``index.theme``, its vendors and each vendor's file per name.

A package is unpacked (``dpkg-deb -x``) into a folder of its own, and nothing outside that folder is ever read: a
symbolic link is followed inside it, an absolute target taken from the folder (``/usr/share/icons/x`` is
``FOLDER/usr/share/icons/x``), and a link that leaves the folder, loops or leads nowhere (a file of another
package) is no icon. The rules (which themes are vendors, which files are icons, which file of a name is drawn) are
``icons_catalogue``'s.
"""

from __future__ import annotations

import configparser
import os
from dataclasses import dataclass
from pathlib import Path

from .icons_catalogue import (
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

THEMES = Path("usr/share/icons")
MAX_LINKS = 40
"""Symbolic links followed for one path before it counts as a loop (Linux's own limit)."""


@dataclass(frozen=True)
class Drawing:
    """A vendor's drawing of one icon name: the theme and the file (``listed``: its path inside the package, as the
    theme lists it; ``file``: the file itself, every link followed)."""

    vendor: str
    name: str
    theme: str
    listed: str
    file: Path
    rank: tuple

    @property
    def kind(self) -> str:
        """``svg``, ``png`` or ``xpm``: the file's own extension, else the listed one."""
        suffix = self.file.suffix.lower()
        return (suffix if suffix in EXTENSIONS else Path(self.listed).suffix.lower()).lstrip(".")

    @property
    def alias(self) -> bool:
        """Whether the name reaches a file of another name (a symbolic link from one name to another)."""
        return self.file.name.rsplit(".", 1)[0] != self.name


def resolve_inside(path: Path, root: Path) -> Path | None:
    """``path`` (inside ``root``) with every symbolic link followed inside ``root``; None when it leaves ``root``,
    loops or does not exist."""
    try:
        parts = list(path.relative_to(root).parts)
    except ValueError:
        return None
    resolved: list[str] = []
    links = 0
    while parts:
        part = parts.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            if not resolved:
                return None
            resolved.pop()
            continue
        current = root.joinpath(*resolved, part)
        if current.is_symlink():
            links += 1
            if links > MAX_LINKS:
                return None
            try:
                target = os.readlink(current)
            except OSError:
                return None
            if target.startswith("/"):
                resolved = []
            parts = [p for p in target.split("/") if p] + parts
            continue
        resolved.append(part)
    final = root.joinpath(*resolved)
    return final if os.path.lexists(final) else None


def _int(value: str | None) -> int | None:
    try:
        return int(str(value).strip())
    except ValueError:
        return None


def read_index(text: str) -> tuple[str, tuple[str, ...], list[IconFolder]] | None:
    """An ``index.theme``'s ``Name``, ``Inherits`` and the folders it lists (``Directories`` and GTK's
    ``ScaledDirectories``) with their sizes; None when it has no ``[Icon Theme]`` group. A folder without a valid
    ``Size`` is skipped, as desktops skip it."""
    parser = configparser.RawConfigParser(strict=False, interpolation=None, delimiters=("=",),
                                          comment_prefixes=("#", ";"), inline_comment_prefixes=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
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


def package_themes(root: Path) -> dict[str, tuple[str, tuple[str, ...], list[IconFolder]]]:
    """The themes of the package unpacked in ``root`` that can be vendors (``is_vendor_theme``), by folder name."""
    base = resolve_inside(root / THEMES, root)
    themes = {}
    if base is None or not base.is_dir():
        return themes
    for entry in sorted(os.listdir(base)):
        index = resolve_inside(base / entry / "index.theme", root)
        if index is None or not index.is_file():
            continue
        read = read_index(index.read_text(encoding="utf-8", errors="replace"))
        if read is not None and is_vendor_theme(entry, read[0]):
            themes[entry] = read
    return themes


def _theme_files(root: Path, theme: str, folders: list[IconFolder], size: int) -> dict[str, tuple[tuple, str, Path]]:
    """Theme ``theme``'s best file per icon name: (its rank, its listed path, the file itself)."""
    best: dict[str, tuple[tuple, str, Path]] = {}
    for folder in folders:
        if is_symbolic_folder(folder.path):
            continue
        listed_dir = THEMES / theme / folder.path
        real_dir = resolve_inside(root / listed_dir, root)
        if real_dir is None or not real_dir.is_dir():
            continue
        with os.scandir(real_dir) as entries:
            for entry in entries:
                stem, dot, extension = entry.name.rpartition(".")
                extension = f".{extension.lower()}"
                if not dot or extension not in EXTENSIONS or not ICON_NAME.fullmatch(stem) or is_symbolic(stem):
                    continue
                key = rank(folder, extension, size)
                if stem in best and best[stem][0] <= key:
                    continue
                if entry.is_symlink():
                    file = resolve_inside(real_dir / entry.name, root)
                    if file is None or not file.is_file():
                        continue
                elif entry.is_file():
                    file = real_dir / entry.name
                else:
                    continue
                best[stem] = (key, (listed_dir / entry.name).as_posix(), file)
    return best


def package_drawings(root: Path, size: int) -> dict[str, dict[str, Drawing]]:
    """Each vendor's drawing of each icon name in the package unpacked in ``root``, by vendor then name: the vendor
    theme's own file, else that of the first theme folded into it that has one (``vendor_themes``)."""
    themes = package_themes(root)
    vendors = vendor_themes({folder: inherits for folder, (_, inherits, _) in themes.items()})
    found: dict[str, dict[str, Drawing]] = {}
    for vendor, members in vendors.items():
        drawings: dict[str, Drawing] = {}
        for theme in members:
            for name, (key, listed, file) in _theme_files(root, theme, themes[theme][2], size).items():
                drawings.setdefault(name, Drawing(vendor, name, theme, listed, file, key))
        if drawings:
            found[vendor] = drawings
    return found
