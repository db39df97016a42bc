"""A run's per-query test results on disk: ``per-query.npz`` beside ``metrics.json`` (``per-query-last.npz`` beside
``metrics-last.json``).

The file is a compressed ``.npz`` of plain arrays (``numpy.savez_compressed``; read with ``allow_pickle=False``, so a
crafted file cannot run code), in query order:

- ``first_hit`` (Q,) int32: 0-based rank of the query's first neighbour of its class, -1 when none was among the
  ``depth`` neighbours ranked;
- ``average_precision`` (Q,) float32: AP@R, the query's term of MAP@R;
- ``r_precision`` (Q,) float32;
- ``relevant`` (Q,) int32: R, the gallery items of its class (its own row not counted); 0: left out of every metric;
- ``depth`` (): the neighbours ranked per query;
- ``queries_sha256``, ``gallery_sha256`` (): the identity of the query rows and of the gallery rows, in order
  (``table_identity``): two runs whose identities match ranked the same queries against the same gallery, so their
  results can be paired query by query.

Recall@K is the share of counted queries (R > 0) whose first hit ranks below K, MAP@R and R-precision the means of
their columns: ``metrics.per_query_metrics`` gives ``metrics.json``'s figures from the file.
"""

from __future__ import annotations

import hashlib
import io
import os
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from ..data.table import RetrievalTable
from ..errors import DeepMetricError
from ..io.files import atomic_write_bytes
from .metrics import NO_HIT, PerQuery

ARRAYS = {"first_hit": "i", "average_precision": "f", "r_precision": "f", "relevant": "i"}
"""The per-query columns of the file, with their numpy dtype kinds."""

IDENTITY = ("queries_sha256", "gallery_sha256")

FILE_OF = {"metrics.json": "per-query.npz", "metrics-last.json": "per-query-last.npz"}
"""The per-query file beside each test evaluation file."""


def per_query_path(metrics_file: Path) -> Path:
    """The per-query file of the test evaluation file ``metrics_file`` (``metrics.json`` -> ``per-query.npz``,
    ``metrics-on-<data>.json`` -> ``per-query-on-<data>.npz``)."""
    name = metrics_file.name
    if name in FILE_OF:
        return metrics_file.with_name(FILE_OF[name])
    return metrics_file.with_name("per-query" + name.removeprefix("metrics").removesuffix(".json") + ".npz")


def _rows_sha256(table: RetrievalTable, rows: np.ndarray) -> str:
    """SHA-256 of ``rows``' labels and images, in order: the images' paths relative to the folder holding every image
    of ``table`` (the same data set unpacked elsewhere on another machine gives the same identity), or the pixels of
    an in-memory table."""
    digest = hashlib.sha256()
    digest.update(b"labels\0" + np.asarray(table.labels[rows], dtype="<i8").tobytes())
    if table.in_memory:
        digest.update(b"pixels\0" + np.ascontiguousarray(table.images[rows]).tobytes())
    else:
        paths = [str(table.images[i]) for i in range(len(table))]
        root = os.path.commonpath(paths) if len(paths) > 1 else os.path.dirname(paths[0])
        digest.update(b"paths\0" + "\n".join(os.path.relpath(paths[i], root) for i in rows).encode("utf-8",
                                                                                                 "surrogateescape"))
    return digest.hexdigest()


def table_identity(table: RetrievalTable) -> dict[str, str]:
    """``{"queries_sha256": ..., "gallery_sha256": ...}`` of a split's table (``_rows_sha256``)."""
    rows = np.arange(len(table))
    return {"queries_sha256": _rows_sha256(table, rows[table.is_query]),
            "gallery_sha256": _rows_sha256(table, rows[table.is_gallery])}


def save_per_query(path: Path, per_query: PerQuery, identity: dict[str, str]) -> None:
    """Write ``per_query`` and the table's ``identity`` to ``path`` (compressed ``.npz``, atomically)."""
    buffer = io.BytesIO()
    named: dict[str, Any] = {key: np.str_(identity[key]) for key in IDENTITY}  # (mypy matches ** to allow_pickle)
    np.savez_compressed(buffer, first_hit=per_query.first_hit.astype(np.int32),
                        average_precision=per_query.average_precision.astype(np.float32),
                        r_precision=per_query.r_precision.astype(np.float32),
                        relevant=per_query.relevant.astype(np.int32), depth=np.int64(per_query.depth),
                        **named)
    atomic_write_bytes(path, buffer.getvalue())


class PerQueryFile:
    """A loaded per-query file: ``per_query`` (``PerQuery``) and ``identity`` (``IDENTITY`` -> hex digest)."""

    def __init__(self, per_query: PerQuery, identity: dict[str, str]):
        self.per_query = per_query
        self.identity = identity

    @property
    def key(self) -> tuple[str, ...]:
        """What must match for two runs' results to be paired: the queries and the gallery, in order."""
        return tuple(self.identity[key] for key in IDENTITY)


