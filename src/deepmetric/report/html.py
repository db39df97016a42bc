"""``RUN/report.html``: curves, Recall@K, a retrieval grid, attention overlays, an embedding map, the software and
machines that trained and evaluated the run, and the config (and, once ``deepmetric evaluate --all-embeddings``
has run, its table of every embedding).

Self-contained: every figure is a PNG embedded as a base64 data URI, so the file can be mailed or opened
anywhere. The test split is embedded once with the run's evaluated checkpoint (``best`` when the run had
a validation split, else ``last``).
"""

from __future__ import annotations

import base64
import html
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from ..errors import DeepMetricError
from ..evaluation import EmbedSettings, embed_table
from ..evaluation.table import metric_label, percent
from ..io import atomic_write_text
from ..training.run_dir import RunDir, load_run_model
from ..training.setup import load_table, resolve_device
from . import figures

logger = logging.getLogger("deepmetric")

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.15em; margin-top: 2em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; font-size: 0.9em; } td, th { padding: 4px 10px; border-bottom: 1px solid #eee; }
th { text-align: left; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
img { max-width: 100%; } pre { background: #f6f6f6; padding: 1em; overflow: auto; font-size: 0.8em; }
.note { color: #666; font-size: 0.85em; }
"""


def _img(png: bytes, alt: str) -> str:
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'


def _metrics_table(rows: dict[str, dict[str, float]]) -> str:
    keys = list(dict.fromkeys(k for metrics in rows.values() for k in metrics))
    head = "".join(f"<th>{html.escape(metric_label(k))}</th>" for k in keys)
    body = "".join(
        f"<tr><td>{html.escape(name)}</td>"
        + "".join(f'<td class="num">{percent(m[k])}</td>' if k in m else "<td></td>" for k in keys) + "</tr>"
        for name, m in rows.items())
    return f"<table><tr><th></th>{head}</tr>{body}</table>"


PROVENANCE_FIELDS = (("at", "when"), ("start_step", "from step"), ("steps", "to step"),
                     ("processes", "processes"), ("deepmetric", "deepmetric"), ("source", "commit"),
                     ("torch", "torch"), ("device", "device"), ("gpu", "GPU"), ("cpu", "CPU"),
                     ("threads", "threads"), ("knn_engine", "kNN engine"))


def _provenance_section(records: dict[str, dict[str, Any]]) -> str:
    """The software and machine of each training session and test evaluation (``deepmetric.provenance``), one
    column each; commits shortened to 12 digits."""
    if not records:
        return ""
    fields = [(key, label) for key, label in PROVENANCE_FIELDS if any(key in r for r in records.values())]

    def cell(record: dict[str, Any], key: str) -> str:
        value = str(record.get(key, ""))
        if key == "source" and len(value) >= 40:
            value = value[:12] + value[40:]
        return f"<td>{html.escape(value)}</td>"

    head = "".join(f"<th>{html.escape(name)}</th>" for name in records)
    body = "".join(f"<tr><td>{html.escape(label)}</td>" + "".join(cell(r, key) for r in records.values()) + "</tr>"
                   for key, label in fields)
    return f"<h2>Provenance</h2><table><tr><th></th>{head}</tr>{body}</table>"


def _figure(heading: str, draw: Callable[[], str]) -> str:
    """``heading`` and what ``draw`` returns, or a note saying why the figure is missing: a figure that fails
    leaves the rest of the report (and a training run that writes it) intact."""
    try:
        return heading + draw()
    except figures.FigureSkipped as reason:
        return f"{heading}<p class='note'>No figure: {html.escape(str(reason))}.</p>"
    except Exception as error:  # noqa: BLE001 - a figure must never take the report down
        logger.warning("report: the figure '%s' failed (%s: %s)", heading, type(error).__name__, error)
        return (f"{heading}<p class='note'>This figure failed ({html.escape(type(error).__name__)}: "
                f"{html.escape(str(error))}); the rest of the report is complete.</p>")


def _attention_section(model: torch.nn.Module, table: Any, image_size: int, test_resize: str,
                        device: torch.device, count: int = 4, seed: int = 0) -> str:
    """Overlays of the head's attention maps on a few test images, or '' for heads without maps."""
    from ..data.transforms import TestTransform
    from ..viz.overlays import image_overlays

    rows = np.random.default_rng(seed + 1).choice(len(table), size=min(count, len(table)), replace=False)
    transform = TestTransform(image_size, test_resize)
    images = torch.stack([transform(table.image(int(r))) for r in rows]).to(device)
    with torch.no_grad():
        maps = model.eval()(images).attention
    if maps is None:
        return ""
    parts = []
    for i in range(len(rows)):
        shown = images[i].permute(1, 2, 0).clamp(0, 1).cpu().numpy()
        parts.append(_img(image_overlays(shown, maps[i].cpu(), title=table.describe(int(rows[i])),
                                         part_name=model.head.part_name),
                          f"attention maps of test image {int(rows[i])}"))
    return "<h2>Attention</h2><p class='note'>Each map upsampled to the input and overlaid.</p>" + "".join(parts)


def build_report(run_dir: str | Path, which: str = "auto", progress: bool = True,
                 test_embeddings: np.ndarray | None = None) -> Path:
    """Write ``RUN/report.html`` and return its path. ``test_embeddings``: the test split's embeddings by the
    same checkpoint (from ``evaluate_run_embeddings``), which are then not computed again."""
    run = RunDir(run_dir)
    config = run.config()
    device = resolve_device(config.train.device)
    model, _, checkpoint = load_run_model(run.path, which, device)
    test, _ = load_table(config, progress, only_split="test")
    if test_embeddings is not None and len(test_embeddings) != len(test):
        raise DeepMetricError(f"the report got {len(test_embeddings)} test embeddings for {len(test)} test images")
    embeddings = test_embeddings if test_embeddings is not None else embed_table(
        model, test, EmbedSettings.from_config(config, device, progress), desc="embedding test")
    log = run.read_log()
    results: dict[str, dict[str, float]] = {}
    provenance = {f"training session {i}": session for i, session in enumerate(run.sessions(), 1)}
    if run.baseline.is_file():
        baseline = json.loads(run.baseline.read_text())
        results["untrained backbone"] = baseline["metrics"]
        provenance["untrained backbone's test"] = baseline.get("environment", {})
    for file, label in ((run.test_metrics, "test evaluation"), (run.last_test_metrics, "test evaluation (last)")):
        if file.is_file():  # the chosen checkpoint's, then last's when evaluated
            record = json.loads(file.read_text())
            results[f"trained ({record['checkpoint']}, step {record['step']})"] = record["metrics"]
            provenance[label] = record.get("environment", {})
    m = config.model
    sections = [
        f"<h1>deepmetric run {html.escape(run.path.name)}</h1>",
        f"<p>{html.escape(config.data.spec)} · backbone {html.escape(m.backbone)} · head {html.escape(m.head)} · "
        f"loss {html.escape(config.loss.name)} · {config.train.steps} steps · checkpoint "
        f"{html.escape(checkpoint.name)} · {test.count('test'):,} test images of {len(test.classes()):,} "
        f"unseen classes</p><p class='note'>Written {time.strftime('%Y-%m-%d %H:%M')} from {html.escape(str(run.path))}"
        "</p>",
        "<h2>Test metrics (%)</h2>" + (_metrics_table(results) if results else "<p>not evaluated yet</p>"),
    ]
    if results:
        sections.append(_figure("", lambda: _img(figures.recall_curve(results), "Recall@K curve")))
    if run.all_embeddings_metrics.is_file():
        every = json.loads(run.all_embeddings_metrics.read_text())
        sections.append(f"<h2>Every embedding (%)</h2><p class='note'>From <code>deepmetric evaluate RUN "
                        f"--all-embeddings</code>: checkpoint {html.escape(str(every['checkpoint']))}, step "
                        f"{every['step']}, evaluated {html.escape(str(every['evaluated_at']))}.</p>"
                        + _metrics_table(every["embeddings"]))
    if log:
        sections.append(_figure("<h2>Training</h2>", lambda: _img(figures.training_curves(log), "training curves")))
    sections.append(_figure("<h2>Retrieval</h2><p class='note'>Random test queries (black) and their 8 nearest test "
                            "images: green when of the query's class, red otherwise.</p>",
                            lambda: _img(figures.retrieval_grid(test, embeddings), "retrieval grid")))
    sections.append(_figure("", lambda: _attention_section(model, test, config.data.image_size,
                                                           config.data.test_resize, device)))
    sections.append(_figure("<h2>Embedding map</h2>", lambda: _img(
        figures.embedding_map(embeddings, test.labels, class_names=test.class_names), "map of test embeddings")))
    sections.append(_provenance_section(provenance))
    sections.append("<h2>Resolved config</h2><pre>" + html.escape(yaml.safe_dump(config.to_dict(), sort_keys=False))
                    + "</pre>")
    page = (f"<!doctype html><html><head><meta charset='utf-8'><title>deepmetric report {html.escape(run.path.name)}"
            f"</title><style>{STYLE}</style></head><body>{''.join(sections)}</body></html>")
    path = run.path / "report.html"
    atomic_write_text(path, page)
    return path
