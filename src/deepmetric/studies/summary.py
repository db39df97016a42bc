"""The per-variant sections of ``results.md``: the table of means ± std (``markdown``, the best mean of each column
in bold among the variants on the same data set), each variant's 95% t-interval of Recall@1 and MAP@R
(``intervals``) and each repeat's figures (``per_repeat``), from the rows ``collect.aggregate`` reads. The std is the
sample standard deviation (ddof = 1) over the repeats; with one repeat it is 0. Every text a run's files give is
escaped (``text.cell``)."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from ..evaluation.table import metric_label
from . import statistics
from .record import TABLE_KEYS
from .spec import StudySpec
from .text import cell

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
             stamp: str | None = None, of_runs: int | None = None) -> str:
    """The table of means ± std per variant; ``bold`` marks each column's best mean (not for tables whose rows
    mix kinds, such as a deviation row beside the metrics); ``stamp``: the time it says it was written (now);
    ``of_runs``: how many runs the study has, said in the header when ``rows`` (a row a run) hold fewer."""
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
             + f". Written {stamp or time.strftime('%Y-%m-%d %H:%M')}."
             + (f" **{len(rows)} of the study's {of_runs} runs have finished**: each row's runs column counts its own."
                if of_runs is not None and len(rows) < of_runs else ""), "",
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