def _problem(arrays: dict[str, Any]) -> str | None:
    missing = [name for name in (*ARRAYS, "depth", *IDENTITY) if name not in arrays]
    if missing:
        return f"it lacks {', '.join(missing)}"
    columns = {name: arrays[name] for name in ARRAYS}
    for name, kind in ARRAYS.items():
        if columns[name].ndim != 1 or columns[name].dtype.kind not in (kind, "u" if kind == "i" else kind):
            return f"'{name}' is not a 1-D array of {'integers' if kind == 'i' else 'numbers'}"
    lengths = {len(column) for column in columns.values()}
    if len(lengths) != 1 or not lengths.pop():
        return "its columns are empty or of different lengths"
    if arrays["depth"].shape != () or arrays["depth"].dtype.kind not in "iu" or int(arrays["depth"]) < 1:
        return "'depth' is not a whole number >= 1"
    for name in IDENTITY:
        value = arrays[name]
        if value.shape != () or value.dtype.kind != "U" or len(str(value)) != 64:
            return f"'{name}' is not a SHA-256 hex digest"
    first_hit, relevant = columns["first_hit"], columns["relevant"]
    if (first_hit < NO_HIT).any() or (first_hit >= int(arrays["depth"])).any() or (relevant < 0).any():
        return "'first_hit' or 'relevant' holds a value out of range"
    scores = np.concatenate([columns["average_precision"], columns["r_precision"]])
    if not np.isfinite(scores).all() or (scores < 0).any() or (scores > 1).any():
        return "'average_precision' or 'r_precision' holds a value outside [0, 1]"
    if not (relevant > 0).any():
        return "no query has a relevant item (R = 0 everywhere)"
    return None


def problem(path: Path) -> str | None:
    """What is wrong with the per-query file ``path`` (not a plain ``.npz``, a pickled array, a missing or malformed
    column), or None when it is sound."""
    try:
        arrays = read_arrays(path)
    except DeepMetricError as error:
        return str(error)
    return _problem(arrays)


MAX_BYTES = 256 * 2**20
"""The largest per-query file read (a run of SOP's 60,502 queries writes under 1 MB; a zip bomb is refused)."""


def read_arrays(path: Path) -> dict[str, np.ndarray]:
    """The arrays of ``path``, read without pickles; a ``DeepMetricError`` (the reason, without the path) when it is
    not a plain ``.npz``."""
    try:
        with zipfile.ZipFile(path) as archive:
            if sum(info.file_size for info in archive.infolist()) > MAX_BYTES:
                raise DeepMetricError(f"it unpacks to more than {MAX_BYTES // 2**20} MB")
        with np.load(path, allow_pickle=False) as data:
            return {name: data[name] for name in data.files}
    except (zipfile.BadZipFile, EOFError):
        raise DeepMetricError("it is not an .npz archive") from None
    except ValueError as error:  # a pickled (object) array, a damaged member
        raise DeepMetricError(f"it holds an array that is not plain data ({error})") from None
    except OSError as error:
        raise DeepMetricError(f"it cannot be read: {error.strerror or error}") from None


def load_per_query(path: Path) -> PerQueryFile:
    """The per-query file ``path``; a ``DeepMetricError`` naming it when it is not sound (``problem``)."""
    try:
        arrays = read_arrays(path)
    except DeepMetricError as error:
        raise DeepMetricError(f"{path}: {error}") from None
    found = _problem(arrays)
    if found is not None:
        raise DeepMetricError(f"{path} is not a per-query file deepmetric writes: {found}")
    per_query = PerQuery(arrays["first_hit"].astype(np.int32), arrays["average_precision"].astype(np.float32),
                         arrays["r_precision"].astype(np.float32), arrays["relevant"].astype(np.int32),
                         int(arrays["depth"]))
    return PerQueryFile(per_query, {key: str(arrays[key]) for key in IDENTITY})


def query_scores(per_query: PerQuery, metric: str) -> np.ndarray | None:
    """Each counted query's term of ``metric`` (its mean is the metric): 1.0 or 0.0 for ``recall@K`` (a first hit
    below K), AP@R for ``map@r``, R-precision for ``r_precision``; None for a metric that is no mean over queries
    (NMI)."""
    counted = per_query.counted
    if metric.startswith("recall@") and metric[len("recall@"):].isdigit():
        first_hit = per_query.first_hit[counted]
        return ((first_hit != NO_HIT) & (first_hit < int(metric[len("recall@"):]))).astype(np.float64)
    if metric == "map@r":
        return per_query.average_precision[counted].astype(np.float64)
    if metric == "r_precision":
        return per_query.r_precision[counted].astype(np.float64)
    return None
