"""tools/results_rows.py: the rows of a comparison on docs/results.md, copied from its record's statistics."""

from __future__ import annotations

import re
from pathlib import Path

from helpers import load_tool

ROOT = Path(__file__).parents[1]


def test_the_rows_carry_the_published_figures_of_the_emoji_comparison(capsys):
    """Written from emoji-160px's record, each row's R@1 and MAP@R (mean ± std, interval) and its difference from
    GAP are the figures docs/results.md publishes for that variant (the page's own test holds those to the record)."""
    tool = load_tool("results_rows")
    assert tool.main([str(ROOT / "configs/studies/emoji-160px.yaml"), "--label", "abe=ABE-8"]) == 0
    written = capsys.readouterr().out.splitlines()
    assert written[0].startswith("| method (variant) | R@1 | 95% interval | MAP@R |")
    section = (ROOT / "docs/results.md").read_text().split("## Emoji at 160 px: the seven core methods\n")[1]
    published = {m[1]: m[0] for m in re.finditer(r"^\|[^\n]*?\(`([\w.-]+)`[^\n]*$", section.split("\n## ")[0],
                                                    flags=re.M)}
    rows = written[2:]
    assert [re.search(r"\(`([\w.-]+)`\)", row)[1] for row in rows] == [
        "abe", "deml", "diablo", "dgml", "horde", "gap", "n-grouping-stage5"]  # best R@1 first
    assert rows[0].startswith("| ABE-8 (`abe`) | **85.45 ± 0.38** | [84.50, 86.40] | **72.07 ± 0.26** |")
    for row in rows:
        variant = re.search(r"\(`([\w.-]+)`\)", row)[1]
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        for figure in cells[1:6]:
            assert figure in published[variant], (variant, figure)
    assert "| (reference) | +3.86 ▲ / +3.07 ▲ |" in rows[5]  # GAP against the control: that test read backwards
    assert "| −3.86 ▼ / −3.07 ▼ | (reference) |" in rows[6]


def test_signs_marks_and_the_best_mean():
    tool = load_tool("results_rows")

    def variant(name, metric, mean):
        return {"kind": "variant", "variant": name, "metric": metric, "mean": mean, "std": "0.01",
                "interval_low": "0.1", "interval_high": "0.2"}

    statistics = [variant("a", "recall@1", "0.5"), variant("a", "map@r", "0.3"),
                  variant("b", "recall@1", "0.6"), variant("b", "map@r", "0.2"),
                  {"kind": "comparison", "variant": "a", "reference": "b", "metric": "recall@1",
                   "difference": "-0.1", "mark": "▼"},
                  {"kind": "comparison", "variant": "a", "reference": "b", "metric": "map@r",
                   "difference": "0.1", "mark": ""}]
    header, rule, first, second = tool.rows(statistics, ["b"], {"b": "B"})
    assert "vs b" in header and rule.count("---") == 7
    assert first == "| B (`b`) | **60.00 ± 1.00** | [10.00, 20.00] | 20.00 ± 1.00 | [10.00, 20.00] | (reference) |  |"
    assert second == ("| a (`a`) | 50.00 ± 1.00 | [10.00, 20.00] | **30.00 ± 1.00** | [10.00, 20.00] "
                      "| −10.00 ▼ / +10.00 |  |")
    header, rule, first, second = tool.rows(statistics, ["a", "b"], {"b": "B"})
    assert first.endswith("| +10.00 ▲ / −10.00 | (reference) |  |")  # b against a: a's test read backwards
    statistics = [row for row in statistics if row["metric"] == "recall@1" or row["kind"] == "variant"]
    assert tool.rows(statistics, ["b"], {})[3].endswith("| −10.00 ▼ / — |  |")  # MAP@R's pair is not tested
