"""``deepmetric study FILE --dry-run``: every run of a study listed and built, no image read, nothing written.

For each run: its name, repeat (seed or split) and the settings that make it differ from the base config; then
its config is built, its data path checked to exist (``data.check_data_path``: the study file's placeholder path
fails here until the command line gives the real one), and its model (with the weights it names: a missing file
or an unreachable download is that run's failure), objective and optimiser groups, as ``deepmetric train`` builds
them. Runs that resolve to the same model, objective and groups are built once.

Each run's state is read from its folder and the study's record, so that a study trained over several sessions (or
machines) says where it stands: ``finished``, ``recorded`` (in the record, restored when the study runs),
``training now`` (held by a process: its last logged step), ``stopped at step N`` (resumes there), ``trained``
(its test evaluation left) or ``to train``. The last line counts them.

The command prints as it goes (``on_row``): a first line before anything is built, each run's lines once it is
checked (the demo study's 33 runs were 35 s of silence, then 66 lines at once), then the counts.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import build_config
from ..data import check_data_path
from ..errors import DeepMetricError
from ..runs.checkpoint import checkpoint_state
from ..runs.folder import RunDir
from .record import finished, recorded
from .spec import StudyRun, StudySpec

DRY_RUN_CLASSES = 100
"""Training classes assumed for losses with per-class parameters (no data is read)."""


@dataclass
class DryRunRow:
    run: str
    repeat: str
    settings: str
    outcome: str
    ok: bool
    state: str = "to train"
    """``finished``, ``recorded``, ``training now``, ``stopped``, ``trained`` or ``to train``."""
    progress: str = ""
    """The state's details: ``step 580 of 1,000 (process 7497)``."""


