"""Run every run of a study that has not finished, then aggregate. Interrupted studies pick up where they
stopped: a run with ``metrics.json`` is done (and, with ``all_embeddings``, ``metrics-all-embeddings.json``),
a run with a ``last`` checkpoint resumes from it. Several study processes may work on one study at once (one per
core or GPU): a run that another process is training (its folder's lock) is left to it, and whichever process
ends last writes the complete results. A run that
fails with a user-facing error (bad data or settings for that variant) is reported and skipped; the others
still run and are aggregated, and the study then ends with an error naming every failed run. A signal that
interrupts training (after its checkpoint) stops the whole study. With a ``record`` folder, runs recorded there
are restored first (a damaged record is that run's failure, named, never restored) and each finished run is
recorded (``record.py``). A finished run is reused only while its saved ``config.yaml`` is the config the study
builds now: otherwise the study stops naming it and the changed settings, or, with ``retrain_changed``, sets it
aside and trains it again."""

from __future__ import annotations

import contextlib
import logging
import time
from pathlib import Path
from typing import Any

from ..config import build_config
from ..errors import ConfigError, DeepMetricError, RunInUse, TrainingInterrupted
from ..runs.folder import RunDir
from ..training import train
from ..workflows import evaluate_all_embeddings, evaluate_run
from .aggregate import write_results
from .changes import changed_settings
from .collect import aggregate, aggregate_all_embeddings
from .record import DamagedRecord, finished, record_lock, record_run, refuse_links, restore_run, write_manifest
from .spec import StudyRun, StudySpec
from .tuning import apply_best_values, run_tuning, trials_of

log = logging.getLogger("deepmetric")


def _set_aside(folder: RunDir) -> Path:
    """Move a finished run that is to be trained again into a folder beside it (``<repeat>.replaced-<time>``):
    nothing is deleted. Called while this process holds the run (``RunDir.holding``): its folder and lock stay in
    place, so another study process sees the run held and leaves it alone, and, once this one has trained it again,
    finds it finished with the study's settings instead of setting it aside a second time. ``metrics.json`` moves
    last: a stop in between leaves a finished run that is set aside again, never checkpoints without it."""
    directory = folder.path
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target = directory.with_name(f"{directory.name}.replaced-{stamp}")
    number = 1
    while target.exists():
        number += 1
        target = target.with_name(f"{directory.name}.replaced-{stamp}-{number}")
    target.mkdir()
    entries = sorted((entry for entry in directory.iterdir() if entry.name != folder.lock_path.name),
                     key=lambda entry: entry.name == folder.test_metrics.name)
    for entry in entries:
        entry.rename(target / entry.name)
    return target


def _tuned_first(spec: StudySpec, progress: bool, only: list[str] | tuple[str, ...]) -> list[str]:
    """With a ``tune:`` section: run the tuning (``tuning.run_tuning``), then give each variant whose trials have all
    finished its best trial's values (``spec.tuned``); the variants still being tuned by other processes."""
    run_tuning(spec, progress, only)
    pending = apply_best_values(spec, [run.variant for run in spec.runs(only)])
    for variant in pending:
        log.info("%s: its seeds wait until its tuning ends (%d of %d trials)", variant,
                 len(trials_of(spec, variant)), spec.tune.trials if spec.tune else 0)
    return pending


def _finished(spec: StudySpec, run: StudyRun) -> bool:
    return finished(RunDir(spec.run_dir(run)))


def _still_pending(spec: StudySpec, pending: list[str]) -> list[str]:
    """``pending`` looked at again at the end, as the runs met held are: a variant that other processes have tuned
    (``apply_best_values``) and trained every seed of since this one started is no longer pending."""
    untuned = apply_best_values(spec, pending)
    return [variant for variant in pending
            if variant in untuned or not all(_finished(spec, run) for run in spec.runs([variant]))]


def _restore_records(spec: StudySpec, runs: list[StudyRun]) -> dict[str, str]:
    """Restore each of ``runs`` that its record holds finished (``restore_run``); the runs whose record is damaged,
    by name, with the error (such a run is never restored, nor trained over its record)."""
    damaged = {}
    for number, run in enumerate(runs, start=1):
        record = spec.record_dir(run)
        try:
            if record is not None and restore_run(record, RunDir(spec.run_dir(run))):
                log.info("[%d/%d] %s: restored from %s", number, len(runs), run.name, record)
        except DamagedRecord as error:
            damaged[run.name] = str(error)
    return damaged


