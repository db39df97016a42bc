"""Collect a study's test metrics into ``results.csv`` (one row per run), ``results.md`` (mean ± std per
variant, the best mean of each column in bold among the variants on the same data set) and ``results.png``
(Recall@1 and MAP@R with std bars). ``results.md`` also lists each repeat's Recall@1 and MAP@R (``per_repeat``) and
what each variant cost to train (``cost.training_cost``). With ``compare``, it sets each variant against the reference
variants (``comparison``: the difference of means, marked where the ±1 std intervals do not overlap). With
``all_embeddings``, ``results-all-embeddings.{csv,md}`` do the same for every embedding ``evaluate
--all-embeddings`` scored, one row per variant and embedding (``abe-8 / abe.learner1-8 std`` is the learners'
deviation in each run, averaged over the repeats).

The std is the sample standard deviation (ddof = 1) over the repeats (seeds or splits); with one repeat
it is 0.
"""

from __future__ import annotations

import csv
import io
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import DeepMetricError
from ..evaluation.table import metric_label
from ..io import atomic_write_bytes, atomic_write_text
from ..training.run_dir import RunDir
from .cost import training_cost
from .record import finished, problem
from .spec import StudyRun, StudySpec


def _records(spec: StudySpec, file_of: Callable[[RunDir], Path]) -> Iterator[tuple[StudyRun, dict[str, Any]]]:
    """Each run whose evaluation file ``file_of(run directory)`` exists, with that file's record."""
    for run in spec.runs():
        path = file_of(RunDir(spec.run_dir(run)))
        if path.is_file() and problem(path) is None:  # a damaged copy is no finished run
            yield run, json.loads(path.read_text())


VALIDATION_METRICS = ("recall@1", "map@r")
"""The validation figures a study row carries (``val_recall@1``, ``val_map@r``): what chose the checkpoint, and what
a tuning study reads, since the test split chooses nothing."""


def validation_of(folder: RunDir, step: int | None) -> dict[str, float]:
    """The validation metrics logged at ``step`` (the evaluated checkpoint's), as ``val_<metric>``; none for a run
    without validation."""
    for record in folder.read_log():
        if record.get("split") == "val" and record.get("step") == step:
            return {f"val_{m}": record[m] for m in VALIDATION_METRICS if m in record}
    return {}


def aggregate(spec: StudySpec) -> list[dict[str, Any]]:
    """One row per finished run: variant, repeat, data set, its test metrics, then the validation metrics of the
    evaluated checkpoint."""
    rows = []
    for run in spec.runs():
        folder = RunDir(spec.run_dir(run))
        if finished(folder):  # a damaged copy is no finished run
            record = json.loads(folder.test_metrics.read_text())
            rows.append({"variant": run.variant, "repeat": run.repeat, "data": record.get("data", ""),
                         **record["metrics"], **validation_of(folder, record.get("step"))})
    return rows


def aggregate_all_embeddings(spec: StudySpec) -> list[dict[str, Any]]:
    """One row per finished run and embedding of ``metrics-all-embeddings.json``; the variant is
    ``<variant> / <embedding>``."""
    return [{"variant": f"{run.variant} / {name}", "repeat": run.repeat, "data": record.get("data", ""), **metrics}
            for run, record in _records(spec, lambda folder: folder.all_embeddings_metrics)
            for name, metrics in record["embeddings"].items()]


KEYS = ("variant", "repeat", "data")


def summarise(rows: list[dict[str, Any]]) -> tuple[list[str], dict[str, dict[str, tuple[float, float, int]]]]:
    """Metric names (every metric of any run, in order) and, per variant and metric it has, (mean, std, count)."""
    metrics = list(dict.fromkeys(k for r in rows for k in r if k not in KEYS))
    summary: dict[str, dict[str, tuple[float, float, int]]] = {}
    for variant in dict.fromkeys(r["variant"] for r in rows):
        values = {m: np.array([r[m] for r in rows if r["variant"] == variant and r.get(m) is not None], dtype=float)
                  for m in metrics}  # an undefined metric (null) is left out of its mean
        summary[variant] = {m: (float(v.mean()), float(v.std(ddof=1)) if len(v) > 1 else 0.0, len(v))
                            for m, v in values.items() if len(v)}
    return metrics, summary


