"""Whole jobs on a run directory, shared by the CLI and Python callers: evaluate it, embed images with it."""

from __future__ import annotations

import contextlib
import io
import logging
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .config import RunConfig
from .config.validate import set_inference
from .data import check_data_path
from .data.listing import files_table, image_sources, list_images_of
from .data.table import RetrievalTable, test_sizes_match
from .devices import resolve_device
from .errors import CheckpointError, RunInUse
from .evaluation import EmbedSettings, embed_table, split_metrics
from .evaluation.evaluator import split_metrics_per_query
from .evaluation.per_query import per_query_path, save_per_query, table_identity
from .evaluation.rerank import Rerank
from .evaluation.table import format_table
from .io.files import atomic_write_bytes, atomic_write_text, check_writable, refuse_folder
from .io.strict import read_json_object, to_json
from .io.tensors import unprefixed
from .provenance import evaluation_environment
from .runs.checkpoint import checkpoint_state
from .runs.folder import RunDir
from .runs.model import load_run_checkpoint, load_run_model
from .runs.table import load_table

log = logging.getLogger("deepmetric")


@contextlib.contextmanager
def held_for_evaluation(run: RunDir) -> Iterator[None]:
    """Hold ``run`` (``RunDir.claimed``) while it is evaluated. A run another process holds is refused: its
    ``metrics.json``, written mid-training, made a run that then stopped count as finished (a study skipped it),
    and the training's own evaluation overwrites it anyway. Inside a study's ``holding`` the claim nests."""
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(run.claimed())
        except RunInUse as busy:
            raise RunInUse(f"{run.path} is in use by process {busy.holder} (training or evaluating it): evaluate "
                           "it once that ends (a training's own evaluation writes metrics.json), or evaluate a copy "
                           "of a checkpoint", busy.holder) from None
        yield


def evaluate_run(run_dir: str | Path, data_spec: str | None = None, which: str = "auto",
                 progress: bool = True, rerank: Rerank | None = None, amp: str | bool | None = None,
                 compile: bool | None = None) -> dict[str, Any]:
    """Evaluate a run's checkpoint on the test split; writes and returns the record of ``RUN/metrics.json`` (the
    run's chosen checkpoint) or, for ``last`` beside a ``best``, of ``RUN/metrics-last.json``, and each query's
    results beside it (``per-query.npz`` / ``per-query-last.npz``: ``evaluation/per_query.py``), from the same
    ranking; on another data set (``data_spec`` not the run's own), of ``RUN/metrics-on-<data>.json`` and
    ``per-query-on-<data>.npz`` (``RunDir.test_metrics_of``).

    With ``rerank`` (``evaluation/rerank.py``) the figures are those after re-ranking, with the settings and the
    same ranking metrics without it (``without_rerank``), in files of their own that leave the run's record as it
    was: ``metrics-rerank-<method>.json`` (``metrics-last-rerank-…``, ``metrics-on-<data>-rerank-…``) and its
    per-query file.

    ``amp`` and ``compile`` set the embedding pass's ``eval.amp`` and ``eval.compile`` (None: the run's); a record
    embedded under autocast or compiled says so (``embedding``), and one under another precision than the run's own
    goes to a file of its own, ``metrics-<amp>.json`` (``bf16``, ``fp16``, or ``fp32`` for a run whose own is not),
    with its per-query file."""
    return evaluate_run_embeddings(run_dir, data_spec, which, progress, rerank, amp, compile)[0]


