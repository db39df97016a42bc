"""A study's record: the small files of each finished run (its config, training log, test metrics and provenance,
not its checkpoints), copied to a folder that can be committed beside the code (the study file's ``record:``).

Each run's record is its folder ``<record>/<variant>/<repeat>``; recording a run again replaces that folder's
contents as a whole (a file the new run lacks, such as a replaced run's ``metrics-last.json``, does not stay beside
the new files). The record's root holds the study's tables (``results.md``, ``results.csv``,
``results-statistics.csv``) and ``MANIFEST.sha256``, the SHA-256 of every recorded file in ``sha256sum``'s format
(``sha256sum -c MANIFEST.sha256`` checks it too): ``deepmetric study FILE --verify`` (``verify.py``) checks the hashes
and recomputes every figure of the tables from the recorded files. A record holds no symbolic link: one inside it
(a variant's folder linked elsewhere) is refused, since writing through it would write outside the record.

A study's runs folder holds checkpoints of tens of megabytes and is not kept in version control, so a study that
takes longer than one machine's session would start over on a fresh checkout. With a record, each run is copied
there as soon as it is evaluated, and a later ``deepmetric study`` on a fresh checkout restores the recorded runs into
its runs folder: they count as finished (nothing is retrained) and aggregate exactly as before, validation columns
included. A restored run has no checkpoint, so ``evaluate`` or ``index`` on it says it is a finished run without
its weights.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from ..errors import DeepMetricError
from ..evaluation import per_query
from ..io.files import (
    TEMPORARY_PREFIX,
    TEMPORARY_SUFFIX,
    atomic_write_bytes,
    atomic_write_text,
    file_sha256,
    open_in_place,
    replace_folder,
)
from ..runs.folder import RunDir

RECORDED = ("config.yaml", "metrics.jsonl", "metrics.json", "metrics-last.json", "metrics-all-embeddings.json",
            "environment.json", "per-query.npz", "per-query-last.npz")
"""The files of a run that its record keeps (those it has): everything ``aggregate`` reads, and the provenance."""

MANIFEST = "MANIFEST.sha256"
"""The record's manifest: ``<sha256>  <path>`` per recorded file (``sha256sum``'s format), paths relative to the
record's root, sorted."""

METRIC_NAME = re.compile(r"[a-z][a-z0-9_]*(@[a-z0-9]+)?")
"""What a metric's name looks like (``recall@1``, ``map@r``, ``r_precision``, ``nmi``): a record's metric named
otherwise (``variant``, a Markdown cell) is refused rather than written into the tables."""

TABLE_KEYS = ("variant", "repeat", "data")
"""The columns a study table keeps for itself: no metric may take their names."""

MAX_NAME = 200
"""The longest embedding name a record may give (``metrics-all-embeddings.json``)."""


EXPECTED = {"metrics.json": "metrics", "metrics-last.json": "metrics", "metrics-all-embeddings.json": "embeddings"}
"""The mapping each evaluation file must hold (what ``aggregate`` reads)."""


class DamagedRecord(DeepMetricError):
    """A file of a run's record (or a run's evaluation file) that does not hold what it should: merge-conflict
    markers, a truncated write, a hand edit."""


def _metrics_problem(value: Any) -> str | None:
    """What is wrong with a ``metrics`` mapping (names as ``METRIC_NAME``, values finite numbers or null)."""
    if not isinstance(value, dict):
        return "no mapping of numbers"
    for name, number in value.items():
        if not isinstance(name, str) or not METRIC_NAME.fullmatch(name) or name in TABLE_KEYS:
            return f"a metric named {name!r} (metric names look like recall@1, map@r, r_precision)"
        if number is not None and (isinstance(number, bool) or not isinstance(number, int | float)
                                   or not math.isfinite(number)):
            return f"{name} is not a finite number"
    return None


def _name_problem(name: Any) -> str | None:
    if not isinstance(name, str) or not name or len(name) > MAX_NAME or not name.isprintable():
        return f"an embedding named {name!r} (printable text of 1 to {MAX_NAME} characters)"
    return None


