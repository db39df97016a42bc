"""The run directory: its files, and rebuilding a trained model from it.

```
RUN/
  config.yaml                 the resolved config (a run is reproducible from it and its seed)
  metrics.jsonl               one JSON line per logged step and per validation
  checkpoints/last.safetensors   model + optimiser + RNG state, for exact resumption
  checkpoints/best.safetensors   model at the best validation Recall@1 (when there is a val split)
  baseline.json               test metrics of the untrained backbone (eval.baseline)
  metrics.json                test metrics of the trained model (written by evaluate)
  bad_images.txt              what data.skip_bad_images left out, one "item: problem" per line
  environment.json            the software and machine of each training session (deepmetric.provenance)
  generator.json, mirage-*.png   an example generator's diagnostics (generator.name, e.g. MIRAGE)
```
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import yaml

from ..config import RunConfig, config_from_dict
from ..errors import CheckpointError, DeepMetricError
from ..models import Embedder, create_model
from .checkpoint import atomic_write_text, load_checkpoint, unprefixed


class RunDir:
    def __init__(self, path: str | Path):
        self.path = Path(path)

    @property
    def config_path(self) -> Path:
        return self.path / "config.yaml"

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
        """Append a training session's record (``deepmetric.provenance.environment``) to ``environment.json``."""
        sessions = self.sessions()
        atomic_write_text(self.environment, json.dumps({"sessions": [*sessions, record]}, indent=2))

    def sessions(self) -> list[dict[str, Any]]:
        """The training sessions recorded so far (none for runs trained before sessions were recorded)."""
        if not self.environment.is_file():
            return []
        return json.loads(self.environment.read_text())["sessions"]

    @property
    def baseline(self) -> Path:
        return self.path / "baseline.json"

    @property
    def test_metrics(self) -> Path:
        return self.path / "metrics.json"

    @property
    def all_embeddings_metrics(self) -> Path:
        """``deepmetric evaluate --all-embeddings``'s record."""
        return self.path / "metrics-all-embeddings.json"

    def exists(self) -> bool:
        return self.config_path.is_file()

    def config(self) -> RunConfig:
        if not self.config_path.is_file():
            raise DeepMetricError(f"{self.path} is not a run directory (no config.yaml)")
        return config_from_dict(yaml.safe_load(self.config_path.read_text()) or {})

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
        raise CheckpointError(f"{self.path} holds no checkpoint yet ({self.last} is missing)")

    def append_log(self, record: dict[str, Any]) -> None:
        with self.metrics_log.open("a") as handle:
            handle.write(json.dumps(record) + "\n")

    def truncate_log(self, step: int) -> None:
        """Drop the log records of steps after ``step`` (what a resumed run will redo)."""
        kept = [r for r in self.read_log() if r.get("step", 0) <= step]
        atomic_write_text(self.metrics_log, "".join(json.dumps(r) + "\n" for r in kept))

    def read_log(self) -> list[dict[str, Any]]:
        if not self.metrics_log.is_file():
            return []
        return [json.loads(line) for line in self.metrics_log.read_text().splitlines() if line.strip()]


def model_from_checkpoint(path: Path, device: str | torch.device = "cpu") -> tuple[Embedder, dict[str, Any]]:
    """Rebuild the ``Embedder`` described by a checkpoint's spec and load its weights."""
    tensors, state = load_checkpoint(path)
    return model_from_tensors(tensors, state, path, device), state


def model_from_tensors(tensors: dict[str, torch.Tensor], state: dict[str, Any], path: Path,
                       device: str | torch.device = "cpu") -> Embedder:
    """``model_from_checkpoint`` for a checkpoint already read (``path`` only names it in errors)."""
    spec = dict(state["model_spec"])
    options = spec.pop("head_options", {})
    model = create_model(pretrained=False, **spec, **options)
    result = model.load_state_dict(unprefixed("model", tensors), strict=False)
    if result.missing_keys or result.unexpected_keys:
        raise CheckpointError(f"{path} does not fit the model it describes: missing {result.missing_keys[:5]}, "
                              f"unexpected {result.unexpected_keys[:5]}")
    return model.to(device).eval()


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
