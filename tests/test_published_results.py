"""The comparisons in docs/results.md are what ``deepmetric study`` gives from the records committed beside them.

A study whose record holds every run: each line of the table that ``deepmetric study`` writes from that record
(``studies.aggregate.markdown``, mean ± std and the bold best) is in docs/results.md as written. A study still
being trained: docs/results.md says how many of its runs are recorded, and that count is the record's.
Nothing is trained here: the record is read as the study's run folders, as a fresh checkout restores them.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from deepmetric.studies.aggregate import aggregate, markdown
from deepmetric.studies.spec import StudySpec, load_study

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results.md"
COMPARISONS = ("emoji.yaml", "emoji-160px.yaml", "emoji-160px-extras.yaml")
RECORDS = ("emoji.yaml", "emoji-160px.yaml", "emoji-160px-extras.yaml", "emoji-ablations-160px.yaml",
           "emoji-pml-tuning-160px.yaml")
"""The study files whose records are committed under docs/studies/."""
"""The study files whose tables docs/results.md publishes (the ablations' table is a validation table of its own)."""


def _rows_from_record(study: str, tmp_path: Path) -> tuple[StudySpec, list[dict]]:
    spec = load_study(ROOT / "configs" / "studies" / study)
    assert spec.record is not None, f"{study} keeps no record"
    (tmp_path / "runs").symlink_to(ROOT / spec.record)  # <record>/<variant>/<seed> is <out>/runs/<variant>/<seed>
    spec = dataclasses.replace(spec, out=tmp_path)
    return spec, aggregate(spec)


@pytest.mark.parametrize("study", COMPARISONS)
def test_a_published_comparison_is_its_records_table_or_says_how_much_is_recorded(study, tmp_path):
    spec, rows = _rows_from_record(study, tmp_path)
    text = RESULTS.read_text()
    total = len(spec.runs())
    if len(rows) == total:
        lines = [line for line in markdown(spec, rows).splitlines() if line.startswith("| ")]
        missing = [line for line in lines if line not in text]
        assert not missing, f"docs/results.md lacks these lines of {study}'s table (deepmetric study {study}):\n" + \
            "\n".join(missing)
    else:
        said = re.findall(rf"(\d+) of {total} runs recorded", text)
        assert said == [str(len(rows))], (f"{study}: {len(rows)} of {total} runs are recorded; docs/results.md says "
                                          f"{said or 'nothing'}")


@pytest.mark.parametrize("study", RECORDS)
def test_a_committed_record_verifies(study):
    """``deepmetric study FILE --verify`` on each committed record: its MANIFEST.sha256, each run's files and every
    figure of the tables kept in it (recomputed from the record, nothing trained). These records predate per-query
    files: that is said, not failed."""
    from deepmetric.studies.verify import verify

    spec = load_study(ROOT / "configs" / "studies" / study)
    spec = dataclasses.replace(spec, record=ROOT / spec.record)
    found = verify(spec)
    assert found.problems == [], "\n".join(found.problems)
    assert any("per-query checks unavailable" in note for note in found.notes)
