"""Sort the surviving mutants of a mutation run (tools/mutation.sh) into classes by the shape of their diff.

    python tools/mutation_survivors.py RUN_DIR [--markdown]

The classes are rules of thumb over the changed lines (``mutmut show``), each a reason a survivor can be left
(see docs/testing.md); what no rule covers is ``open``: a survivor that still needs a test or an argument.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

from mutation_table import count

STRING_LINE = re.compile(r"""^f?["'].*["'],?\)*$""")  # a continuation line of a message: a string literal only


def _message(old: str, new: str) -> bool:
    return bool(re.search(r"(Error|warning|warn|info)\(", old)) or bool(STRING_LINE.match(old))


def _keyword_dropped(old: str, new: str) -> bool:
    """``f(x, dim=1)`` -> ``f(x, )``: the call falls back on the callee's default (often the same value)."""
    return any(re.sub(r"\s+", "", old.replace(m.group(0), "", 1)) == re.sub(r"\s+", "", new)
               for m in re.finditer(r"\b\w+=[^,()]+(?=[,)])", old))


RULES = [  # (class, test on the removed and added lines), first match wins
    ("message", _message),
    ("device", lambda old, new: "device" in old and ("device=None" in new or "device" not in new
                                                     or ".to(None)" in new) or '"cuda"' in old),
    ("same value", lambda old, new: old.lower() == new.lower() and ("float(" in old or "einsum(" in old)),
    ("zip strict", lambda old, new: "strict=" in old and "zip(" in old),
    ("persistent buffer", lambda old, new: "persistent=" in old),
    ("dtype default", lambda old, new: "dtype=" in old and ("dtype=None" in new or "dtype=" not in new)),
    ("argument default", lambda old, new: old.startswith("def ") or (
        re.search(r"\w+: [\w\[\]| .]+ = [^,)]+[,)]", old) is not None and "(" not in old.split(":")[0])),
    ("keyword dropped", _keyword_dropped),
]


def classify(run: Path) -> dict[str, list[tuple[str, str, str]]]:
    classes = defaultdict(list)
    for row in count(run).values():
        for name in row["survivors"]:
            shown = subprocess.run([str(Path(sys.executable).parent / "mutmut"), "show", name], cwd=run,
                                   capture_output=True, text=True).stdout
            lines = [line for line in shown.splitlines() if not line.startswith(("---", "+++"))]
            old = " ".join(line[1:].strip() for line in lines if line.startswith("-"))
            new = " ".join(line[1:].strip() for line in lines if line.startswith("+"))
            kind = next((k for k, rule in RULES if old and rule(old, new)), "open")
            classes[kind].append((name, old, new))
    return classes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path)
    args = parser.parse_args()
    for kind, items in sorted(classify(args.run).items()):
        print(f"### {kind} ({len(items)})")
        for name, old, new in items:
            print(f"- `{name.split('.', 2)[-1]}`: `{old[:110]}` → `{new[:110]}`")


if __name__ == "__main__":
    main()