def _record_problem(name: str, data: Any) -> str | None:
    """What is wrong with the JSON object ``data`` of the evaluation file ``name``."""
    if not isinstance(data, dict):
        return "it does not hold a JSON object"
    if "data" in data and not isinstance(data["data"], str):
        return "its 'data' is not a data set's name"
    key = EXPECTED.get(name)
    if key == "metrics":
        found = _metrics_problem(data.get(key))
        return None if found is None else f"its 'metrics' holds {found}"
    if key == "embeddings":
        embeddings = data.get(key)
        if not isinstance(embeddings, dict):
            return "it has no 'embeddings' mapping of metrics"
        for embedding, metrics in embeddings.items():
            found = _name_problem(embedding) or _metrics_problem(metrics)
            if found is not None:
                return f"its 'embeddings' hold {found}"
    return None


def problem(path: Path) -> str | None:
    """What is wrong with ``path`` (one of ``RECORDED``; a JSON file must parse and hold its ``EXPECTED`` mapping of
    numbers under metric names, each line of ``metrics.jsonl`` be a JSON object, ``config.yaml`` a YAML mapping, a
    per-query file plain arrays: ``evaluation.per_query``; nesting too deep to parse is damage, not a crash), or
    None when it is sound."""
    name = path.name
    if name.endswith(".npz"):
        return per_query.problem(path)
    text = ""
    try:
        text = path.read_text()
        if name.endswith(".jsonl"):
            for number, line in enumerate(text.splitlines(), start=1):
                if line.strip() and not isinstance(json.loads(line), dict):
                    return f"line {number} is not a JSON object"
        elif name.endswith(".json"):
            return _record_problem(name, json.loads(text))
        elif not isinstance(yaml.safe_load(text), dict):
            return "it does not hold a YAML mapping"
    except UnicodeDecodeError:
        return "it is not UTF-8 text"
    except RecursionError:  # JSON or YAML nested thousands deep: the parsers recurse; deepmetric writes a few levels
        return "it nests too deeply to be a file deepmetric writes"
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


def refuse_links(root: Path, folder: Path) -> None:
    """Refuse (``DeepMetricError`` naming it) a symbolic link at ``folder`` or at any folder between the record's
    ``root`` and it, or a file or link inside ``folder``'s tree that is no plain file: writing a run's record through
    a linked variant folder wrote outside the record."""
    root = Path(root)
    try:
        parts = Path(folder).relative_to(root).parts
    except ValueError:
        parts = ()
    current = root
    for part in parts:
        current = current / part
        if current.is_symlink():
            raise DeepMetricError(f"{current} is a symbolic link: a study's record holds its own folders (writing "
                                  "through the link would write outside the record); remove the link")
    if Path(folder).is_dir() and not Path(folder).is_symlink():
        record_files(Path(folder))  # refuses a link or anything else that is no plain file or folder inside


def _same_contents(record: Path, files: dict[str, bytes]) -> int:
    """How many files differ between the run folder's record ``files`` and what ``record`` holds now (a new, changed
    or removed file each count); 0 when the record is already ``files``."""
    held = {p.name for p in record.iterdir()} if record.is_dir() else set()
    changed = len(held - set(files))
    for name, data in files.items():
        target = record / name
        if name not in held or not target.is_file() or target.read_bytes() != data:
            changed += 1
    return changed