def _write_tables(spec: StudySpec, rows: list[dict[str, Any]], into_record: bool) -> dict[str, Path]:
    """The study's tables from ``rows`` (``write_results``), into the record too when ``into_record``: only the
    process that ends last, since tables of some runs kept in a record go stale with the next run recorded
    (``--verify`` refuses them). The record's lock keeps two processes from writing it at once."""
    locked = spec.record is not None and into_record
    with record_lock(spec.out) if locked else contextlib.nullcontext():
        return write_results(spec, rows, aggregate_all_embeddings(spec) if spec.all_embeddings else None,
                             into_record=into_record)


def _record(spec: StudySpec, run: StudyRun, folder: RunDir) -> None:
    """Record ``run``'s files (``record_run``) and the record's manifest, under the study's record lock."""
    record = spec.record_dir(run)
    if record is None or spec.record is None:
        return
    with record_lock(spec.out):
        if record_run(folder, record, spec.record):
            write_manifest(spec.record)


def run_study(spec: StudySpec, progress: bool = True, only: list[str] | tuple[str, ...] = (),
              retrain_changed: bool = False, tuning_only: bool = False) -> dict[str, Path]:
    """Train and evaluate each unfinished run (of the variants in ``only``, when given: the others wait for a later
    call); write ``results.csv``, ``results.md`` and ``results.png`` from every finished run of the study. A
    finished run whose saved config differs from the one the study builds now stops the study before anything is
    trained (naming it and the settings), unless ``retrain_changed``: then it is set aside and trained again. With
    a ``tune:`` section every variant is tuned first, and its seeds train with its best trial's values
    (``tuning_only``: stop after the tuning)."""
    if spec.record is not None and spec.record.is_dir():
        refuse_links(spec.record, spec.record)  # before anything is read from it or written through a link in it
    pending: list[str] = []
    if spec.tune is not None:
        if tuning_only:
            return run_tuning(spec, progress, only)
        pending = _tuned_first(spec, progress, only)
    runs = [run for run in spec.runs(only) if run.variant not in pending]
    damaged = _restore_records(spec, runs)  # before anything trains: restore, then compare the finished runs
    changed: dict[str, list[str]] = {}
    for run in runs:
        folder = RunDir(spec.run_dir(run))
        if run.name not in damaged and finished(folder):
            try:
                config = build_config(*run.layers)
            except ConfigError:
                continue  # reported as that run's failure below
            differences = changed_settings(folder, config)
            if differences:
                changed[run.name] = differences
    if changed and not retrain_changed:
        raise ConfigError(f"study {spec.name}: {len(changed)} finished run(s) were trained with other settings than "
                          "the study now gives: " + "; ".join(f"{name} ({', '.join(keys)})"
                                                              for name, keys in changed.items())
                          + ": restore those settings, or pass --retrain-changed to train them again (the old run "
                          "folders are kept beside, as <repeat>.replaced-<time>)")
    failed: list[str] = []
    elsewhere: list[StudyRun] = []
    for number, run in enumerate(runs, start=1):
        directory = spec.run_dir(run)
        folder = RunDir(directory)
        if run.name in damaged:
            log.error("[%d/%d] %s failed: %s", number, len(runs), run.name, damaged[run.name])
            failed.append(f"{run.name} ({damaged[run.name]})")
            continue
        trained = finished(folder) and run.name not in changed
        try:
            if trained and (not spec.all_embeddings or finished(folder, all_embeddings=True)):
                log.info("[%d/%d] %s: done already", number, len(runs), run.name)
                _record(spec, run, folder)
                continue
            holder = folder.holder()
            if holder is not None:  # looked at before the run is announced (train() refuses it too)
                raise RunInUse(f"{directory} is in use by process {holder}", holder)
            if not trained:
                config = build_config(*run.layers)  # a variant's bad setting fails this run only, before its folder
            with folder.holding():  # held from training through evaluation: another study process leaves it be
                if run.name in changed and finished(folder):  # looked at again under the lock: only one process
                    if changed_settings(folder, config):       # sets a changed run aside and trains it again
                        log.info("[%d/%d] %s: settings changed (%s): the old run moves to %s", number, len(runs),
                                 run.name, ", ".join(changed[run.name]), _set_aside(folder))
                    else:
                        log.info("[%d/%d] %s: trained again by another process", number, len(runs), run.name)
                        trained = True
                elif not trained and finished(folder):  # another process finished it while this one looked
                    log.info("[%d/%d] %s: finished by another process", number, len(runs), run.name)
                    trained = True
                if not trained:
                    resume = folder.last.is_file()  # without one, train() restarts a run that stopped before it
                    log.info("[%d/%d] %s: %s", number, len(runs), run.name, "resuming" if resume else "training")
                    train(config, directory, resume=resume, progress=progress)
                    evaluate_run(directory, progress=progress)
                if spec.all_embeddings and not finished(folder, all_embeddings=True):
                    log.info("[%d/%d] %s: evaluating every embedding", number, len(runs), run.name)
                    evaluate_all_embeddings(directory, progress=progress)
            _record(spec, run, folder)
        except RunInUse as busy:
            log.info("[%d/%d] %s: being trained by process %s: left to it", number, len(runs), run.name, busy.holder)
            elsewhere.append(run)
        except TrainingInterrupted:
            raise  # a signal stops the whole study (the run resumes next time), it is not a failed run
        except DeepMetricError as error:
            log.error("[%d/%d] %s failed: %s", number, len(runs), run.name, error)
            failed.append(f"{run.name} ({error})")
    # looked at again at the end: a run met held by another process that has finished it since is in the table,
    # so that the process ending last knows it is last and writes the record's tables
    elsewhere = [run for run in elsewhere if not _finished(spec, run)]
    pending = _still_pending(spec, pending)
    rows = aggregate(spec)
    if not rows and failed:  # nothing finished: the failures are the news, not the empty table
        raise DeepMetricError(f"study {spec.name}: {len(failed)} of {len(runs)} runs failed and none has finished: "
                              + "; ".join(failed))
    paths = _write_tables(spec, rows, into_record=not elsewhere and not pending)  # the last process's to record
    if elsewhere:
        log.warning("%s lacks %d run(s) that other processes are training (%s): the last process to end writes "
                    "the complete results%s", paths["md"], len(elsewhere), ", ".join(run.name for run in elsewhere),
                    " (and the record's tables)" if spec.record is not None else "")
    if pending:
        log.warning("%s lacks the variants still being tuned by other processes (%s): run the study again once "
                    "their tuning ends", paths["md"], ", ".join(pending))
    if failed:
        raise DeepMetricError(f"study {spec.name}: {len(failed)} of {len(runs)} runs failed (the others are in "
                              f"{paths['md']}): " + "; ".join(failed))
    return paths


