"""The run directory: its files, its logs and its config (the lock is ``runs.lock``, the model ``runs.model``).

```
RUN/
  config.yaml                 the resolved config (a run is reproducible from it and its seed)
  metrics.jsonl               one JSON line per logged step and per validation
  checkpoints/last.safetensors   model + optimiser + RNG state, for exact resumption
  checkpoints/best.safetensors   model at the best validation Recall@1 (when there is a val split)
  baseline.json               test metrics of the untrained backbone (eval.baseline)
  baseline-val.json           its validation metrics (eval.baseline with a validation split)
  metrics.json                test metrics of the trained model (written by evaluate)
  bad_images.txt              what data.skip_bad_images left out, one "item: problem" per line
  environment.json            the software and machine of each training session (deepmetric.provenance)
  generator.json, mirage-*.png   an example generator's diagnostics (generator.name, e.g. MIRAGE)
```
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import logging
import os
import re
from pathlib import Path
from typing import Any

from ..config import RunConfig, config_from_dict
from ..errors import CheckpointError, DeepMetricError
from ..folders import RUN_CONFIG, check_run_dir
from ..io.files import TEMPORARY_PREFIX, TEMPORARY_SUFFIX, atomic_write_text, open_in_place
from ..io.strict import MalformedFile, NotParsable, load_json, load_yaml, to_json
from . import lock

log = logging.getLogger("deepmetric")

# Settings that shape what ``last`` holds (the model's and objective's tensors, the optimiser's groups): a resumed
# run must keep them. Weight files and the pretrained flag only matter before step 1, so they may change.
FIXED_ON_RESUME = ("model.", "loss.", "generator.", "train.groups")
FREE_ON_RESUME = ("model.weights", "model.trust_pickle", "model.pretrained")


def data_slug(spec: str) -> str:
    """A file-name part for a data spec: ``emoji`` as it is, ``folder:/data/icons`` as ``folder-data-icons``;
    letters, digits, ``.``, ``_`` and ``-`` only, at most 69 characters, with a digest of the spec where other
    characters were replaced or the name cut (``folder:/data/my icons``: ``folder-data-my_icons-<8 hex>``)."""
    readable = re.sub(r"[:/]+", "-", spec)
    text = re.sub(r"[^A-Za-z0-9._-]+", "_", readable).strip("-_.") or "data"
    if text != readable or len(text) > 80:  # characters were replaced or cut: a digest keeps two specs apart
        text = f"{text[:60]}-{hashlib.sha256(spec.encode()).hexdigest()[:8]}"
    return text


def flat_settings(mapping: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A config's sections as ``section.key`` settings (``train.groups`` kept whole: it is one setting)."""
    flat: dict[str, Any] = {}
    for key, value in mapping.items():
        if isinstance(value, dict) and value and f"{prefix}{key}" != "train.groups":
            flat.update(flat_settings(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


CHECKPOINTS = ("auto", "best", "last")
"""Which checkpoint of a run a command uses: ``auto`` is ``best`` when the run has one (it had a validation split),
else ``last`` (``RunDir.checkpoint``)."""

OWN_FOLDERS = ("checkpoints", "tensorboard")
"""Folders of a run that only the run writes (everything inside them is the run's)."""
OWN_FILES = ("config.yaml", "metrics.jsonl", "metrics.json", "metrics-last.json", "metrics-all-embeddings.json",
             "baseline.json", "baseline-val.json", "bad_images.txt", "environment.json", "environment.json.damaged",
             "generator.json", "report.html", ".lock")
"""Files at the top of a run that the run writes (training, ``evaluate``, ``report``), there yet or not."""
OWN_PATTERNS = ("mirage-*.png", "*.safetensors")
"""Names of other files the run writes at its top (an example generator's pictures) or reads (checkpoints)."""
AMP_LOG_KEYS = ("skipped_steps", "loss_scale")
"""What a ``train.amp=fp16`` run adds to each training record of ``metrics.jsonl`` (the steps its gradient scaler
skipped so far, the scale): figures beside the loss and its terms, as ``lr`` and ``images_per_s`` are."""


class RunDir:
    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)

    def owns(self, path: str | Path) -> bool:
        """Whether ``path`` is one of the run's own files: inside its ``checkpoints/`` (or another folder only the
        run writes), or a name the run writes at its top (``OWN_FILES``, ``OWN_PATTERNS``), whether it is there yet
        or not. Both paths are resolved first (``..``, symbolic links), so no spelling of a run file escapes; names
        of the run's temporaries (which a start removes) count too. Commands that write a file a user names (``export``)
        refuse such a path: writing it would destroy the run or be overwritten by it."""
        root, target = self.path.resolve(), Path(path).resolve()
        if target == root:
            return True
        if not target.is_relative_to(root):
            return False
        parts = target.relative_to(root).parts
        if parts[0] in OWN_FOLDERS:
            return True
        if len(parts) > 1:
            return False
        name = parts[0]
        temporary = name.startswith(TEMPORARY_PREFIX) and name.endswith(TEMPORARY_SUFFIX)
        return temporary or name in OWN_FILES or any(fnmatch.fnmatch(name, pattern) for pattern in OWN_PATTERNS)

    @property
    def config_path(self) -> Path:
        return self.path / RUN_CONFIG

    @property
    def metrics_log(self) -> Path:
        return self.path / "metrics.jsonl"

    @property
    def last(self) -> Path:
        return self.path / "checkpoints" / "last.safetensors"

    @property
    def best(self) -> Path:
        return self.path / "checkpoints" / "best.safetensors"

    @property
    def bad_items(self) -> Path:
        return self.path / "bad_images.txt"

    @property
    def environment(self) -> Path:
        return self.path / "environment.json"

    def add_session(self, record: dict[str, Any]) -> None:
        """Append a training session's record (``deepmetric.provenance.environment``) to ``environment.json``; a
        damaged file is kept beside it as ``environment.json.damaged`` and a new one started."""
        sessions = self._recorded_sessions()
        if sessions is None:
            self.environment.replace(self.environment.with_name("environment.json.damaged"))
        atomic_write_text(self.environment, to_json({"sessions": [*(sessions or []), record]}, indent=2))

    def _recorded_sessions(self) -> list[dict[str, Any]] | None:
        """The sessions ``environment.json`` holds ([] without the file), or None when it is damaged (not the JSON
        deepmetric writes), which a warning says; the file is read once."""
        if not self.environment.is_file():
            return []
        try:
            sessions = load_json(self.environment.read_bytes())["sessions"]
        except (ValueError, KeyError, TypeError, RecursionError):
            sessions = None
        if isinstance(sessions, list):
            return sessions
        log.warning("%s is damaged (not the JSON deepmetric writes); its sessions are not read", self.environment)
        return None

    def sessions(self) -> list[dict[str, Any]]:
        """The training sessions recorded so far (none for runs trained before sessions were recorded, or when
        the file is damaged, which a warning says)."""
        return self._recorded_sessions() or []

    @property
    def baseline(self) -> Path:
        return self.path / "baseline.json"

    @property
    def baseline_val(self) -> Path:
        return self.path / "baseline-val.json"

    @property
    def test_metrics(self) -> Path:
        """The test metrics of the run's chosen checkpoint (``best``, or ``last`` without validation)."""
        return self.path / "metrics.json"

    @property
    def last_test_metrics(self) -> Path:
        """The test metrics of ``last`` when the run also has a ``best`` (``evaluate --checkpoint last``)."""
        return self.path / "metrics-last.json"

    def test_metrics_of(self, checkpoint: Path, other_data: str | None = None) -> Path:
        """Where the test metrics of ``checkpoint`` go: ``metrics.json`` for the chosen one, ``metrics-last.json``
        for ``last`` beside a ``best`` (it overwrote the chosen checkpoint's file); on ``other_data``, a data set
        that is not the run's own, ``metrics-on-<data>[-last].json``: the run's own record is never replaced by
        another data set's figures."""
        own = self.last_test_metrics if checkpoint == self.last and self.best.is_file() else self.test_metrics
        if other_data is None:
            return own
        return own.with_name(f"metrics-on-{data_slug(other_data)}{own.name.removeprefix('metrics')}")

    @property
    def all_embeddings_metrics(self) -> Path:
        """``deepmetric evaluate --all-embeddings``'s record."""
        return self.path / "metrics-all-embeddings.json"

    def exists(self) -> bool:
        return self.config_path.is_file()

    @property
    def lock_path(self) -> Path:
        return self.path / ".lock"

    def holder(self) -> str | None:
        """The PID of the process that holds this folder now (``claimed``), or None when it is free
        (``runs.lock.holder``)."""
        return lock.holder(self.lock_path)

    def claimed(self) -> contextlib.AbstractContextManager[None]:
        """Hold the run folder for this process (``runs.lock.claimed``): a second training into it is refused
        naming the holder's PID."""
        return lock.claimed(self.path, self.lock_path, self.metrics_log)

    def holding(self) -> contextlib.AbstractContextManager[None]:
        """``claimed`` for a sequence of steps on one run, within which the steps' own claims nest
        (``runs.lock.holding``)."""
        return lock.holding(self.path, self.lock_path, self.metrics_log)

    def clear_failed_start(self) -> None:
        """Remove what a run that stopped before its first checkpoint wrote, so that it starts afresh."""
        for file in (self.config_path, self.metrics_log, self.environment, self.baseline, self.baseline_val,
                     self.bad_items):
            file.unlink(missing_ok=True)

    def remove_stale_temporaries(self) -> None:
        """Remove the temporary files that a killed write left in the run folder (``deepmetric.io.files``'
        ``.<name>.<random>.tmp``, safetensors' ``.tmp<random>``): each kill during a checkpoint left one."""
        stale = [f for folder in (self.path, self.path / "checkpoints") if folder.is_dir() for f in folder.iterdir()
                 if f.is_file() and f.name.startswith(TEMPORARY_PREFIX)
                 and (f.name.endswith(TEMPORARY_SUFFIX) or f.name.startswith(".tmp"))]
        if stale:
            size = sum(f.stat().st_size for f in stale)
            for file in stale:
                file.unlink(missing_ok=True)
            log.info("removed %d temporary file(s) (%.1f MB) left by an interrupted write", len(stale), size / 2**20)

    def config(self) -> RunConfig:
        check_run_dir(self.path)
        try:
            data = load_yaml(self.config_path.read_text()) or {}
        except UnicodeDecodeError:
            raise DeepMetricError(f"{self.config_path} is not valid YAML (not UTF-8 text); it is the run's resolved "
                                  "config, rewrite it or start a new run") from None
        except MalformedFile as error:
            raise DeepMetricError(f"{error.naming(self.config_path)}; it is the run's resolved config, rewrite it "
                                  "or start a new run") from None
        if not isinstance(data, dict):
            raise DeepMetricError(f"{self.config_path} must hold a mapping of config sections")
        return config_from_dict(data)

    def check_resumable(self, config: RunConfig) -> None:
        """Refuse, naming them, settings of ``config`` that differ from the run's saved ones and shape what its
        ``last`` checkpoint holds (``FIXED_ON_RESUME``): resuming would not fit the saved tensors."""
        saved, new = flat_settings(self.config().to_dict()), flat_settings(config.to_dict())
        changed = [key for key in sorted(set(saved) | set(new)) if key.startswith(FIXED_ON_RESUME)
                   and not key.startswith(FREE_ON_RESUME) and saved.get(key) != new.get(key)]
        if changed:
            shown = ", ".join(f"{key}={new.get(key)!r} (the run has {saved.get(key)!r})" for key in changed)
            raise DeepMetricError(f"cannot resume {self.path} with {shown}: the model, objective and optimiser "
                                  "groups must stay as the run was trained; start a new run (another --out) instead")

    def checkpoint(self, which: str = "auto") -> Path:
        """``best`` when it exists (or was asked for), else ``last``."""
        if which not in CHECKPOINTS:
            raise DeepMetricError(f"checkpoint must be auto, best or last, got '{which}'")
        if which in ("auto", "best") and self.best.is_file():
            return self.best
        if which == "best":
            raise CheckpointError(f"{self.best} does not exist (the run had no validation split)")
        if self.last.is_file():
            return self.last
        if self.test_metrics.is_file():
            raise CheckpointError(f"{self.path} is a finished run without its checkpoints ({self.last} is missing): "
                                  "its metrics are here but not its weights (a run restored from a study's record "
                                  "keeps no checkpoint); train it again to evaluate or index it")
        raise CheckpointError(f"{self.path} holds no checkpoint yet ({self.last} is missing)")

    def append_log(self, record: dict[str, Any]) -> None:
        """Append one JSON line to ``metrics.jsonl``, written in place: a symbolic link there is refused, not
        followed (``deepmetric.io.files.open_in_place``)."""
        fd = open_in_place(self.metrics_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        with os.fdopen(fd, "a", encoding="utf-8") as handle:
            handle.write(to_json(record) + "\n")

    def truncate_log(self, step: int) -> None:
        """Drop the log records of steps after ``step`` (what a resumed run will redo)."""
        kept = [r for r in self.read_log() if r.get("step", 0) <= step]
        atomic_write_text(self.metrics_log, "".join(to_json(r) + "\n" for r in kept))

    def read_log(self) -> list[dict[str, Any]]:
        """The logged records; a last line cut short (what a full disk or a kill leaves) is left out with a
        warning, a damaged line elsewhere is an error naming it."""
        if not self.metrics_log.is_file():
            return []
        lines = [(n, line) for n, line in enumerate(self.metrics_log.read_text(errors="replace").split("\n"), 1)
                 if line.strip()]
        records = []
        for position, (number, line) in enumerate(lines):
            try:
                record = load_json(line)
            except MalformedFile as error:
                if position < len(lines) - 1 or not isinstance(error, NotParsable):
                    raise DeepMetricError(f"{self.metrics_log} line {number} is not a JSON object ({error}); the "
                                          "log is damaged") from None
                log.warning("%s: its last line (%d) was cut short and is left out", self.metrics_log, number)
                continue
            if not isinstance(record, dict):
                raise DeepMetricError(f"{self.metrics_log} line {number} is not a JSON object (a "
                                      f"{type(record).__name__}); the log is damaged")
            records.append(record)
        return records
