"""Reading a study's finished runs into rows: one per run (``aggregate``: its test metrics and the validation
figures of the evaluated checkpoint), one per run and embedding (``aggregate_all_embeddings``), and the runs'
per-query files for the bootstrap (``per_query_files``). A run's files are read from its run folder, or from its
record (``FolderOf``); a damaged copy is no finished run."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ..errors import DeepMetricError
from ..evaluation.per_query import PerQueryFile, load_per_query, per_query_path
from ..runs.folder import RunDir
from .record import TABLE_KEYS, finished, problem
from .spec import StudyRun, StudySpec

log = logging.getLogger("deepmetric")

FolderOf = Callable[[StudyRun], Path]
"""Where a run's files are read: its run folder (``StudySpec.run_dir``, the default), or its record."""


def _folder_of(spec: StudySpec, folder_of: FolderOf | None) -> FolderOf:
    return folder_of or spec.run_dir


def _records(spec: StudySpec, file_of: Callable[[RunDir], Path],
             folder_of: FolderOf | None = None) -> Iterator[tuple[StudyRun, dict[str, Any]]]:
    """Each run whose evaluation file ``file_of(run directory)`` exists, with that file's record."""
    where = _folder_of(spec, folder_of)
    for run in spec.runs():
        path = file_of(RunDir(where(run)))
        if path.is_file() and problem(path) is None:  # a damaged copy is no finished run
            yield run, json.loads(path.read_text())


VALIDATION_METRICS = ("recall@1", "map@r")
"""The validation figures a study row carries (``val_recall@1``, ``val_map@r``): what chose the checkpoint, and what
a tuning study reads, since the test split chooses nothing."""


def validation_of(folder: RunDir, step: int | None) -> dict[str, float]:
    """The validation metrics logged at ``step`` (the evaluated checkpoint's), as ``val_<metric>``; none for a run
    without validation."""
    for record in folder.read_log():
        if record.get("split") == "val" and record.get("step") == step:
            return {f"val_{m}": record[m] for m in VALIDATION_METRICS if m in record}
    return {}


def _own(metrics: dict[str, Any]) -> dict[str, Any]:
    """A run's metrics without any that would take a column the table keeps for itself (``problem`` refuses such
    a file; this keeps a row's variant the study's even so)."""
    return {key: value for key, value in metrics.items() if key not in TABLE_KEYS}


def aggregate(spec: StudySpec, folder_of: FolderOf | None = None) -> list[dict[str, Any]]:
    """One row per finished run: variant, repeat, data set, its test metrics, then the validation metrics of the
    evaluated checkpoint (read from ``folder_of(run)``: the run folders by default)."""
    rows = []
    for run in spec.runs():
        folder = RunDir(_folder_of(spec, folder_of)(run))
        if finished(folder):  # a damaged copy is no finished run
            record = json.loads(folder.test_metrics.read_text())
            rows.append({"variant": run.variant, "repeat": run.repeat, "data": str(record.get("data", "")),
                         **_own(record["metrics"]), **validation_of(folder, record.get("step"))})
    return rows


def aggregate_all_embeddings(spec: StudySpec, folder_of: FolderOf | None = None) -> list[dict[str, Any]]:
    """One row per finished run and embedding of ``metrics-all-embeddings.json``; the variant is
    ``<variant> / <embedding>``."""
    return [{"variant": f"{run.variant} / {name}", "repeat": run.repeat, "data": str(record.get("data", "")),
             **_own(metrics)}
            for run, record in _records(spec, lambda folder: folder.all_embeddings_metrics, folder_of)
            for name, metrics in record["embeddings"].items()]


def per_query_files(spec: StudySpec, folder_of: FolderOf | None = None) -> dict[tuple[str, int], PerQueryFile]:
    """The per-query file of each finished run that has a sound one, by (variant, repeat); a damaged one is left
    out with a warning (its run still counts in the means, not in the bootstrap)."""
    files = {}
    for run in spec.runs():
        folder = RunDir(_folder_of(spec, folder_of)(run))
        path = per_query_path(folder.test_metrics)
        if finished(folder) and path.is_file():
            try:
                files[(run.variant, run.repeat)] = load_per_query(path)
            except DeepMetricError as error:
                log.warning("%s: left out of the bootstrap (%s)", run.name, error)
    return files
