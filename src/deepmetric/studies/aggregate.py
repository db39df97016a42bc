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
"""

from __future__ import annotations

import csv
import io
import json
import logging
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import DeepMetricError
from ..evaluation.per_query import PerQueryFile, load_per_query, per_query_path, query_scores
from ..evaluation.table import metric_label
from ..io import atomic_write_bytes, atomic_write_text
from ..runs.folder import RunDir
from . import statistics
from .cost import training_cost
from .record import TABLE_KEYS, finished, problem, write_manifest
from .spec import StudyRun, StudySpec
from .text import cell

log = logging.getLogger("deepmetric")

FolderOf = Callable[[StudyRun], Path]
"""Where a run's files are read: its run folder (``StudySpec.run_dir``, the default), or its record."""


def _folder_of(spec: StudySpec, folder_of: FolderOf | None) -> FolderOf:
    return folder_of or spec.run_dir


def _records(spec: StudySpec, file_of: Callable[[RunDir], Path],
             folder_of: FolderOf | None = None) -> Iterator[tuple[StudyRun, dict[str, Any]]]:
    """Each run whose evaluation file ``file_of(run directory)`` exists, with that file's record."""
    where = _folder_of(spec, folder_of)
    for run in spec.runs():
        path = file_of(RunDir(where(run)))
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


def _own(metrics: dict[str, Any]) -> dict[str, Any]:
    """A run's metrics without any that would take a column the table keeps for itself (``problem`` refuses such
    a file; this keeps a row's variant the study's even so)."""
    return {key: value for key, value in metrics.items() if key not in TABLE_KEYS}


def aggregate(spec: StudySpec, folder_of: FolderOf | None = None) -> list[dict[str, Any]]:
    """One row per finished run: variant, repeat, data set, its test metrics, then the validation metrics of the
    evaluated checkpoint (read from ``folder_of(run)``: the run folders by default)."""
    rows = []
    for run in spec.runs():
        folder = RunDir(_folder_of(spec, folder_of)(run))
        if finished(folder):  # a damaged copy is no finished run
            record = json.loads(folder.test_metrics.read_text())
            rows.append({"variant": run.variant, "repeat": run.repeat, "data": str(record.get("data", "")),
                         **_own(record["metrics"]), **validation_of(folder, record.get("step"))})
    return rows


def aggregate_all_embeddings(spec: StudySpec, folder_of: FolderOf | None = None) -> list[dict[str, Any]]:
    """One row per finished run and embedding of ``metrics-all-embeddings.json``; the variant is
    ``<variant> / <embedding>``."""
    return [{"variant": f"{run.variant} / {name}", "repeat": run.repeat, "data": str(record.get("data", "")),
             **_own(metrics)}
            for run, record in _records(spec, lambda folder: folder.all_embeddings_metrics, folder_of)
            for name, metrics in record["embeddings"].items()]


def per_query_files(spec: StudySpec, folder_of: FolderOf | None = None) -> dict[tuple[str, int], PerQueryFile]:
    """The per-query file of each finished run that has a sound one, by (variant, repeat); a damaged one is left
    out with a warning (its run still counts in the means, not in the bootstrap)."""
    files = {}
    for run in spec.runs():
        folder = RunDir(_folder_of(spec, folder_of)(run))
        path = per_query_path(folder.test_metrics)
        if finished(folder) and path.is_file():
            try:
                files[(run.variant, run.repeat)] = load_per_query(path)
            except DeepMetricError as error:
                log.warning("%s: left out of the bootstrap (%s)", run.name, error)
    return files


KEYS = TABLE_KEYS


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


