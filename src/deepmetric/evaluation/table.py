"""Plain-text tables of metrics, as the CLI prints them (percentages, the papers' convention)."""

from __future__ import annotations

from collections.abc import Mapping


def metric_label(key: str) -> str:
    if key.startswith("val_"):
        return "val " + metric_label(key.removeprefix("val_"))
    if key.startswith("recall@"):
        return "R@" + key.split("@", 1)[1]
    return {"map@r": "MAP@R", "r_precision": "RP", "nmi": "NMI"}.get(key, key)


def percent(value: float | None) -> str:
    """A metric in % with 2 decimals; ``—`` for an undefined one (None or NaN: NMI of queries of one class)."""
    return "—" if value is None or value != value else f"{100 * value:.2f}"


def format_table(rows: Mapping[str, Mapping[str, float | None]]) -> str:
    """One row per model, one column per metric (the union of keys, recall first), values in %."""
    keys: list[str] = []
    for metrics in rows.values():
        for key in metrics:
            if key not in keys:
                keys.append(key)
    rest = ["map@r", "r_precision", "nmi"]
    keys.sort(key=lambda k: (0, int(k.split("@")[1])) if k.startswith("recall@") else
              (1, rest.index(k) if k in rest else len(rest), k))
    name_width = max([len(n) for n in rows] + [5])
    header = " " * name_width + "".join(f"{metric_label(k):>8}" for k in keys)
    lines = [header]
    for name, metrics in rows.items():
        cells = "".join(f"{percent(metrics.get(k)):>8}" if k in metrics else f"{'-':>8}" for k in keys)
        lines.append(f"{name:<{name_width}}{cells}")
    return "\n".join(lines)
