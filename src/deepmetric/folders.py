"""What makes a folder a training run or an index, and a path something images can be read from, checked without
torch: the CLI names a mistyped path before it imports the model code (seconds on a loaded machine), and
``RunDir``, ``read_manifest`` and ``list_images`` raise the same messages."""

from __future__ import annotations

from pathlib import Path

from .errors import DataError, DeepMetricError, IndexStoreError

RUN_CONFIG = "config.yaml"  # a run folder's resolved config: what makes a folder a run
INDEX_MANIFEST = "index.json"  # an index folder's manifest: what makes a folder an index


def check_run_dir(path: str | Path) -> None:
    """Raise ``DeepMetricError`` unless ``path`` holds a run's ``config.yaml``."""
    path = Path(path)
    if not (path / RUN_CONFIG).is_file():
        if not path.exists():
            raise DeepMetricError(f"no such run directory: {path}")
        raise DeepMetricError(f"{path} is not a run directory (no {RUN_CONFIG})")


def check_index_dir(path: str | Path) -> None:
    """Raise ``IndexStoreError`` unless ``path`` holds an ``index.json``; a run given for an index is named so."""
    if (Path(path) / INDEX_MANIFEST).is_file():
        return
    if (Path(path) / RUN_CONFIG).is_file():
        raise IndexStoreError(f"{path} is a training run, not an index: build an index from it with deepmetric index "
                              f"{path} --images FOLDER --out INDEX")
    what = "does not exist" if not Path(path).exists() else f"holds no {INDEX_MANIFEST}"
    raise IndexStoreError(f"{path} is not a deepmetric index: it {what} (build one with deepmetric index)")


def check_image_path(path: str | Path) -> None:
    """Raise ``DataError`` unless ``path`` is a file (an image or a list of them) or a folder."""
    path = Path(path)
    if path.is_file() or path.is_dir():
        return
    if not path.exists():
        raise DataError(f"{path} does not exist")
    raise DataError(f"{path} is neither an image file nor a folder")


def source_folder(name: str, source: str | Path, holds: str) -> Path:
    """The folder of a built data set's ``NAME:PATH`` (its packages, to build from): one that does not exist, or is
    not a folder, is refused naming it and what it should hold (``holds``)."""
    folder = Path(source)
    if not folder.is_dir():
        raise DataError(f"{name}: no such folder: {source}" if not folder.exists() else
                        f"{name}: {source} is not a folder (expected the folder of {holds})")
    return folder