def markdown(spec: StudySpec, rows: list[dict[str, Any]], title: str = "", bold: bool = True,
             stamp: str | None = None) -> str:
    """The table of means ± std per variant; ``bold`` marks each column's best mean (not for tables whose rows
    mix kinds, such as a deviation row beside the metrics); ``stamp``: the time it says it was written (now)."""
    metrics, summary = summarise(rows)
    data = data_of(rows)
    best: dict[tuple[str, str], float] = {}  # (data set, metric) -> best mean
    for variant, stats in summary.items():
        for m, (mean, _, _) in stats.items():
            best[(data[variant], m)] = max(best.get((data[variant], m), mean), mean)
    several = len(set(data.values())) > 1
    protocol = (f"{len(spec.repeats)} class-disjoint train/val splits ({spec.split_fraction:.0%} of the training "
                "classes validate)" if spec.protocol == "splits" else f"seeds {spec.repeats}")
    lines = [f"# Study {cell(spec.name)}{title}", "",
             f"Test metrics in %, mean ± std over {protocol}"
             + ("; val: the validation classes' figures at the evaluated checkpoint"
                if any(m.startswith("val_") for m in metrics) else "")
             + ("; best mean of each column in bold" if bold else "")
             + (" among the variants on the same data set" if several and bold else "")
             + f". Written {stamp or time.strftime('%Y-%m-%d %H:%M')}.", "",
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
            shown = f"{100 * mean:.2f}" + (f" ± {100 * std:.2f}" if n > 1 else "")  # one run has no spread to show
            cells.append(f"**{shown}**" if bold and mean == best[(data[variant], m)] else shown)
        count = max(s[2] for s in stats.values())
        lines.append(f"| {cell(variant)} | " + (f"{cell(data[variant])} | " if several else "") + f"{count} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


COMPARED = ("recall@1", "map@r")
"""The metrics ``comparison`` sets against the references and ``intervals`` gives (those of the chart)."""


def values_of(rows: list[dict[str, Any]], variant: str, metric: str) -> dict[int, float]:
    """``variant``'s ``metric`` in each repeat that has it (an undefined metric, null, left out)."""
    return {r["repeat"]: float(r[metric]) for r in rows if r["variant"] == variant and r.get(metric) is not None}


@dataclass
class Comparison:
    """One variant against one reference on one metric (``statistics.py``): the difference of means, Welch's
    p-value across repeats and the paired bootstrap over queries, each with its Holm-adjusted p-value."""

    variant: str
    reference: str
    metric: str
    difference: float
    welch: float | None
    bootstrap: statistics.Bootstrap | None
    welch_holm: float | None = None
    bootstrap_holm: float | None = None

    @property
    def mark(self) -> str:
        """``▲`` / ``▼`` where Welch's test is significant after Holm (``statistics.ALPHA``), else ``""``."""
        if self.welch_holm is None or self.welch_holm >= statistics.ALPHA or self.difference == 0:
            return ""
        return "▲" if self.difference > 0 else "▼"


def _paired_scores(per_query: dict[tuple[str, int], PerQueryFile], variant: str, reference: str, metric: str,
                   repeats: list[int]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per-query scores of ``metric`` of the two variants' runs in each of ``repeats`` that both have a per-query
    file of the same queries and gallery (``PerQueryFile.key``)."""
    ours, theirs = [], []
    for repeat in repeats:
        mine, other = per_query.get((variant, repeat)), per_query.get((reference, repeat))
        if mine is None or other is None or mine.key != other.key:
            continue
        a, b = query_scores(mine.per_query, metric), query_scores(other.per_query, metric)
        if a is not None and b is not None and a.shape == b.shape:
            ours.append(a)
            theirs.append(b)
    return ours, theirs


def comparisons(spec: StudySpec, rows: list[dict[str, Any]],
                per_query: dict[tuple[str, int], PerQueryFile] | None = None) -> list[Comparison]:
    """Every variant against every reference of ``spec.compare`` on each of ``COMPARED`` (on the same data set,
    both finished), with the Holm adjustments over all of them; the bootstrap where ``per_query`` (``per_query_files``)
    pairs their runs. Two references compared with each other give one test, seen from both sides (``mirror``):
    it counts once in Holm's m."""
    metrics, summary = summarise(rows)
    data = data_of(rows)
    found: list[Comparison] = []
    tests: list[Comparison] = []  # each test once: what Holm adjusts
    for variant in summary:
        for reference in spec.compare:
            for metric in (m for m in COMPARED if m in metrics):
                if (variant == reference or metric not in summary[variant]
                        or metric not in summary.get(reference, {}) or data[variant] != data[reference]):
                    continue
                seen = next((c for c in tests if (c.variant, c.reference, c.metric) == (reference, variant, metric)),
                            None)
                if seen is not None:
                    found.append(mirror(seen))
                    continue
                mine, theirs = values_of(rows, variant, metric), values_of(rows, reference, metric)
                difference = summary[variant][metric][0] - summary[reference][metric][0]
                ours, others = _paired_scores(per_query or {}, variant, reference, metric,
                                              [r for r in spec.repeats if r in mine and r in theirs])
                bootstrap = (statistics.paired_bootstrap(ours, others, seed=statistics.stream_seed(variant, reference))
                             if ours else None)
                test = Comparison(variant, reference, metric, difference,
                                  statistics.welch_p(list(mine.values()), list(theirs.values())), bootstrap)
                found.append(test)
                tests.append(test)
    for adjusted, test in zip(statistics.holm([c.welch for c in tests]), tests, strict=True):
        test.welch_holm = adjusted
    for adjusted, test in zip(statistics.holm([c.bootstrap.p if c.bootstrap else None for c in tests]), tests,
                              strict=True):
        test.bootstrap_holm = adjusted
    return [c if c in tests else mirror(next(t for t in tests if (t.variant, t.reference, t.metric)
                                             == (c.reference, c.variant, c.metric))) for c in found]


def mirror(test: Comparison) -> Comparison:
    """``test`` seen from its reference's side: the difference and the bootstrap interval negated, the same
    p-values."""
    b = test.bootstrap
    return Comparison(test.reference, test.variant, test.metric, -test.difference, test.welch,
                      None if b is None else statistics.Bootstrap(-b.difference, -b.high, -b.low, b.p, b.pairs),
                      test.welch_holm, test.bootstrap_holm)


def is_mirror(test: Comparison, found: list[Comparison]) -> bool:
    """Whether ``test`` is the second side of a test already in ``found`` before it (two references compared)."""
    return any((c.variant, c.reference, c.metric) == (test.reference, test.variant, test.metric)
               for c in found[:found.index(test)])


def p_value(p: float | None) -> str:
    """A p-value in a table: 3 decimals, or 2 significant digits below 0.001; ``—`` when there is none."""
    if p is None:
        return "—"
    return f"{p:.3f}" if p >= 0.001 else f"{p:.1e}"


def points(value: float) -> str:
    return f"{100 * value:+.2f}"


def comparison(spec: StudySpec, rows: list[dict[str, Any]], found: list[Comparison] | None = None) -> str:
    """The "Against the references" section: each variant's difference from each of ``spec.compare`` (in points)
    for Recall@1 and MAP@R with its mark, then every test (``comparisons``; computed here without per-query files
    when ``found`` is not given); "—" where the reference has no finished run or the two were run on different data
    sets. Empty without references."""
    metrics, summary = summarise(rows)
    shown = [m for m in COMPARED if m in metrics]
    if not spec.compare or not shown:
        return ""
    found = comparisons(spec, rows) if found is None else found
    by_key = {(c.variant, c.reference, c.metric): c for c in found}
    header = [f"{metric_label(m)} − {cell(reference)}" for reference in spec.compare for m in shown]
    lines = ["## Against the references", "",
             "Each variant's mean minus the reference's, in points; ▲ / ▼ where Welch's t-test across the repeats "
             f"is significant at {statistics.ALPHA} after Holm's correction over every comparison below (above / "
             "below). The tests below give each p-value and the paired bootstrap over test queries.", "",
             "| variant | " + " | ".join(header) + " |", "|---|" + "---|" * len(header)]
    for variant in summary:
        cells = []
        for reference in spec.compare:
            for m in shown:
                found_here = by_key.get((variant, reference, m))
                if variant == reference:
                    cells.append("(reference)")
                elif found_here is None:
                    cells.append("—")
                else:
                    cells.append(f"{points(found_here.difference)} {found_here.mark}".rstrip())
        lines.append(f"| {cell(variant)} | " + " | ".join(cells) + " |")
    tests = [c for c in found if not is_mirror(c, found)]  # two references compared: their test once
    if tests:
        lines += ["", "### The tests", "",
                  f"Difference of means in points; Welch: two-sided p-value of Welch's t-test across the repeats, and "
                  f"that p-value after Holm's correction over the {sum(c.welch is not None for c in tests)} Welch "
                  f"tests of the table (it decides the marks); bootstrap: the paired bootstrap over test queries "
                  f"({statistics.RESAMPLES:,} resamples of the queries, the runs paired by repeat), its "
                  f"{statistics.CONFIDENCE:.0%} interval of the difference in points, its two-sided p-value and that "
                  "p-value after Holm's correction over the table's bootstrap tests; — where a test is undefined "
                  "(one repeat; runs recorded without per-query results).", "",
                  "| variant | reference | metric | difference | Welch p | Welch p, Holm | repeats paired | "
                  "bootstrap interval | bootstrap p | bootstrap p, Holm |", "|---|---|---|---|---|---|---|---|---|---|"]
        for c in tests:
            b = c.bootstrap
            lines.append(f"| {cell(c.variant)} | {cell(c.reference)} | {metric_label(c.metric)} | "
                         f"{points(c.difference)} {c.mark}".rstrip() + f" | {p_value(c.welch)} | "
                         f"{p_value(c.welch_holm)} | {b.pairs if b else 0} | "
                         + (f"[{points(b.low)}, {points(b.high)}] | {p_value(b.p)} | {p_value(c.bootstrap_holm)} |"
                            if b else "— | — | — |"))
    return "\n".join(lines) + "\n"


def intervals(spec: StudySpec, rows: list[dict[str, Any]]) -> str:
    """The "95% intervals" section: each variant's t-interval of the mean of Recall@1 and MAP@R over its repeats
    (``statistics.summarise``); empty when no variant has two repeats."""
    metrics, summary = summarise(rows)
    shown = [m for m in COMPARED if m in metrics]
    if not shown or not any(stats[m][2] > 1 for stats in summary.values() for m in shown if m in stats):
        return ""
    lines = [f"## {statistics.CONFIDENCE:.0%} intervals", "",
             "The t-interval of each mean, in %: mean ± t(0.975, n − 1) · std / √n over the n repeats (— for one "
             "repeat); it says where the mean of many more repeats would lie, the std how much one repeat varies.", "",
             "| variant | runs | " + " | ".join(metric_label(m) for m in shown) + " |",
             "|---|---|" + "---|" * len(shown)]
    for variant, stats in summary.items():
        cells = []
        for m in shown:
            values = list(values_of(rows, variant, m).values())
            found = statistics.summarise(values) if values else None
            cells.append("—" if found is None or found.low is None or found.high is None
                         else f"[{100 * found.low:.2f}, {100 * found.high:.2f}]")
        lines.append(f"| {cell(variant)} | {max(s[2] for s in stats.values())} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


STATISTICS_FIELDS = ("kind", "variant", "reference", "data", "metric", "runs", "mean", "std", "interval_low",
                     "interval_high", "difference", "welch_p", "welch_p_holm", "repeats_paired", "bootstrap_difference",
                     "bootstrap_low", "bootstrap_high", "bootstrap_p", "bootstrap_p_holm", "mark")
"""The columns of ``results-statistics.csv``: a ``variant`` row per variant and metric (its mean, std and
t-interval), a ``comparison`` row per test of ``comparisons``; fractions, as ``results.csv``."""


def statistics_rows(rows: list[dict[str, Any]], found: list[Comparison]) -> list[dict[str, Any]]:
    """The rows of ``results-statistics.csv``."""
    metrics, summary = summarise(rows)
    data = data_of(rows)
    table: list[dict[str, Any]] = []
    for variant in summary:
        for metric in metrics:
            values = list(values_of(rows, variant, metric).values())
            if values:
                found_here = statistics.summarise(values)
                table.append({"kind": "variant", "variant": variant, "data": data[variant], "metric": metric,
                              "runs": found_here.n, "mean": found_here.mean, "std": found_here.std,
                              "interval_low": found_here.low, "interval_high": found_here.high})
    for c in (c for c in found if not is_mirror(c, found)):
        b = c.bootstrap
        table.append({"kind": "comparison", "variant": c.variant, "reference": c.reference, "data": data[c.variant],
                      "metric": c.metric, "difference": c.difference, "welch_p": c.welch, "welch_p_holm": c.welch_holm,
                      "repeats_paired": b.pairs if b else 0, "bootstrap_difference": b.difference if b else None,
                      "bootstrap_low": b.low if b else None, "bootstrap_high": b.high if b else None,
                      "bootstrap_p": b.p if b else None, "bootstrap_p_holm": c.bootstrap_holm, "mark": c.mark})
    return [{key: row.get(key) for key in STATISTICS_FIELDS} for row in table]


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
        lines.append(f"| {cell(variant)} | " + " | ".join(cells) + " |")
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
    sections = [markdown(spec, rows, stamp=stamp), intervals(spec, rows), per_repeat(spec, rows),
                comparison(spec, rows, found), training_cost(spec, folder_of)]
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
                  embedding_rows: list[dict[str, Any]] | None = None) -> dict[str, Path]:
    """The study's results files; with ``embedding_rows`` (``aggregate_all_embeddings``) also those of every
    embedding. With a record, the tables go into the record too (rewritten only when a figure changed), and its
    manifest is written again."""
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
    if spec.record is not None:
        for name, text in texts.items():
            kept = spec.record / name
            if not kept.is_file() or not same_tables(kept.read_text(errors="replace"), text):
                atomic_write_text(kept, text)
        write_manifest(spec.record)
    return paths
