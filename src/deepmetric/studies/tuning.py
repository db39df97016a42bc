"""Tuning a study's variants with the same budget each (Musgrave et al., ECCV 2020): Optuna's seeded TPE searches each
variant's declared space (``search_space``) on the validation classes only, ``tune.trials`` trials per variant.

A trial is a training run (the study's settings, the variant's overrides, then the trial's values) in
``<out>/trials/<variant>/<number>``; it is trained, never tested: its score is ``tune.objective`` on the validation
classes at the checkpoint the library selects (``training.selection.selection_key``: the best validation Recall@1, ties
by MAP@R then R-precision). A trial whose training stops on a non-finite loss scores what it reached before (0 with no
validation yet) and counts: a rate that diverges is an answer of the search, and every variant keeps its budget.

The Optuna studies (one a variant, named ``<study>/<variant>``) live in one journal file, ``tuning.journal`` in the
study's record folder (else its ``out``), which several processes share (one per core or GPU share); each process
takes the next trial of a variant under a lock (``trials/<variant>/.next.lock``), so that a variant never runs more
than its budget. Each finished trial is recorded like a run (``record/trials/<variant>/<number>``: config, training
log, provenance and ``trial.json`` with its values and scores), so that a study cut by the end of a session goes on in
a fresh checkout: a trial the journal holds as running while no process holds its folder was cut, and is trained
again (resumed when its folder is there) with the same values. ``tuning.md`` / ``tuning.csv`` list every trial and
each variant's best; ``best_values`` gives the best trial's values to a comparison study (``tuned:``).
"""

from __future__ import annotations

import contextlib
import csv
import fcntl
import io
import json
import logging
import math
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..config import build_config
from ..errors import ConfigError, RunInUse, TrainingError
from ..io.files import atomic_write_bytes, atomic_write_text
from ..io.strict import load_json
from ..runs.folder import RunDir
from ..training import train
from ..training.selection import selection_key
from .changes import changed_settings
from .record import record_lock, write_manifest
from .search_space import TuneSpec
from .spec import StudySpec

log = logging.getLogger("deepmetric")

JOURNAL = "tuning.journal"
TRIAL = "trial.json"
RECORDED = ("config.yaml", "metrics.jsonl", "environment.json", TRIAL)


@dataclass
class Trial:
    """A finished trial: its variant, number, the values it tried, its score and what chose it."""

    variant: str
    number: int
    values: dict[str, Any]
    score: float
    step: int | None
    validation: dict[str, float]
    failed: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"variant": self.variant, "number": self.number, "values": self.values, "score": self.score,
                "step": self.step, "validation": self.validation, "failed": self.failed}


def _optuna() -> Any:
    try:
        import optuna
    except ImportError:
        raise ConfigError("tuning needs Optuna: pip install 'deepmetric[tune]' (or pip install optuna)") from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def journal_path(spec: StudySpec) -> Path:
    return (spec.record if spec.record is not None else spec.out) / JOURNAL


def trial_dir(spec: StudySpec, variant: str, number: int) -> Path:
    return spec.out / "trials" / variant / str(number)


def trial_record(spec: StudySpec, variant: str, number: int) -> Path | None:
    return None if spec.record is None else spec.record / "trials" / variant / str(number)


def _storage(spec: StudySpec) -> Any:
    """The study's Optuna storage: the journal (``journal_path``), locked for each append by a file in the study's
    output folder, beside the record's own lock (``record_lock``). Optuna's default lock is a symbolic link beside
    the journal, renamed away on release: in the record, another process walking it (``refuse_links``,
    ``write_manifest``) met a link, or a file gone between listing and reading it."""
    optuna = _optuna()
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend, JournalFileOpenLock

    path = journal_path(spec)
    path.parent.mkdir(parents=True, exist_ok=True)
    spec.out.mkdir(parents=True, exist_ok=True)
    lock = JournalFileOpenLock(str(spec.out / JOURNAL))
    return optuna, JournalStorage(JournalFileBackend(str(path), lock_obj=lock))


def _study(spec: StudySpec, variant: str, optuna: Any, storage: Any) -> Any:
    """``variant``'s Optuna study, loaded when the journal has it (``create_study`` would append a creation line to
    the recorded journal at every start of every process), created otherwise."""
    name, sampler = f"{spec.name}/{variant}", _sampler(optuna, _tune(spec), variant, 0)
    try:
        return optuna.load_study(study_name=name, storage=storage, sampler=sampler)
    except KeyError:  # not in the journal yet; another process may create it at the same moment, hence load_if_exists
        return optuna.create_study(study_name=name, storage=storage, sampler=sampler, direction="maximize",
                                   load_if_exists=True)