def _flatten(layer: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in layer.items():
        if isinstance(value, dict) and value and key not in ("head_options", "options", "regularizers", "groups"):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _settings(spec: StudySpec, run: StudyRun) -> str:
    """The run's own settings: ``set``, its variant's overrides and the command line's, as ``key=value``."""
    flat: dict[str, Any] = {}
    for layer in run.layers[1:-1]:
        flat.update(_flatten(layer))
    return " ".join(f"{k}={json.dumps(v, separators=(',', ':'))}" for k, v in flat.items()) or "(the base config)"


def _build(config: Any) -> str:
    """Build the run's model, objective and optimiser groups as training does; a summary of what was built."""
    from ..losses import build_objective
    from ..training.optim import build_optimizer
    from ..training.setup import build_model

    model = build_model(config)
    objective = build_objective(config.loss, model.head, num_classes=DRY_RUN_CLASSES)
    optimizer = build_optimizer(model, objective, config.train)
    if config.generator.name is not None:
        from ..generators import build_generator

        d = config.data
        build_generator(config.generator.name, config.generator.options, head=model.head,
                        num_classes=DRY_RUN_CLASSES, batch_size=d.classes_per_batch * d.samples_per_class,
                        lr=config.train.lr, seed=config.train.seed)
    count = sum(p.numel() for p in model.parameters()) + sum(p.numel() for p in objective.parameters())
    groups = ", ".join(group["name"] for group in optimizer.param_groups)
    return f"ok: {count:,} parameters; groups {groups}"


def _last_logged_step(folder: RunDir) -> int | None:
    """The last training step ``metrics.jsonl`` logged (None: nothing logged, or nothing readable)."""
    try:
        records = folder.read_log()
    except (DeepMetricError, OSError):
        return None
    steps = [r["step"] for r in records if isinstance(r, dict) and isinstance(r.get("step"), int)]
    return steps[-1] if steps else None


def run_state(folder: RunDir, record: Path | None, steps: int) -> tuple[str, str]:
    """Where a study's run stands (the module docstring lists the states), and the details in words."""
    if finished(folder):
        return "finished", ""
    if record is not None and recorded(record):
        return "recorded", "restored from the record when the study runs"
    holder = folder.holder()
    if holder is not None:
        return "training now", f"step {_last_logged_step(folder) or 0:,} of {steps:,} (process {holder})"
    if not folder.last.is_file():
        return "to train", ""
    try:
        step = checkpoint_state(folder.last).get("step")
    except DeepMetricError as error:
        return "stopped", f"its last checkpoint does not read ({error})"
    if isinstance(step, int) and step >= steps:
        return "trained", f"step {step:,} (its test evaluation is left)"
    return "stopped", f"step {step:,} of {steps:,} (resumes there)" if isinstance(step, int) else "resumes"


def dry_run(spec: StudySpec, only: list[str] | tuple[str, ...] = (),
            on_row: Callable[[DryRunRow], None] | None = None) -> list[DryRunRow]:
    """Build every run of ``spec`` (of the variants in ``only``, when given: those a study run with ``--only``
    trains; see the module docstring); a row per run, in the order the study runs them, each also given to
    ``on_row`` as soon as it is known. A variant whose tuning has ended is built with its best trial's values, as
    the study would train it; a finished trial trained with other settings than the study gives now stops it, as it
    stops the study (``tuning.check_finished_trials``)."""
    if spec.tune is not None:  # a variant still being tuned is built with its own settings
        from .tuning import apply_best_values, check_finished_trials

        variants = list(dict.fromkeys(run.variant for run in spec.runs(only)))
        check_finished_trials(spec, variants)
        apply_best_values(spec, variants)
    rows, built = [], {}
    for run in spec.runs(only):
        repeat = f"split {run.repeat}" if spec.protocol == "splits" else f"seed {run.repeat}"
        state, progress = "to train", ""
        try:
            config = build_config(*run.layers)
            state, progress = run_state(RunDir(spec.run_dir(run)), spec.record_dir(run), config.train.steps)
            check_data_path(config.data.spec)
            plain = config.to_dict()
            key = json.dumps({k: plain[k] for k in ("model", "loss", "generator")} | {"train": plain["train"]},
                             sort_keys=True)
            if key not in built:
                try:
                    built[key] = (_build(config), True)
                except DeepMetricError as error:
                    built[key] = (f"FAILS: {error}", False)
                except Exception as error:  # noqa: BLE001 - a bug of ours fails the run too; list it, go on
                    built[key] = (f"FAILS: {type(error).__name__}: {error}", False)
            outcome, ok = built[key]
        except DeepMetricError as error:
            outcome, ok = f"FAILS: {error}", False
        rows.append(DryRunRow(run.variant or "base", repeat, _settings(spec, run), outcome, ok, state, progress))
        if on_row is not None:
            on_row(rows[-1])
    return rows


STATES = ("finished", "recorded", "training now", "stopped", "trained", "to train")


def format_header(spec: StudySpec, runs: list[StudyRun]) -> str:
    """The dry run's first lines, printed before anything is built: how many runs, and how far the tuning of their
    variants is."""
    lines = [f"study {spec.name}: checking {len(runs)} runs into {spec.out}, each built as training builds it "
             "(no image is read, nothing written)"]
    if spec.tune is not None:
        from .tuning import trials_of

        variants = dict.fromkeys(run.variant for run in runs)
        done = ", ".join(f"{v} {len(trials_of(spec, v))} of {spec.tune.trials}" for v in variants)
        lines.append(f"  tuned first, {spec.tune.trials} trials a variant ({done}); a variant whose tuning has ended "
                     "is built with its best values")
    return "\n".join(lines)


def format_row(row: DryRunRow) -> str:
    """A run's two lines: where it stands and its settings, then what building it gave."""
    state = row.state + (f": {row.progress}" if row.progress else "")
    return f"  {row.run} / {row.repeat} [{state}]: {row.settings}\n      {row.outcome}"


def format_summary(spec: StudySpec, rows: list[DryRunRow]) -> str:
    """The dry run's last line: the runs counted by state."""
    counts = Counter(row.state for row in rows)
    states = ", ".join(f"{counts[state]} {state}" for state in STATES if counts[state])
    return f"study {spec.name}: {len(rows)} runs into {spec.out} ({states})"


def format_dry_run(spec: StudySpec, rows: list[DryRunRow], only: list[str] | tuple[str, ...] = ()) -> str:
    """What the command prints for ``dry_run(spec, only)``'s rows, at once: ``format_header``, each row,
    ``format_summary``."""
    return "\n".join([format_header(spec, spec.runs(only)), *map(format_row, rows), format_summary(spec, rows)])