def evaluate_run_embeddings(run_dir: str | Path, data_spec: str | None = None, which: str = "auto",
                            progress: bool = True, rerank: Rerank | None = None, amp: str | bool | None = None,
                            compile: bool | None = None) -> tuple[dict[str, Any], np.ndarray]:
    """``evaluate_run``, also returning the test split's embeddings (rows in the split's order), so that a
    report of the same checkpoint need not embed the split again."""
    run = RunDir(run_dir)
    config = run.config()
    other_data = data_spec if data_spec and data_spec != config.data.spec else None
    if data_spec:
        config.data.spec = data_spec
        config.data.val_fraction = 0.0
    own_amp = config.eval.amp
    set_inference(config, amp, compile)
    check_data_path(config.data.spec)  # before the model is loaded
    device = resolve_device(config.train.device)
    with held_for_evaluation(run):
        model, _, checkpoint = load_run_model(run.path, which, device)
        table, _ = load_table(config, progress, only_split="test")
        part = table.split("test")
        embeddings = embed_table(model, part, EmbedSettings.from_config(config, device, progress),
                                 desc="embedding test")
        recall_at = config.eval.recall_at or table.recall_at
        metrics, per_query = split_metrics_per_query(embeddings, part, recall_at, config.eval.nmi, config.eval.engine,
                                                     progress, rerank)
        identity = table_identity(part)
        results: dict[str, Any] = {"metrics": metrics}
        if rerank is not None:  # the same ranking metrics without it, for comparison (NMI does not change)
            plain = split_metrics(embeddings, part, recall_at, False, config.eval.engine, progress=False)
            nmi = {"nmi": metrics["nmi"]} if "nmi" in metrics else {}
            results.update(rerank=rerank.to_dict(), without_rerank={**plain, **nmi})
        record = _test_record(config, table, checkpoint, checkpoint_state(checkpoint), device, **results,
                              queries_sha256=identity["queries_sha256"])
        target = run.test_metrics_of(checkpoint, other_data)
        if config.eval.amp != own_amp:  # another precision than the run's own: a file of its own
            target = target.with_name(f"{target.stem}-{config.eval.amp or 'fp32'}.json")
        if rerank is not None:
            target = target.with_name(f"{target.stem}-rerank-{rerank.method}.json")
        save_per_query(per_query_path(target), per_query, identity)  # first: metrics.json marks the run finished
        atomic_write_text(target, to_json(record, indent=2))
        if other_data is not None:
            log.info("%s is not the run's own data set: its figures are in %s (%s keeps the run's own)", other_data,
                     target, run.test_metrics_of(checkpoint).name)
    return record, embeddings


def _test_record(config: RunConfig, table: RetrievalTable, checkpoint: Path, state: dict[str, Any],
                 device: torch.device, **results: Any) -> dict[str, Any]:
    """What a test evaluation file records: the data, the checkpoint and its step, the split's size, ``results``,
    the embedding pass's precision when it was not float32 eager (``embedding``), and the machine, software and kNN
    engine that computed them."""
    settings = EmbedSettings.from_config(config, device, False)
    embedding = {"embedding": {"amp": settings.amp, "compile": settings.compile}} if settings.amp or settings.compile \
        else {}
    return {"data": config.data.spec, "split": "test", "checkpoint": checkpoint.stem, "step": state.get("step"),
            "test_classes": int(len(table.classes("test"))), "test_images": table.count("test"),
            "published_test_sizes": test_sizes_match(table), **results, **embedding,
            "evaluated_at": time.strftime("%Y-%m-%d %H:%M:%S"),
            "environment": evaluation_environment(device, config.eval.engine)}


def evaluate_all_embeddings(run_dir: str | Path, which: str = "auto", pca_dim: int = 512,
                            progress: bool = True) -> dict[str, Any]:
    """Test metrics of the model's embedding, of each auxiliary embedding its head computes (DeML's per-scale
    root-learners, Table 2's O columns; ABE's individual learners, then their mean and std, Tables 1-2's "Ind")
    or its objective computes (HORDE's per-order embeddings, thesis Tables 5.3-5.5) and, with the objective's,
    of the concatenation of those and the model's reduced by a PCA fitted on the training split (HORDE's †);
    writes and returns ``RUN/metrics-all-embeddings.json``'s record."""
    run = RunDir(run_dir)
    config = run.config()
    check_data_path(config.data.spec)  # before the model is loaded
    with held_for_evaluation(run):
        return _all_embeddings_record(run, config, which, pca_dim, progress)