def _sampler(optuna: Any, tune: TuneSpec, variant: str, number: int) -> Any:
    """The TPE sampler that suggests trial ``number`` of ``variant``, seeded by (``tune.seed``, the variant, the
    trial's number). Processes that share a study each hold a sampler, and samplers seeded alike suggested the same
    values to the trials they took at once (on a GPU, 2026-11-27: five DeML trials with equal values); a seed per
    trial gives each trial its own draw and keeps a study run in one process reproducible. ``constant_liar``: a
    trial still training counts as a poor one, so that trials taken at once spread out (Optuna's advice for
    distributed TPE)."""
    seed = int(np.random.SeedSequence([tune.seed, zlib.crc32(variant.encode()), number]).generate_state(1)[0])
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=min(5, tune.trials), constant_liar=True)


def _tune(spec: StudySpec) -> TuneSpec:
    if spec.tune is None:
        raise ConfigError(f"study {spec.name} has no tune: section")
    return spec.tune


def score_of(run: RunDir, objective: str) -> tuple[float, int | None, dict[str, float]]:
    """``objective`` on the validation classes at the checkpoint the library selects from ``run``'s log (the best
    ``selection_key``; the earliest among equals, as training keeps it), that step, and its validation figures;
    ``(0.0, None, {})`` when nothing was validated."""
    best: tuple[list[float], int | None, dict[str, float]] | None = None
    for record in run.read_log():
        if record.get("split") != "val" or not all(k in record for k in ("recall@1", "map@r", "r_precision")):
            continue
        key = selection_key(record)
        if best is None or key > best[0]:
            best = (key, record.get("step"), {m: record[m] for m in ("recall@1", "map@r", "r_precision")})
    if best is None:
        return 0.0, None, {}
    value = best[2][objective]
    return (float(value) if math.isfinite(value) else 0.0), best[1], best[2]


def _read_trial(path: Path) -> Trial | None:
    """The trial recorded in ``path`` (a ``trial.json``), or None when it is missing or damaged."""
    try:
        data = load_json(path.read_bytes())  # a hand-edited or damaged file: None, never a RecursionError
        return Trial(variant=str(data["variant"]), number=int(data["number"]), values=dict(data["values"]),
                     score=float(data["score"]), step=data.get("step"), validation=dict(data["validation"]),
                     failed=data.get("failed"))
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return None


def _record_trial(folder: RunDir, trial: Trial, record: Path | None) -> None:
    atomic_write_text(folder.path / TRIAL, json.dumps(trial.to_json(), indent=1))
    if record is None:
        return
    for name in RECORDED:
        source = folder.path / name
        if source.is_file():
            atomic_write_bytes(record / name, source.read_bytes())


def finished_trial(spec: StudySpec, variant: str, number: int) -> Trial | None:
    """Trial ``number`` of ``variant`` when it has finished (recorded, or in its run folder)."""
    for folder in (trial_record(spec, variant, number), trial_dir(spec, variant, number)):
        if folder is not None:
            trial = _read_trial(folder / TRIAL)
            if trial is not None:
                return trial
    return None


@contextlib.contextmanager
def _next_lock(spec: StudySpec, variant: str) -> Iterator[None]:
    path = spec.out / "trials" / variant / ".next.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _take_trial(spec: StudySpec, variant: str, study: Any, optuna: Any,
                held: contextlib.ExitStack) -> tuple[int, dict[str, Any]] | None:
    """The next trial of ``variant`` for this process, its folder held in ``held``: a cut one (running in the
    journal, its folder free), else a new one while the budget allows; None when every trial is finished or taken."""
    tune = _tune(spec)
    running = optuna.trial.TrialState.RUNNING
    with _next_lock(spec, variant):
        trials = study.get_trials(deepcopy=False)
        for frozen in trials:
            if frozen.state != running:
                continue
            try:
                held.enter_context(RunDir(trial_dir(spec, variant, frozen.number)).holding())
            except RunInUse:
                continue  # another process trains it
            return frozen.number, dict(frozen.params)
        if len(trials) >= tune.trials:
            return None
        study.sampler = _sampler(optuna, tune, variant, len(trials))  # the trial's number once asked
        trial = study.ask()
        values = {dimension.key: dimension.suggest(trial) for dimension in tune.spaces[variant]}
        held.enter_context(RunDir(trial_dir(spec, variant, trial.number)).holding())
        return trial.number, values