def write_tables_now(spec: StudySpec) -> dict[str, Path]:
    """Train nothing: write the study's results files under ``spec.out`` from the runs finished so far, restoring
    recorded runs first as ``run_study`` does (a damaged record is named and left out). Each row's ``runs`` column
    says how many repeats it holds; a warning names the runs not finished yet. The record's tables are left to the
    study's processes (written as each ends): tables of some runs kept there would go stale with the next run
    recorded, and ``--verify`` would refuse them."""
    if spec.record is not None and spec.record.is_dir():
        refuse_links(spec.record, spec.record)
    runs = spec.runs()
    for name, error in _restore_records(spec, runs).items():
        log.error("%s left out: %s", name, error)
    rows = aggregate(spec)
    if not rows:
        raise DeepMetricError(f"study {spec.name}: no run has finished yet under {spec.out}"
                              + ("" if spec.record is None else f" or in its record {spec.record}")
                              + ": there is no table to write")
    paths = _write_tables(spec, rows, into_record=False)
    done = {(row["variant"], row["repeat"]) for row in rows}
    missing = [run.name for run in runs if (run.variant, run.repeat) not in done]
    if missing:
        log.warning("%s holds %d of %d runs; not finished yet: %s", paths["md"], len(runs) - len(missing), len(runs),
                    ", ".join(missing))
    return paths