def record_run(run: RunDir, record: Path, root: Path | None = None) -> int:
    """Make ``record`` hold ``run``'s recorded files (``RECORDED``) and no others of those names (``io.replace_folder``:
    in one step, so a replaced run's files never stay beside the new run's); a file of another name that someone put
    there is kept; the number of files that changed (0: nothing written).
    A run without sound test metrics (unfinished) is not recorded. ``root`` is the study's record folder: a
    symbolic link between it and ``record``, or in ``record``, is refused (``refuse_links``)."""
    if not finished(run):
        return 0
    refuse_links(record.parent.parent if root is None else root, record)
    files = {name: (run.path / name).read_bytes() for name in RECORDED if (run.path / name).is_file()}
    for other in sorted(record.iterdir()) if record.is_dir() else []:  # not deepmetric's: kept, never deleted
        temporary = other.name.startswith(TEMPORARY_PREFIX) and other.name.endswith(TEMPORARY_SUFFIX)
        if other.name not in RECORDED and not temporary:  # an interrupted write's temporary goes with the old folder
            if not other.is_file():
                raise DeepMetricError(f"{other} is not a file of a run's record; move it out of {record}")
            files[other.name] = other.read_bytes()
    changed = _same_contents(record, files)
    if changed:
        replace_folder(record, files)
    return changed


def record_files(root: Path) -> list[Path]:
    """Every file below ``root`` except the manifest and ``io``'s temporaries (a write in progress), sorted by their
    path relative to ``root``; a symbolic link, or anything that is no plain file or folder, is refused naming it
    (``DeepMetricError``)."""
    found = []
    for folder, folders, names in os.walk(root, followlinks=False):
        for name in sorted(folders + names):
            path = Path(folder) / name
            mode = path.lstat().st_mode
            if stat.S_ISLNK(mode):
                raise DeepMetricError(f"{path} is a symbolic link: a study's record holds its own files and folders "
                                      "(writing through the link would write outside the record); remove the link")
            if stat.S_ISDIR(mode):
                continue
            if not stat.S_ISREG(mode):
                raise DeepMetricError(f"{path} is not a regular file; remove it from the record")
            temporary = name.startswith(TEMPORARY_PREFIX) and name.endswith(TEMPORARY_SUFFIX)
            if not temporary and not (path.parent == Path(root) and name == MANIFEST):
                found.append(path)
    return sorted(found, key=lambda p: p.relative_to(root).as_posix())


def manifest_text(root: Path) -> str:
    """``MANIFEST.sha256``'s text for the record ``root`` as it is now (``sha256sum``'s format)."""
    return "".join(f"{file_sha256(path)}  {path.relative_to(root).as_posix()}\n" for path in record_files(root))


def write_manifest(root: Path) -> Path:
    """Write (atomically, only when it changes) the record's ``MANIFEST.sha256``: the SHA-256 of every file of the
    record (``record_files``)."""
    path = Path(root) / MANIFEST
    text = manifest_text(Path(root))
    if not path.is_file() or path.read_text(errors="replace") != text:
        atomic_write_text(path, text)
    return path


@contextlib.contextmanager
def record_lock(out: Path) -> Iterator[None]:
    """Hold the study's record for writing (an exclusive ``flock`` on ``<out>/.record.lock``, waited for): study
    processes sharing a study record their runs and rewrite its manifest and tables one at a time, so the manifest
    that the last one writes lists every file. The lock lives in the study's output folder, not in the record that
    is committed."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    handle = os.fdopen(open_in_place(out / ".record.lock", os.O_RDWR | os.O_CREAT), "r+")
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def read_manifest(root: Path) -> tuple[dict[str, str], list[str]]:
    """The record's manifest as ``{relative path: sha256}`` and its malformed lines (each named by its number): a
    line that is not ``<64 hex digits>  <relative path>``, an absolute path or one with ``..``, a path listed
    twice."""
    entries: dict[str, str] = {}
    bad = []
    text = (Path(root) / MANIFEST).read_text(errors="replace")
    for number, line in enumerate(text.splitlines(), start=1):
        match = re.fullmatch(r"([0-9a-f]{64}) [ *](.+)", line)
        name = match.group(2) if match else ""
        if not match or name.startswith("/") or ".." in Path(name).parts or name in entries:
            bad.append(f"{MANIFEST} line {number} is not '<sha256>  <path inside the record>' (or lists a path "
                       "twice)")
            continue
        entries[name] = match.group(1)
    return entries, bad


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
