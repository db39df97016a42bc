"""The rows of a comparison's table on docs/results.md, written from its record's ``results-statistics.csv``.

    python tools/results_rows.py configs/studies/icons-cpu-64px.yaml [--label deml="DeML(2,4)" ...]

Prints one Markdown row per variant, best test R@1 first: R@1 and MAP@R as mean ± std and the 95% t-interval, then
each variant's difference from each reference of the study (``compare:``), R@1 / MAP@R in points with the study's
mark (▲ / ▼ where Welch's test is significant after Holm's correction; a pair tested the other way round read
backwards; "—" for a pair the study does not test), and an empty last column for where the method departs from
its paper. The figures are those that ``tests/test_published_results.py`` holds the page to,
so they are copied, never typed; the method's name (``--label``) and its departures are the writer's.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

from deepmetric.studies import load_study

METRICS = ("recall@1", "map@r")


def points(value: str, signed: bool = False) -> str:
    """A fraction as points with two decimals and a true minus sign (the page's typography)."""
    return (f"{100 * float(value):+.2f}" if signed else f"{100 * float(value):.2f}").replace("-", "−")


def difference(against: dict[tuple[str, str, str], dict[str, str]], variant: str, reference: str,
               metric: str) -> str:
    """``variant``'s mean minus ``reference``'s in points with the study's mark; a pair the study tests the other
    way round (a reference against another) is that test read backwards (the sign and the mark turned); "—" where
    the study does not test the pair."""
    row = against.get((variant, reference, metric))
    if row is not None:
        return points(row["difference"], signed=True) + (f" {row['mark']}" if row["mark"] else "")
    row = against.get((reference, variant, metric))
    if row is None:
        return "—"
    mark = {"▲": "▼", "▼": "▲"}.get(row["mark"], row["mark"])
    return points(str(-float(row["difference"])), signed=True) + (f" {mark}" if mark else "")


def rows(statistics: list[dict[str, str]], references: list[str], labels: dict[str, str]) -> list[str]:
    """The table's header and one row per variant of ``statistics`` (rows of ``results-statistics.csv``)."""
    own = {(row["variant"], row["metric"]): row for row in statistics if row["kind"] == "variant"}
    against = {(row["variant"], row["reference"], row["metric"]): row for row in statistics
               if row["kind"] != "variant"}
    variants = sorted({variant for variant, _ in own}, key=lambda v: -float(own[(v, METRICS[0])]["mean"]))
    best = {metric: max(float(own[(v, metric)]["mean"]) for v in variants) for metric in METRICS}
    header = ["| method (variant) | R@1 | 95% interval | MAP@R | 95% interval | "
              + " | ".join(f"Δ R@1 / MAP@R vs {reference}" for reference in references)
              + " | departs from its paper or code here |",
              "|---|---|---|---|---|" + "---|" * len(references) + "---|"]
    lines = []
    for variant in variants:
        cells = [f"{labels.get(variant, variant)} (`{variant}`)"]
        for metric in METRICS:
            row = own[(variant, metric)]
            figure = f"{points(row['mean'])} ± {points(row['std'])}"
            if float(row["mean"]) == best[metric]:
                figure = f"**{figure}**"
            cells += [figure, f"[{points(row['interval_low'])}, {points(row['interval_high'])}]"]
        for reference in references:
            if variant == reference:
                cells.append("(reference)")
                continue
            cells.append(" / ".join(difference(against, variant, reference, metric) for metric in METRICS))
        cells.append("")
        lines.append("| " + " | ".join(cells) + " |")
    return header + lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("study", help="the study file whose record holds results-statistics.csv")
    parser.add_argument("--label", action="append", default=[], metavar="VARIANT=NAME",
                        help="the method's name shown before (`variant`); repeatable")
    args = parser.parse_args(argv)
    spec = load_study(args.study)
    if spec.record is None:
        parser.error(f"{args.study} keeps no record: its figures cannot be published from one")
    path = Path(spec.record) / "results-statistics.csv"
    if not path.is_file():
        parser.error(f"{path} does not exist: the study writes it once its runs have finished")
    labels = dict(label.split("=", 1) for label in args.label if "=" in label)
    with open(path, newline="") as handle:
        statistics = list(csv.DictReader(handle))
    print("\n".join(rows(statistics, list(spec.compare), labels)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
