"""The comparisons published in docs/studies/*.md (and summarised in docs/results.md) are what ``deepmetric study``
gives from the records committed beside them.

A study whose record holds every run: each line of the table that ``deepmetric study`` writes from that record
(``studies.summary.markdown``, mean ± std and the bold best) is on its study page as written, and the results
page's row of each variant gives its R@1 and MAP@R (mean ± std and 95% interval) as the record's statistics have
them. A study still being trained: its page says how many of its runs are recorded, and that count is the record's.
Nothing is trained here: the record is read as the study's run folders, as a fresh checkout restores them.
"""

from __future__ import annotations

import csv
import dataclasses
import re
from pathlib import Path

import pytest

from deepmetric.studies.collect import aggregate
from deepmetric.studies.spec import StudySpec, load_study
from deepmetric.studies.summary import markdown

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results.md"
PAGES = {"emoji.yaml": "emoji-64px.md", "emoji-160px.yaml": "emoji-160px.md",
         "emoji-160px-extras.yaml": "emoji-160px-extras.md", "icons-cpu-64px.yaml": "icons-cpu-64px.md",
         "emoji-cpu-64px.yaml": "emoji-cpu-64px.md", "icons-cpu-64px-extras.yaml": "icons-cpu-64px-extras.md",
         "emoji-cpu-64px-extras.yaml": "emoji-cpu-64px-extras.md", "emoji-jitter-64px.yaml": "color-jitter.md",
         "icons-jitter-64px.yaml": "color-jitter.md"}
"""Each comparison's study file and the page of docs/studies/ that publishes its table."""
COMPARISONS = tuple(PAGES)
SUMMARISED = {"emoji-160px.yaml": "Emoji at 160 px: the seven core methods",
              "icons-cpu-64px.yaml": "Icons at 64 px on a CPU: the seven core methods, tuned alike",
              "emoji-cpu-64px.yaml": "Emoji at 64 px on a CPU: the seven core methods, tuned alike",
              "icons-cpu-64px-extras.yaml": "Icons at 64 px on a CPU: the other methods, tuned alike",
              "emoji-cpu-64px-extras.yaml": "Emoji at 64 px on a CPU: the other methods, tuned alike"}
"""The comparisons whose figures docs/results.md gives, a row per variant, and the section (### heading, under its
benchmark's ## heading) with them."""
RECORDS = ("emoji.yaml", "emoji-160px.yaml", "emoji-160px-extras.yaml", "emoji-ablations-160px.yaml",
           "emoji-pml-tuning-160px.yaml", "icons-cpu-64px.yaml", "emoji-cpu-64px.yaml",
           "icons-cpu-64px-extras.yaml", "emoji-cpu-64px-extras.yaml", "emoji-jitter-64px.yaml",
           "icons-jitter-64px.yaml")
"""The study files whose records are committed under docs/studies/."""
BEFORE_PER_QUERY = RECORDS[:5]
"""The records whose runs predate per-query files."""


def _rows_from_record(study: str, tmp_path: Path) -> tuple[StudySpec, list[dict]]:
    spec = load_study(ROOT / "configs" / "studies" / study)
    assert spec.record is not None, f"{study} keeps no record"
    (tmp_path / "runs").symlink_to(ROOT / spec.record)  # <record>/<variant>/<seed> is <out>/runs/<variant>/<seed>
    spec = dataclasses.replace(spec, out=tmp_path)
    return spec, aggregate(spec)


@pytest.mark.parametrize("study", COMPARISONS)
def test_a_published_comparison_is_its_records_table_or_says_how_much_is_recorded(study, tmp_path):
    spec, rows = _rows_from_record(study, tmp_path)
    page = ROOT / "docs" / "studies" / PAGES[study]
    text = page.read_text()
    total = len(spec.runs())
    if len(rows) == total:
        lines = [line for line in markdown(spec, rows).splitlines() if line.startswith("| ")]
        missing = [line for line in lines if line not in text]
        assert not missing, f"{page.name} lacks these lines of {study}'s table (deepmetric study {study}):\n" + \
            "\n".join(missing)
    else:
        said = re.findall(rf"(\d+) of {total} runs recorded", text)
        assert said == [str(len(rows))], (f"{study}: {len(rows)} of {total} runs are recorded; {page.name} says "
                                          f"{said or 'nothing'}")


