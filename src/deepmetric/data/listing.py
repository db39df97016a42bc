"""Images a user names: an image file, a folder of them, or a ``.txt`` / ``.lst`` list, as every command that takes
images (``embed``, ``index``, ``search``, ``explain``) and the Python ``Index`` reads them."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..errors import DataError
from ..folders import check_image_path
from .images import IMAGE_EXTENSIONS
from .table import RetrievalTable

LIST_SUFFIXES = (".txt", ".lst")
"""A file of these endings given where images are asked lists them, one path a line."""
LINE_BREAKS = frozenset("\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029")
"""What ``str.splitlines`` breaks a line at: an image name holding one is refused wherever images are given (a
folder, a file, a list), as ``OUT.paths.txt`` and a list file hold one name a line."""


def read_image_list(list_file: Path) -> list[Path]:
    """The images a ``.txt`` / ``.lst`` file lists, one path a line relative to the list's folder (blank lines and
    ``#`` comments ignored), each checked to be an image file; their folders' links resolved."""
    folder = list_file.parent.resolve()
    files = []
    try:  # as written: read_text would turn a lone \r into a line break, splitlines \x85 and U+2028 too
        text = list_file.read_bytes().decode("utf-8")
    except UnicodeDecodeError as error:
        raise DataError(f"{list_file} is not UTF-8 text (byte {error.start}); a list holds one image path a "
                        "line") from None
    for number, line in enumerate(text.split("\n"), 1):
        entry = line.strip(" \t\r")
        if not entry or entry.startswith("#"):
            continue
        named = folder / entry
        file = named.parent.resolve() / named.name
        if not file.is_file():
            raise DataError(f"{list_file} line {number}: {entry} is not a file")
        if file.suffix.lower() not in IMAGE_EXTENSIONS:
            raise DataError(f"{list_file} line {number}: {entry} is not an image ({', '.join(IMAGE_EXTENSIONS)})")
        files.append(file)
    if not files:
        raise DataError(f"{list_file} lists no image")
    return files


def image_sources(images: str | os.PathLike | Sequence[str | os.PathLike]) -> list[str | os.PathLike]:
    """``images`` as a list of what ``list_images`` takes: one path (a folder, an image or a list), or several."""
    givens = [images] if isinstance(images, str | os.PathLike) else list(images)
    if not givens:
        raise DataError("no images given: name a folder, an image or a .txt list")
    return givens


def list_images(path: str | os.PathLike[str]) -> list[Path]:
    """An image file, the images a ``.txt`` / ``.lst`` file lists (``read_image_list``), or every image below a
    folder (sorted); a name holding a line break (``LINE_BREAKS``) is refused, however it was given."""
    path = Path(path)
    if path.is_file() and path.suffix.lower() in LIST_SUFFIXES:
        files = read_image_list(path)
    elif path.is_file():
        files = [path]
    else:
        check_image_path(path)
        files = sorted(p for p in path.rglob("*") if p.suffix.lower() in IMAGE_EXTENSIONS and p.is_file())
        if not files:
            raise DataError(f"{path} holds no image ({', '.join(IMAGE_EXTENSIONS)})")
    broken = [f for f in files if LINE_BREAKS.intersection(str(f))]
    if broken:  # OUT.paths.txt holds one path per line: such a name would shift every later row
        shown = ", ".join(repr(str(f)) for f in broken[:3])
        raise DataError(f"{len(broken)} image file name(s) hold a line break ({shown}); rename them")
    return files


def list_images_of(images: str | os.PathLike | Sequence[str | os.PathLike]) -> list[Path]:
    """The images of each path in ``images`` (``image_sources``), as ``list_images`` finds them, in the order given."""
    return [file for given in image_sources(images) for file in list_images(given)]


def same_file_key(path: Path, folders: dict[str, str]) -> str:
    """``path`` with its folder's links resolved (``folders`` caches them): what tells two names of one file apart
    from two files when ``index --add`` skips images already indexed, and repeats are dropped."""
    folder = str(path.parent)
    if folder not in folders:
        folders[folder] = os.path.realpath(folder)
    return os.path.join(folders[folder], path.name)


def first_of_each(files: list[Path], folders: dict[str, str]) -> list[Path]:
    """``files`` without the repeats of a file (``same_file_key``), each kept where it first appears."""
    seen: set[str] = set()
    kept = []
    for file in files:
        key = same_file_key(file, folders)
        if key not in seen:
            seen.add(key)
            kept.append(file)
    return kept


def folder_holding(files: Sequence[Path]) -> Path:
    """The deepest folder that holds every one of ``files`` (absolute paths), e.g. a gallery's root."""
    return Path(os.path.commonpath([file.parent for file in files]))


def files_table(name: str, files: list[Path]) -> RetrievalTable:
    """A table of unlabelled image files (label 0, split ``test``), to run a model over them."""
    count = len(files)
    return RetrievalTable(name=name, images=[str(f) for f in files], labels=np.zeros(count),
                            splits=np.array(["test"] * count, dtype=object), is_query=np.ones(count, bool),
                            is_gallery=np.ones(count, bool))
