"""``deepmetric study FILE --verify``: check that a study's committed record is what its runs wrote and that every
figure of its tables follows from it, without training or evaluating anything.

Checked, each failure one line naming the file:

1. the record holds no symbolic link (nor anything but plain files and folders);
2. ``MANIFEST.sha256``: every file it lists exists with that SHA-256, and every file of the record is listed;
3. each recorded run's files are sound (``record.problem``: JSON and YAML that parse, metrics under metric names, a
   per-query file of plain arrays);
4. each run's per-query results (``per-query.npz``) give its ``metrics.json`` figures: Recall@K from the first-hit
   ranks, MAP@R and R-precision as means (``evaluation.metrics.per_query_metrics``), within ``TOLERANCE``, and the
   same query identity;
5. the tables in the record (``results.md``, ``results.csv``, ``results-statistics.csv`` and, with
   ``all_embeddings``, ``results-all-embeddings.*``) are what the study computes from the recorded files: every
   mean, std, interval, difference, p-value and bootstrap interval (the bootstrap from the per-query files; only
   the time ``results.md`` says it was written is not compared; CSV numbers within a relative 1e-9).

Runs recorded before runs kept per-query results cannot have check 4 nor a bootstrap: that is said (a note, not a
failure), and their tables are still recomputed from their ``metrics.json``.
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ConfigError, DeepMetricError
from ..evaluation.metrics import per_query_metrics
from ..evaluation.per_query import FILE_OF, load_per_query
from ..io.files import file_sha256
from .aggregate import same_tables, stamp_of, tables
from .collect import aggregate, aggregate_all_embeddings
from .record import MANIFEST, RECORDED, problem, read_manifest, record_files, recorded
from .spec import StudyRun, StudySpec

TOLERANCE = 1e-6
"""How far a ``metrics.json`` figure may lie from its per-query file's (float32 sums in another order)."""

CSV_TOLERANCE = 1e-9
"""Relative difference allowed between a CSV number and its recomputation (the last digits of a float printed by
another numpy or scipy)."""

SHOWN = 10
"""Differing lines of one table named, at most."""


@dataclass
class Verification:
    """What ``verify`` found: ``problems`` (each one line naming a file; the record does not verify when there is
    any), ``notes`` (what could not be checked, and why) and ``checked`` (counts, for the summary line)."""

    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    checked: dict[str, int] = field(default_factory=dict)

    def summary(self, spec: StudySpec) -> str:
        counts = ", ".join(f"{count} {what}" for what, count in self.checked.items())
        verdict = f"{len(self.problems)} problem(s)" if self.problems else "verified"
        return f"study {spec.name}, record {spec.record}: {verdict} ({counts})"


def _check_manifest(root: Path, files: list[Path], found: Verification) -> None:
    manifest = root / MANIFEST
    if not manifest.is_file():
        found.problems.append(f"{manifest} is missing: deepmetric study FILE writes it with the record")
        return
    entries, bad = read_manifest(root)
    found.problems += [f"{root / line}" for line in bad]
    for name, digest in entries.items():
        path = root / name
        if not path.is_file():
            found.problems.append(f"{path} is listed in {MANIFEST} but is not in the record")
        elif file_sha256(path) != digest:
            found.problems.append(f"{path} does not match {MANIFEST} (its SHA-256 changed since it was recorded)")
    listed = set(entries)
    for path in files:
        if path.relative_to(root).as_posix() not in listed:
            found.problems.append(f"{path} is not listed in {MANIFEST}")
    found.checked["files hashed"] = len(entries)