def _train_trial(spec: StudySpec, variant: str, number: int, values: dict[str, Any], progress: bool) -> Trial:
    """Train trial ``number`` (resumed from its last checkpoint when there is one) and score it."""
    tune = _tune(spec)
    folder = RunDir(trial_dir(spec, variant, number))
    config = build_config(*spec.trial_layers(variant, values))
    failed = None
    try:
        train(config, folder.path, resume=folder.last.is_file(), progress=progress)
    except TrainingError as error:  # a non-finite loss: the values diverge, a result of the search
        failed = str(error)
        log.warning("trial %s/%d stopped: %s; it scores what it reached", variant, number, error)
    score, step, validation = score_of(folder, tune.objective)
    return Trial(variant, number, values, score, step, validation, failed)


def run_tuning(spec: StudySpec, progress: bool = True, only: list[str] | tuple[str, ...] = ()) -> dict[str, Path]:
    """Run trials of every variant (those in ``only``, when given) until each has ``tune.trials`` finished trials,
    recording each; write ``tuning.md`` and ``tuning.csv``. Several processes may run it on one study at once."""
    tune = _tune(spec)
    variants = list(dict.fromkeys(run.variant for run in spec.runs(only)))
    check_finished_trials(spec, variants)
    optuna, storage = _storage(spec)
    for variant in variants:
        study = _study(spec, variant, optuna, storage)
        while True:
            with contextlib.ExitStack() as held:
                taken = _take_trial(spec, variant, study, optuna, held)
                if taken is None:
                    break
                number, values = taken
                trial = finished_trial(spec, variant, number)  # recorded before the journal was told
                if trial is None:
                    shown = ", ".join(f"{k}={_shown(v)}" for k, v in values.items())
                    log.info("tuning %s: trial %d of %d (%s)", variant, number + 1, tune.trials, shown)
                    trial = _train_trial(spec, variant, number, values, progress)
                    _record_trial(RunDir(trial_dir(spec, variant, number)), trial,
                                  trial_record(spec, variant, number))
                study.tell(number, trial.score)
                _write_manifest(spec)
                log.info("tuning %s: trial %d scored %s %.4f (step %s)", variant, number + 1, tune.objective,
                         trial.score, trial.step)
    return write_tuning(spec)


def check_finished_trials(spec: StudySpec, variants: list[str]) -> None:
    """Refuse to go on while a finished trial of ``variants`` was trained with other settings than the study gives
    its values now (``changed_settings``): its score would count for a variant it did not train."""
    changed = []
    for variant in variants:
        for trial in trials_of(spec, variant):
            folders = (trial_record(spec, variant, trial.number), trial_dir(spec, variant, trial.number))
            folder = next(RunDir(f) for f in folders if f is not None and (f / TRIAL).is_file())
            differences = changed_settings(folder, build_config(*spec.trial_layers(variant, trial.values)))
            if differences:
                changed.append(f"{variant}/{trial.number} in {folder.path} ({', '.join(differences)})")
    if changed:
        raise ConfigError(f"study {spec.name}: {len(changed)} finished trial(s) were trained with other settings than "
                          "the study now gives them: " + "; ".join(changed) + ": restore those settings, or, to tune "
                          "the variant again, move its trials out of the record and the study's folder and delete its "
                          f"Optuna study from {journal_path(spec)} (optuna.delete_study)")


def _write_manifest(spec: StudySpec) -> None:
    """The record's ``MANIFEST.sha256`` again (the journal and the trials changed), under the record's lock."""
    if spec.record is not None:
        with record_lock(spec.out):
            write_manifest(spec.record)


def trials_of(spec: StudySpec, variant: str, record_only: bool = False) -> list[Trial]:
    """The finished trials of ``variant``, by number (from the record, else the runs folder; ``record_only``: from
    the record alone)."""
    numbers: set[int] = set()
    for root in (spec.record,) if record_only else (spec.record, spec.out):
        folder = None if root is None else root / "trials" / variant
        if folder is not None and folder.is_dir():
            numbers.update(int(p.name) for p in folder.iterdir() if p.name.isdigit())
    if record_only:  # (no record: no numbers)
        trials = [_read_trial(spec.record / "trials" / variant / str(n) / TRIAL)
                  for n in sorted(numbers)] if spec.record is not None else []
    else:
        trials = [finished_trial(spec, variant, n) for n in sorted(numbers)]
    return [t for t in trials if t is not None]


