"""Each variant against the reference variants of ``compare:`` (the "Against the references" section of
``results.md``, ``comparison``): the difference of means, Welch's t-test across repeats and a paired bootstrap over
test queries, Holm-corrected over every test of the table (``comparisons``; the tests are ``statistics.py``'s), and
every figure of them at full precision for ``results-statistics.csv`` (``statistics_rows``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..evaluation.per_query import PerQueryFile, query_scores
from ..evaluation.table import metric_label
from . import statistics
from .spec import StudySpec
from .summary import COMPARED, data_of, summarise, values_of
from .text import cell


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
        welch = sum(c.welch is not None for c in tests)
        holm = (f"that p-value after Holm's correction over the {welch} Welch tests of the table (it decides the "
                "marks)" if welch else "that p-value after Holm's correction (none here: a Welch test needs two "
                "repeats of each side)")
        lines += ["", "### The tests", "",
                  f"Difference of means in points; Welch: two-sided p-value of Welch's t-test across the repeats, and "
                  f"{holm}; bootstrap: the paired bootstrap over test queries "
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