@pytest.mark.parametrize("study", list(SUMMARISED))
def test_the_results_page_gives_each_variants_figures_as_its_record_has_them(study):
    """Each variant's row in the study's section of docs/results.md (the row naming it as `variant`) holds its R@1
    and MAP@R as mean ± std and as the 95% t-interval, and its difference from GAP with the study's mark (▲ / ▼ or
    none), to the digit of the record's ``results-statistics.csv``. A variant without a row there can only be one of
    the study's references (`compare:`), shown with another study's figures."""
    spec = load_study(ROOT / "configs" / "studies" / study)
    with open(ROOT / spec.record / "results-statistics.csv", newline="") as handle:
        table = list(csv.DictReader(handle))
    stats = [row for row in table if row["kind"] == "variant"]
    against_gap = [row for row in table if row["kind"] != "variant" and row["reference"] == "gap"
                   and row["metric"] in ("recall@1", "map@r")]
    assert against_gap, f"{study}'s record compares nothing with gap"
    heading = f"\n### {SUMMARISED[study]}\n"
    text = RESULTS.read_text()
    assert heading in text, f"docs/results.md has no section '{heading.strip()}'"
    section = text.split(heading, 1)[1].split("\n#", 1)[0]  # to the next heading of any level
    rows = {match[1]: match[0] for match in re.finditer(r"^\|[^\n]*?\(`([\w.-]+)`[^\n]*$", section, flags=re.M)}
    variants = {row["variant"] for row in stats}
    assert variants - set(spec.compare) <= set(rows), f"docs/results.md has no row for {sorted(variants - set(rows))}"
    assert set(rows) <= variants, f"docs/results.md has rows for variants {study} lacks: {sorted(set(rows) - variants)}"
    stats = [row for row in stats if row["variant"] in rows]
    against_gap = [row for row in against_gap if row["variant"] in rows]

    def shown(value: str) -> str:
        return f"{100 * float(value):.2f}".replace("-", "−")

    for row in stats:
        if row["metric"] not in ("recall@1", "map@r"):
            continue
        line = rows[row["variant"]]
        expected = (f"{shown(row['mean'])} ± {shown(row['std'])}",
                    f"[{shown(row['interval_low'])}, {shown(row['interval_high'])}]")
        for figure in expected:
            assert figure in line, f"docs/results.md's {row['variant']} row lacks {row['metric']} {figure}:\n{line}"
    for row in against_gap:
        line = rows[row["variant"]]
        figure = f"{100 * float(row['difference']):+.2f}".replace("-", "−") + (f" {row['mark']}" if row["mark"] else "")
        following = line.split(figure, 1)[1][:2] if figure in line else ""
        assert figure in line and following.strip() in ("", "/", "|"), (
            f"docs/results.md's {row['variant']} row lacks {row['metric']} − gap {figure!r}:\n{line}")


@pytest.mark.parametrize("study", RECORDS)
def test_a_committed_record_verifies(study):
    """``deepmetric study FILE --verify`` on each committed record: its MANIFEST.sha256, each run's files, its tuning
    trials and every figure of the tables kept in it (recomputed from the record, nothing trained). The records that
    predate per-query files say so; that is not a failure."""
    from deepmetric.studies.verify import verify

    spec = load_study(ROOT / "configs" / "studies" / study)
    spec = dataclasses.replace(spec, record=ROOT / spec.record)
    found = verify(spec)
    assert found.problems == [], "\n".join(found.problems)
    if study in BEFORE_PER_QUERY:
        assert any("per-query checks unavailable" in note for note in found.notes)
