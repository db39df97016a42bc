"""Loaders for the four benchmarks of the papers, as their official archives unpack.

Each uses the standard zero-shot split (thesis §2.6.1; Song et al. 2016 for CUB/Cars/SOP, Liu et al.
2016 for In-Shop) and checks the published split sizes:

| data set | layout | train | test |
|---|---|---|---|
| CUB-200-2011 | ``CUB_200_2011/{images.txt, image_class_labels.txt, images/}`` | 1-100: 5,864 | 101-200: 5,924 |
| Cars-196 | ``cars_annos.mat`` + ``car_ims/`` | classes 1-98: 8,054 | 99-196: 8,131 |
| SOP | ``Stanford_Online_Products/{Ebay_train.txt, Ebay_test.txt, *_final/}`` | 59,551 | 60,502 |
| In-Shop | ``Eval/list_eval_partition.txt`` + ``Img/img/...`` | 25,882 | 14,218 query + 12,612 gallery |

CUB's ``train_test_split.txt`` and Cars' ``test`` flag are the *classification* splits and are
ignored: the DML protocol splits by class. ``crop=True`` (specs ``cub-cropped:PATH``, ``cars-cropped:PATH``;
ABE Table 5) gives every image its bounding box, so the table returns the box's pixels: CUB's
``bounding_boxes.txt`` (``id x y width height``, taken as 0-based pixels: box (x, y, x + width, y + height))
and Cars' ``bbox_x1..bbox_y2`` (MATLAB's 1-based inclusive pixels: box (x1 - 1, y1 - 1, x2, y2)).
``cub`` with no path fetches the publisher's archive on first use (``deepmetric.data.download``); the other three
need their ``PATH``. Each loader accepts the data set's own folder (CUB's and SOP's also their parent folder), and the
common flattened variants (e.g. In-Shop's partition file beside ``img/``).
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from ..errors import DataError
from .registry import register_dataset
from .table import RetrievalTable, check_counts

PUBLISHED = {
    "cub": {"train": 5864, "test": 5924},
    "cars": {"train": 8054, "test": 8131},
    "sop": {"train": 59551, "test": 60502},
    "inshop": {"train": 25882, "query": 14218, "gallery": 12612},
}
RECALL_AT = {
    "cub": (1, 2, 4, 8, 16, 32),
    "cars": (1, 2, 4, 8, 16, 32),
    "sop": (1, 10, 100, 1000),
    "inshop": (1, 10, 20, 30, 40, 50),
}


def _find(root: Path, candidates: list[str], what: str, dataset: str) -> Path:
    """The first existing ``root/candidate``; else a DataError naming every place looked at."""
    for candidate in candidates:
        path = root / candidate
        if path.exists():
            return path
    looked = ", ".join(str(root / c) for c in candidates)
    raise DataError(f"{dataset}: expected {what} at {looked}")


def _read_rows(path: Path, columns: int, dataset: str, skip: int = 0) -> list[list[str]]:
    rows = []
    for number, line in enumerate(path.read_text().splitlines()[skip:], start=skip + 1):
        if not line.strip():
            continue
        fields = line.split()
        if len(fields) < columns:
            raise DataError(f"{dataset}: {path} line {number} has {len(fields)} fields, expected {columns}: "
                            f"{line!r}")
        rows.append(fields)
    return rows


def _int(value: str, path: Path, dataset: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise DataError(f"{dataset}: {path} holds a non-integer id {value!r}") from None


def _table(name: str, paths: list[str], labels: np.ndarray, splits: np.ndarray, root: Path, check: bool,
           is_query: np.ndarray | None = None, is_gallery: np.ndarray | None = None,
           boxes: np.ndarray | None = None) -> RetrievalTable:
    """The benchmark's table; with ``boxes``, the ``<name>-cropped`` variant."""
    ones = np.ones(len(paths), dtype=bool)
    table = RetrievalTable(
        name=name if boxes is None else f"{name}-cropped", images=paths, labels=labels, splits=splits,
        is_query=ones if is_query is None else is_query, is_gallery=ones if is_gallery is None else is_gallery,
        recall_at=RECALL_AT[name], meta={"root": str(root)}, boxes=boxes,
    )
    check_counts(name, table, PUBLISHED[name], check)
    return table


@register_dataset("cub", "folder")
def load_cub(path: str | Path | None = None, check: bool = True, crop: bool = False) -> RetrievalTable:
    """CUB-200-2011: classes 1-100 train (5,864 images), 101-200 test (5,924); ``crop``: bounding boxes. Without
    ``path``, the publisher's archive is fetched to ``$DEEPMETRIC_DATA/cub`` on first use (``download.fetch``)."""
    if path is None:
        from .download import fetch

        path = fetch("cub")
    given = Path(path)
    root = given / "CUB_200_2011" if (given / "CUB_200_2011" / "images.txt").is_file() else given
    images_txt = _find(root, ["images.txt"], "the image list images.txt", "cub")
    labels_txt = _find(root, ["image_class_labels.txt"], "the label list image_class_labels.txt", "cub")
    image_dir = _find(root, ["images"], "the image folder images/", "cub")
    id_to_path = {_int(i, images_txt, "cub"): p for i, p in _read_rows(images_txt, 2, "cub")}
    id_to_label = {_int(i, labels_txt, "cub"): _int(c, labels_txt, "cub")
                   for i, c in _read_rows(labels_txt, 2, "cub")}
    missing = sorted(set(id_to_path) - set(id_to_label))
    if missing:
        raise DataError(f"cub: {labels_txt} has no class for image id(s) {missing[:10]}")
    ids = sorted(id_to_path)
    labels = np.array([id_to_label[i] for i in ids])
    paths = [str(image_dir / id_to_path[i]) for i in ids]
    splits = np.where(labels <= 100, "train", "test").astype(object)
    table = _table("cub", paths, labels, splits, root, check, boxes=_cub_boxes(root, ids) if crop else None)
    classes_txt = root / "classes.txt"
    if classes_txt.is_file():
        table.class_names = {int(r[0]): " ".join(r[1:]) for r in _read_rows(classes_txt, 2, "cub")}
    return table


