"""Run every run of a study that has not finished, then aggregate. Interrupted studies pick up where they
stopped: a run with ``metrics.json`` is done (and, with ``all_embeddings``, ``metrics-all-embeddings.json``),
a run with a ``last`` checkpoint resumes from it. Several study processes may work on one study at once (one per
core or GPU): a run that another process is training (its folder's lock) is left to it, and whichever process
ends last writes the complete results. A run that
fails with a user-facing error (bad data or settings for that variant) is reported and skipped; the others
still run and are aggregated, and the study then ends with an error naming every failed run. A signal that
interrupts training (after its checkpoint) stops the whole study. With a ``record`` folder, runs recorded there
are restored first and each finished run is recorded (``record.py``)."""

from __future__ import annotations

import logging
from pathlib import Path

from ..config import build_config
from ..errors import ConfigError, DeepMetricError, RunInUse, TrainingInterrupted
from ..training import train
from ..training.run_dir import RunDir
from ..workflows import evaluate_all_embeddings, evaluate_run
from .aggregate import aggregate, aggregate_all_embeddings, write_results
from .record import record_run, restore_run
from .spec import StudySpec, variant_hint

log = logging.getLogger("deepmetric")


def run_study(spec: StudySpec, progress: bool = True, only: list[str] | tuple[str, ...] = ()) -> dict[str, Path]:
    """Train and evaluate each unfinished run (of the variants in ``only``, when given: the others wait for a later
    call); write ``results.csv``, ``results.md`` and ``results.png`` from every finished run of the study."""
    runs = spec.runs()
    if only:
        unknown = [name for name in only if name not in spec.variants]
        if unknown:
            raise ConfigError(f"study {spec.name}: no variant named {unknown[0]!r}"
                              + variant_hint(unknown[0], spec.variants))
        runs = [run for run in runs if run.variant in only]
    failed: list[str] = []
    elsewhere: list[str] = []
    for number, run in enumerate(runs, start=1):
        directory = spec.run_dir(run)
        folder = RunDir(directory)
        record = spec.record_dir(run)
        if record is not None and restore_run(record, folder):
            log.info("[%d/%d] %s: restored from %s", number, len(runs), run.name, record)
        trained = folder.test_metrics.is_file()
        if trained and (not spec.all_embeddings or folder.all_embeddings_metrics.is_file()):
            log.info("[%d/%d] %s: done already", number, len(runs), run.name)
            if record is not None:
                record_run(folder, record)
            continue
        try:
            holder = folder.holder()
            if holder is not None:  # looked at before the run is announced (train() refuses it too)
                raise RunInUse(f"{directory} is in use by process {holder}", holder)
            if not trained:
                resume = folder.last.is_file()  # without one, train() restarts a run that stopped before it
                log.info("[%d/%d] %s: %s", number, len(runs), run.name, "resuming" if resume else "training")
                train(build_config(*run.layers), directory, resume=resume, progress=progress)
                evaluate_run(directory, progress=progress)
            if spec.all_embeddings:
                log.info("[%d/%d] %s: evaluating every embedding", number, len(runs), run.name)
                evaluate_all_embeddings(directory, progress=progress)
            if record is not None:
                record_run(folder, record)
        except RunInUse as busy:
            log.info("[%d/%d] %s: being trained by process %s: left to it", number, len(runs), run.name, busy.holder)
            elsewhere.append(run.name)
        except TrainingInterrupted:
            raise  # a signal stops the whole study (the run resumes next time), it is not a failed run
        except DeepMetricError as error:
            log.error("[%d/%d] %s failed: %s", number, len(runs), run.name, error)
            failed.append(f"{run.name} ({error})")
    paths = write_results(spec, aggregate(spec), aggregate_all_embeddings(spec) if spec.all_embeddings else None)
    if elsewhere:
        log.warning("%s lacks %d run(s) that other processes are training (%s): the last process to end writes "
                    "the complete results", paths["md"], len(elsewhere), ", ".join(elsewhere))
    if failed:
        raise DeepMetricError(f"study {spec.name}: {len(failed)} of {len(runs)} runs failed (the others are in "
                              f"{paths['md']}): " + "; ".join(failed))
    return paths
