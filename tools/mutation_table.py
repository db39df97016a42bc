"""Count mutmut's verdicts per file from the ``mutants/**/*.py.meta`` files of a mutation run (tools/mutation.sh).

    python tools/mutation_table.py [--json out.json] [--survivors] [--retest] RUN_DIR

Prints one Markdown row per mutated file (killed / survived / timed out / no tests / other) and, with
``--survivors``, the names of the surviving mutants (``mutmut show NAME`` in RUN_DIR prints the diff).
``--retest`` forgets the verdicts "survived" and "no tests" (and which tests cover what), so that the next
``tools/mutation.sh`` run tests those mutants again against today's tests; mutmut itself keeps every verdict of a
function whose source did not change, however the tests changed.
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


def forget_survivors(run: Path) -> int:
    """Reset the survivors' and untested mutants' verdicts in RUN/mutants/**/*.py.meta; return how many."""
    forgotten = 0
    for meta in (run / "mutants").rglob("*.py.meta"):
        data = json.loads(meta.read_text())
        codes = data["exit_code_by_key"]
        again = [name for name, code in codes.items() if STATUS.get(code) in ("survived", "no tests")]
        for name in again:
            codes[name] = None
        forgotten += len(again)
        meta.write_text(json.dumps(data))
    (run / "mutants" / "mutmut-stats.json").unlink(missing_ok=True)  # recollect which tests reach what
    return forgotten


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--survivors", action="store_true")
    parser.add_argument("--retest", action="store_true", help="forget survivors so the next run tests them again")
    args = parser.parse_args()
    if args.retest:
        print(f"{forget_survivors(args.run)} mutants will be tested again by the next tools/mutation.sh run")
        return
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