def data_of(rows: list[dict[str, Any]]) -> dict[str, str]:
    """The data set of each variant."""
    return {r["variant"]: str(r.get("data", "")) for r in rows}


def markdown(spec: StudySpec, rows: list[dict[str, Any]], title: str = "", bold: bool = True) -> str:
    """The table of means ± std per variant; ``bold`` marks each column's best mean (not for tables whose rows
    mix kinds, such as a deviation row beside the metrics)."""
    metrics, summary = summarise(rows)
    data = data_of(rows)
    best: dict[tuple[str, str], float] = {}  # (data set, metric) -> best mean
    for variant, stats in summary.items():
        for m, (mean, _, _) in stats.items():
            best[(data[variant], m)] = max(best.get((data[variant], m), mean), mean)
    several = len(set(data.values())) > 1
    protocol = (f"{len(spec.repeats)} class-disjoint train/val splits ({spec.split_fraction:.0%} of the training "
                "classes validate)" if spec.protocol == "splits" else f"seeds {spec.repeats}")
    lines = [f"# Study {spec.name}{title}", "",
             f"Test metrics in %, mean ± std over {protocol}"
             + ("; val: the validation classes' figures at the evaluated checkpoint"
                if any(m.startswith("val_") for m in metrics) else "")
             + ("; best mean of each column in bold" if bold else "")
             + (" among the variants on the same data set" if several and bold else "")
             + f". Written {time.strftime('%Y-%m-%d %H:%M')}.", "",
             "| variant | " + ("data | " if several else "") + "runs | "
             + " | ".join(metric_label(m) for m in metrics) + " |",
             "|---|" + ("---|" if several else "") + "---|" + "---|" * len(metrics)]
    for variant, stats in summary.items():
        cells = []
        for m in metrics:
            if m not in stats:
                cells.append("—")
                continue
            mean, std, n = stats[m]
            cell = f"{100 * mean:.2f}" + (f" ± {100 * std:.2f}" if n > 1 else "")  # one run has no spread to show
            cells.append(f"**{cell}**" if bold and mean == best[(data[variant], m)] else cell)
        count = max(s[2] for s in stats.values())
        lines.append(f"| {variant} | " + (f"{data[variant]} | " if several else "") + f"{count} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


COMPARED = ("recall@1", "map@r")
"""The metrics ``comparison`` sets against the references (those of the chart)."""


def apart(variant: tuple[float, float, int], reference: tuple[float, float, int]) -> str:
    """``▲`` when the interval mean ± std of ``variant`` lies wholly above that of ``reference``, ``▼`` wholly
    below, else ``""``; also ``""`` unless both have two repeats or more (one run's interval has no width)."""
    (mean, std, n), (ref_mean, ref_std, ref_n) = variant, reference
    if min(n, ref_n) < 2:
        return ""
    if mean - std > ref_mean + ref_std:
        return "▲"
    return "▼" if mean + std < ref_mean - ref_std else ""


def comparison(spec: StudySpec, rows: list[dict[str, Any]]) -> str:
    """A table of each variant against each of ``spec.compare``: the difference of its mean from the reference's
    (in points) for Recall@1 and MAP@R, with ``apart``'s mark; "—" where the reference has no finished run or
    the two were run on different data sets. Empty without references."""
    metrics, summary = summarise(rows)
    shown = [m for m in COMPARED if m in metrics]
    if not spec.compare or not shown:
        return ""
    data = data_of(rows)
    header = [f"{metric_label(m)} − {reference}" for reference in spec.compare for m in shown]
    lines = ["## Against the references", "",
             "Each variant's mean minus the reference's, in points; ▲ / ▼ where the two mean ± std intervals do not "
             "overlap (above / below; shown only when both have two runs or more).", "",
             "| variant | " + " | ".join(header) + " |", "|---|" + "---|" * len(header)]
    for variant, stats in summary.items():
        cells = []
        for reference in spec.compare:
            for m in shown:
                theirs = summary.get(reference, {}).get(m)
                if variant == reference:
                    cells.append("(reference)")
                elif theirs is None or m not in stats or data[variant] != data[reference]:
                    cells.append("—")
                else:
                    cells.append(f"{100 * (stats[m][0] - theirs[0]):+.2f} {apart(stats[m], theirs)}".rstrip())
        lines.append(f"| {variant} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def per_repeat(spec: StudySpec, rows: list[dict[str, Any]]) -> str:
    """Each variant's Recall@1 and MAP@R of every repeat (seed or split), in the study's order ("—": not finished);
    empty for a study of one repeat."""
    shown = [m for m in COMPARED if any(m in r for r in rows)]
    if len(spec.repeats) < 2 or not shown:
        return ""
    kind = "split" if spec.protocol == "splits" else "seed"
    order = " / ".join(str(repeat) for repeat in spec.repeats)
    lines = [f"## Each {kind}", "", f"Test figures in %, {kind} {order}.", "",
             "| variant | " + " | ".join(metric_label(m) for m in shown) + " |", "|---|" + "---|" * len(shown)]
    for variant in dict.fromkeys(r["variant"] for r in rows):
        by_repeat = {r["repeat"]: r for r in rows if r["variant"] == variant}
        cells = [" / ".join(f"{100 * by_repeat[repeat][m]:.2f}" if by_repeat.get(repeat, {}).get(m) is not None
                            else "—" for repeat in spec.repeats) for m in shown]
        lines.append(f"| {variant} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def chart(rows: list[dict[str, Any]], title: str) -> bytes:
    """Grouped bars of Recall@1 and MAP@R (mean ± std) per variant, as PNG bytes."""
    from matplotlib.figure import Figure

    from ..render import figure_png

    metrics, summary = summarise(rows)
    shown = [m for m in ("recall@1", "map@r") if m in metrics]
    variants = list(summary)
    x = np.arange(len(variants))
    width = 0.8 / max(len(shown), 1)
    figure = Figure(figsize=(max(6, 1.2 * len(variants) + 2), 4), dpi=110)
    axis = figure.subplots()
    for i, m in enumerate(shown):
        means = [100 * summary[v][m][0] if m in summary[v] else np.nan for v in variants]
        stds = [100 * summary[v][m][1] if m in summary[v] else 0.0 for v in variants]
        axis.bar(x + (i - (len(shown) - 1) / 2) * width, means, width, yerr=stds, capsize=3, label=metric_label(m))
    axis.set_xticks(x, variants, rotation=20, ha="right")
    axis.set_ylabel("%")
    axis.set_title(title)
    axis.legend()
    axis.grid(axis="y", alpha=0.3)
    figure.tight_layout()
    return figure_png(figure)


FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def _cell(value: Any) -> Any:
    """A text cell that a spreadsheet would run as a formula (OWASP's CSV injection: ``=``, ``+``, ``-``, ``@``,
    tab, CR) gets a leading ``'``; numbers are written as they are."""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return "" if isinstance(value, float) and value != value else value  # an undefined metric: an empty cell


def _csv(rows: list[dict[str, Any]]) -> str:
    rows = [{key: _cell(value) for key, value in row.items()} for row in rows]
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(dict.fromkeys(k for row in rows for k in row)))
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


def write_results(spec: StudySpec, rows: list[dict[str, Any]],
                  embedding_rows: list[dict[str, Any]] | None = None) -> dict[str, Path]:
    """The study's results files; with ``embedding_rows`` (``aggregate_all_embeddings``) also those of every
    embedding."""
    if not rows:
        raise DeepMetricError(f"study {spec.name}: no finished run to aggregate under {spec.out}")
    spec.out.mkdir(parents=True, exist_ok=True)
    paths = {"csv": spec.out / "results.csv", "md": spec.out / "results.md", "png": spec.out / "results.png"}
    atomic_write_text(paths["csv"], _csv(rows))
    sections = [markdown(spec, rows), per_repeat(spec, rows), comparison(spec, rows), training_cost(spec)]
    atomic_write_text(paths["md"], "\n".join(section for section in sections if section))
    atomic_write_bytes(paths["png"], chart(rows, f"study {spec.name}"))
    if embedding_rows:
        paths["embeddings_csv"] = spec.out / "results-all-embeddings.csv"
        paths["embeddings_md"] = spec.out / "results-all-embeddings.md"
        atomic_write_text(paths["embeddings_csv"], _csv(embedding_rows))
        atomic_write_text(paths["embeddings_md"], markdown(spec, embedding_rows, ": every embedding", bold=False))
    return paths
