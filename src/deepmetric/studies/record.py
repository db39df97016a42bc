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

import json
import math
from pathlib import Path
from typing import Any

import yaml

from ..errors import DeepMetricError
from ..io import atomic_write_bytes
from ..training.run_dir import RunDir

RECORDED = ("config.yaml", "metrics.jsonl", "metrics.json", "metrics-last.json", "metrics-all-embeddings.json",
            "environment.json")
"""The files of a run that its record keeps (those it has): everything ``aggregate`` reads, and the provenance."""


EXPECTED = {"metrics.json": "metrics", "metrics-last.json": "metrics", "metrics-all-embeddings.json": "embeddings"}
"""The mapping each evaluation file must hold (what ``aggregate`` reads)."""


class DamagedRecord(DeepMetricError):
    """A file of a run's record (or a run's evaluation file) that does not hold what it should: merge-conflict
    markers, a truncated write, a hand edit."""


def _is_metrics(value: Any) -> bool:
    return isinstance(value, dict) and all(
        isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) or v is None
        for v in value.values())


def problem(path: Path) -> str | None:
    """What is wrong with ``path`` (one of ``RECORDED``; a JSON file must parse and hold its ``EXPECTED`` mapping of
    numbers, each line of ``metrics.jsonl`` be a JSON object, ``config.yaml`` a YAML mapping), or None when it is
    sound."""
    name = path.name
    try:
        text = path.read_text()
        if name.endswith(".jsonl"):
            for number, line in enumerate(text.splitlines(), start=1):
                if line.strip() and not isinstance(json.loads(line), dict):
                    return f"line {number} is not a JSON object"
        elif name.endswith(".json"):
            data = json.loads(text)
            if not isinstance(data, dict):
                return "it does not hold a JSON object"
            key = EXPECTED.get(name)
            if key == "metrics" and not _is_metrics(data.get(key)):
                return "it has no 'metrics' mapping of numbers"
            if key == "embeddings" and not (isinstance(data.get(key), dict)
                                            and all(_is_metrics(v) for v in data[key].values())):
                return "it has no 'embeddings' mapping of metrics"
        elif not isinstance(yaml.safe_load(text), dict):
            return "it does not hold a YAML mapping"
    except UnicodeDecodeError:
        return "it is not UTF-8 text"
    except json.JSONDecodeError as error:
        conflict = " (merge-conflict markers?)" if "<<<<<<<" in text or ">>>>>>>" in text else ""
        return f"it is not valid JSON{conflict}: {error.msg} at line {error.lineno}"
    except yaml.YAMLError as error:
        return f"it is not valid YAML: {type(error).__name__}"
    except OSError as error:
        return f"it cannot be read: {error.strerror or error}"
    return None


def check_record(record: Path) -> None:
    """Raise ``DamagedRecord`` naming the first recorded file of ``record`` that is not sound (``problem``)."""
    for name in RECORDED:
        path = record / name
        if path.is_file():
            found = problem(path)
            if found is not None:
                raise DamagedRecord(f"{path} is damaged ({found}): fix it (e.g. resolve the merge conflict) or "
                                    f"remove {record} to train the run again")


def finished(run: RunDir, all_embeddings: bool = False) -> bool:
    """Whether ``run`` holds a sound ``metrics.json`` (and, with ``all_embeddings``, a sound
    ``metrics-all-embeddings.json``): a damaged copy never counts as a finished run."""
    files = [run.test_metrics] + ([run.all_embeddings_metrics] if all_embeddings else [])
    return all(path.is_file() and problem(path) is None for path in files)


def record_run(run: RunDir, record: Path) -> int:
    """Copy ``run``'s recorded files into ``record`` (atomically, each only when its bytes changed); the number
    copied. A run without sound test metrics (unfinished) is not recorded."""
    if not finished(run):
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


def recorded(record: Path) -> bool:
    """Whether ``record`` holds a finished run (its ``metrics.json``, checked when it is restored)."""
    return (record / "metrics.json").is_file()


def restore_run(record: Path, run: RunDir) -> bool:
    """Restore a recorded finished run into ``run``'s folder when that folder holds no finished run of its own;
    whether it did. Files of an unfinished attempt in the folder (a partial log, a damaged ``metrics.json``) give
    way to the record's. Every recorded file is checked first: a damaged record raises ``DamagedRecord`` naming the
    file, and nothing is restored."""
    if finished(run) or not recorded(record):
        return False
    check_record(record)
    for name in sorted(RECORDED, key=lambda name: name == "metrics.json"):  # the file that marks it finished last
        if (record / name).is_file():
            atomic_write_bytes(run.path / name, (record / name).read_bytes())
    return True