@register_dataset("cars", "folder")
def load_cars(path: str | Path, check: bool = True, crop: bool = False) -> RetrievalTable:
    """Cars-196 from ``cars_annos.mat``: classes 1-98 train (8,054 images), 99-196 test (8,131); ``crop``:
    bounding boxes."""
    from scipy.io import loadmat

    root = Path(path)
    annos = _find(root, ["cars_annos.mat"], "the annotation file cars_annos.mat", "cars")
    try:
        mat = loadmat(str(annos), squeeze_me=True, struct_as_record=True)
        records = np.atleast_1d(mat["annotations"])
        rel_paths = [str(r) for r in records["relative_im_path"]]
        labels = np.array([int(c) for c in records["class"]])
        corners = ("bbox_x1", "bbox_y1", "bbox_x2", "bbox_y2")
        # 1-based inclusive corners -> 0-based, right and bottom exclusive
        boxes = np.array([[float(v) for v in records[c]] for c in corners]).T - [1, 1, 0, 0] if crop else None
    except (KeyError, ValueError, TypeError, OSError) as error:
        raise DataError(f"cars: {annos} is not the official annotation file (an 'annotations' struct with "
                        f"'relative_im_path' and 'class' fields): {error}") from None
    _find(root, ["car_ims"], "the image folder car_ims/", "cars")
    paths = [str(root / p) for p in rel_paths]
    splits = np.where(labels <= 98, "train", "test").astype(object)
    table = _table("cars", paths, labels, splits, root, check, boxes=boxes)
    if "class_names" in mat:
        table.class_names = {i + 1: str(n) for i, n in enumerate(np.atleast_1d(mat["class_names"]))}
    return table


def _cub_boxes(root: Path, ids: list[int]) -> np.ndarray:
    """(left, top, right, bottom) per image id, in ``ids`` order, from ``bounding_boxes.txt``."""
    listing = _find(root, ["bounding_boxes.txt"], "the bounding boxes bounding_boxes.txt (cub-cropped)", "cub")
    boxes = {}
    for fields in _read_rows(listing, 5, "cub"):
        try:
            x, y, width, height = (float(v) for v in fields[1:5])
        except ValueError:
            raise DataError(f"cub: {listing} holds a non-numeric box {' '.join(fields)!r}") from None
        boxes[_int(fields[0], listing, "cub")] = (x, y, x + width, y + height)
    missing = [i for i in ids if i not in boxes]
    if missing:
        raise DataError(f"cub: {listing} has no bounding box for image id(s) {missing[:10]}")
    return np.array([boxes[i] for i in ids])


@register_dataset("sop", "folder")
def load_sop(path: str | Path, check: bool = True) -> RetrievalTable:
    """Stanford Online Products: ``Ebay_train.txt`` (59,551 images) and ``Ebay_test.txt`` (60,502)."""
    given = Path(path)
    root = given / "Stanford_Online_Products" if (given / "Stanford_Online_Products").is_dir() else given
    paths, labels, splits = [], [], []
    for split, name in (("train", "Ebay_train.txt"), ("test", "Ebay_test.txt")):
        listing = _find(root, [name], f"the list {name}", "sop")
        for fields in _read_rows(listing, 4, "sop", skip=1):
            labels.append(_int(fields[1], listing, "sop"))
            paths.append(str(root / fields[3]))
            splits.append(split)
    return _table("sop", paths, np.array(labels), np.array(splits, dtype=object), root, check)


@register_dataset("inshop", "folder")
def load_inshop(path: str | Path, check: bool = True) -> RetrievalTable:
    """In-Shop: ``list_eval_partition.txt`` (25,882 train, 14,218 query, 12,612 gallery); queries vs gallery."""
    root = Path(path)
    listing = _find(root, ["Eval/list_eval_partition.txt", "list_eval_partition.txt"],
                    "the partition file list_eval_partition.txt", "inshop")
    # The listed paths start with img/; officially under Img/, flattened beside the partition file.
    image_root = next((r for r in (root / "Img", root, listing.parent) if (r / "img").is_dir()), None)
    if image_root is None:
        raise DataError(f"inshop: expected the image folder img/ at {root / 'Img' / 'img'} or {root / 'img'}")
    rows = _read_rows(listing, 3, "inshop", skip=2)
    items = sorted({r[1] for r in rows})
    item_index = {item: i for i, item in enumerate(items)}
    status = np.array([r[2] for r in rows], dtype=object)
    bad = sorted(set(status.tolist()) - {"train", "query", "gallery"})
    if bad:
        raise DataError(f"inshop: {listing} has unknown evaluation status {bad}; expected train/query/gallery")
    paths = [str(image_root / r[0]) for r in rows]
    labels = np.array([item_index[r[1]] for r in rows])
    splits = np.where(status == "train", "train", "test").astype(object)
    table = _table("inshop", paths, labels, splits, root, check,
                   is_query=status != "gallery", is_gallery=status != "query")
    table.class_names = {i: item for item, i in item_index.items()}
    return table


register_dataset("cub-cropped", "folder", functools.partial(load_cub, crop=True))
register_dataset("cars-cropped", "folder", functools.partial(load_cars, crop=True))
