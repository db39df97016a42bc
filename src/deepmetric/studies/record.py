"""A study's record: the small files of each finished run (its config, training log, test metrics and provenance,
not its checkpoints), copied to a folder that can be committed beside the code (the study file's ``record:``).

A study's runs folder holds checkpoints of tens of megabytes and is not kept in version control, so a study that
takes longer than one machine's session would start over on a fresh checkout. With a record, each run is copied
there as soon as it is evaluated, and a later ``deepmetric study`` on a fresh checkout restores the recorded runs into
its runs folder: they count as finished (nothing is retrained) and aggregate exactly as before, validation columns
included. A restored run has no checkpoint, so ``evaluate`` or ``index`` on it says it is a finished run without
its weights.
"""

from __future__ import annotations

from pathlib import Path

from ..io import atomic_write_bytes
from ..training.run_dir import RunDir

RECORDED = ("config.yaml", "metrics.jsonl", "metrics.json", "metrics-last.json", "metrics-all-embeddings.json",
            "environment.json")
"""The files of a run that its record keeps (those it has): everything ``aggregate`` reads, and the provenance."""


def record_run(run: RunDir, record: Path) -> int:
    """Copy ``run``'s recorded files into ``record`` (atomically, each only when its bytes changed); the number
    copied. A run without test metrics (unfinished) is not recorded."""
    if not run.test_metrics.is_file():
        return 0
    copied = 0
    for name in RECORDED:
        source, target = run.path / name, record / name
        if not source.is_file():
            continue
        data = source.read_bytes()  # read once: compared, then written
        if not target.is_file() or target.read_bytes() != data:
            atomic_write_bytes(target, data)
            copied += 1
    return copied


def restore_run(record: Path, run: RunDir) -> bool:
    """Restore a recorded finished run into ``run``'s folder when that folder holds no finished run of its own;
    whether it did. Files of an unfinished attempt in the folder (a partial log) give way to the record's."""
    if run.test_metrics.is_file() or not (record / "metrics.json").is_file():
        return False
    for name in sorted(RECORDED, key=lambda name: name == "metrics.json"):  # the file that marks it finished last
        if (record / name).is_file():
            atomic_write_bytes(run.path / name, (record / name).read_bytes())
    return True