def _all_embeddings_record(run: RunDir, config: RunConfig, which: str, pca_dim: int,
                           progress: bool) -> dict[str, Any]:
    """``evaluate_all_embeddings``' work, on a run this process holds."""
    from .evaluation.auxiliary import concat_pca, embed_with_objective, learner_summary
    from .losses import build_objective

    device = resolve_device(config.train.device)
    model, _, checkpoint, tensors, state = load_run_checkpoint(run.path, which, device)  # the objective's too
    table, _ = load_table(config, progress, only_split="test")  # the audit reads only the splits it needs
    train_table = None
    classes = state.get("objective_classes")
    if classes is None:  # a checkpoint from before the count was saved: count the audited training classes
        train_table, _ = load_table(config, progress, only_split="train")
        classes = len(train_table.classes("train"))
    objective = build_objective(config.loss, model.head, classes).to(device)
    objective_state = unprefixed("objective", tensors)
    if objective.state_dict() and not objective_state:
        raise CheckpointError(f"{checkpoint} holds no objective state (it predates saving it); use --checkpoint last")
    objective.load_state_dict(objective_state)
    settings = EmbedSettings.from_config(config, device, progress)
    test_part = table.split("test")
    recall_at = config.eval.recall_at or table.recall_at
    test = embed_with_objective(model, objective, test_part, settings, desc="embedding test")

    def score(embeddings: np.ndarray) -> dict[str, float | None]:
        return split_metrics(embeddings, test_part, recall_at, config.eval.nmi, config.eval.engine, progress)

    rows = {name: score(values) for name, values in test.items()}
    rows.update(learner_summary(rows, model.head.individual_learners))
    concatenated = ["embedding"] + [k for k in test if k.partition(".")[0] in objective.regularizers]
    if len(concatenated) > 1:
        if train_table is None:
            train_table, _ = load_table(config, progress, only_split="train")
        train = embed_with_objective(model, objective, train_table, settings, desc="embedding train")
        rows[f"concatenation, PCA {pca_dim} (fit on train)"] = score(
            concat_pca({k: train[k] for k in concatenated}, {k: test[k] for k in concatenated}, pca_dim))
    record = _test_record(config, table, checkpoint, state, device, embeddings=rows)
    atomic_write_text(run.all_embeddings_metrics, to_json(record, indent=2))
    return record


def add_regularizers(config: RunConfig, names: list[str]) -> None:
    """Add regularisers ``names`` to ``config.loss`` with their default options (``--regularizer NAME``).

    Regularisers the config already sets keep their options; when the config leaves them to the head
    (``loss.regularizers`` unset), the head's defaults are kept beside the new ones.
    """
    from .losses import REGULARIZERS
    from .models.heads import head_class

    current = config.loss.regularizers
    if current is None:
        current = {k: dict(v) for k, v in head_class(config.model.head).default_regularizers.items()}
    for name in names:
        REGULARIZERS.get(name)  # an unknown name is refused with the nearest valid one
        current.setdefault(name, {})
    config.loss.regularizers = current


def results_table(run_dir: str | Path, record: dict[str, Any]) -> str:
    """The evaluated metrics beside the untrained backbone's (when the run recorded them)."""
    run = RunDir(run_dir)
    rows = {}
    if run.baseline.is_file():
        rows["untrained backbone"] = read_json_object(run.baseline).get("metrics", {})
    trained = f"trained ({record['checkpoint']}, step {record['step']})"
    if "rerank" in record:  # the same checkpoint without and with the re-ranking
        rows[trained] = record["without_rerank"]
        trained += f" + {record['rerank']['method']}"
    rows[trained] = record["metrics"]
    title = (f"{record['data']} test split: {record['test_images']:,} images of {record['test_classes']:,} "
             "classes unseen in training (values in %)")
    return title + "\n" + format_table(rows)


def embed_images(run_dir: str | Path, images: str | Path | Sequence[str | Path], out: str | Path, which: str = "auto",
                 batch_size: int | None = None, progress: bool = True, amp: str | bool | None = None,
                 compile: bool | None = None) -> tuple[Path, Path, int]:
    """Embed images with a run's model; writes ``out`` (N x D float32 .npy) and ``out``'s ``.paths.txt``.
    ``images`` is what ``list_images`` takes, or several of these (their images in the order given, one row each);
    ``amp`` and ``compile`` set the pass's ``eval.amp`` and ``eval.compile`` (None: the run's)."""
    config: RunConfig = RunDir(run_dir).config()
    set_inference(config, amp, compile)
    refuse_folder(out, "embeddings.npy")
    out = Path(out) if Path(out).suffix == ".npy" else Path(f"{out}.npy")  # as numpy.save names it: feat.v2.npy
    check_writable(out)  # before the embedding work, not after it
    sources = image_sources(images)
    files = list_images_of(sources)  # a missing image is named before the model loads
    device = resolve_device(config.train.device)
    model, _, _ = load_run_model(run_dir, which, device)
    table = files_table(" ".join(map(str, sources)), files)
    embeddings = embed_table(model, table, EmbedSettings.from_config(config, device, progress, batch_size))
    buffer = io.BytesIO()
    np.save(buffer, embeddings.astype(np.float32), allow_pickle=False)
    atomic_write_bytes(out, buffer.getvalue())
    paths_file = out.with_suffix(".paths.txt")
    atomic_write_text(paths_file, "".join(f"{f}\n" for f in files))
    return out, paths_file, len(files)
