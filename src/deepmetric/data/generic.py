"""Loaders for user data (a folder per class, a CSV table) and the small built-in sets.

``fashion-mnist`` and ``digits`` train on classes 0-4 and test on 5-9: with five training classes they
show the protocol, not what metric learning can do (see ``glyphs`` for that).
"""

from __future__ import annotations

import csv
import gzip
import logging
from pathlib import Path

import numpy as np

from ..errors import DataError
from .images import IMAGE_EXTENSIONS
from .registry import register_dataset
from .table import RetrievalTable

log = logging.getLogger("deepmetric")

FASHION_MNIST_DIRS = ("/usr/share/datasets/fashion-mnist",)
FASHION_MNIST_CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker",
                         "Bag", "Ankle boot"]
TRUE_WORDS = {"1", "true", "yes", "y", "t"}
FALSE_WORDS = {"0", "false", "no", "n", "f", ""}


def _half_split(labels: np.ndarray) -> np.ndarray:
    """First half of the sorted classes (rounded up) train, the rest test."""
    classes = np.unique(labels)
    train = classes[: (len(classes) + 1) // 2]
    return np.where(np.isin(labels, train), "train", "test").astype(object)


@register_dataset("folder", "folder")
def load_folder(path: str | Path) -> RetrievalTable:
    """One sub-folder per class (images anywhere below it); sorted class names, first half train."""
    root = Path(path)
    if not root.is_dir():
        raise DataError(f"folder: {root} is not a directory (expected one sub-folder of images per class)")
    class_dirs = sorted(d for d in root.iterdir() if d.is_dir() and not d.name.startswith("."))
    if len(class_dirs) < 2:
        loose = sum(1 for p in root.iterdir() if p.suffix.lower() in IMAGE_EXTENSIONS and p.is_file())
        where = (f" (its {loose:,} image(s) lie in the folder itself: put each class's images in a sub-folder named "
                 f"after the class, {root}/<class>/<image>)" if loose else "")
        raise DataError(f"folder: {root} has {len(class_dirs)} class sub-folder(s); expected at least 2{where}")
    paths: list[str] = []
    labels: list[int] = []
    names: dict[int, str] = {}
    for label, class_dir in enumerate(class_dirs):
        files = sorted(p for p in class_dir.rglob("*") if p.suffix.lower() in IMAGE_EXTENSIONS and p.is_file())
        if not files:
            raise DataError(f"folder: class folder {class_dir} holds no image ({', '.join(IMAGE_EXTENSIONS)})")
        names[label] = class_dir.name
        paths.extend(str(p) for p in files)
        labels.extend([label] * len(files))
    labels_array = np.array(labels)
    ones = np.ones(len(paths), dtype=bool)
    return RetrievalTable(name=f"folder:{root}", images=paths, labels=labels_array,
                            splits=_half_split(labels_array), is_query=ones, is_gallery=ones,
                            class_names=names, meta={"root": str(root)})


def _flag(value: str, column: str, line: int, path: Path) -> bool:
    word = value.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise DataError(f"csv: {path} line {line}: column '{column}' must be true/false or 1/0, got {value!r}")


MAX_LISTED = 20  # problems a refusal lists before it counts the rest
INT64 = np.iinfo(np.int64)


def _csv_rows(path: Path) -> list[dict[str, str]]:
    """The rows of a CSV as dicts keyed by the stripped header; UTF-8 with or without Excel's byte-order mark."""
    try:
        with path.open(newline="", encoding="utf-8-sig") as handle:
            reader = csv.DictReader(handle)
            columns = [c.strip() for c in (reader.fieldnames or [])]
            missing = [c for c in ("path", "label", "split") if c not in columns]
            if missing:
                raise DataError(f"csv: {path} lacks column(s) {missing}; its header is {columns}, expected "
                                "path,label,split[,is_query,is_gallery]")
            return [{k.strip(): (v or "") for k, v in row.items() if k is not None} for row in reader]
    except UnicodeDecodeError as error:
        line = path.read_bytes()[:error.start].count(b"\n") + 1
        raise DataError(f"csv: {path} line {line} is not UTF-8 (byte {error.object[error.start]:#04x}); save the "
                        "file as UTF-8") from None
    except csv.Error as error:
        raise DataError(f"csv: {path} is not a readable CSV: {error}") from None


@register_dataset("csv", "file")
def load_csv(path: str | Path, skip_bad: bool = False) -> RetrievalTable:
    """A CSV with columns ``path,label,split`` and optional ``is_query,is_gallery``.

    Paths are relative to the CSV's folder; labels are integers (64-bit); split is train, val or test. The
    file is UTF-8, with or without a byte-order mark. Every bad row is listed in one error; with ``skip_bad``
    (``data.skip_bad_images``) an image listed twice keeps its first row and the repeats are left out.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"csv: {path} does not exist")
    rows = _csv_rows(path)
    if not rows:
        raise DataError(f"csv: {path} has a header but no rows")
    paths, labels, splits, queries, galleries = [], [], [], [], []
    seen: dict[str, int] = {}
    problems: list[str] = []
    repeats = 0
    for line, row in enumerate(rows, start=2):
        image = (path.parent / row["path"].strip()).resolve()
        if str(image) in seen:
            if skip_bad:
                repeats += 1
                continue
            problems.append(f"line {line}: image {row['path']!r} already listed on line {seen[str(image)]}")
            continue
        seen[str(image)] = line
        try:
            label = int(row["label"])
        except ValueError:
            problems.append(f"line {line}: label {row['label']!r} is not an integer")
            continue
        if not INT64.min <= label <= INT64.max:
            problems.append(f"line {line}: label {row['label'][:30]!r} does not fit in 64 bits")
            continue
        split = row["split"].strip()
        if split not in ("train", "val", "test"):
            problems.append(f"line {line}: split {split!r} is not train, val or test")
            continue
        try:
            query = _flag(row["is_query"], "is_query", line, path) if "is_query" in row else True
            gallery = _flag(row["is_gallery"], "is_gallery", line, path) if "is_gallery" in row else True
        except DataError as error:
            problems.append(str(error).removeprefix(f"csv: {path} "))
            continue
        paths.append(str(image))
        labels.append(label)
        splits.append(split)
        queries.append(query)
        galleries.append(gallery)
    if problems:
        more = f"\n  ... and {len(problems) - MAX_LISTED} more" if len(problems) > MAX_LISTED else ""
        raise DataError(f"csv: {path} has {len(problems)} bad row(s):\n  " + "\n  ".join(problems[:MAX_LISTED])
                        + more)
    if repeats:
        log.warning("csv: %s lists %d image(s) more than once; their repeated rows are left out", path, repeats)
    return RetrievalTable(name=f"csv:{path}", images=paths, labels=np.array(labels, dtype=np.int64),
                            splits=np.array(splits, dtype=object), is_query=np.array(queries, dtype=bool),
                            is_gallery=np.array(galleries, dtype=bool), meta={"root": str(path.parent)})


def _read_idx(path: Path) -> np.ndarray:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as handle:
        data = handle.read()
    magic = int.from_bytes(data[:4], "big")
    ndim = magic & 0xFF
    if magic >> 8 != 0x08:
        raise DataError(f"fashion-mnist: {path} is not an unsigned-byte IDX file")
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


def _fashion_mnist_files(root: Path | None) -> tuple[np.ndarray, np.ndarray]:
    names = ["train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
             "t10k-labels-idx1-ubyte"]
    candidates = [Path(root)] if root else [Path(d) for d in FASHION_MNIST_DIRS]
    for base in candidates:
        found: list[Path] = []
        for name in names:
            options = [base / f"{name}.gz", base / name, base / "FashionMNIST" / "raw" / name]
            file = next((p for p in options if p.is_file()), None)
            if file is not None:
                found.append(file)
        if len(found) == len(names):
            images = np.concatenate([_read_idx(found[0]), _read_idx(found[2])])
            labels = np.concatenate([_read_idx(found[1]), _read_idx(found[3])]).astype(np.int64)
            return images, labels
    if root:
        raise DataError(f"fashion-mnist: expected the four IDX files ({', '.join(names)}, optionally .gz) in {root}")
    from .glyphs import data_home

    target = data_home() / "fashion-mnist"
    from ..progress import stdout_to_log

    try:
        from torchvision.datasets import FashionMNIST

        with stdout_to_log():  # torchvision prints "Downloading ..." on standard output
            FashionMNIST(str(target), train=True, download=True)
            FashionMNIST(str(target), train=False, download=True)
    except Exception as error:  # noqa: BLE001 - any download failure means the same thing to the user
        raise DataError("fashion-mnist: not found in /usr/share/datasets/fashion-mnist (Debian package "
                        f"dataset-fashion-mnist) and the download failed: {error}") from None
    return _fashion_mnist_files(target)


@register_dataset("fashion-mnist", "folder")
def load_fashion_mnist(path: str | Path | None = None) -> RetrievalTable:
    """Fashion-MNIST, all 70,000 images: classes 0-4 train, 5-9 test."""
    images, labels = _fashion_mnist_files(Path(path) if path else None)
    ones = np.ones(len(labels), dtype=bool)
    return RetrievalTable(name="fashion-mnist", images=np.ascontiguousarray(images), labels=labels,
                            splits=np.where(labels <= 4, "train", "test").astype(object), is_query=ones,
                            is_gallery=ones, class_names=dict(enumerate(FASHION_MNIST_CLASSES)))


@register_dataset("digits", "none")
def load_digits() -> RetrievalTable:
    """scikit-learn's 1,797 8x8 handwritten digits (16 grey levels scaled to 0-255): 0-4 train, 5-9 test."""
    from sklearn.datasets import load_digits as sklearn_digits

    bunch = sklearn_digits()
    images = np.clip(bunch.images * (255.0 / 16.0) + 0.5, 0, 255).astype(np.uint8)
    labels = bunch.target.astype(np.int64)
    ones = np.ones(len(labels), dtype=bool)
    return RetrievalTable(name="digits", images=images, labels=labels,
                            splits=np.where(labels <= 4, "train", "test").astype(object), is_query=ones,
                            is_gallery=ones, class_names={i: str(i) for i in range(10)})
