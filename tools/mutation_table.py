"""Count mutmut's verdicts per file from the ``mutants/**/*.py.meta`` files of a mutation run (tools/mutation.sh).

    python tools/mutation_table.py [--json out.json] [--survivors] RUN_DIR

Prints one Markdown row per mutated file (killed / survived / timed out / no tests / other) and, with
``--survivors``, the names of the surviving mutants (``mutmut show NAME`` in RUN_DIR prints the diff).
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

# mutmut 3's exit codes (mutmut/stats.py): 1 and 3 mean a test failed, i.e. the mutant is killed
STATUS = {1: "killed", 3: "killed", 0: "survived", 36: "timeout", 24: "timeout", -24: "timeout", 152: "timeout",
          255: "timeout", 33: "no tests", 5: "no tests", None: "not checked"}
COLUMNS = ("killed", "survived", "timeout", "no tests", "not checked", "other")


def count(run: Path) -> dict[str, dict]:
    table = {}
    for meta in sorted((run / "mutants").rglob("*.py.meta")):
        codes = json.loads(meta.read_text())["exit_code_by_key"]
        if not codes:
            continue
        source = str(meta.relative_to(run / "mutants"))[: -len(".meta")]
        counts = Counter(STATUS.get(code, "other") for code in codes.values())
        survivors = sorted(name for name, code in codes.items() if STATUS.get(code) == "survived")
        table[source] = {"total": len(codes), **{c: counts.get(c, 0) for c in COLUMNS}, "survivors": survivors}
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--survivors", action="store_true")
    args = parser.parse_args()
    table = count(args.run)
    if args.json:
        args.json.write_text(json.dumps(table, indent=1) + "\n")
    print("| file | mutants | killed | survived | timed out | no tests | not checked |")
    print("|---|---|---|---|---|---|---|")
    for source, row in table.items():
        print(f"| `{source}` | {row['total']} | {row['killed']} | {row['survived']} | {row['timeout']} | "
              f"{row['no tests']} | {row['not checked'] + row['other']} |")
    if args.survivors:
        for row in table.values():
            for name in row["survivors"]:
                print(f"survived: {name}")


if __name__ == "__main__":
    main()
