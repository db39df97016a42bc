"""The run directory: its files, and rebuilding a trained model from it.

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
import fcntl
import fnmatch
import hashlib
import logging
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from ..config import RunConfig, config_from_dict
from ..config.validate import model_spec_config
from ..errors import CheckpointError, DeepMetricError, RunInUse
from ..folders import RUN_CONFIG, check_run_dir
from ..io import (
    TEMPORARY_PREFIX,
    TEMPORARY_SUFFIX,
    MalformedFile,
    NotParsable,
    atomic_write_text,
    load_json,
    load_yaml,
    open_in_place,
    to_json,
    unprefixed,
)
from ..models import Embedder
from ..models.embedder import build_plan, plan_model
from .checkpoint import load_checkpoint

log = logging.getLogger("deepmetric")

# Settings that shape what ``last`` holds (the model's and objective's tensors, the optimiser's groups): a resumed
# run must keep them. Weight files and the pretrained flag only matter before step 1, so they may change.
MODEL_SPEC_KEYS = {"backbone", "head", "embedding_dim", "split", "freeze_bn", "head_options"}
"""What ``Embedder.spec`` holds: the arguments of ``create_model`` that rebuild the architecture."""
FIXED_ON_RESUME = ("model.", "loss.", "generator.", "train.groups")
FREE_ON_RESUME = ("model.weights", "model.trust_pickle", "model.pretrained")


_HELD_HERE: set[str] = set()
"""Run folders this process holds through ``RunDir.holding`` (real paths): a claim on one of them nests, where flock
would refuse a second open file of the same process."""


def data_slug(spec: str) -> str:
    """A file-name part for a data spec: ``emoji`` as it is, ``folder:/data/icons`` as ``folder-data-icons``;
    letters, digits, ``.``, ``_`` and ``-`` only, at most 69 characters, with a digest of the spec where other
    characters were replaced or the name cut (``folder:/data/my icons``: ``folder-data-my_icons-<8 hex>``)."""
    readable = re.sub(r"[:/]+", "-", spec)
    text = re.sub(r"[^A-Za-z0-9._-]+", "_", readable).strip("-_.") or "data"
    if text != readable or len(text) > 80:  # characters were replaced or cut: a digest keeps two specs apart
        text = f"{text[:60]}-{hashlib.sha256(spec.encode()).hexdigest()[:8]}"
    return text


def _flat(mapping: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in mapping.items():
        if isinstance(value, dict) and value and f"{prefix}{key}" != "train.groups":
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


OWN_FOLDERS = ("checkpoints", "tensorboard")
"""Folders of a run that only the run writes (everything inside them is the run's)."""
OWN_FILES = ("config.yaml", "metrics.jsonl", "metrics.json", "metrics-last.json", "metrics-all-embeddings.json",
             "baseline.json", "baseline-val.json", "bad_images.txt", "environment.json", "environment.json.damaged",
             "generator.json", "report.html", ".lock")
"""Files at the top of a run that the run writes (training, ``evaluate``, ``report``), there yet or not."""
OWN_PATTERNS = ("mirage-*.png", "*.safetensors")
"""Names of other files the run writes at its top (an example generator's pictures) or reads (checkpoints)."""


class RunDir:
    def __init__(self, path: str | Path):
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
        sessions = self.sessions()
        if self.environment.is_file() and not sessions and self._damaged_sessions():
            self.environment.replace(self.environment.with_name("environment.json.damaged"))
        atomic_write_text(self.environment, to_json({"sessions": [*sessions, record]}, indent=2))

    def _damaged_sessions(self) -> bool:
        try:
            sessions = load_json(self.environment.read_bytes())["sessions"]
            return not isinstance(sessions, list)
        except (ValueError, KeyError, TypeError, RecursionError):
            return True

    def sessions(self) -> list[dict[str, Any]]:
        """The training sessions recorded so far (none for runs trained before sessions were recorded, or when
        the file is damaged, which a warning says)."""
        if not self.environment.is_file():
            return []
        if self._damaged_sessions():
            log.warning("%s is damaged (not the JSON deepmetric writes); its sessions are not read", self.environment)
            return []
        return load_json(self.environment.read_bytes())["sessions"]

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
        """The PID of the process that holds this folder now (``claimed``), or None when it is free. A look only:
        the lock is not kept, so the folder may be taken a moment later (``claimed`` still refuses then)."""
        try:  # not through a symbolic link (``claimed`` refuses one, naming it)
            handle = os.fdopen(open_in_place(self.lock_path, os.O_RDONLY))
        except (OSError, DeepMetricError):
            return None
        with handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return handle.read().strip() or "?"
            fcntl.flock(handle, fcntl.LOCK_UN)
            return None

    @contextlib.contextmanager
    def claimed(self) -> Iterator[None]:
        """Hold the run folder for this process: an exclusive ``flock`` on ``RUN/.lock``, released when the
        process ends or dies. A second training into the same folder is refused naming the holder's PID (two
        trainings into one ``--out`` both ran and interleaved their logs, configs and checkpoints). The lock file is
        opened without following a symbolic link (one planted there had the file it points to overwritten with the
        PID): a link or a FIFO there is refused, naming it. Inside ``holding`` by this process, a claim nests."""
        if os.path.realpath(self.path) in _HELD_HERE:
            yield
            return
        if self.path.exists() and not self.path.is_dir():
            raise DeepMetricError(f"{self.path} is a file, not a run folder; choose another --out")
        real = self.path.resolve()  # '..' and links resolved: the folders removed below are the ones made here
        created = [folder for folder in (real, *real.parents) if not folder.exists()]
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            handle = os.fdopen(open_in_place(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_APPEND), "a+")
        except OSError as error:
            raise DeepMetricError(f"cannot write to {self.path}: {error.strerror or error}") from None
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "?"
            handle.close()
            raise RunInUse(f"{self.path} is in use by another training (process {holder}); wait for it to end or "
                           "choose another --out", holder) from None
        try:
            handle.seek(0)
            handle.truncate()
            handle.write(f"{os.getpid()}\n")
            handle.flush()
            if os.path.lexists(self.metrics_log):  # the log is appended in place: a link there is refused now,
                os.close(open_in_place(self.metrics_log, os.O_WRONLY | os.O_APPEND))  # not after a first step
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
            handle.close()
            if [f.name for f in self.path.iterdir()] == [self.lock_path.name]:  # nothing written: leave no folder
                self.lock_path.unlink()
                for folder in created:  # deepest first
                    folder.rmdir()

    @contextlib.contextmanager
    def holding(self) -> Iterator[None]:
        """``claimed`` for a sequence of steps on one run (a study: training, then its evaluation), within which
        the steps' own claims (``train``'s) nest instead of being refused: the folder is never free in between,
        so another process cannot resume or evaluate the run a second time."""
        key = os.path.realpath(self.path)
        with self.claimed():
            _HELD_HERE.add(key)
            try:
                yield
            finally:
                _HELD_HERE.discard(key)

    def clear_failed_start(self) -> None:
        """Remove what a run that stopped before its first checkpoint wrote, so that it starts afresh."""
        for file in (self.config_path, self.metrics_log, self.environment, self.baseline, self.baseline_val,
                     self.bad_items):
            file.unlink(missing_ok=True)

    def remove_stale_temporaries(self) -> None:
        """Remove the temporary files that a killed write left in the run folder (``deepmetric.io``'s
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
        saved, new = _flat(self.config().to_dict()), _flat(config.to_dict())
        changed = [key for key in sorted(set(saved) | set(new)) if key.startswith(FIXED_ON_RESUME)
                   and not key.startswith(FREE_ON_RESUME) and saved.get(key) != new.get(key)]
        if changed:
            shown = ", ".join(f"{key}={new.get(key)!r} (the run has {saved.get(key)!r})" for key in changed)
            raise DeepMetricError(f"cannot resume {self.path} with {shown}: the model, objective and optimiser "
                                  "groups must stay as the run was trained; start a new run (another --out) instead")

    def checkpoint(self, which: str = "auto") -> Path:
        """``best`` when it exists (or was asked for), else ``last``."""
        if which not in ("auto", "best", "last"):
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
        followed (``deepmetric.io.open_in_place``)."""
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


def model_from_checkpoint(path: Path, device: str | torch.device = "cpu") -> tuple[Embedder, dict[str, Any]]:
    """Rebuild the ``Embedder`` described by a checkpoint's spec and load its weights."""
    tensors, state = load_checkpoint(path)
    return model_from_tensors(tensors, state, path, device), state


def model_from_tensors(tensors: dict[str, torch.Tensor], state: dict[str, Any], path: Path,
                       device: str | torch.device = "cpu") -> Embedder:
    """``model_from_checkpoint`` for a checkpoint already read (``path`` only names it in errors)."""
    spec = state.get("model_spec")
    if not isinstance(spec, dict) or not isinstance(spec.get("head_options", {}), dict):
        raise CheckpointError(f"{path} has no model_spec describing its model (a damaged or hand-edited header)")
    unknown = sorted(set(spec) - MODEL_SPEC_KEYS)
    if unknown:
        raise CheckpointError(f"{path}: its model_spec has unknown key(s) {unknown}; expected "
                              f"{', '.join(sorted(MODEL_SPEC_KEYS))}")
    weights = unprefixed("model", tensors)
    damaged = [name for name, value in weights.items() if value.is_floating_point() and not value.isfinite().all()]
    if damaged:
        raise CheckpointError(f"{path} holds NaN or infinite weights ({len(damaged)} tensors, e.g. {damaged[0]})")
    plan = planned_model(spec, path)
    expected = {name: tuple(value.shape) for name, value in plan.state_dict().items()}
    missing = [name for name in expected if name not in weights]
    unexpected = [name for name in weights if name not in expected]
    if missing or unexpected:
        raise CheckpointError(f"{path} does not fit the model it describes: missing {missing[:5]}, unexpected "
                              f"{unexpected[:5]}")
    misshapen = [f"{name} {tuple(weights[name].shape)} (expected {shape})" for name, shape in expected.items()
                 if tuple(weights[name].shape) != shape]
    if misshapen:  # found on the plan, before the model's memory is allocated
        raise CheckpointError(f"{path} does not fit the model it describes: {len(misshapen)} tensor(s) of another "
                              f"shape, e.g. {misshapen[0]}")
    model = build_plan(plan)
    model.load_state_dict(weights)
    return model.to(device).eval()


def planned_model(spec: dict[str, Any], path: Path) -> Embedder:
    """The model a checkpoint's ``model_spec`` describes, on the meta device (``plan_model``), once the spec is typed
    and checked as the config's ``model`` section (``model_spec_config``): a crafted header can ask for no option the
    head does not declare (``weights``, ``trust_pickle``), no value of another type or out of bounds, and no model
    above ``MAX_MODEL_VALUES``. Each refusal is one ``CheckpointError`` naming the file."""
    try:
        model = model_spec_config(spec)
        return plan_model(model.backbone, model.head, model.embedding_dim, model.split, model.freeze_bn,
                          **model.head_options)
    except DeepMetricError as error:
        raise CheckpointError(f"{path}: its model_spec describes no model deepmetric builds: {error}") from None
    except (TypeError, ValueError, RuntimeError) as error:  # a head option out of the head's range
        raise CheckpointError(f"{path}: its model_spec describes no model deepmetric builds: "
                              f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}") from None


def load_run_checkpoint(run_dir: str | Path, which: str = "auto", device: str | torch.device = "cpu"
                        ) -> tuple[Embedder, RunConfig, Path, dict[str, torch.Tensor], dict[str, Any]]:
    """``load_run_model`` that also returns the checkpoint's tensors and state (e.g. the objective's), read once."""
    run = RunDir(run_dir)
    config = run.config()
    path = run.checkpoint(which)
    tensors, state = load_checkpoint(path)
    model = model_from_tensors(tensors, state, path, device).set_channels_last(config.train.channels_last)
    return model, config, path, tensors, state


def load_run_model(run_dir: str | Path, which: str = "auto",
                   device: str | torch.device = "cpu") -> tuple[Embedder, RunConfig, Path]:
    """A run's model from its checkpoint ``which`` (``auto``, ``best`` or ``last``), its config and the file."""
    model, config, path, _, _ = load_run_checkpoint(run_dir, which, device)
    return model, config, path
