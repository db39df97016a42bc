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
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import yaml

from ..data import check_data_path
from ..devices import resolve_device
from ..errors import DeepMetricError
from ..evaluation import EmbedSettings, embed_table
from ..evaluation.table import metric_label, percent
from ..io.files import atomic_write_text, check_writable, refuse_folder
from ..io.strict import read_json_object
from ..runs.folder import RunDir
from ..runs.model import load_run_model
from ..runs.table import load_table
from . import figures

if TYPE_CHECKING:
    from ..models.embedder import Embedder

logger = logging.getLogger("deepmetric")

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.15em; margin-top: 2em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; font-size: 0.9em; } td, th { padding: 4px 10px; border-bottom: 1px solid #eee; }
th { text-align: left; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
img { max-width: 100%; } pre { background: #f6f6f6; padding: 1em; overflow: auto; font-size: 0.8em; }
.note { color: #666; font-size: 0.85em; }
"""


def _text(value: Any) -> str:
    """``value`` as HTML text: every value that reaches the page goes through here, whatever file it came from (the
    run's JSON files, its config, its folder name are all editable by whoever hands the run over)."""
    return html.escape(str(value), quote=True)


def _number(value: Any) -> str:
    """A metric cell: the value in % when it is a number, else the value itself, as text (a hand-edited file)."""
    if value is None or (isinstance(value, int | float) and not isinstance(value, bool)):
        return percent(value)
    return _text(value)


def _read_record(path: Path) -> dict[str, Any]:
    """A JSON object the run wrote (metrics, baseline, every-embedding record); one error naming it otherwise."""
    return read_json_object(path)


def _mapping(value: Any) -> dict[Any, Any]:
    return value if isinstance(value, dict) else {}


def _img(png: bytes, alt: str) -> str:
    return f'<img alt="{_text(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'


def _metrics_table(rows: dict[str, Any]) -> str:
    rows = {name: _mapping(metrics) for name, metrics in rows.items()}
    keys = list(dict.fromkeys(k for metrics in rows.values() for k in metrics))
    head = "".join(f"<th>{_text(metric_label(str(k)))}</th>" for k in keys)
    body = "".join(
        f"<tr><td>{_text(name)}</td>"
        + "".join(f'<td class="num">{_number(m[k])}</td>' if k in m else "<td></td>" for k in keys) + "</tr>"
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
    records = {name: _mapping(record) for name, record in records.items()}
    fields = [(key, label) for key, label in PROVENANCE_FIELDS if any(key in r for r in records.values())]

    def cell(record: dict[str, Any], key: str) -> str:
        value = str(record.get(key, ""))
        if key == "source" and len(value) >= 40:
            value = value[:12] + value[40:]
        return f"<td>{_text(value)}</td>"

    head = "".join(f"<th>{_text(name)}</th>" for name in records)
    body = "".join(f"<tr><td>{_text(label)}</td>" + "".join(cell(r, key) for r in records.values()) + "</tr>"
                   for key, label in fields)
    return f"<h2>Provenance</h2><table><tr><th></th>{head}</tr>{body}</table>"


def _figure(heading: str, draw: Callable[[], str]) -> str:
    """``heading`` and what ``draw`` returns, or a note saying why the figure is missing: a figure that fails
    leaves the rest of the report (and a training run that writes it) intact."""
    try:
        return heading + draw()
    except figures.FigureSkipped as reason:
        return f"{heading}<p class='note'>No figure: {_text(reason)}.</p>"
    except Exception as error:  # noqa: BLE001 - a figure must never take the report down
        logger.warning("report: the figure '%s' failed (%s: %s)", heading, type(error).__name__, error)
        return (f"{heading}<p class='note'>This figure failed ({_text(type(error).__name__)}: "
                f"{_text(error)}); the rest of the report is complete.</p>")


def _attention_section(model: Embedder, table: Any, image_size: int, test_resize: str,
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
                 test_embeddings: np.ndarray | None = None, out: str | Path | None = None) -> Path:
    """Write ``RUN/report.html`` (or ``out``) and return its path. ``test_embeddings``: the test split's
    embeddings by the same checkpoint (from ``evaluate_run_embeddings``), which are then not computed again."""
    run = RunDir(run_dir)
    if out is None:
        path = run.path / "report.html"
    else:
        refuse_folder(out, "report.html")
        path = Path(out)
        check_writable(path)  # before the embedding work, not after it
    config = run.config()
    check_data_path(config.data.spec)  # a missing data folder, before the model
    device = resolve_device(config.train.device)
    model, _, checkpoint = load_run_model(run.path, which, device)
    test, _ = load_table(config, progress, only_split="test")
    if test_embeddings is not None and len(test_embeddings) != len(test):
        raise DeepMetricError(f"the report got {len(test_embeddings)} test embeddings for {len(test)} test images")
    embeddings = test_embeddings if test_embeddings is not None else embed_table(
        model, test, EmbedSettings.from_config(config, device, progress), desc="embedding test")
    log = run.read_log()
    results: dict[str, Any] = {}
    provenance: dict[str, Any] = {f"training session {i}": session for i, session in enumerate(run.sessions(), 1)}
    if run.baseline.is_file():
        baseline = _read_record(run.baseline)
        results["untrained backbone"] = _mapping(baseline.get("metrics"))
        provenance["untrained backbone's test"] = baseline.get("environment")
    for file, label in ((run.test_metrics, "test evaluation"), (run.last_test_metrics, "test evaluation (last)")):
        if file.is_file():  # the chosen checkpoint's, then last's when evaluated
            record = _read_record(file)
            name = f"trained ({record.get('checkpoint')}, step {record.get('step')})"
            results[name] = _mapping(record.get("metrics"))
            provenance[label] = record.get("environment")
    m = config.model
    sections = [
        f"<h1>deepmetric run {_text(run.path.name)}</h1>",
        f"<p>{_text(config.data.spec)} · backbone {_text(m.backbone)} · head {_text(m.head)} · "
        f"loss {_text(config.loss.name)} · {_text(config.train.steps)} steps · checkpoint "
        f"{_text(checkpoint.name)} · {test.count('test'):,} test images of {len(test.classes()):,} "
        f"unseen classes</p><p class='note'>Written {time.strftime('%Y-%m-%d %H:%M')} from {_text(run.path)}"
        "</p>",
        "<h2>Test metrics (%)</h2>" + (_metrics_table(results) if results else "<p>not evaluated yet</p>"),
    ]
    if results:
        sections.append(_figure("", lambda: _img(figures.recall_curve(results), "Recall@K curve")))
    if run.all_embeddings_metrics.is_file():
        every = _read_record(run.all_embeddings_metrics)
        sections.append(f"<h2>Every embedding (%)</h2><p class='note'>From <code>deepmetric evaluate RUN "
                        f"--all-embeddings</code>: checkpoint {_text(every.get('checkpoint'))}, step "
                        f"{_text(every.get('step'))}, evaluated {_text(every.get('evaluated_at'))}.</p>"
                        + _metrics_table(_mapping(every.get("embeddings"))))
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
    sections.append("<h2>Resolved config</h2><pre>" + _text(yaml.safe_dump(config.to_dict(), sort_keys=False))
                    + "</pre>")
    page = (f"<!doctype html><html><head><meta charset='utf-8'><title>deepmetric report {_text(run.path.name)}"
            f"</title><style>{STYLE}</style></head><body>{''.join(sections)}</body></html>")
    atomic_write_text(path, page)
    return path