def _check_per_query(metrics_file: Path, per_query_file: Path, found: Verification) -> None:
    """Check 4 on one evaluation file and its per-query file (both sound)."""
    try:
        loaded = load_per_query(per_query_file)
    except DeepMetricError as error:
        found.problems.append(str(error))
        return
    record = json.loads(metrics_file.read_text())
    metrics = record["metrics"]
    recall_at = [int(key.split("@", 1)[1]) for key in metrics if key.startswith("recall@")
                 and key.split("@", 1)[1].isdigit()]
    for key, value in per_query_metrics(loaded.per_query, recall_at).items():
        given = metrics.get(key)
        if given is not None and abs(float(given) - value) > TOLERANCE:
            found.problems.append(f"{metrics_file}: {key} is {given:.6f} but {per_query_file.name} gives "
                                  f"{value:.6f}")
    identity = record.get("queries_sha256")
    if identity is not None and identity != loaded.identity["queries_sha256"]:
        found.problems.append(f"{metrics_file}: its queries_sha256 is not {per_query_file.name}'s (the two files "
                              "come from different evaluations)")


def _check_runs(spec: StudySpec, found: Verification) -> None:
    without, missing, runs = [], [], 0
    for run in spec.runs():
        record = spec.record_dir(run)
        assert record is not None
        if not recorded(record):
            missing.append(run.name)
            continue
        runs += 1
        damaged = False
        for name in RECORDED:
            path = record / name
            if path.is_file():
                reason = problem(path)
                if reason is not None:
                    found.problems.append(f"{path} is damaged: {reason}")
                    damaged = True
        for metrics_name, per_query_name in FILE_OF.items():
            metrics_file, per_query_file = record / metrics_name, record / per_query_name
            if not per_query_file.is_file():
                if metrics_name == "metrics.json":
                    without.append(run.name)
            elif not metrics_file.is_file():
                found.problems.append(f"{per_query_file} has no {metrics_name} beside it")
            elif not damaged:
                _check_per_query(metrics_file, per_query_file, found)
    found.checked["runs"] = runs
    if without:
        found.notes.append(f"per-query checks unavailable for {len(without)} of {runs} recorded runs (recorded before "
                           f"runs kept per-query results: {', '.join(without)}): their files are checked against the "
                           "manifest and their metrics.json figures against the tables (where the record holds them), "
                           "and they have no bootstrap")
    if missing:
        found.notes.append(f"{len(missing)} run(s) of the study are not recorded: {', '.join(missing)}")


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _same_cell(old: str, new: str) -> bool:
    a, b = _number(old), _number(new)
    if a is None or b is None:
        return old == new
    return math.isclose(a, b, rel_tol=CSV_TOLERANCE, abs_tol=1e-12) or (math.isnan(a) and math.isnan(b))


def _compare_csv(path: Path, recorded_text: str, computed: str, found: Verification) -> None:
    old, new = list(csv.reader(io.StringIO(recorded_text))), list(csv.reader(io.StringIO(computed)))
    if not old or not new or old[0] != new[0]:
        found.problems.append(f"{path}: its columns are not the ones the record gives ({', '.join(new[0][:6])}, …)"
                              if new else f"{path}: the record gives no table")
        return
    if len(old) != len(new):
        found.problems.append(f"{path} has {len(old) - 1} rows, the record gives {len(new) - 1}")
        return
    header, differing = new[0], []
    for number, (was, now) in enumerate(zip(old[1:], new[1:], strict=True), start=2):
        differing += [f"{path} line {number} ({', '.join(now[:2])}), {column}: the file has {a!r}, the record gives "
                      f"{b!r}" for column, a, b in zip(header, was, now, strict=False) if not _same_cell(a, b)]
        if len(was) != len(now):
            differing.append(f"{path} line {number} has {len(was)} cells, the record gives {len(now)}")
    _add(found, path, differing)


def _add(found: Verification, path: Path, differing: list[str]) -> None:
    """The first ``SHOWN`` differences of one table, and how many more there are."""
    found.problems += differing[:SHOWN]
    if len(differing) > SHOWN:
        found.problems.append(f"{path}: and {len(differing) - SHOWN} more differences")