def best_trial(trials: list[Trial]) -> Trial | None:
    """The trial with the highest score (the lowest number among equals)."""
    return max(trials, key=lambda t: (t.score, -t.number), default=None)


def best_values(spec: StudySpec, variant: str) -> dict[str, Any]:
    """The values of ``variant``'s best trial, once all its ``tune.trials`` trials have finished."""
    tune = _tune(spec)
    trials = trials_of(spec, variant)
    if len(trials) < tune.trials:
        raise ConfigError(f"tuning study {spec.name}: variant {variant!r} has {len(trials)} of its {tune.trials} "
                          f"trials: finish them first (deepmetric study {spec.name} --only {variant})")
    best = best_trial(trials[:tune.trials])
    assert best is not None
    return best.values


def _shown(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def tuning_rows(spec: StudySpec, record_only: bool = False) -> list[dict[str, Any]]:
    rows = []
    for variant in spec.variants:
        trials = trials_of(spec, variant, record_only)
        best = best_trial(trials)
        for trial in trials:
            rows.append({"variant": variant, "trial": trial.number, "best": trial is best, "score": trial.score,
                         "step": trial.step, **{f"val_{k}": v for k, v in trial.validation.items()},
                         **trial.values, "failed": trial.failed or ""})
    return rows


def tuning_tables(spec: StudySpec, record_only: bool = False) -> dict[str, str]:
    """``tuning.csv`` (every finished trial) and ``tuning.md`` (per variant: trials done, best trial and values,
    its space), as text."""
    tune = _tune(spec)
    rows = tuning_rows(spec, record_only)
    keys: list[str] = []
    for row in rows:
        keys += [k for k in row if k not in keys]
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=keys or ["variant"], lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    lines = [f"# Tuning: {spec.name}", "",
             f"Optuna TPE (seed {tune.seed}), {tune.trials} trials per variant, each scored by validation "
             f"{tune.objective} at the checkpoint the library selects (best validation Recall@1, ties by MAP@R). "
             "The test classes chose nothing.", "",
             "| variant | trials | best trial | best " + tune.objective + " | its values | space |",
             "|---|---|---|---|---|---|"]
    for variant, dimensions in tune.spaces.items():
        trials = trials_of(spec, variant, record_only)
        best = best_trial(trials)
        failed = sum(1 for t in trials if t.failed)
        done = f"{len(trials)} of {tune.trials}" + (f" ({failed} diverged)" if failed else "")
        values = ", ".join(f"{k}={_shown(v)}" for k, v in best.values.items()) if best else "—"
        space = "; ".join(f"{d.key} {d.describe()}" for d in dimensions)
        lines.append(f"| {variant} | {done} | {best.number if best else '—'} | "
                     f"{f'{100 * best.score:.2f}' if best else '—'} | {values} | {space} |")
    return {"tuning.csv": buffer.getvalue(), "tuning.md": "\n".join(lines) + "\n"}


def write_tuning(spec: StudySpec) -> dict[str, Path]:
    """``tuning_tables`` written in the study's ``out`` and, with a record, there too."""
    texts = tuning_tables(spec)
    paths: dict[str, Path] = {}
    for folder in (spec.out, spec.record):
        if folder is None:
            continue
        folder.mkdir(parents=True, exist_ok=True)
        for name, text in texts.items():
            atomic_write_text(folder / name, text)
        paths.setdefault("md", folder / "tuning.md")
        paths.setdefault("csv", folder / "tuning.csv")
    _write_manifest(spec)
    return paths


def apply_best_values(spec: StudySpec, variants: list[str] | tuple[str, ...]) -> list[str]:
    """Give each of ``variants`` whose trials have all finished its best trial's values (``spec.tuned``, the layer
    its seeds train with); the variants still being tuned."""
    pending = []
    for variant in dict.fromkeys(variants):
        try:
            spec.tuned[variant] = spec.trial_layers(variant, best_values(spec, variant))[-1]
        except ConfigError:
            pending.append(variant)
    return pending
