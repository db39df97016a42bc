"""Run every run of a study that has not finished, then aggregate. Interrupted studies pick up where they
stopped: a run with ``metrics.json`` is done, a run with a ``last`` checkpoint resumes from it."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from ..config import build_config
from ..training import train
from ..training.run_dir import RunDir
from ..workflows import evaluate_run
from .aggregate import aggregate, write_results
from .spec import StudyRun, StudySpec

log = logging.getLogger("deepmetric")


def run_dir_of(spec: StudySpec, run: StudyRun) -> Path:
    return spec.out / "runs" / run.variant / str(run.repeat)


def run_study(spec: StudySpec, progress: bool = True) -> dict[str, Path]:
    """Train and evaluate each unfinished run; write ``results.csv``, ``results.md`` and ``results.png``."""
    runs = spec.runs()
    for number, run in enumerate(runs, start=1):
        directory = run_dir_of(spec, run)
        folder = RunDir(directory)
        if folder.test_metrics.is_file():
            log.info("[%d/%d] %s: done already", number, len(runs), run.name)
            continue
        resume = folder.last.is_file()
        if folder.exists() and not resume:  # stopped before its first checkpoint: start it again
            shutil.rmtree(directory)
        log.info("[%d/%d] %s: %s", number, len(runs), run.name, "resuming" if resume else "training")
        train(build_config(*run.layers), directory, resume=resume, progress=progress)
        evaluate_run(directory, progress=progress)
    return write_results(spec, aggregate(spec))
