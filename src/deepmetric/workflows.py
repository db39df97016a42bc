"""Whole jobs on a run directory, shared by the CLI and Python callers: evaluate it, embed images with it."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from .config import RunConfig
from .data.images import IMAGE_EXTENSIONS
from .data.table import RetrievalDataset
from .errors import DataError
from .evaluation import embed_table, evaluate
from .evaluation.table import format_table
from .training.checkpoint import atomic_write_bytes, atomic_write_text, load_checkpoint
from .training.run_dir import RunDir, load_run_model
from .training.setup import load_table, resolve_device


def evaluate_run(run_dir: str | Path, data_spec: str | None = None, which: str = "auto",
                 progress: bool = True) -> dict[str, Any]:
    """Evaluate a run's checkpoint on the test split; writes and returns ``RUN/metrics.json``'s record."""
    run = RunDir(run_dir)
    config = run.config()
    device = resolve_device(config.train.device)
    model, _, checkpoint = load_run_model(run.path, which, device)
    if data_spec:
        config.data.spec = data_spec
        config.data.val_fraction = 0.0
    table, _ = load_table(config, progress, only_split="test")
    metrics = evaluate(model, table, "test", config.data.image_size, config.eval.recall_at, config.eval.nmi,
                       config.data.test_resize, config.eval.batch_size, device, config.data.num_workers, progress,
                       config.eval.engine)
    _, state = load_checkpoint(checkpoint)
    record = {"data": config.data.spec, "split": "test", "checkpoint": checkpoint.stem, "step": state.get("step"),
              "test_classes": int(len(table.classes("test"))), "test_images": table.count("test"),
              "metrics": metrics, "evaluated_at": time.strftime("%Y-%m-%d %H:%M:%S")}
    atomic_write_text(run.test_metrics, json.dumps(record, indent=2))
    return record


def results_table(run_dir: str | Path, record: dict[str, Any]) -> str:
    """The evaluated metrics beside the untrained backbone's (when the run recorded them)."""
    run = RunDir(run_dir)
    rows = {}
    if run.baseline.is_file():
        rows["untrained backbone"] = json.loads(run.baseline.read_text())["metrics"]
    rows[f"trained ({record['checkpoint']}, step {record['step']})"] = record["metrics"]
    title = (f"{record['data']} test split: {record['test_images']:,} images of {record['test_classes']:,} "
             "classes unseen in training (values in %)")
    return title + "\n" + format_table(rows)


def list_images(path: str | Path) -> list[Path]:
    """An image file, or every image below a folder (sorted)."""
    path = Path(path)
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise DataError(f"{path} is neither an image file nor a folder")
    files = sorted(p for p in path.rglob("*") if p.suffix.lower() in IMAGE_EXTENSIONS and p.is_file())
    if not files:
        raise DataError(f"{path} holds no image ({', '.join(IMAGE_EXTENSIONS)})")
    return files


def files_table(name: str, files: list[Path]) -> RetrievalDataset:
    """A table of unlabelled image files (label 0, split ``test``), to run a model over them."""
    count = len(files)
    return RetrievalDataset(name=name, images=[str(f) for f in files], labels=np.zeros(count),
                            splits=np.array(["test"] * count, dtype=object), is_query=np.ones(count, bool),
                            is_gallery=np.ones(count, bool))


def embed_images(run_dir: str | Path, images: str | Path, out: str | Path, which: str = "auto",
                 batch_size: int | None = None, progress: bool = True) -> tuple[Path, Path, int]:
    """Embed images with a run's model; writes ``out`` (N x D float32 .npy) and ``out``'s ``.paths.txt``."""
    config: RunConfig = RunDir(run_dir).config()
    device = resolve_device(config.train.device)
    model, _, _ = load_run_model(run_dir, which, device)
    files = list_images(images)
    table = files_table(str(images), files)
    embeddings = embed_table(model, table, config.data.image_size, config.data.test_resize,
                             batch_size or config.eval.batch_size, device, config.data.num_workers, progress)
    out = Path(out)
    if out.suffix != ".npy":
        out = out.with_suffix(".npy")
    buffer = io.BytesIO()
    np.save(buffer, embeddings.astype(np.float32), allow_pickle=False)
    atomic_write_bytes(out, buffer.getvalue())
    paths_file = out.with_suffix(".paths.txt")
    atomic_write_text(paths_file, "".join(f"{f}\n" for f in files))
    return out, paths_file, len(files)
