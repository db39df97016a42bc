"""Collect a study's test metrics into ``results.csv`` (one row per run), ``results.md`` (mean ± std per
variant, the best mean of each column in bold among the variants on the same data set) and ``results.png``
(Recall@1 and MAP@R with std bars). ``results.md`` also gives each variant's 95% t-interval of Recall@1 and MAP@R
(``intervals``), lists each repeat's Recall@1 and MAP@R (``per_repeat``) and what each variant cost to train
(``cost.training_cost``). With ``compare``, it sets each variant against the reference variants (``comparison``: the
difference of means, Welch's t-test across repeats and a paired bootstrap over test queries, Holm-corrected; ▲ / ▼
where Welch's test is significant after Holm: ``statistics.py``); ``results-statistics.csv`` holds every figure of
those sections at full precision. With ``all_embeddings``, ``results-all-embeddings.{csv,md}`` do the same for every
embedding ``evaluate --all-embeddings`` scored, one row per variant and embedding (``abe-8 / abe.learner1-8 std`` is
the learners' deviation in each run, averaged over the repeats).

The std is the sample standard deviation (ddof = 1) over the repeats (seeds or splits); with one repeat
it is 0. With a ``record``, the tables are written into the record too, beside its ``MANIFEST.sha256``
(``record.py``), and ``deepmetric study FILE --verify`` recomputes them from the recorded files (``verify.py``).
Every text a run's files give (variant, data set, embedding and machine names) is escaped in the Markdown
(``text.cell``) and guarded in the CSV (``_cell``).

The steps, one module each: ``collect`` reads the runs' files into rows, ``summary`` writes the per-variant sections
(means ± std, intervals, each repeat), ``comparison`` the tests against the references, ``cost`` what each variant
cost; this module assembles them into the files, with the chart, and writes them.
"""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import DeepMetricError
from ..evaluation.table import metric_label
from ..io.files import atomic_write_bytes, atomic_write_text
from .collect import FolderOf, per_query_files
from .comparison import STATISTICS_FIELDS, comparison, comparisons, statistics_rows
from .cost import training_cost
from .record import write_manifest
from .spec import StudySpec
from .summary import intervals, markdown, per_repeat, summarise


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
    if value is None:
        return ""
    return "" if isinstance(value, float) and value != value else value  # an undefined metric: an empty cell


def _csv(rows: list[dict[str, Any]], fields: tuple[str, ...] | None = None) -> str:
    rows = [{key: _cell(value) for key, value in row.items()} for row in rows]
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(fields or dict.fromkeys(k for row in rows for k in row)))
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


STAMP = re.compile(r"Written (\d{4}-\d{2}-\d{2} \d{2}:\d{2})\.")
"""The time a ``results.md`` says it was written: the only text of the tables that their files do not give."""


def stamp_of(text: str) -> str | None:
    """The time ``STAMP`` finds in a written table, or None."""
    found = STAMP.search(text)
    return found.group(1) if found else None


def tables(spec: StudySpec, rows: list[dict[str, Any]], embedding_rows: list[dict[str, Any]] | None = None,
           folder_of: FolderOf | None = None, stamp: str | None = None) -> dict[str, str]:
    """The study's table files (name -> text) from ``rows`` (``aggregate``) and the runs' files under ``folder_of``
    (per-query results for the bootstrap, logs for the cost): ``results.csv``, ``results.md``,
    ``results-statistics.csv``, and with ``embedding_rows`` the tables of every embedding. ``stamp``: the time the
    tables say they were written (now)."""
    found = comparisons(spec, rows, per_query_files(spec, folder_of)) if spec.compare else []
    sections = [markdown(spec, rows, stamp=stamp, of_runs=len(spec.runs())), intervals(spec, rows),
                per_repeat(spec, rows), comparison(spec, rows, found), training_cost(spec, folder_of)]
    texts = {"results.csv": _csv(rows), "results.md": "\n".join(section for section in sections if section),
             "results-statistics.csv": _csv(statistics_rows(rows, found), STATISTICS_FIELDS)}
    if embedding_rows:
        texts["results-all-embeddings.csv"] = _csv(embedding_rows)
        texts["results-all-embeddings.md"] = markdown(spec, embedding_rows, ": every embedding", bold=False,
                                                      stamp=stamp)
    return texts


def same_tables(old: str, new: str) -> bool:
    """Whether two texts of a table file are the same but for the time they say they were written."""
    return STAMP.sub("Written.", old) == STAMP.sub("Written.", new)


def write_results(spec: StudySpec, rows: list[dict[str, Any]],
                  embedding_rows: list[dict[str, Any]] | None = None, into_record: bool = True) -> dict[str, Path]:
    """The study's results files; with ``embedding_rows`` (``aggregate_all_embeddings``) also those of every
    embedding. With a record (and ``into_record``), the tables go into the record too (rewritten only when a figure
    changed), and its manifest is written again."""
    if not rows:
        raise DeepMetricError(f"study {spec.name}: no finished run to aggregate under {spec.out}")
    spec.out.mkdir(parents=True, exist_ok=True)
    texts = tables(spec, rows, embedding_rows)
    paths = {"csv": spec.out / "results.csv", "md": spec.out / "results.md", "png": spec.out / "results.png",
             "statistics_csv": spec.out / "results-statistics.csv"}
    if embedding_rows:
        paths["embeddings_csv"] = spec.out / "results-all-embeddings.csv"
        paths["embeddings_md"] = spec.out / "results-all-embeddings.md"
    for name, text in texts.items():
        atomic_write_text(spec.out / name, text)
    atomic_write_bytes(paths["png"], chart(rows, f"study {spec.name}"))
    if spec.record is not None and into_record:
        for name, text in texts.items():
            kept = spec.record / name
            if not kept.is_file() or not same_tables(kept.read_text(errors="replace"), text):
                atomic_write_text(kept, text)
        write_manifest(spec.record)
    return paths