def _compare_text(path: Path, recorded_text: str, computed: str, found: Verification) -> None:
    if same_tables(recorded_text, computed):
        return
    old, new = recorded_text.splitlines(), computed.splitlines()
    differing = [f"{path} line {number}: the file has {a!r}, the record gives {b!r}"
                 for number, (a, b) in enumerate(zip(old, new, strict=False), start=1) if not same_tables(a, b)]
    if len(old) != len(new):
        differing.append(f"{path} has {len(old)} lines, the record gives {len(new)}")
    _add(found, path, differing)


def _check_tables(spec: StudySpec, found: Verification) -> None:
    root = spec.record
    assert root is not None

    def record_dir(run: StudyRun) -> Path:
        folder = spec.record_dir(run)
        assert folder is not None  # the study has a record (root)
        return folder

    rows = aggregate(spec, record_dir)
    if not rows:
        found.notes.append("no run is recorded: no table to check")
        return
    markdown_file = root / "results.md"
    stamp = stamp_of(markdown_file.read_text(errors="replace")) if markdown_file.is_file() else None
    embedding_rows = aggregate_all_embeddings(spec, record_dir) if spec.all_embeddings else None
    computed = tables(spec, rows, embedding_rows, folder_of=record_dir, stamp=stamp)
    if not any((root / name).is_file() for name in computed):
        found.notes.append(f"the record holds no tables ({', '.join(computed)}): deepmetric study FILE writes them "
                           "into it; only the runs' files were checked")
        return
    for name, text in computed.items():
        path = root / name
        if not path.is_file():
            found.problems.append(f"{path} is missing: deepmetric study FILE writes it from the record")
        elif name.endswith(".csv"):
            _compare_csv(path, path.read_text(errors="replace"), text, found)
        else:
            _compare_text(path, path.read_text(errors="replace"), text, found)
    found.checked["tables recomputed"] = len(computed)


def verify(spec: StudySpec) -> Verification:
    """Check ``spec``'s record (the module docstring); what was found. A study without a record is refused."""
    root = spec.record
    if root is None:
        raise ConfigError(f"study {spec.name} keeps no record (the study file's 'record:'): there is nothing to "
                          "verify")
    if not root.exists():
        raise DeepMetricError(f"study {spec.name}: nothing is recorded yet ({root} does not exist): run the study "
                              "first, then verify what it recorded")
    if not root.is_dir():
        raise DeepMetricError(f"study {spec.name}: its record {root} is not a folder")
    found = Verification()
    try:
        files = record_files(root)
    except DeepMetricError as error:  # a link: nothing more is read through it
        found.problems.append(str(error))
        return found
    _check_manifest(root, files, found)
    _check_runs(spec, found)
    _check_tables(spec, found)
    if spec.tune is not None:
        _check_trials(spec, found)
    return found


def _check_trials(spec: StudySpec, found: Verification) -> None:
    """6. each recorded trial's score and step follow from its recorded training log (``tuning.score_of``), and
    ``tuning.md`` / ``tuning.csv`` are what the recorded trials give."""
    from ..runs.folder import RunDir
    from .tuning import TRIAL, score_of, trials_of, tuning_tables

    assert spec.record is not None and spec.tune is not None
    count = 0
    for variant in spec.variants:
        for trial in trials_of(spec, variant, record_only=True):
            folder = spec.record / "trials" / variant / str(trial.number)
            score, step, validation = score_of(RunDir(folder), spec.tune.objective)
            if (score, step) != (trial.score, trial.step) or validation != trial.validation:
                found.problems.append(f"{folder / TRIAL}: it says score {trial.score} at step {trial.step}, its "
                                      f"metrics.jsonl gives {score} at step {step}")
            count += 1
    found.checked["trials"] = count
    for name, text in tuning_tables(spec, record_only=True).items():
        path = spec.record / name
        if not path.is_file():
            if count:
                found.problems.append(f"{path} is missing: deepmetric study FILE --tuning-only writes it")
        elif name.endswith(".csv"):
            _compare_csv(path, path.read_text(errors="replace"), text, found)
        else:
            _compare_text(path, path.read_text(errors="replace"), text, found)
